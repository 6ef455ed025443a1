"""The recorded hook transcripts (tests/fixtures/htcondor-transcripts: HTCondor 25.13.2 with
stub hooks) played again on the real startd with our hooks: each installed hook is wrapped by a
recorder, and one job's calls are compared with the recorded job's, scenario by scenario: the
sequence of hooks and their argv, the environment (names, and values up to the node's paths),
the account and working directory, the attribute names of stdin, and how the job ended.

Scenarios our hooks cannot make the startd repeat are not here: 00 (an ad without `User`), 04
(garbage ad), 05 (a failing PREPARE_JOB), 06 (FETCH_WORK exiting 1), 07a/07c (ads the slot
rejects), 08 (root's job) and 10b/10c (rank) need ads that our store refuses or never hands
out. 09 (`condor_off -master` while a job runs) is played with `condor_off -startd`, which
takes the same startd shutdown path and leaves the session's master, collector and agent up."""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from jobstore.testing.livepool import wait_for
from jobstore.testing.support import ensure_account

from .conftest import SUBMITTER, Live

TRANSCRIPTS = Path(__file__).resolve().parents[1] / "fixtures" / "htcondor-transcripts"

# installed file -> HTCondor's hook name
HOOK_FILES = {"fetch_job": "FETCH_WORK", "reply_fetch": "REPLY_FETCH",
              "evict_claim": "EVICT_CLAIM", "prepare_job": "PREPARE_JOB",
              "update_job_info": "UPDATE_JOB_INFO", "job_exit": "JOB_EXIT"}
STARTER_HOOKS = {"PREPARE_JOB", "UPDATE_JOB_INFO", "JOB_EXIT"}
# The variables the transcripts keep (their README): the wrapper records these only.
ENV_NAMES = ("_CONDOR_SLOT", "_CONDOR_SCRATCH_DIR", "_CONDOR_JOB_AD", "_CONDOR_MACHINE_AD",
             "_CONDOR_JOB_IWD", "_CONDOR_MAINJOB_EXIT_CODE", "_CONDOR_MAINJOB_EXIT_SIGNAL",
             "_CONDOR_JOB_PIDS", "BATCH_SYSTEM", "TMPDIR", "HOME", "CONDOR_CONFIG")
LITE = "sqlite:///{}"
REQUESTS = "request_cpus = 1\nrequest_memory = 64\nrequest_disk = 1024\n"  # the recorded ads'

# Recorded attribute names that the live stdin may lack, by part, each for a reason that is
# not the startd's version: the slot's history, the recording node's configuration, or what
# the recording's stub hooks printed.
_HISTORY = ("a slot's time in one state/activity, published once it has spent some there: the "
            "recording's own slot ads have it in some calls and not in others")
_SLOT_HISTORY = {f"TotalTime{s}": _HISTORY
                 for s in ("UnclaimedIdle", "ClaimedIdle", "ClaimedBusy", "OwnerIdle")}
_STUB_PREPARE = ("printed by the recording's stub PREPARE_JOB (the starter merges PREPARE_JOB's "
                 "output into the job ad); ours prints no such attribute")
# A slot ad's `has_<feature>` for each CPU feature the startd found on its machine (has_avx2,
# has_avx512f, ...): the recording machine's CPU, not the startd's version.
CPU_FLAG = "has_"
NOT_THE_STARTDS: dict[str, dict[str, str]] = {
    "FETCH_WORK": _SLOT_HISTORY,
    "REPLY_FETCH job": {},
    "REPLY_FETCH slot": {
        **_SLOT_HISTORY,
        # REPLY_FETCH's slot ad carries the configured policy expressions (START, KILL, ...):
        # the recording's condor_config set `HIBERNATE = false` and `RANK = 0`, the live pool's
        # sets neither (`condor_config_val -v RANK`: Not defined). Its FETCH_WORK ad does have
        # the startd's default `Rank = 0.0`.
        "HIBERNATE": "set in the recording's condor_config only",
        "Rank": "RANK set in the recording's condor_config only",
        # Seen live when the job came to a slot that had entered Unclaimed that very second (a
        # claim had just ended: EnteredCurrentState == MyCurrentTime in REPLY_FETCH's slot ad),
        # while the FETCH_WORK ad of the same slot a moment before had both. Our FetchWorkDelay
        # fetches at once after a claim; the recording's (5 s) never did.
        "CurrentRank": "absent right after a claim ended (timing)",
        "NumPids": "absent right after a claim ended (timing)",
    },
    "PREPARE_JOB": {},
    "UPDATE_JOB_INFO": {"HookPrepared": _STUB_PREPARE, "HookPrepareUser": _STUB_PREPARE},
    "JOB_EXIT": {"HookPrepared": _STUB_PREPARE, "HookPrepareUser": _STUB_PREPARE},
}


