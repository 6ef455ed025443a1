"""The DAGs' engine where the database has none of its own (a SQLite store): DAGMan's work done
in the transactions that change the jobs, as PostgreSQL's functions do it there (migration
0019, jobstore_dag_*; tests/store/test_dags.py runs both).

The transaction that ends a node's last job decides the node (done: every job completed with
exit code 0), releases the children whose parents are all done (within the DAG's throttles:
-maxjobs, -maxidle, MAXJOBS per CATEGORY), makes the descendants of a failed node futile (their
jobs removed, never run), stops the DAG on an ABORT-DAG-ON exit, releases the FINAL node once
nothing else can run, and ends the DAG with DAGMan's result.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, and_, case, func, insert, select, update

from jobstore.core.jobs import Job
from jobstore.core.states import FINAL_VALUES, Event, Status
from jobstore.db.backends import DAG, Change, DagSettings
from jobstore.db.rows import event_row
from jobstore.db.schema import (
    clusters,
    dag_categories,
    dag_edges,
    dag_nodes,
    dags,
    jobs,
)
from jobstore.db.transitions import Transitions
from jobstore.errors import InvalidInput

# dag_nodes.status (PRE, POST: its script is due on the access point, or runs there)
WAITING, READY, PRE, QUEUED, POST, DONE, FAILED, FUTILE = (
    "waiting", "ready", "pre", "queued", "post", "done", "failed", "futile")
UNFINISHED_NODES = (WAITING, READY, PRE, QUEUED, POST)
NOT_STARTED = (WAITING, READY, PRE)  # nodes whose jobs have not been released
HOLD = "hold"  # a HOLD script's kind (it has a lease of its own: hold_token)
# DAGMan's DAG_Status
DAG_OK, DAG_NODE_FAILED, DAG_ABORTED, DAG_REMOVED = 0, 2, 3, 4
# a DAG that has not ended
LIVE = ("running", "held", "removing")
# a script's run: the service's own id, then the run's (32 hexadecimal digits in all)
SCRIPT_TOKEN = re.compile(r"[0-9a-f]{32}")
# DAGMan's return value of a node whose job could not be submitted: here, whose
# transfer_input_files the access point could not read when the node was submitted
SUBMIT_FAILED = -1001
MAX_LATE_INPUTS = 1000  # entries of a node's transfer_input_files read when it is submitted
MAX_LATE_BYTES = 1 << 20  # of their JSON text
MAX_PATH = 4096
MAX_DEFER = 2_592_000  # seconds a SCRIPT DEFER may put its script off
DEBUG_STREAMS = ("STDOUT", "STDERR", "ALL")


def late_inputs_text(entries: Any) -> str | None:
    """A node's late inputs as dag_nodes.late_inputs holds them (JSON: [[path, name], ...]);
    InvalidInput for anything else than absolute paths with names in a sandbox ("" for a
    directory's contents), as the door checks them on PostgreSQL."""
    if entries is None:
        return None
    if not isinstance(entries, list) or not 0 < len(entries) <= MAX_LATE_INPUTS:
        raise InvalidInput("a node's late inputs are a list of [path, name]")
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 2
                and all(isinstance(x, str) for x in entry)):
            raise InvalidInput("a node's late inputs are a list of [path, name]")
        path, name = entry
        if (not path.startswith("/") or len(path) > MAX_PATH or len(name) > MAX_PATH
                or any(ord(c) < 32 or c == "\x7f" for c in path + name)
                or name.startswith("/") or ".." in name.split("/")):
            raise InvalidInput(f"a node's late input {path!r} -> {name!r} is not an absolute "
                               "path with a name in the sandbox")
    text = json.dumps(entries)
    if len(text) > MAX_LATE_BYTES:
        raise InvalidInput(f"a node's late inputs are more than {MAX_LATE_BYTES} bytes")
    return text

# Remove the unfinished jobs of these clusters (`jobstore rm` of a DAG's queued nodes)
RemoveJobs = Callable[[Connection, list[int], float, str], None]


