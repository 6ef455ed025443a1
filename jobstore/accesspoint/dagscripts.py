"""DAG node scripts on the access point: SCRIPT PRE before a node's jobs are released, SCRIPT
POST after they end, SCRIPT HOLD when one of them was held (best effort: its exit changes
nothing; one run for the holds since the last), each run as DAGMan runs it (in the node's
directory, its arguments split on white space, DAGMan's macros such as $JOB, $RETURN and
$PRE_SCRIPT_RETURN given), as the DAG's owner, by a runner of its own (scriptrunner) that
outlives this service.

A script starts only after its lease is taken in the store (one run of it, named by a token
whose first half is this service's own id), and its exit is given to the store when its
runner has written it into this service's directory: so a restarted service, or a second one
on the same store, never runs a script twice, and one that restarts takes up the exits its
runners wrote meanwhile. A run whose runner vanished without an exit fails its node.

A node whose transfer_input_files are read when it is submitted (one with parents) waits in
`pre` too: once its PRE script (if any) exited 0, its inputs are read as its owner
(ownerread) and stored with that exit, in one transaction; when they cannot be, the node
fails as DAGMan's does when its job cannot be submitted (-1001)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pwd
import secrets
import shutil
import signal
import stat
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from jobstore.accesspoint import scriptrunner
from jobstore.accesspoint.ownerread import read_as
from jobstore.accesspoint.service import SaidOnce, refusal, serving_account
from jobstore.db.dagengine import POST, PRE, QUEUED, SCRIPT_TOKEN, SUBMIT_FAILED
from jobstore.db.dagscripts import NodeJob, NodeScript, ScriptExit
from jobstore.db.sandbox import FileSource
from jobstore.db.store import JobStore
from jobstore.errors import DatabaseError, FileChanged, InputTooLarge, NotRead
from jobstore.node import config, settingtable

LOG = logging.getLogger("jobstore.schedd")
MAX_PER_DAG = 20  # DAGMan's DAGMAN_MAX_PRE_SCRIPTS and DAGMAN_MAX_POST_SCRIPTS
MAX_PER_OWNER = 100  # scripts one owner's DAGs may run at once on this access point
MAX_RUNS = 1000  # scripts that run at once on this access point, every owner's
LOST_AFTER = 60.0  # seconds after its start a run with no runner and no exit is lost
RESCAN = 60.0  # seconds between looks for the runs of a former service of this directory
ORPHAN_AGE = 60.0  # seconds a run no node holds is left alone (another service may lease it)
PASS_BUDGET = 2.0  # seconds a pass may spend starting scripts before the other duties' turn
RESPAWNS = 3  # runners of one run that may end without starting its script, before it fails
MAX_OWNERS = 10_000  # owners whose late inputs were read lately, remembered for their turns
LEAST_DEFER = 1.0  # seconds a deferred script waits at least (DAGMan's may be 0)
AGAIN_PER_MINUTE = 60  # deferred and HOLD scripts of one owner started in a minute, at most
RUN_FILES = (".json", ".pid", ".tmp", ".inputs")  # what a run leaves, after its token
CHECK = 2.0  # seconds between looks at whether the nodes still wait for the running scripts
CANNOT_RUN = scriptrunner.CANNOT_RUN
MAX_COMMAND = 4096
# DAGMan's macros that only a POST script is told of (a PRE script gets them as written)
POST_ONLY = {"$JOBID", "$CLUSTERID", "$JOB_COUNT", "$SUCCESS", "$RETURN", "$EXIT_CODES",
             "$EXIT_CODE_COUNTS", "$EXIT_CODE_LIST", "$PRE_SCRIPT_RETURN", "$JOB_ABORT_COUNT"}
REMOVED_RETURN = -1002  # $RETURN of a job removed from the queue, as DAGMan gives it


@dataclass
class _Run:
    """A script this service started (or found running): its node and its runner (None: a
    former service's)."""

    dag_id: int
    name: str
    kind: str
    owner: str
    started: float
    pid: int | None = None
    command: tuple[int, int, str, list[str]] | None = None  # (uid, gid, cwd, argv)
    waiting: bool = False  # its runner is to be started (again)
    respawns: int = 0
    late: bool = False  # the node's inputs are read once its PRE step exited 0
    has_pre: bool = True  # the node has a PRE script (else its PRE step runs no runner)
    cluster_id: int | None = None
    defer: tuple[int, int] | None = None  # SCRIPT DEFER: this exit runs it again so much later
    debug: scriptrunner.Debug | None = None  # SCRIPT DEBUG


@dataclass
class DagScripts:
    """Runs the due PRE and POST scripts of the DAGs whose home is `name`; as root, every
    owner's (each as herself), else only this account's."""

    store: JobStore
    name: str
    settings: config.Settings
    clock: Callable[[], float] = time.time
    _owner: str | None = field(default=None, init=False)
    _directory: Path | None = field(default=None, init=False)
    _id: str = field(default="", init=False)
    _runs: dict[str, _Run] = field(default_factory=dict, init=False)
    _said: SaidOnce = field(default_factory=SaidOnce, init=False)
    _rescan_at: float = field(default=0.0, init=False)
    _check_at: float = field(default=0.0, init=False)
    _served: dict[str, float] = field(default_factory=dict, init=False)  # late inputs, by owner
    # when each owner's deferred and HOLD scripts were started lately (AGAIN_PER_MINUTE)
    _again: dict[str, list[float]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._owner = serving_account()
        try:
            where = _safe_path(self._where())  # what is missing of it, this process makes
            base = _own_directory(where)
            _safe_path(where)
            store = hashlib.sha256(self.settings.database_url.encode()).hexdigest()[:12]
            self._directory = _own_directory(str(base / f"{self.name}-{store}"))
            self._id = _service_id(self._directory)
        except OSError as exc:
            LOG.error("DAG node scripts are not run: %s", exc)
            self._directory = None

    @property
    def busy(self) -> bool:
        """Do scripts run (their exits are looked for, not announced)?"""
        return bool(self._runs)

    def pass_once(self) -> int:
        """Give the store the exits of the scripts that ended, then start the due ones;
        returns how many scripts ended or started."""
        if self._directory is None:
            return 0
        if self.clock() >= self._rescan_at:
            self._take_up()
        done = self._collect()
        for token, run in self._runs.items():
            if run.waiting:
                self._spawn(token, run)
        until = time.monotonic() + PASS_BUDGET
        while len(self._runs) < MAX_RUNS and time.monotonic() < until and (started := self._start(
                self.store.dag_scripts.due(self.name, owner=self._owner, per_dag=MAX_PER_DAG,
                                           per_owner=MAX_PER_OWNER))):
            done += started
        if len(self._runs) < MAX_RUNS and time.monotonic() < until:
            done += self._start(self.store.dag_scripts.due_holds(
                self.name, owner=self._owner, per_dag=MAX_PER_DAG, per_owner=MAX_PER_OWNER))
        return done

    def _take_up(self) -> None:
        """Take up the runs a former service of this directory started (their runners may
        still run, or have written their exits), and stop those whose node no longer waits
        for them (a DAG removed while no service ran)."""
        assert self._directory is not None
        held = set()
        for row in self.store.dag_scripts.held_by(self.name, self._id, owner=self._owner):
            if row.token is None or not SCRIPT_TOKEN.fullmatch(row.token):
                continue
            held.add(row.token)
            if row.token not in self._runs:
                self._runs[row.token] = _Run(row.dag_id, row.name, row.kind, row.owner,
                                             row.started_at or 0.0, late=row.late,
                                             cluster_id=row.cluster_id, has_pre=row.has_pre,
                                             defer=row.defer)
        now = time.time()
        for path in self._directory.iterdir():
            token, _, suffix = path.name.partition(".")
            if (not SCRIPT_TOKEN.fullmatch(token) or token in held or token in self._runs
                    or f".{suffix}" not in RUN_FILES):
                continue
            try:
                if now - path.lstat().st_mtime < ORPHAN_AGE:
                    continue
                if suffix == "pid" and scriptrunner.stop(path):
                    LOG.info("the run %s is no node's: its runner is stopped", token)
                elif suffix == "inputs":
                    shutil.rmtree(path)
                else:
                    path.unlink()
            except OSError:
                pass
        self._rescan_at = self.clock() + RESCAN

    # ---- the scripts that ended ----------------------------------------------------------

    def _collect(self) -> int:
        ended: list[ScriptExit] = []
        deferred: list[tuple[ScriptExit, float]] = []
        inputs: list[tuple[str, _Run]] = []
        running: list[tuple[str, _Run]] = []
        for token, run in list(self._runs.items()):
            result = self._result(token, run)
            if result is None:
                running.append((token, run))
                continue
            code, why = result
            if code is None:  # the runner could not start the script: start it again
                self._respawn(token, run, why)
                running.append((token, run))
                continue
            if why:
                LOG.warning("DAG %s node %s: its %s script: %s", run.dag_id, run.name,
                            run.kind.upper(), why)
            if run.kind == PRE and code == 0 and run.late:
                inputs.append((token, run))
                continue
            if run.defer is not None and code == run.defer[0] and not why:
                deferred.append((ScriptExit(run.dag_id, run.name, run.kind, token, code),
                                 self.clock() + max(float(run.defer[1]), LEAST_DEFER)))
                continue
            ended.append(ScriptExit(run.dag_id, run.name, run.kind, token, code))
        if running and self.clock() >= self._check_at:
            holding = self.store.dag_scripts.holding(
                [(r.dag_id, r.name, r.kind) for _, r in running])
            for token, run in running:
                if holding.get((run.dag_id, run.name, run.kind)) == token:
                    continue
                if run.waiting:  # the node no longer waits for it (removed): never start it
                    run.waiting, run.command = False, None
                    self._give_up(token, "its node no longer waits for it")
                else:
                    self._stop(token, run)
            self._check_at = self.clock() + CHECK
        self._give(ended)
        self._defer(deferred)
        self._read_inputs(inputs)
        return len(ended) + len(deferred) + len(inputs)

    def _defer(self, deferred: list[tuple[ScriptExit, float]]) -> None:
        """The runs that exited with their DEFER status: each script due again later (as
        DAGMan's, it has not ended), then forgotten."""
        if not deferred:
            return
        for run in self.store.dag_scripts.defer(deferred):
            LOG.debug("DAG %s node %s: its %s script exited with %s: deferred", run.dag_id,
                      run.name, run.kind.upper(), run.code)
            self._forget(run.token)

    def _read_inputs(self, inputs: list[tuple[str, _Run]]) -> None:
        """Read the late inputs of at most one node of each owner this pass, the owners
        served least lately first, until PASS_BUDGET: one owner's many or slow files keep
        another's node waiting one of her nodes at most."""
        until = time.monotonic() + PASS_BUDGET
        first: dict[str, tuple[str, _Run]] = {}
        for token, run in inputs:
            first.setdefault(run.owner, (token, run))
        for owner in sorted(first, key=lambda o: self._served.get(o, 0.0)):
            if time.monotonic() >= until:
                break  # the rest on the next pass
            self._store_inputs(*first[owner])
            self._served[owner] = time.monotonic()
            if len(self._served) > MAX_OWNERS:
                self._served.clear()

    def _store_inputs(self, token: str, run: _Run) -> None:
        """Read the node's late inputs as its owner and store them with its PRE step's exit
        0; when they cannot be read or stored, the node fails (DAGMan's submit failure)."""
        assert self._directory is not None
        exit_ = ScriptExit(run.dag_id, run.name, PRE, token, 0)
        copies = self._directory / f"{token}.inputs"
        try:
            why = refusal(run.owner, self._owner, self.settings)
            if why is not None:
                raise NotRead(why)
            entries = _late_entries(self.store.dag_scripts.late_inputs(run.dag_id, run.name))
            if run.cluster_id is None:
                raise NotRead("the node has no jobs")
            shutil.rmtree(copies, ignore_errors=True)  # a former try's
            copies.mkdir(mode=0o700)
            max_file, max_total = self.store.dag_scripts.input_limits()
            files = read_as(run.owner if self._owner is None else None, entries, copies,
                            max_file, max_total)
            if not self.store.dag_scripts.inputs_done(
                    exit_, run.cluster_id, run.owner,
                    [FileSource(f.name, f.path, f.mode) for f in files]):
                return  # its node is another transaction's now: the next pass reads again
        except DatabaseError:
            raise
        except (NotRead, InputTooLarge, FileChanged, OSError, ValueError, KeyError) as exc:
            self._warn(run.dag_id, f"DAG {run.dag_id} node {run.name}: its transfer_input_files"
                       f" could not be read: {' '.join(str(exc).split())[:300]}")
            self._give([exit_._replace(code=SUBMIT_FAILED)])
            return
        finally:
            shutil.rmtree(copies, ignore_errors=True)
        self._forget(token)

    def _give(self, ended: list[ScriptExit]) -> None:
        """Give the store the exits, in one transaction (one at a time if that fails, so
        that one that cannot be given holds back none other), then forget them."""
        if not ended:
            return
        try:
            taken = self.store.dag_scripts.done(ended)
        except DatabaseError:
            raise
        except Exception:  # noqa: BLE001 - one node's exit must not hold back the others
            for run in ended:
                try:
                    if not self.store.dag_scripts.done([run]):
                        continue  # its node is another transaction's: the next pass
                except DatabaseError:
                    raise
                except Exception as exc:  # noqa: BLE001
                    LOG.error("DAG %s node %s: its %s script's exit %s was not taken: %s",
                              run.dag_id, run.name, run.kind.upper(), run.code,
                              " ".join(str(exc).split())[:300])
                    continue
                self._forget(run.token)
            return
        for run in taken:  # the others' nodes are another transaction's: the next pass
            self._forget(run.token)

    def _respawn(self, token: str, run: _Run, why: str) -> None:
        """Start the run's runner again, its script never having started; after RESPAWNS,
        or for a former service's run, its node fails."""
        self._remove_files(token)
        run.pid = None
        run.respawns += 1
        run.waiting = run.command is not None
        if not run.waiting or run.respawns > RESPAWNS:
            run.waiting = False
            run.command = None  # so its next look ends it
            self._warn(run.dag_id, f"DAG {run.dag_id} node {run.name}: its {run.kind.upper()} "
                       f"script could not be started: {why}")
            self._give_up(token, why)

    def _give_up(self, token: str, why: str) -> None:
        """End a run whose script never started: its next look gives the store its failure."""
        assert self._directory is not None
        (self._directory / f"{token}.json").write_text(json.dumps(
            {"code": CANNOT_RUN, "error": why}))

    def _result(self, token: str, run: _Run) -> tuple[int | None, str] | None:
        """How the run ended (its exit, and why it could not run; exit None: its script never
        started, and may be started again), None while it runs."""
        assert self._directory is not None
        path = self._directory / f"{token}.json"
        if run.waiting:
            return None
        if run.pid is not None and run.pid > 0:  # -1: reaped (waitpid(-1) is any child's)
            if os.waitpid(run.pid, os.WNOHANG) == (0, 0):
                return None
            run.pid = -1
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
            why = " ".join(str(found.get("error") or "").split())[:300]
            return (None if found.get("retry") is True else int(found["code"])), why
        except FileNotFoundError:
            if run.kind == PRE and run.late and not run.has_pre:
                return 0, ""  # no runner: its inputs are to be read
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return CANNOT_RUN, f"its exit could not be read: {exc}"
        if run.pid is not None:
            return None, "its runner ended without an exit"
        if scriptrunner.alive(self._directory / f"{token}.pid"):
            return None
        if self.clock() - run.started < LOST_AFTER:
            return None
        return CANNOT_RUN, "its runner was lost (no exit was written)"

    def _stop(self, token: str, run: _Run) -> None:
        assert self._directory is not None
        if run.pid is not None and run.pid > 0:
            try:
                os.kill(run.pid, signal.SIGTERM)  # this process's child, not reaped yet
            except OSError:
                pass
        else:
            scriptrunner.stop(self._directory / f"{token}.pid")

    def _forget(self, token: str) -> None:
        run = self._runs.pop(token, None)
        if run is not None and run.pid is not None and run.pid > 0:
            os.waitpid(run.pid, 0)  # it wrote its exit: it ends at once
        self._remove_files(token)

    def _remove_files(self, token: str) -> None:
        assert self._directory is not None
        for suffix in RUN_FILES:
            path = self._directory / f"{token}{suffix}"
            if suffix == ".inputs":
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    # ---- the due scripts -----------------------------------------------------------------

    def _start(self, rows: list[NodeScript]) -> int:
        """Lease and start what the throttles allow of the due scripts `rows`: how many
        started."""
        running = Counter((run.dag_id, run.kind) for run in self._runs.values())
        owners = Counter(run.owner for run in self._runs.values())
        chosen: list[tuple[NodeScript, str]] = []
        for row in rows:
            if len(self._runs) + len(chosen) >= MAX_RUNS:
                break
            if (running[(row.dag_id, row.kind)] >= row.cap
                    or owners[row.owner] >= MAX_PER_OWNER):
                continue
            why = refusal(row.owner, self._owner, self.settings)
            if why is not None:
                if self._owner is None:
                    self._warn(row.owner, f"DAG {row.dag_id}: its scripts are not run: {why}")
                continue
            if row.again and not self._may_run_again(row.owner):
                continue  # her deferred and HOLD scripts wait their turn: a later pass
            chosen.append((row, self._id + secrets.token_hex(8)))
            running[(row.dag_id, row.kind)] += 1
            owners[row.owner] += 1
        if not chosen:
            return 0
        taken = self.store.dag_scripts.start(chosen)
        failed: list[ScriptExit] = []
        started = 0
        for (row, token), free in zip(chosen, taken, strict=True):
            if not free:
                continue
            if row.kind == PRE and row.command is None and row.late:
                self._inputs_due(row, token)
                started += 1
            elif self._launch(row, token):
                started += 1
            else:
                failed.append(ScriptExit(row.dag_id, row.name, row.kind, token, CANNOT_RUN))
        self._give(failed)
        return started

    def _may_run_again(self, owner: str) -> bool:
        """May one more of `owner`'s deferred or HOLD scripts start now (at most
        AGAIN_PER_MINUTE a minute: a DEFER that always asks again, or a job held and
        released over and over, costs the service a process per run)?"""
        now = time.monotonic()
        recent = [t for t in self._again.get(owner, ()) if t > now - 60.0]
        if len(recent) >= AGAIN_PER_MINUTE:
            self._again[owner] = recent
            return False
        if len(self._again) > MAX_OWNERS:
            self._again.clear()
        self._again[owner] = [*recent, now]
        return True

    def _inputs_due(self, row: NodeScript, token: str) -> None:
        """A node with no PRE script whose inputs are to be read: a run with no runner,
        whose PRE step "exited" 0, and the next look at the runs reads them (a service
        started again does it too: _result)."""
        self._runs[token] = _Run(row.dag_id, row.name, row.kind, row.owner, self.clock(),
                                 late=row.late, cluster_id=row.cluster_id, has_pre=False)

    def _launch(self, row: NodeScript, token: str) -> bool:
        """Start the runner of `row`'s script, whose lease `token` holds: whether it can
        start (now, or once this host can start a process again)."""
        self._runs[token] = run = _Run(row.dag_id, row.name, row.kind, row.owner, self.clock(),
                                       late=row.late, cluster_id=row.cluster_id,
                                       defer=row.defer)
        if row.debug is not None:
            run.debug = scriptrunner.Debug(row.debug[0], row.debug[1], row.name,
                                           row.kind.upper())
        try:
            argv, directory = self._command(row)
            uid = gid = -1
            if self._owner is None:
                account = pwd.getpwnam(row.owner)
                uid, gid = account.pw_uid, account.pw_gid
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self._warn(row.dag_id, f"DAG {row.dag_id} node {row.name}: its {row.kind.upper()} "
                       f"script cannot run: {' '.join(str(exc).split())[:300]}")
            return False
        run.command, run.waiting = (uid, gid, directory, argv), True
        self._spawn(token, run)
        return True

    def _warn(self, about: int | str, message: str) -> None:
        """Log `message`, the first about that DAG (or owner): a DAG of many nodes says it
        once."""
        self._said.warn(about, message)

    def _spawn(self, token: str, run: _Run) -> None:
        """Fork the run's runner; when this host has no room for a process now, the run
        keeps its lease and is started on a later pass."""
        assert self._directory is not None and run.command is not None
        uid, gid, directory, argv = run.command
        try:
            run.pid = scriptrunner.start(self._directory, token, uid, gid, directory, argv,
                                         run.debug)
        except OSError as exc:
            self._warn(run.dag_id, f"DAG {run.dag_id} node {run.name}: its {run.kind.upper()} "
                       f"script waits to start: {exc.strerror or exc}")
            return
        run.waiting = False

    def _command(self, row: NodeScript) -> tuple[list[str], str]:
        """The script's arguments (DAGMan's macros replaced) and its directory; ValueError
        when the store holds no command line or directory a DAG file could give."""
        command, directory = row.command or "", row.directory or ""
        if (not command.strip() or len(command) > MAX_COMMAND or "\0" in command
                or not os.path.isabs(directory) or "\0" in directory
                or len(directory) > MAX_COMMAND):
            raise ValueError("the store holds no command line and directory for it")
        words = command.split()
        macros = self._macros(row, words)
        return [macros.get(w.upper(), w) for w in words], directory

    def _macros(self, row: NodeScript, words: list[str]) -> dict[str, str]:
        """DAGMan's macros the script's arguments name, by name."""
        wanted = {w.upper() for w in words if w.startswith("$")}
        if not wanted:
            return {}
        out: dict[str, object] = {"$JOB": row.name, "$NODE": row.name, "$RETRY": 0,
                                  "$MAX_RETRIES": 0, "$DAGID": row.dag_id}
        if "$DAG_STATUS" in wanted:
            out["$DAG_STATUS"] = self.store.dag_scripts.dag_status(row.dag_id)
        if wanted & {"$FAILED_COUNT", "$FUTILE_COUNT", "$DONE_COUNT", "$QUEUED_COUNT",
                     "$NODE_COUNT"}:
            counts = self.store.dag_scripts.counts(row.dag_id)
            out.update({"$FAILED_COUNT": counts.get("failed", 0),
                        "$FUTILE_COUNT": counts.get("futile", 0),
                        "$DONE_COUNT": counts.get("done", 0),
                        "$QUEUED_COUNT": counts.get(QUEUED, 0),
                        "$NODE_COUNT": sum(counts.values())})
        if row.kind == POST and wanted & POST_ONLY:
            jobs = (self.store.dag_scripts.node_jobs(row.cluster_id)
                    if row.cluster_id is not None else [])
            out.update(_post_macros(row, jobs))
        return {name: str(value) for name, value in out.items()}

    def _where(self) -> str:
        where = self.settings.dag_scripts
        if os.geteuid() != 0 and where == settingtable.default("dag_scripts"):
            home = pwd.getpwuid(os.geteuid()).pw_dir
            return os.path.join(home, ".local", "state", "htcondor-jobstore", "dagscripts")
        return where


def _post_macros(row: NodeScript, jobs: list[NodeJob]) -> dict[str, object]:
    """What DAGMan tells a POST script of the node's jobs."""
    codes = [j.exit_code for j in jobs if j.status == "completed" and not j.by_signal
             and j.exit_code is not None]
    aborted = sum(1 for j in jobs if j.status != "completed")
    counts: dict[int, int] = {}
    for code in codes:
        counts[code] = counts.get(code, 0) + 1
    last = jobs[-1] if jobs else None
    return {
        "$CLUSTERID": row.cluster_id if row.cluster_id is not None else -1,
        "$JOBID": f"{row.cluster_id}.{last.proc_id}" if last and row.cluster_id else "-1.-1",
        "$JOB_COUNT": len(jobs), "$JOB_ABORT_COUNT": aborted,
        "$SUCCESS": "True" if row.job_code == 0 else "False",
        "$RETURN": _return(jobs),
        "$EXIT_CODES": ",".join(str(c) for c in sorted(counts)),
        "$EXIT_CODE_COUNTS": ",".join(f"{c}:{n}" for c, n in sorted(counts.items())),
        "$EXIT_CODE_LIST": ",".join("" if j.status != "completed" or j.by_signal
                                    else str(j.exit_code) for j in jobs),
        "$PRE_SCRIPT_RETURN": row.pre_code if row.pre_code is not None and row.has_pre
        else -1,
    }


def _late_entries(text: str | None) -> list[tuple[str, str]]:
    """A node's late inputs as the store holds them (ValueError: not what the door takes)."""
    found = json.loads(text or "null")
    if not isinstance(found, list) or not found:
        raise ValueError("the store holds no inputs for it")
    out = []
    for entry in found:
        if not (isinstance(entry, list) and len(entry) == 2
                and all(isinstance(x, str) for x in entry) and os.path.isabs(entry[0])):
            raise ValueError("the store holds no inputs for it")
        out.append((entry[0], entry[1]))
    return out


def _return(jobs: list[NodeJob]) -> int:
    """$RETURN: 0 when every job succeeded, else the first failure's value (a signal's
    negative number, -1002 for a job removed from the queue)."""
    for job in jobs:
        if job.status != "completed":
            return REMOVED_RETURN
        if job.by_signal:
            return -(job.exit_signal or 1)
        if job.exit_code:
            return job.exit_code
    return 0


def _safe_path(where: str) -> str:
    """`where`, whose every directory above that is there is root's or this process's, a
    directory (no link), and changed by nobody else (or sticky, as /tmp: nobody else may
    replace what is in it); OSError otherwise."""
    if not os.path.isabs(where) or os.path.normpath(where) != where:
        raise OSError(f"{where} is not an absolute path")
    me = os.geteuid()
    above = os.path.dirname(where)
    while True:
        try:
            st = os.lstat(above)
        except FileNotFoundError:
            above = os.path.dirname(above)
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, me) or (
                st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
            raise OSError(f"{where}: {above} is not a directory that only root"
                          f"{'' if me == 0 else ' or uid ' + str(me)} may change")
        if above == os.path.dirname(above):
            return where
        above = os.path.dirname(above)


def _own_directory(where: str) -> Path:
    """`where`, this process's own directory of mode 0700 (made if missing); OSError when
    it is something else (a link, another's)."""
    path = Path(where)
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(f"{where} is not a directory of uid {os.geteuid()}")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def _service_id(directory: Path) -> str:
    """This service's own id (16 hexadecimal digits), kept in its directory."""
    path = directory / "id"
    try:
        text = path.read_text(encoding="ascii").strip()
        if SCRIPT_TOKEN.fullmatch(text * 2):
            return text
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    text = secrets.token_hex(8)
    tmp = directory / "id.tmp"
    tmp.write_text(text + "\n", encoding="ascii")
    os.replace(tmp, path)
    return text


__all__ = ["DagScripts"]