# ---- the calls, recorded and live ----------------------------------------------------------

@dataclass(frozen=True)
class Call:
    """One hook call: what the daemon gave the hook."""

    hook: str
    argv: tuple[str, ...]
    env: dict[str, str]
    account: str  # "condor" or "owner" (or the uid, for anything else)
    cwd: str  # "log dir", "job scratch dir" (or the path, for anything else)
    stdin: str
    order: tuple[int, int]
    where: str  # the record's file name, for the messages


@dataclass(frozen=True)
class Node:
    """Where a node keeps things: the paths the environment's values are read against."""

    local: str
    config: str
    owner_home: str
    daemon_home: str


RECORDED_NODE = Node("/var/lib/condor", "/var/lib/condor/condor_config", "/home/alice", "/root")


def recorded(scenario: str) -> list[Call]:
    """A scenario folder's calls, in the order the hooks started."""
    calls = []
    for meta_path in sorted((TRANSCRIPTS / scenario).glob("*.meta.json")):
        meta = json.loads(meta_path.read_text())
        stdin = meta_path.with_name(meta_path.name.replace(".meta.json", ".stdin"))
        calls.append(Call(
            meta["hook"], tuple(meta["argv"]), dict(meta["env"]),
            {"condor": "condor", "job owner": "owner"}[meta["runs_as"]], meta["cwd_kind"],
            stdin.read_text(), (int(meta_path.name[:2]), 0), f"{scenario}/{meta_path.name}"))
    return calls


def wrapper(capture: Path, hook: str, real: Path) -> str:
    """A /bin/sh hook that records its call into `capture` and execs `real` with the same
    stdin, argv and environment (stdout, stderr and the exit status are the real hook's)."""
    env = " ".join(ENV_NAMES)
    return f"""#!/bin/sh
# written by tests/live/test_transcripts_live.py: record this call, then run the real hook
s=$(cut -d' ' -f22 /proc/$$/stat 2>/dev/null)
f='{capture}'/"$s.$$.{hook}"
if cat 2>/dev/null > "$f.stdin"; then
  {{
    echo "hook {hook}"
    echo "start $s $$"
    echo "uid $(id -u)"
    echo "cwd $(pwd)"
    for a in "$@"; do printf 'arg %s\\n' "$a"; done
    for v in {env}; do
      eval "[ -n \\"\\${{$v+x}}\\" ] && printf 'env %s=%s\\n' $v \\"\\$$v\\""
    done
    :
  }} > "$f.tmp" 2>/dev/null && mv "$f.tmp" "$f.meta" 2>/dev/null
  exec '{real}' "$@" < "$f.stdin"
fi
exec '{real}' "$@"  # nothing recorded (no capture directory): stdin is still the daemon's
"""