class DagEngine:
    """Queue a DAG's rows and carry its nodes forward in the caller's transaction."""

    def __init__(self, transitions: Transitions, remove_jobs: RemoveJobs) -> None:
        self.transitions = transitions
        self.remove_jobs = remove_jobs

    # ---- a DAG queued --------------------------------------------------------------------

    def new_dag(self, conn: Connection, *, owner: str, queue: str, path: str,
                batch_name: str | None, max_jobs: int | None, max_idle: int | None,
                attrs: Mapping[str, str], now: float, home: str | None = None) -> int:
        dag_id = int(conn.execute(insert(clusters).values(
            owner=owner, queue=queue, submit_file=path, num_procs=0, submitted_at=now,
            home=home).returning(clusters.c.id)).scalar_one())
        conn.execute(insert(dags).values(
            id=dag_id, owner=owner, path=path,
            batch_name=batch_name or f"{path.rsplit('/', 1)[-1]}+{dag_id}",
            status="running", created_at=now, attrs=json.dumps(dict(attrs)) if attrs else None,
            max_jobs=max_jobs, max_idle=max_idle))
        return dag_id

    def dag_nodes(self, conn: Connection, dag_id: int, nodes: Sequence[Mapping[str, Any]],
                  edges: Sequence[tuple[str, str]], categories: Mapping[str, int],
                  now: float) -> dict[str, int]:
        dag = conn.execute(select(dags).where(dags.c.id == dag_id)).one()
        queue, home = conn.execute(select(clusters.c.queue, clusters.c.home)
                                   .where(clusters.c.id == dag_id)).one()
        done = {n["name"] for n in nodes if n.get("done")}
        parents: dict[str, list[str]] = {}
        for parent, child in edges:
            parents.setdefault(child, []).append(parent)
        clusters_of: dict[str, int] = {}
        for node in nodes:
            if node["procs"] and not node.get("done"):
                clusters_of[node["name"]] = int(conn.execute(insert(clusters).values(
                    owner=dag.owner, queue=queue, submit_file=None, num_procs=node["procs"],
                    submitted_at=now, home=home).returning(clusters.c.id)).scalar_one())
        conn.execute(insert(dag_nodes), [{
            "dag_id": dag_id, "name": n["name"], "owner": dag.owner,
            "cluster_id": clusters_of.get(n["name"]),
            "status": DONE if n.get("done") else WAITING,
            "pending": len([p for p in parents.get(n["name"], []) if p not in done]),
            "priority": n.get("priority") or 0, "category": n.get("category"),
            "abort_exit": n.get("abort_exit"), "abort_return": n.get("abort_return"),
            "final": bool(n.get("final")), "updated_at": now,
            "pre_script": n.get("pre_script"), "post_script": n.get("post_script"),
            "pre_skip": n.get("pre_skip"), "directory": n.get("directory"),
            "late_inputs": late_inputs_text(n.get("late_inputs"))} for n in nodes])
        if edges:
            conn.execute(insert(dag_edges), [{"dag_id": dag_id, "parent": p, "child": c,
                                              "owner": dag.owner} for p, c in edges])
        if categories:
            conn.execute(insert(dag_categories), [
                {"dag_id": dag_id, "name": name, "owner": dag.owner, "maxjobs": n}
                for name, n in categories.items()])
        return clusters_of

    @staticmethod
    def dag_settings(conn: Connection, dag_id: int, settings: DagSettings) -> None:
        """Record a new DAG's settings for its access point (InvalidInput: a status file
        that is no absolute path of one line, a negative count, or a DAG with nodes
        already)."""
        if conn.execute(select(dag_nodes.c.name).where(dag_nodes.c.dag_id == dag_id)
                        .limit(1)).first() is not None:
            raise InvalidInput(f"DAG {dag_id} has its nodes already")
        path, every = settings.status_file, settings.status_every
        if path is not None and (not path.startswith("/") or len(path) > MAX_PATH or any(
                ord(c) < 32 or c == "\x7f" for c in path)) or not 0 <= every <= 86400:
            raise InvalidInput("NODE_STATUS_FILE is an absolute path of one line, written at "
                               "most every 0 to 86400 s")
        if any(n is not None and not 0 <= n <= 1_000_000
               for n in (settings.max_pre, settings.max_post)):
            raise InvalidInput("-MaxPre and -MaxPost are 0 or more")
        conn.execute(update(dags).where(dags.c.id == dag_id).values(
            status_file=path, status_every=every, max_pre=settings.max_pre,
            max_post=settings.max_post))

    def start_dag(self, conn: Connection, dag_id: int, now: float) -> list[Change]:
        conn.execute(update(dag_nodes).where(
            dag_nodes.c.dag_id == dag_id, dag_nodes.c.status == WAITING,
            dag_nodes.c.pending == 0, dag_nodes.c.final.is_(False)).values(status=READY))
        self.advance(conn, dag_id, now)
        return []

    # ---- a node's jobs ended -------------------------------------------------------------

    def jobs_ended(self, conn: Connection, job_ids: list[int], now: float, *,
                   nodes: bool = False) -> None:
        """Decide the nodes whose jobs `job_ids` just ended (in this transaction), and carry
        their DAGs forward. `nodes`: they are DAG nodes' jobs (their ads say so)."""
        ids = list(job_ids)
        if not ids or not (nodes or self._any_dag(conn)):
            return
        found = conn.execute(
            select(dag_nodes.c.dag_id, dag_nodes.c.name, dag_nodes.c.cluster_id)
            .join(jobs, jobs.c.cluster_id == dag_nodes.c.cluster_id)
            .where(self.transitions.id_in(ids), dag_nodes.c.status == QUEUED).distinct()
            .order_by(dag_nodes.c.dag_id, dag_nodes.c.name)).all()
        for dag_id, name, cluster_id in found:
            still = conn.execute(select(dag_nodes.c.status).where(
                dag_nodes.c.dag_id == dag_id, dag_nodes.c.name == name)).scalar()
            if still != QUEUED:
                continue  # decided meanwhile, by an earlier node's end
            verdict = self._node_verdict(conn, cluster_id)
            if verdict is None:
                continue  # other jobs of the node still run
            if conn.execute(update(dag_nodes).where(
                    dag_nodes.c.dag_id == dag_id, dag_nodes.c.name == name,
                    dag_nodes.c.post_script.is_not(None))
                    .values(status=POST, job_code=verdict, updated_at=now)).rowcount:
                continue  # its POST script decides it
            self._node_ended(conn, dag_id, name, verdict, now)
            self.advance(conn, dag_id, now)

    def node_job_started(self, conn: Connection, job: Job, now: float) -> None:
        """A node's job left the idle ones: a DAG with -maxidle may release more nodes."""
        dag_id = job.ad.get("DAGManJobId")
        text = dag_id.get("expr") if isinstance(dag_id, dict) else dag_id
        if not str(text).isdigit():
            return
        throttled = conn.execute(select(dags.c.id).where(
            dags.c.id == int(str(text)), dags.c.status == "running",
            dags.c.max_idle.is_not(None))).first()
        if throttled is not None:
            self.advance(conn, int(str(text)), now)

    @staticmethod
    def _any_dag(conn: Connection) -> bool:
        """Is there a running DAG at all (one indexed read, so that a store without DAGs pays
        nothing more per page of an rm)?"""
        return conn.execute(select(dags.c.id).where(
            dags.c.status.in_(LIVE)).limit(1)).first() is not None

    @staticmethod
    def _node_verdict(conn: Connection, cluster_id: int) -> int | None:
        """None while a job of the node's cluster is unfinished; else the node's exit: 0 when
        every job completed with exit code 0, else the first failing job's code (1 when it
        has none: removed, held out, killed by a signal)."""
        rows = conn.execute(select(jobs.c.status, jobs.c.exit_code, jobs.c.exit_by_signal)
                            .where(jobs.c.cluster_id == cluster_id)
                            .order_by(jobs.c.proc_id)).all()
        if any(status not in FINAL_VALUES for status, _code, _signal in rows):
            return None
        for status, code, by_signal in rows:
            if status != Status.COMPLETED or by_signal or code != 0:
                return code if status == Status.COMPLETED and code and not by_signal else 1
        return 0

    def _node_ended(self, conn: Connection, dag_id: int, name: str, code: int,
                    now: float) -> None:
        node = conn.execute(update(dag_nodes).where(dag_nodes.c.dag_id == dag_id,
                                                    dag_nodes.c.name == name)
                            .values(status=DONE if code == 0 else FAILED, exit_code=code,
                                    updated_at=now)
                            .returning(dag_nodes.c.abort_exit, dag_nodes.c.abort_return)).one()
        if code == 0:
            self._parents_done(conn, dag_id, [name], now)
            return
        self._make_futile(conn, dag_id, self._descendants(conn, dag_id, [name]), now,
                          f"never run: its ancestor node {name} failed")
        if node.abort_exit is not None and node.abort_exit == code:
            self._abort(conn, dag_id, now, f"ABORT-DAG-ON: node {name} exited with {code}",
                        DAG_ABORTED, node.abort_return if node.abort_return is not None
                        else code)

    def _parents_done(self, conn: Connection, dag_id: int, names: list[str],
                      now: float) -> None:
        """One parent fewer to wait for, for each child of `names`; those with none left are
        ready."""
        for name in names:
            children = select(dag_edges.c.child).where(dag_edges.c.dag_id == dag_id,
                                                        dag_edges.c.parent == name)
            conn.execute(update(dag_nodes).where(
                dag_nodes.c.dag_id == dag_id, dag_nodes.c.name.in_(children),
                dag_nodes.c.status == WAITING).values(
                pending=dag_nodes.c.pending - 1, updated_at=now,
                status=case((dag_nodes.c.pending <= 1, READY), else_=WAITING)))

    def _descendants(self, conn: Connection, dag_id: int, names: list[str]) -> list[str]:
        edges: dict[str, list[str]] = {}
        for parent, child in conn.execute(select(dag_edges.c.parent, dag_edges.c.child)
                                          .where(dag_edges.c.dag_id == dag_id)):
            edges.setdefault(parent, []).append(child)
        seen: dict[str, None] = {}  # in the order found
        todo = list(names)
        while todo:
            for child in edges.get(todo.pop(), []):
                if child not in seen:
                    seen[child] = None
                    todo.append(child)
        return list(seen)

    def _make_futile(self, conn: Connection, dag_id: int, names: list[str], now: float,
                     why: str) -> None:
        """Nodes that will never run (not the FINAL node): their waiting jobs removed."""
        if not names:
            return
        futile = list(conn.execute(select(dag_nodes.c.name, dag_nodes.c.cluster_id).where(
            dag_nodes.c.dag_id == dag_id, dag_nodes.c.name.in_(names),
            dag_nodes.c.status.in_(NOT_STARTED), dag_nodes.c.final.is_(False))))
        if not futile:
            return
        conn.execute(update(dag_nodes).where(
            dag_nodes.c.dag_id == dag_id, dag_nodes.c.name.in_([n for n, _ in futile]))
            .values(status=FUTILE, updated_at=now))
        self._move_jobs(conn, [c for _, c in futile if c is not None], Event.NODE_FUTILE,
                        Status.REMOVED, now, why)

    def _move_jobs(self, conn: Connection, cluster_ids: list[int], event: Event, to: Status,
                   now: float, why: str) -> None:
        """Waiting jobs of `cluster_ids` to `to`, each with its event."""
        if not cluster_ids:
            return
        moved = conn.execute(
            select(jobs.c.id, jobs.c.claims).where(jobs.c.cluster_id.in_(cluster_ids),
                                                    jobs.c.status == Status.WAITING)
            .order_by(jobs.c.id)).all()
        if not moved:
            return
        values: dict[str, Any] = {"status": to.value, "updated_at": now}
        if to == Status.REMOVED:
            values.update(finished_at=now, reason=why)
        conn.execute(update(jobs).where(jobs.c.cluster_id.in_(cluster_ids),
                                        jobs.c.status == Status.WAITING).values(values))
        self.transitions.insert_events(conn, [
            event_row(job_id, event, Status.WAITING, to, now, attempt=claims, reason=why)
            for job_id, claims in moved], dags_too=False)

    def _abort(self, conn: Connection, dag_id: int, now: float, why: str, dag_status: int,
               code: int | None) -> None:
        """Stop a DAG: what has not run never will (the FINAL node still runs), its queued
        nodes' unfinished jobs are removed."""
        conn.execute(update(dags).where(dags.c.id == dag_id).values(
            dag_status=dag_status, exit_code=code))
        conn.execute(update(dag_nodes).where(  # it runs no POST script but its FINAL node's
            dag_nodes.c.dag_id == dag_id, dag_nodes.c.status == POST,
            dag_nodes.c.final.is_(False)).values(
            status=FAILED, updated_at=now,
            exit_code=case((dag_nodes.c.job_code != 0, dag_nodes.c.job_code), else_=1)))
        waiting = list(conn.execute(select(dag_nodes.c.name).where(
            dag_nodes.c.dag_id == dag_id, dag_nodes.c.status.in_(NOT_STARTED),
            dag_nodes.c.final.is_(False))).scalars())
        self._make_futile(conn, dag_id, waiting, now, f"never run: {why}")
        queued = list(conn.execute(select(dag_nodes.c.cluster_id).where(
            dag_nodes.c.dag_id == dag_id, dag_nodes.c.status == QUEUED,
            dag_nodes.c.final.is_(False))).scalars())
        if queued:
            self.remove_jobs(conn, queued, now, why)

    # ---- releasing ready nodes -----------------------------------------------------------

    def advance(self, conn: Connection, dag_id: int, now: float) -> None:
        """Release the ready nodes the DAG's throttles allow (a NOOP node is done at once),
        then release the FINAL node or end the DAG when nothing else can run."""
        dag = conn.execute(select(dags).where(dags.c.id == dag_id)).one()
        if dag.status not in ("running", "removing"):
            return  # held: nothing released until it is released; or ended
        while dag.status == "running" and self._release_ready(conn, dag, now):
            pass
        left = conn.execute(select(dag_nodes.c.final, dag_nodes.c.status, func.count())
                            .where(dag_nodes.c.dag_id == dag_id,
                                   dag_nodes.c.status.in_(UNFINISHED_NODES))
                            .group_by(dag_nodes.c.final, dag_nodes.c.status)).all()
        if any(not final for final, _status, _n in left):
            return
        if any(s in (WAITING, READY) for _final, s, _n in left):  # the FINAL node's turn
            conn.execute(update(dag_nodes).where(dag_nodes.c.dag_id == dag_id,
                                                 dag_nodes.c.final.is_(True))
                         .values(status=READY, pending=0))
            self._release_ready(conn, dag, now, final=True)
            if self._unfinished(conn, dag_id):
                return
        elif left:
            return  # the FINAL node runs
        self._end(conn, dag_id, now)

    @staticmethod
    def _unfinished(conn: Connection, dag_id: int) -> bool:
        return conn.execute(select(func.count()).where(
            dag_nodes.c.dag_id == dag_id,
            dag_nodes.c.status.in_(UNFINISHED_NODES))).scalar_one() > 0

    def _release_ready(self, conn: Connection, dag: Any, now: float, *,
                       final: bool = False) -> bool:
        """Release what the throttles allow of the ready nodes, best priority first; whether a
        NOOP node was done (its children may be ready now)."""
        ready = conn.execute(select(dag_nodes).where(
            dag_nodes.c.dag_id == dag.id, dag_nodes.c.status == READY,
            dag_nodes.c.final.is_(final)).order_by(
            dag_nodes.c.priority.desc(), dag_nodes.c.name)).all()
        if not ready:
            return False
        queued: dict[str | None, int] = dict(conn.execute(select(dag_nodes.c.category,
                                                                 func.count()).where(
            dag_nodes.c.dag_id == dag.id, dag_nodes.c.status == QUEUED)
            .group_by(dag_nodes.c.category)).all())
        total = sum(queued.values())
        limits = dict(conn.execute(select(dag_categories.c.name, dag_categories.c.maxjobs)
                                   .where(dag_categories.c.dag_id == dag.id)).all())
        idle = 0
        if dag.max_idle is not None:
            idle = conn.execute(select(func.count()).select_from(jobs).join(
                dag_nodes, and_(dag_nodes.c.cluster_id == jobs.c.cluster_id,
                                dag_nodes.c.dag_id == dag.id))
                .where(jobs.c.status == Status.IDLE)).scalar_one()
        released = []
        noop_done: list[str] = []
        pre: list[str] = []
        post: list[str] = []
        for node in ready:
            if ((node.pre_script is not None or node.late_inputs is not None)
                    and node.pre_code is None):
                pre.append(node.name)  # throttled on the access point (-maxpre)
                continue
            if node.cluster_id is None:
                (noop_done if node.post_script is None else post).append(node.name)
                continue
            if not final:
                if dag.max_jobs is not None and total >= dag.max_jobs:
                    break
                if dag.max_idle is not None and idle >= dag.max_idle:
                    break
                if node.category in limits and queued.get(node.category, 0) >= limits[
                        node.category]:
                    continue
            released.append(node)
            total += 1
            queued[node.category] = queued.get(node.category, 0) + 1
            if dag.max_idle is not None:
                idle += self._count_jobs(conn, node.cluster_id)
        if released:
            conn.execute(update(dag_nodes).where(
                dag_nodes.c.dag_id == dag.id, dag_nodes.c.status == READY,
                dag_nodes.c.name.in_([n.name for n in released]))
                .values(status=QUEUED, updated_at=now))
            self._move_jobs(conn, [n.cluster_id for n in released], Event.NODE_READY,
                            Status.IDLE, now, "its parents are done")
        for names, values in ((pre, {"status": PRE}), (post, {"status": POST, "job_code": 0})):
            if names:
                conn.execute(update(dag_nodes).where(
                    dag_nodes.c.dag_id == dag.id, dag_nodes.c.name.in_(names))
                    .values(updated_at=now, **values))
        if noop_done:
            conn.execute(update(dag_nodes).where(
                dag_nodes.c.dag_id == dag.id, dag_nodes.c.name.in_(noop_done))
                .values(status=DONE, exit_code=0, updated_at=now))
            self._parents_done(conn, dag.id, noop_done, now)
        return bool(noop_done)

    @staticmethod
    def _count_jobs(conn: Connection, cluster_id: int) -> int:
        return conn.execute(select(func.count()).where(
            jobs.c.cluster_id == cluster_id)).scalar_one()

    def _end(self, conn: Connection, dag_id: int, now: float) -> None:
        """DAGMan's result: the FINAL node's when there is one, else failed when any node
        failed or never ran."""
        dag = conn.execute(select(dags).where(dags.c.id == dag_id)).one()
        nodes = conn.execute(select(dag_nodes.c.status, dag_nodes.c.final,
                                    dag_nodes.c.exit_code)
                             .where(dag_nodes.c.dag_id == dag.id)).all()
        final = [n for n in nodes if n.final]
        ok = (final[0].status == DONE) if final else all(n.status == DONE for n in nodes)
        dag_status = dag.dag_status or (DAG_OK if ok else DAG_NODE_FAILED)
        if final and ok and dag.status != "removing":
            dag_status = DAG_OK
        code = 0 if ok and dag.status != "removing" else (
            dag.exit_code if dag.exit_code is not None else 1)
        status = "removed" if dag.status == "removing" else "completed" if ok else "failed"
        conn.execute(update(dags).where(dags.c.id == dag.id).values(
            status=status, dag_status=dag_status, exit_code=code, finished_at=now))

    # ---- its scripts (run by the access point's service) -------------------------------

    @staticmethod
    def script_start(conn: Connection, dag_id: int, name: str, kind: str, token: str,
                     now: float) -> bool:
        """Take the lease on node `name`'s due `kind` script ("pre" or "post") for the run
        `token`: whether it was free (a PRE script starts only in a running DAG)."""
        if not SCRIPT_TOKEN.fullmatch(token) or kind not in (PRE, POST):
            raise InvalidInput("not a script's run")
        if kind == PRE and conn.execute(select(dags.c.id).where(
                dags.c.id == dag_id, dags.c.status == "running")).first() is None:
            return False
        return conn.execute(update(dag_nodes).where(
            dag_nodes.c.dag_id == dag_id, dag_nodes.c.name == name,
            dag_nodes.c.status == kind, dag_nodes.c.script_token.is_(None))
            .values(script_token=token, script_started_at=now)).rowcount == 1

    @staticmethod
    def script_defer(conn: Connection, dag_id: int, name: str, kind: str, token: str,
                     until: float) -> bool:
        """The run `token` of node `name`'s `kind` script exited with its DEFER status: due
        again from `until` on. Whether the node still waited for that run."""
        return conn.execute(update(dag_nodes).where(
            dag_nodes.c.dag_id == dag_id, dag_nodes.c.name == name,
            dag_nodes.c.status == kind, dag_nodes.c.script_token == token)
            .values(script_token=None, script_after=until)).rowcount == 1

    @staticmethod
    def hold_start(conn: Connection, dag_id: int, name: str, token: str, now: float) -> bool:
        """Take the lease on node `name`'s HOLD script for the run `token`, for the holds of
        its jobs so far: whether it has holds no HOLD script was started for (its jobs
        queued, or its POST script due) and none runs."""
        if not SCRIPT_TOKEN.fullmatch(token):
            raise InvalidInput("not a script's run")
        node = conn.execute(select(dag_nodes).where(
            dag_nodes.c.dag_id == dag_id, dag_nodes.c.name == name)).first()
        if (node is None or node.hold_script is None or node.hold_token is not None
                or node.status not in (QUEUED, POST) or node.cluster_id is None):
            return False
        try:  # her own file may hold anything in these columns
            holds = int(conn.execute(select(func.coalesce(func.sum(jobs.c.num_holds), 0))
                                     .where(jobs.c.cluster_id == node.cluster_id)).scalar_one())
            if holds <= int(node.holds_seen or 0):
                return False
        except (OverflowError, TypeError, ValueError):
            return False
        return conn.execute(update(dag_nodes).where(
            dag_nodes.c.dag_id == dag_id, dag_nodes.c.name == name,
            dag_nodes.c.hold_token.is_(None))
            .values(hold_token=token, hold_started_at=now, holds_seen=holds)).rowcount == 1

    @staticmethod
    def hold_done(conn: Connection, dag_id: int, name: str, token: str) -> bool:
        """The run `token` of node `name`'s HOLD script ended (its exit changes nothing)."""
        return conn.execute(update(dag_nodes).where(
            dag_nodes.c.dag_id == dag_id, dag_nodes.c.name == name,
            dag_nodes.c.hold_token == token).values(hold_token=None)).rowcount == 1

    @staticmethod
    def script_options(conn: Connection, dag_id: int, options: Mapping[str, Any]) -> None:
        """The DEFER and DEBUG options of the scripts of DAG `dag_id`'s nodes, each checked
        (InvalidInput)."""
        path = conn.execute(select(dags.c.path).where(dags.c.id == dag_id)).scalar_one()
        if not isinstance(options, Mapping):
            raise InvalidInput(f"DAG {path}: its scripts' options are an object of nodes")
        for name, value in options.items():
            node = conn.execute(select(dag_nodes.c.pre_script, dag_nodes.c.post_script,
                                       dag_nodes.c.directory).where(
                dag_nodes.c.dag_id == dag_id, dag_nodes.c.name == name)).first()
            if node is None:
                raise InvalidInput(f"DAG {path}: no node {name}")
            if not isinstance(value, Mapping):
                raise InvalidInput(f"DAG {path}: node {name}: its scripts' options are not an "
                                   "object")
            for kind, given in value.items():
                why = option_problem(kind, given, node.pre_script if kind == PRE
                                     else node.post_script if kind == POST else None)
                if why is not None:
                    raise InvalidInput(f"DAG {path}: node {name}: SCRIPT {str(kind).upper()}: "
                                       f"{why}")
            hold = value.get(HOLD)
            if hold is not None and not (node.directory or "").startswith("/"):
                raise InvalidInput(f"DAG {path}: node {name}: SCRIPT HOLD: its directory is no "
                                   "absolute path")
            conn.execute(update(dag_nodes).where(
                dag_nodes.c.dag_id == dag_id, dag_nodes.c.name == name)
                .values(script_options=json.dumps(dict(value), sort_keys=True,
                                                  ensure_ascii=False),
                        hold_script=hold["command"] if hold is not None else None))

    def script_done(self, conn: Connection, dag_id: int, name: str, kind: str, token: str,
                    code: int, now: float) -> bool:
        """Node `name`'s `kind` script of the run `token` exited with `code`: a PRE script's
        0 releases the node's jobs (its late inputs stored), its PRE_SKIP exit makes the node
        done without them, another exit fails it (SUBMIT_FAILED: its late inputs could not be
        read); a POST script's exit is the node's. Whether it was the run the node waited
        for."""
        node = conn.execute(select(dag_nodes).where(
            dag_nodes.c.dag_id == dag_id, dag_nodes.c.name == name)).first()
        if node is None or node.status != kind or node.script_token != token:
            return False
        values: dict[str, Any] = {"script_token": None, "updated_at": now}
        if kind == PRE:
            values.update(pre_code=code, **({"status": READY} if code == 0 else {}))
        conn.execute(update(dag_nodes).where(dag_nodes.c.dag_id == dag_id,
                                             dag_nodes.c.name == name).values(values))
        if kind == POST:
            self._post_script_event(conn, node.cluster_id, name, code, now)
            self._node_ended(conn, dag_id, name, code, now)
        elif code != 0:
            skipped = code == node.pre_skip
            why = (f"{'PRE_SKIP: ' if skipped else ''}its PRE script exited with {code}"
                   if code != SUBMIT_FAILED else "its transfer_input_files could not be read "
                   "on the access point when the node was submitted")
            if node.cluster_id is not None:
                self._move_jobs(conn, [node.cluster_id], Event.NODE_FUTILE, Status.REMOVED,
                                now, why)
            self._node_ended(conn, dag_id, name, 0 if skipped else code, now)
        self.advance(conn, dag_id, now)
        return True

    def _post_script_event(self, conn: Connection, cluster_id: int | None, name: str,
                           code: int, now: float) -> None:
        """The POST script's end, recorded on the node's proc 0 (DAGMan's 016 in its log)."""
        if cluster_id is None:
            return  # a NOOP node: no job to record it on
        job = conn.execute(select(jobs.c.id, jobs.c.status).where(
            jobs.c.cluster_id == cluster_id, jobs.c.proc_id == 0)).first()
        if job is None:
            return
        status = Status(job.status)
        self.transitions.insert_events(conn, [event_row(
            job.id, Event.POST_SCRIPT, status, status, now,
            attrs={"ReturnValue": code, "DAGNodeName": name})], dags_too=False)

    # ---- the DAG as a whole (hold, release, rm) ------------------------------------------

    def pause_dag(self, conn: Connection, dag_id: int, held: bool, now: float) -> list[Change]:
        """Hold (no node released until it is released) or release a running DAG, as
        condor_hold and condor_release of DAGMan's job do."""
        before, after = ("running", "held") if held else ("held", "running")
        changed = conn.execute(update(dags).where(dags.c.id == dag_id, dags.c.status == before)
                               .values(status=after)).rowcount == 1
        if not changed:
            return []
        if not held:
            self.advance(conn, dag_id, now)
        return [Change(dag_id, "paused", before, None, 0, None, None, False, DAG)]

    def remove_dag(self, conn: Connection, dag_id: int, why: str, now: float) -> list[Change]:
        """condor_rm of DAGMan's job: the nodes that have not run never will, the queued ones'
        jobs are removed, and the DAG ends (removed; its FINAL node still runs)."""
        dag = conn.execute(select(dags).where(dags.c.id == dag_id)).first()
        if dag is None or dag.status not in ("running", "held"):
            return []
        conn.execute(update(dags).where(dags.c.id == dag_id).values(status="removing"))
        self._abort(conn, dag_id, now, why, DAG_REMOVED, 1)
        self.advance(conn, dag_id, now)
        return [Change(dag_id, "removed", dag.status, None, 0, None, None, False, DAG)]