@dataclass
class Capture:
    """The calls the wrappers recorded into `directory`."""

    directory: Path
    condor_uid: int
    owner_uid: int
    log_dir: str
    local: str

    def calls(self) -> list[Call]:
        """Every complete record, in the order the hooks started (start time in clock ticks,
        then pid: pids wrap at 32768 here, not within one tick)."""
        found = []
        for meta_path in self.directory.glob("*.meta"):
            hook, start, pid, uid, cwd = "", 0, 0, -1, ""
            argv: list[str] = []
            env: dict[str, str] = {}
            for line in meta_path.read_text(errors="replace").splitlines():
                key, _, value = line.partition(" ")
                if key == "hook":
                    hook = value
                elif key == "start":
                    start, pid = (int(v) for v in value.split())
                elif key == "uid":
                    uid = int(value)
                elif key == "cwd":
                    cwd = value
                elif key == "arg":
                    argv.append(value)
                elif key == "env":
                    name, _, val = value.partition("=")
                    env[name] = val
            stdin = meta_path.with_suffix(".stdin").read_text(errors="replace")
            account = {self.condor_uid: "condor", self.owner_uid: "owner"}.get(uid, str(uid))
            scratch = env.get("_CONDOR_SCRATCH_DIR", "")
            kind = cwd
            if cwd == self.log_dir:
                kind = "log dir"
            elif cwd == scratch and re.fullmatch(
                    rf"{re.escape(self.local)}/execute/dir_\d+/scratch", scratch):
                kind = "job scratch dir"
            found.append(Call(hook, tuple(argv), env, account, kind, stdin, (start, pid),
                              meta_path.name))
        return sorted(found, key=lambda c: c.order)

    def job(self, marker: str, *, until: str = "JOB_EXIT", timeout: float = 60) -> list[Call]:
        """The calls of the job whose ad holds `marker`, once its hook `until` was called."""
        return wait_for(f"the job's {until} recorded",
                        lambda: (lambda c: c if any(x.hook == until for x in c) else None)(
                            job_calls(self.calls(), lambda ad: marker in ad)), timeout, 0.5)


# ---- reading the ads ------------------------------------------------------------------------

def parts(call: Call) -> dict[str, str]:
    """stdin by part: REPLY_FETCH's job ad and slot ad (with the ClaimId line) apart."""
    if call.hook == "REPLY_FETCH":
        job, _, slot = call.stdin.partition("\n-----\n")
        return {"REPLY_FETCH job": job, "REPLY_FETCH slot": slot}
    return {call.hook: call.stdin}


def names(ad: str) -> set[str]:
    """The attribute names of `Name = value` lines."""
    return {m.group(1) for m in re.finditer(r"^([A-Za-z_][A-Za-z0-9_.]*) = ", ad, re.M)}


def value(ad: str, name: str) -> str | None:
    """The value of `name` in `ad` as written, a string's quotes taken off."""
    m = re.search(rf"^{re.escape(name)} = (.*)$", ad, re.M)
    if m is None:
        return None
    v = m.group(1)
    return v[1:-1] if len(v) >= 2 and v[0] == v[-1] == '"' else v


def job_calls(calls: list[Call], is_job: Callable[[str], bool]) -> list[Call]:
    """One job's calls: the REPLY_FETCHes of its ad, each right after the FETCH_WORK that got
    it (the last one its slot started before it: a slot has one fetch at a time, and a fetch
    may wait in the agent long before it gets the job), and the starter hooks of its ad."""
    keyed: dict[str, tuple[tuple[int, int, int], Call]] = {}
    for call in calls:
        if call.hook == "REPLY_FETCH" and is_job(parts(call)["REPLY_FETCH job"]):
            slot = value(parts(call)["REPLY_FETCH slot"], "Name")
            fetches = [c for c in calls if c.hook == "FETCH_WORK" and c.order < call.order
                       and value(c.stdin, "Name") == slot]
            for fetch in fetches[-1:]:
                keyed[fetch.where] = ((*call.order, 0), fetch)
            keyed[call.where] = ((*call.order, 1), call)
        elif call.hook in STARTER_HOOKS and is_job(call.stdin):
            keyed[call.where] = ((*call.order, 1), call)
    return [call for _, call in sorted(keyed.values(), key=lambda kc: kc[0])]


def cluster(n: int) -> Callable[[str], bool]:
    """A recorded job, by its ClusterId."""
    return lambda ad: value(ad, "ClusterId") == str(n)


def until_exit(calls: list[Call]) -> list[Call]:
    """The calls up to the first JOB_EXIT (the end of a recorded scenario)."""
    ends = [i for i, c in enumerate(calls) if c.hook == "JOB_EXIT"]
    return calls[:ends[0] + 1] if ends else calls


# ---- comparing ------------------------------------------------------------------------------

@dataclass
class Group:
    """Consecutive calls of one hook with one argv (the periodic UPDATE_JOB_INFOs as one)."""

    token: str
    calls: list[Call] = field(default_factory=list)


def groups(calls: list[Call]) -> list[Group]:
    out: list[Group] = []
    for call in calls:
        token = " ".join([call.hook, *call.argv])
        if not out or out[-1].token != token:
            out.append(Group(token))
        out[-1].calls.append(call)
    return out


def env_shape(call: Call, node: Node) -> frozenset[tuple[str, str]]:
    """The environment with the node's own paths named: HOME, the scratch dir, the job's Iwd,
    the config file; a pid list as `PIDS`; slot numbers as N.

    TMPDIR is never read as the Iwd: once the job has started it is `/tmp` on the live pool
    too, where the Iwd is alice's directory (the transcripts' README reads the recorded `/tmp`
    as the Iwd, which was `/tmp` there as well)."""
    scratch = call.env.get("_CONDOR_SCRATCH_DIR", "")
    if not re.fullmatch(rf"{re.escape(node.local)}/execute/dir_\d+/scratch", scratch):
        scratch = ""
    iwd = value(call.stdin, "Iwd") if call.hook in STARTER_HOOKS else None
    out = set()
    for name, v in call.env.items():
        if name == "HOME":
            v = {node.owner_home: "OWNER_HOME", node.daemon_home: "DAEMON_HOME"}.get(v, v)
        elif name == "CONDOR_CONFIG":
            v = "CONDOR_CONFIG" if v == node.config else v
        elif name == "_CONDOR_SLOT":
            v = re.sub(r"\d+", "N", v)
        elif name == "_CONDOR_JOB_PIDS":
            v = "PIDS" if re.fullmatch(r"\d+( \d+)*", v) else v
        elif v and v == iwd and name != "TMPDIR":
            v = "IWD"
        elif scratch and (v == scratch or v.startswith(scratch + "/")):
            v = "SCRATCH" + v[len(scratch):]
        out.add((name, v))
    return frozenset(out)


def show(shapes: set[frozenset[tuple[str, str]]]) -> list[str]:
    return sorted(" ".join(f"{k}={v}" for k, v in sorted(s)) for s in shapes)


def differences(rec: list[Call], live: list[Call], node: Node) -> list[str]:
    """Every way the live calls differ from the recorded ones (empty: the same)."""
    rg, lg = groups(rec), groups(live)
    if [g.token for g in rg] != [g.token for g in lg]:
        return [f"hook sequence: recorded {[g.token for g in rg]}\n"
                f"              live     {[g.token for g in lg]}\n"
                f"  live calls: {[c.where for c in live]}"]
    out = []
    for r, g in zip(rg, lg, strict=True):
        what = f"{g.token} ({', '.join(c.where for c in g.calls)})"
        env_r = {frozenset(c.env) for c in r.calls}
        env_l = {frozenset(c.env) for c in g.calls}
        if env_r != env_l:
            out.append(f"{what}: env names recorded {sorted(map(sorted, env_r))} live "
                       f"{sorted(map(sorted, env_l))}")
        else:
            shape_r = {env_shape(c, RECORDED_NODE) for c in r.calls}
            shape_l = {env_shape(c, node) for c in g.calls}
            if shape_r != shape_l:
                out.append(f"{what}: env values recorded {show(shape_r)}\n"
                           f"                live {show(shape_l)}")
        for attr in ("account", "cwd"):
            got_r = {getattr(c, attr) for c in r.calls}
            got_l = {getattr(c, attr) for c in g.calls}
            if got_r != got_l:
                out.append(f"{what}: {attr} recorded {sorted(got_r)} live {sorted(got_l)}")
        for part in parts(r.calls[0]):
            always = set.intersection(*(names(parts(c)[part]) for c in r.calls))
            missing = set.union(*(always - names(parts(c)[part]) for c in g.calls))
            missing -= set(NOT_THE_STARTDS[part])
            missing -= {name for name in missing if name.startswith(CPU_FLAG)}
            if missing:
                out.append(f"{what}: {part} lacks the recorded {sorted(missing)}")
    return out


def extra_names(rec: list[Call], live: list[Call]) -> dict[str, list[str]]:
    """By part, the names every live call has and no recorded call has (for the record)."""
    out = {}
    for r, g in zip(groups(rec), groups(live), strict=False):
        for part in parts(r.calls[0]):
            seen = set.union(*(names(parts(c)[part]) for c in r.calls))
            new = set.intersection(*(names(parts(c)[part]) for c in g.calls)) - seen
            if new:
                out[f"{g.token} / {part}"] = sorted(new)
    return out