def option_problem(kind: Any, value: Any, script: str | None) -> str | None:
    """Why `value` is not the options of a node's `kind` script (`script`: its command line,
    None when it has none); None when it is."""
    if kind not in (PRE, POST, HOLD):
        return f"{kind!r} is not PRE, POST or HOLD"
    if not isinstance(value, Mapping):
        return "its options are not an object"
    if kind == HOLD:
        if set(value) - {"command", "debug"}:
            return "its command line and DEBUG are its only options"
        command = value.get("command")
        if not (isinstance(command, str) and command.strip() and len(command) <= MAX_PATH
                and command.isprintable()):
            return f"its command line is one line of at most {MAX_PATH} characters"
    elif script is None:
        return f"the node has no {kind.upper()} script"
    elif set(value) - {"defer", "debug"}:
        return "DEFER and DEBUG are its only options"
    defer, debug = value.get("defer"), value.get("debug")
    if "defer" in value and not (
            isinstance(defer, list) and len(defer) == 2
            and all(type(x) is int for x in defer)
            and 1 <= defer[0] <= 255 and 0 <= defer[1] <= MAX_DEFER):
        return f"DEFER is an exit status of 1 to 255 and at most {MAX_DEFER} seconds"
    if "debug" in value and not (
            isinstance(debug, list) and len(debug) == 2
            and all(isinstance(x, str) for x in debug)
            and 0 < len(debug[0]) <= MAX_PATH
            and not any(ord(c) < 32 or c == "\x7f" for c in debug[0])
            and debug[1] in DEBUG_STREAMS):
        return "DEBUG is a file's name and STDOUT, STDERR or ALL"
    return None