# ---- the pool ---------------------------------------------------------------------------------

def _node(live: Live) -> Node:
    return Node(str(live.pool.local), str(live.pool.config),
                pwd.getpwnam(SUBMITTER).pw_dir, live.pool.env["HOME"])


def _end_waiting_fetches(live: Live, hooks: Path) -> None:
    """SIGTERM to the startd's FETCH_WORK hooks that started before the wrappers (they wait in
    the agent for up to a minute, and would take the next job unrecorded); the agent drops a
    waiting fetch whose hook ends, and the startd fetches again a second later."""
    startd = live.pool.child_pid("condor_startd")
    if startd is None:
        return
    done = subprocess.run(["pgrep", "-P", str(startd)], capture_output=True, text=True)
    for pid in (int(p) for p in done.stdout.split()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue
        if (argv and argv[-1] == os.fsencode(hooks / "fetch_job")
                and b"python" in os.path.basename(argv[0])):  # not a wrapper's /bin/sh
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def _fetching_slots(capture: Capture, after: tuple[int, int] = (0, 0)) -> set[str]:
    """The slots (slot1, slot3, ...) with a FETCH_WORK recorded since `after`."""
    return {(value(c.stdin, "Name") or "").split("@")[0]
            for c in capture.calls() if c.hook == "FETCH_WORK" and c.order > after}


@pytest.fixture(scope="module")
def capture(live: Live) -> Iterator[Capture]:
    """Every installed hook wrapped by a recorder for this module's tests; the real hooks put
    back afterwards (the startd execs the configured path on each call: no reconfig)."""
    if not (TRANSCRIPTS / "README.md").exists():
        pytest.skip(f"no transcripts in {TRANSCRIPTS}")
    hooks = live.pool.base / "libexec-jobstore"
    directory = live.pool.base / f"hook-capture-{uuid.uuid4().hex[:8]}"
    directory.mkdir()
    directory.chmod(0o1777)  # the condor account and the job user write here
    cap = Capture(directory, live.pool.condor.pw_uid, ensure_account(SUBMITTER).pw_uid,
                  str(live.pool.log_dir), str(live.pool.local))
    wrapped: list[str] = []
    try:
        for name in HOOK_FILES:
            real = hooks / f"{name}.real"
            os.link(hooks / name, real)  # the same file (mode, owner) under a second name
            tmp = hooks / f".{name}.wrapper"
            tmp.write_text(wrapper(directory, HOOK_FILES[name], real))
            tmp.chmod(0o755)
            os.replace(tmp, hooks / name)
            wrapped.append(name)
        _end_waiting_fetches(live, hooks)
        wait_for("a recorded FETCH_WORK from each slot",
                 lambda: {"slot1", "slot2", "slot3"} <= _fetching_slots(cap), 90, 0.5)
        yield cap
    finally:
        for name in wrapped:
            tmp = hooks / f".{name}.restore"
            os.link(hooks / f"{name}.real", tmp)
            os.replace(tmp, hooks / name)
        time.sleep(2)  # a wrapper that started before has exec'd its real hook by now
        for name in wrapped:
            (hooks / f"{name}.real").unlink()


def _script(live: Live, name: str, text: str) -> Path:
    """An executable of alice's in her work directory."""
    path = live.work / name
    path.write_text(text)
    path.chmod(0o755)
    user = ensure_account(SUBMITTER)
    os.chown(path, user.pw_uid, user.pw_gid)
    return path


def _check(scenario: str, rec: list[Call], live_calls: list[Call], live: Live) -> None:
    problems = differences(rec, live_calls, _node(live))
    extra = extra_names(rec, live_calls)
    print(f"\n{scenario}: live calls {[c.where for c in live_calls]}\n"
          f"names only the live stdin has: {json.dumps(extra, indent=1)}")
    assert not problems, f"{scenario} on the real startd:\n" + "\n".join(problems)


def _starter_values(calls: list[Call], hook: str, *attrs: str) -> list[tuple[str | None, ...]]:
    return [tuple(value(c.stdin, a) for a in attrs) for c in calls if c.hook == hook]


# ---- the scenarios ----------------------------------------------------------------------------

def test_01_a_normal_job(live: Live, capture: Capture) -> None:
    """A `sleep` on a static slot: the recorded sequence, completed with exit code 0."""
    marker = live.marker(8)
    (job,) = live.submit(f"executable = /bin/sleep\narguments = {marker}\n{REQUESTS}queue\n")
    done = live.wait_status(job, "completed", timeout=90)
    assert done["exit_code"] == 0 and not done["exit_by_signal"], done
    calls = capture.job(marker)
    _check("01-normal-job", recorded("01-normal-job"), calls, live)
    rec = recorded("01-normal-job")
    assert (_starter_values(calls, "JOB_EXIT", "ExitBySignal", "ExitCode", "JobState")
            == _starter_values(rec, "JOB_EXIT", "ExitBySignal", "ExitCode", "JobState"))


def test_02_an_exit_code_and_a_signal(live: Live, capture: Capture) -> None:
    """A script that exits 3 and one that kills itself with SIGKILL, on the static slots:
    JOB_EXIT `exit` with ExitCode 3, and with ExitBySignal/ExitSignal 9."""
    exit3 = _script(live, "exit3.sh", "#!/bin/sh\nexit 3\n")
    killself = _script(live, "killself.sh", "#!/bin/sh\nkill -9 $$\n")
    m3, m9 = live.marker(1), live.marker(1)
    j3, j9 = (live.submit(f"executable = {path}\narguments = {m}\n{REQUESTS}queue\n",
                          name=f"{path.stem}.sub")[0]
              for path, m in ((exit3, m3), (killself, m9)))
    d3 = live.wait_status(j3, "completed", timeout=90)
    assert d3["exit_code"] == 3 and not d3["exit_by_signal"], d3
    d9 = live.wait_status(j9, "completed", timeout=90)  # as HTCondor's: ExitBySignal, no code
    assert d9["exit_by_signal"] and d9["exit_signal"] == 9 and d9["exit_code"] is None, d9
    rec = recorded("02-exit-code-and-signal")
    for cid, marker, scenario in ((2, m3, "exit 3"), (3, m9, "kill -9")):
        calls = capture.job(marker)
        rec_job = job_calls(rec, cluster(cid))
        _check(f"02-exit-code-and-signal ({scenario})", rec_job, calls, live)
        attrs = ("ExitBySignal", "ExitCode", "ExitSignal", "ExitReason", "JobState")
        assert (_starter_values(calls, "JOB_EXIT", *attrs)
                == _starter_values(rec_job, "JOB_EXIT", *attrs))


@pytest.mark.parametrize("scenario, args", [("03-vacate", ()), ("03b-vacate-fast", ("-fast",))])
def test_03_a_vacated_job(live: Live, capture: Capture, scenario: str, args: tuple[str, ...]
                          ) -> None:
    """`sleep 120` vacated by condor_vacate (graceful: SIGTERM; -fast: SIGKILL) once it runs:
    JOB_EXIT `evict` with the administrator's VacateReason, no EVICT_CLAIM, and in the store
    the job goes back to the queue and runs again."""
    marker = live.marker(120)
    (job,) = live.submit(f"executable = /bin/sleep\narguments = {marker}\n{REQUESTS}queue\n")
    live.wait_process(marker)
    live.wait_status(job, "running")
    slot = live.job(job)["slot"]
    done = live.pool.tool("condor_vacate", *args, slot)
    assert done.returncode == 0, done.stderr
    calls = until_exit(capture.job(marker))
    rec = recorded(scenario)
    _check(scenario, rec, calls, live)
    attrs = ("ExitBySignal", "ExitSignal", "ExitReason", "VacateReason", "VacateReasonCode",
             "VacateReasonSubCode", "JobState")
    assert (_starter_values(calls, "JOB_EXIT", *attrs)
            == _starter_values(rec, "JOB_EXIT", *attrs))
    again = wait_for("the vacated job starts a second time",
                     lambda: (lambda j: j if j["NumJobStarts"] >= 2 else None)(live.job(job)),
                     90)
    assert again["status"] in ("fetched", "accepted", "running"), again
    assert not [c for c in capture.calls() if c.hook == "EVICT_CLAIM"]
    assert live.jobstore("rm", job).returncode == 0
    live.wait_gone(marker)


def test_07b_a_job_in_a_dynamic_slot(live: Live, capture: Capture) -> None:
    """A `sleep` fetched by the partitionable slot: REPLY_FETCH shows the p-slot, the starter
    hooks run in a dynamic slot and see RequestMemory rounded up (64 -> 128); the busy
    dynamic slot keeps fetching."""
    db = LITE.format(live.sqlite)
    marker = live.marker(8)
    (job,) = live.submit(f"executable = /bin/sleep\narguments = {marker}\n{REQUESTS}queue\n",
                         db=db)
    done = live.wait_status(job, "completed", timeout=90, db=db)
    assert done["exit_code"] == 0 and done["slot"].startswith("slot3"), done
    calls = capture.job(marker)
    rec = job_calls(recorded("07b-pslot-normal"), cluster(9))
    _check("07b-pslot-normal", rec, calls, live)

    def seen(calls: list[Call]) -> tuple[object, ...]:
        reply = next(c for c in calls if c.hook == "REPLY_FETCH")
        starter = [c for c in calls if c.hook in STARTER_HOOKS]
        return (value(parts(reply)["REPLY_FETCH slot"], "SlotType"),
                value(parts(reply)["REPLY_FETCH job"], "RequestMemory"),
                {value(c.stdin, "RequestMemory") for c in starter},
                {re.sub(r"\d+", "N", c.env.get("_CONDOR_SLOT", "")) for c in starter})

    assert seen(calls) == seen(rec) == ("Partitionable", "64", {"128"}, {"slotN_N"})
    dslot = next(c for c in calls if c.hook == "JOB_EXIT").env["_CONDOR_SLOT"]
    busy = [c for c in capture.calls() if c.hook == "FETCH_WORK"
            and value(c.stdin, "Name") == f"{dslot}@{value(c.stdin, 'Machine')}"
            and value(c.stdin, "State") == "Claimed" and value(c.stdin, "Activity") == "Busy"]
    assert busy, f"the busy dynamic slot {dslot} never fetched"


def test_09_the_startd_shut_down_while_a_job_runs(live: Live, capture: Capture) -> None:
    """`sleep 120` in a dynamic slot, then the startd shut down (here `condor_off -startd`,
    not -master, so that the session's pool stays; `condor_on` brings it back): JOB_EXIT
    `evict` with the shutdown's VacateReason; the job goes back to the queue."""
    db = LITE.format(live.sqlite)
    marker = live.marker(120)
    (job,) = live.submit(f"executable = /bin/sleep\narguments = {marker}\n{REQUESTS}queue\n",
                         db=db)
    live.wait_process(marker)
    live.wait_status(job, "running", db=db)
    startd = live.pool.child_pid("condor_startd")
    try:
        done = live.pool.tool("condor_off", "-startd")
        assert done.returncode == 0, done.stderr
        calls = until_exit(capture.job(marker))
        wait_for("the startd exits", lambda: live.pool.child_pid("condor_startd") is None, 60)
    finally:
        off = max(c.order for c in capture.calls())
        assert live.pool.tool("condor_on", "-startd").returncode == 0
        wait_for("a new startd", lambda: (live.pool.child_pid("condor_startd") or startd)
                 != startd, 60)
        # the pool as it was for the tests after this one: every slot fetching again (the
        # agent nudges a quiet startd)
        wait_for("every slot of the new startd fetches", lambda: {"slot1", "slot2", "slot3"}
                 <= _fetching_slots(capture, after=off), 90, 0.5)
    rec = recorded("09-shutdown-while-running")
    _check("09-shutdown-while-running", rec, calls, live)
    attrs = ("ExitBySignal", "ExitSignal", "ExitReason", "VacateReason", "VacateReasonCode",
             "VacateReasonSubCode", "JobState")
    assert (_starter_values(calls, "JOB_EXIT", *attrs)
            == _starter_values(rec, "JOB_EXIT", *attrs))
    assert not [c for c in capture.calls() if c.hook == "EVICT_CLAIM"]
    live.wait_status(job, "idle", "fetched", "accepted", "running", db=db)
    assert live.jobstore("rm", job, db=db).returncode == 0
    live.wait_gone(marker, timeout=120)
