"""Replay every recorded HTCondor 25.13.2 hook call (tests/fixtures/htcondor-transcripts) against
the real hook executables, on SQLite and on PostgreSQL.

The recorded FETCH_WORK stdout came from a stub queue, so the replay is adapted: before a scenario
we submit one job per recorded job ad (same Cmd, Args, Request*, custom attributes; owner alice),
run our fetch_job with the recorded slot ad, and give the later calls the recorded stdin with our
identity lines (JobstoreJobId, JobstoreAttempt, JobstoreToken, from the ad our fetch printed)
inserted into the job ad; every other byte stays as recorded, the raw ClaimId line included. The
unmodified recorded stdin must be left alone by every hook: it names no job of this job store.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import classad2
import pytest
import sqlalchemy as sa
from agentnode import Node
from hookrun import BY_CONDOR_NAME, HookResult, hook_env, run_hook
from testdata import TRANSCRIPTS

from jobstore.core.jobs import Job, JobEvent, JobSpec
from jobstore.core.states import Status
from jobstore.db.schema import job_events, jobs
from jobstore.db.store import JobStore
from jobstore.formats import classads
from jobstore.testing.support import ensure_account, insert_identity

IDENTITY = ("JobstoreAttempt", "JobstoreJobId", "JobstoreToken")
REQUIRED_ATTRS = (
    "Cmd", "Owner", "User", "JobUniverse", "RequestCpus", "RequestMemory", "RequestDisk",
    "ClusterId", "ProcId", "HookKeyword", *IDENTITY,
)
# Attributes of the recorded job ads that our submit reproduces in other ways (or not at all).
STANDARD_JOB_ATTRS = {
    "cmd", "args", "owner", "user", "jobuniverse", "iwd", "requestcpus", "requestmemory",
    "requestdisk", "clusterid", "procid",
}
STATUS_AFTER = {  # what a current attempt's report does to the job, from the state it is in
    ("reply_fetch", "accept"): {"fetched": "accepted"},
    ("reply_fetch", "reject"): {"fetched": "idle", "accepted": "idle"},
    ("prepare_job", None): {"fetched": "accepted", "accepted": "accepted"},
    ("update_job_info", None): {"fetched": "accepted", "accepted": "accepted"},
    ("update_job_info", "pid"): {s: "running" for s in ("fetched", "accepted", "running")},
    ("job_exit", "exit"): {s: "completed" for s in ("fetched", "accepted", "running")},
    ("job_exit", "evict"): {s: "idle" for s in ("fetched", "accepted", "running")},
}
# Final state per scenario (folder name prefix) and recorded ClusterId. "reap" means: the job
# stays accepted (the starter never ran) until its lease runs out; then reap makes it idle again.
EXPECTED: dict[str, dict[int, dict[str, Any]]] = {
    "00": {1: {"status": "accepted", "reap": True}},
    "01": {1: {"status": "completed", "exit_code": 0, "exit_by_signal": False}},
    "02": {
        2: {"status": "completed", "exit_code": 3, "exit_by_signal": False},
        3: {"status": "completed", "exit_by_signal": True, "exit_signal": 9},
    },
    "03": {4: {"status": "idle", "attempts": 1}},
    "03b": {41: {"status": "idle", "attempts": 1}},
    "04": {},
    "05": {6: {"status": "idle", "attempts": 1}, 7: {"status": "idle", "attempts": 1}},
    "06": {8: {"status": "completed", "exit_code": 0}},
    "07a": {11: {"status": "idle", "attempts": 0, "claims": 0}},
    "07b": {
        9: {"status": "completed", "exit_code": 0},
        10: {"status": "idle", "attempts": 0, "claims": 1},
    },
    "07c": {10: {"status": "idle", "attempts": 0, "claims": 1}},
    "08": {14: {"status": "accepted", "reap": True}},
    "09": {15: {"status": "idle", "attempts": 1}},
    "10b": {23: {"status": "idle", "attempts": 0, "claims": 1}},
    "10c": {24: {"status": "accepted", "reap": True}},
}


def scenario_dirs() -> list[Path]:
    if not TRANSCRIPTS.is_dir():
        return []
    return sorted(p for p in TRANSCRIPTS.iterdir() if p.is_dir() and list(p.glob("*.meta.json")))


# ---- recorded calls -----------------------------------------------------------------------


@dataclass
class Call:
    number: str
    condor_hook: str
    hook: str  # our executable
    argv: list[str]
    env: dict[str, str]
    stdin: bytes
    stdout: bytes | None  # FETCH_WORK only

    @property
    def job_part(self) -> bytes:
        """The job ad of the recorded stdin (REPLY_FETCH: the part before `-----`)."""
        if self.hook == "reply_fetch":
            return self.stdin.split(b"\n-----\n", 1)[0] + b"\n"
        return self.stdin

    @property
    def cluster_id(self) -> int | None:
        m = re.search(rb"^ClusterId = (\d+)$", self.job_part, re.M)
        return int(m.group(1)) if m else None


def load_calls(folder: Path) -> list[Call]:
    calls = []
    for meta_path in sorted(folder.glob("*.meta.json")):
        meta = json.loads(meta_path.read_text())
        base = str(meta_path)[: -len(".meta.json")]
        out = Path(base + ".stdout")
        calls.append(
            Call(
                number=meta_path.name.split("-", 1)[0],
                condor_hook=meta["hook"],
                hook=BY_CONDOR_NAME[meta["hook"]],
                argv=list(meta["argv"]),
                env=dict(meta["env"]),
                stdin=Path(base + ".stdin").read_bytes(),
                stdout=out.read_bytes() if out.exists() else None,
            )
        )
    return calls


def recorded_job_ad(text: bytes) -> classad2.ClassAd | None:
    """The stub's FETCH_WORK output as an ad, or None when empty or garbage (like the startd)."""
    if not text.strip():
        return None
    try:
        ad = classads.parse_ad(text.decode())
    except classads.AdError:
        return None
    # classad2 stops silently at a bad line; the startd drops the whole reply instead.
    if len(ad) != len([ln for ln in text.splitlines() if ln.strip()]):
        return None
    return ad if "ClusterId" in ad else None


def claim_id_parts(stdin: bytes) -> list[bytes]:
    """Pieces of the ClaimId value that appear nowhere else in the stdin (the secret parts)."""
    last = stdin.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    if not last.startswith(b'ClaimId = "'):
        return []
    value = last[len(b'ClaimId = "') : last.rindex(b'"')]
    rest = stdin.replace(last, b"")
    parts = [value]
    parts += [p for p in re.split(rb"[^A-Za-z0-9]+", value) if len(p) >= 6 and p not in rest]
    return parts


# ---- database helpers ---------------------------------------------------------------------


def dump(store: JobStore) -> tuple[list[tuple], list[tuple]]:
    with store.db.engine.connect() as conn:
        j = [tuple(r) for r in conn.execute(sa.select(jobs).order_by(jobs.c.id))]
        e = [tuple(r) for r in conn.execute(sa.select(job_events).order_by(job_events.c.id))]
    return j, e


def check_event_chain(store: JobStore, job_id: int) -> list[JobEvent]:
    events = store.reads.events(job_id)
    assert events, f"job {job_id} has no events"
    assert events[0].event == "submit" and events[0].from_status is None
    current = None
    for ev in events:
        assert ev.from_status == current, (job_id, ev, current)
        if ev.to_status is not None:
            current = ev.to_status
    assert current == store.reads.get_job(job_id).status
    return events


def submit_like(store: JobStore, ad: classad2.ClassAd, owner: str = "alice") -> int:
    """Submit one job whose attributes correspond to a recorded job ad; returns the job id."""
    custom = {
        name: str(ad.lookup(name)) for name in ad if name.lower() not in STANDARD_JOB_ATTRS
    }
    spec_kw: dict[str, Any] = {}
    for key, attr in (
        ("request_cpus", "RequestCpus"),
        ("request_memory", "RequestMemory"),
        ("request_disk", "RequestDisk"),
    ):
        if attr in ad:
            spec_kw[key] = int(ad.eval(attr))
    spec = JobSpec(
        cmd=ad.eval("Cmd"),
        args=ad.eval("Args") if "Args" in ad else "",
        iwd=ad.eval("Iwd") if "Iwd" in ad else "/tmp",
        custom=custom,
        **spec_kw,
    )
    _, ids = store.submissions.submit([spec], owner=owner, queue="default", max_attempts=5)
    return ids[0]


# ---- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def alice() -> str:
    try:
        pwd.getpwnam("alice")
    except KeyError:
        if os.geteuid() != 0:
            pytest.skip("needs the account alice (uid 1001): run as root to create it")
        ensure_account("alice", uid=1001)
    return "alice"


@pytest.fixture
def env_for(db_url: str, condor_config: Path, tmp_path: Path):
    """Hook environment with keyword TEST (as on the recording node) and a hook log file."""
    with condor_config.open("a") as fh:
        # the recorded executables and directories are the recording node's, not this one's
        fh.write("STARTD_JOB_HOOK_KEYWORD = TEST\nJOBSTORE_CHECK_LAUNCH = false\n")
    log = tmp_path / "hooks.log"

    def make(call_env: dict[str, str] | None = None) -> dict[str, str]:
        extra: dict[str, Any] = {k: v for k, v in (call_env or {}).items()
                                 if k != "CONDOR_CONFIG"}
        return hook_env(db_url, condor_config, JOBSTORE_HOOK_LOG=str(log), **extra)

    make.log = log  # type: ignore[attr-defined]
    return make


@pytest.fixture(params=["agent", pytest.param("direct", marks=pytest.mark.matrix)])
def replay_env(request: pytest.FixtureRequest, db_url: str, env_for, condor_config: Path,
               hook_dir: Path):
    """The hooks' environment for a replay: an agent serves them, as shipped
    (JOBSTORE_HOOK_MODE=agent), or (`make test-slow`) they work alone, in direct mode."""
    if request.param == "direct":
        yield env_for
        return
    base = Path(tempfile.mkdtemp(prefix="jobstore-replay-"))  # a short path for the socket
    os.chmod(base, 0o755)
    node = Node(base, db_url, condor_config, str(base / "agent.sock"), hook_dir,
                base / "agent.log", spool=condor_config.parent / "spool")  # env_for's spool
    try:
        node.start(JOBSTORE_HOOK_LOG=str(env_for.log))

        def make(call_env: dict[str, str] | None = None) -> dict[str, str]:
            return dict(env_for(call_env), JOBSTORE_AGENT_SOCKET=node.socket,
                        JOBSTORE_HOOK_MODE="agent")

        make.log = env_for.log  # type: ignore[attr-defined]
        yield make
        assert node.stop() == 0, node.log.read_text()
        no_traceback(node.log.read_text())
    finally:
        if node.agent is not None:
            node.agent.kill()
            node.agent.wait()
        shutil.rmtree(base, ignore_errors=True)


def check_fetched_ad(out: bytes) -> classad2.ClassAd:
    assert len(out) <= classads.MAX_JOB_AD_BYTES
    ad = classad2.parseOne(out.decode(), classad2.ParserType.Old)
    assert len(ad) == len(out.decode().splitlines()), "every line must parse"
    for name in REQUIRED_ATTRS:
        assert name in ad, name
    assert ad.eval("User") == "alice@localdomain"
    assert ad.eval("Owner") == "alice"
    assert ad.eval("JobUniverse") == 5
    assert ad.eval("HookKeyword") == "TEST"
    return ad


def no_traceback(*texts: bytes | str) -> None:
    for t in texts:
        t = t.decode(errors="replace") if isinstance(t, bytes) else t
        assert "Traceback" not in t, t


# ---- the replay ---------------------------------------------------------------------------


@dataclass
class Replay:
    store: JobStore
    hook_dir: Path
    env_for: Any
    jobs: dict[int, int] = field(default_factory=dict)  # recorded ClusterId -> our job id
    identity: dict[int, list[bytes]] = field(default_factory=dict)  # our job id -> lines
    secrets: list[bytes] = field(default_factory=list)
    unmodified: list[Call] = field(default_factory=list)

    def run(self, call: Call, stdin: bytes, argv: list[str] | None = None) -> HookResult:
        result = run_hook(
            self.hook_dir,
            call.hook,
            stdin,
            argv=call.argv if argv is None else argv,
            env=self.env_for(call.env),
        )
        no_traceback(result.stderr)
        return result

    def fetch(self, call: Call, stdin: bytes, expect_job: int | None) -> None:
        before = dump(self.store)
        result = self.run(call, stdin)
        assert result.returncode == 0
        assert result.stderr == b""
        if expect_job is None:
            assert result.stdout == b"", f"{call.number}: expected no work"
            assert dump(self.store) == before, "an empty fetch must not touch the database"
            return
        ad = check_fetched_ad(result.stdout)
        assert ad.eval("JobstoreJobId") == expect_job
        job = self.store.reads.get_job(expect_job)
        assert job.status == "fetched"
        assert ad.eval("JobstoreAttempt") == job.claims
        assert ad.eval("JobstoreToken") == job.token
        self.identity[expect_job] = [
            ln for ln in result.stdout.split(b"\n") if ln.split(b" = ")[0].decode() in IDENTITY
        ]
        assert job.token is not None
        self.secrets.append(job.token.encode())

    def report(self, call: Call, job_id: int) -> HookResult:
        stdin = insert_identity(
            call.stdin, self.identity[job_id], reply_fetch=call.hook == "reply_fetch"
        )
        # every recorded byte is still there, in order
        kept = [ln for ln in stdin.split(b"\n") if ln not in self.identity[job_id]]
        assert b"\n".join(kept) == call.stdin
        before = self.store.reads.get_job(job_id)
        result = self.run(call, stdin)
        assert result.returncode == 0, result
        assert result.stdout == b"" and result.stderr == b"", result
        after = self.store.reads.get_job(job_id)
        kind = call.argv[0] if call.argv else None
        if call.hook == "update_job_info" and re.search(rb"^JobPid = [1-9]", stdin, re.M):
            kind = "pid"
        expected = STATUS_AFTER[(call.hook, kind)].get(before.status, before.status)
        assert after.status == expected, (call.number, before.status, after.status)
        return result


def expected_for(folder: Path) -> dict[int, dict[str, Any]] | None:
    return EXPECTED.get(folder.name.split("-", 1)[0])


def busy(slot_stdin: bytes) -> bool:
    return re.search(rb'^Activity = "Idle"$', slot_stdin, re.M) is None or re.search(
        rb'^State = "(Unclaimed|Claimed)"$', slot_stdin, re.M
    ) is None


def fits(job: Job, slot_stdin: bytes) -> bool:
    def num(name: bytes) -> int:
        m = re.search(rb"^" + name + rb" = (\d+)$", slot_stdin, re.M)
        return int(m.group(1)) if m else 0

    return (
        job.request_cpus <= num(b"Cpus")
        and job.request_memory <= num(b"Memory")
        and job.request_disk <= num(b"Disk")
    )


# The hooks' logic does not depend on the backend or the mode: `make test` replays through the
# agent on SQLite; `make test-slow` on PostgreSQL too, and in direct mode (db_url, replay_env).
@pytest.mark.parametrize("folder", scenario_dirs(), ids=lambda p: p.name)
def test_replay(folder: Path, store: JobStore, hook_dir: Path, replay_env, alice: str) -> None:
    calls = load_calls(folder)
    assert calls, folder
    r = Replay(store, hook_dir, replay_env)

    # Submit one job per recorded job ad, in the order the stub handed them out.
    for call in calls:
        if call.condor_hook == "FETCH_WORK":
            ad = recorded_job_ad(call.stdout or b"")
            if ad is not None:
                r.jobs[int(ad.eval("ClusterId"))] = submit_like(store, ad)
    by_job = {v: k for k, v in r.jobs.items()}
    pending_fetch: dict[int, Call] = {}  # job refused to a busy slot -> that fetch call
    late_accept_done = second_exit_done = False

    for call in calls:
        if call.hook == "fetch_job":
            ad = recorded_job_ad(call.stdout or b"")
            job_id = r.jobs.get(int(ad.eval("ClusterId"))) if ad is not None else None
            expect = job_id
            if job_id is not None and (busy(call.stdin) or not fits(store.reads.get_job(job_id),
                                                                      call.stdin)):
                expect = None
            if job_id is not None and store.reads.get_job(job_id).status != "idle":
                expect = None
            r.fetch(call, call.stdin, expect)
            if job_id is not None and expect is None and busy(call.stdin):
                pending_fetch[job_id] = call
            continue

        cluster = call.cluster_id
        job_id = r.jobs.get(cluster) if cluster is not None else None
        r.unmodified.append(call)
        if job_id is not None and job_id not in r.identity and job_id in pending_fetch:
            # A busy slot got nothing from us. The startd still answered for that job, so fetch
            # it once more from the same slot as it is when its running job has ended.
            fetch_call = pending_fetch.pop(job_id)
            idle_slot = re.sub(rb'^Activity = "Busy"$', b'Activity = "Idle"', fetch_call.stdin,
                               flags=re.M)
            assert not busy(idle_slot)
            r.fetch(fetch_call, idle_slot, job_id)
        if job_id is None or job_id not in r.identity:
            # Not ours (the other system's jobs 21/22, or a job we never handed out).
            continue
        if call.hook == "reply_fetch":
            r.secrets += claim_id_parts(call.stdin)
        r.report(call, job_id)

        if call.hook == "prepare_job" and not late_accept_done:
            # A late REPLY_FETCH accept (after PREPARE_JOB) changes nothing.
            accept = next(
                (c for c in calls if c.hook == "reply_fetch" and c.argv == ["accept"]
                 and c.cluster_id == cluster),
                None,
            )
            if accept is not None:
                late_accept_done = True
                row = store.reads.get_job(job_id)
                res = r.run(accept, insert_identity(accept.stdin, r.identity[job_id],
                                                    reply_fetch=True))
                assert res.returncode == 0
                assert store.reads.get_job(job_id) == row
                last = store.reads.events(job_id)[-1]
                assert last.event == "accept" and last.to_status is None
        if call.hook == "job_exit" and not second_exit_done:
            second_exit_done = True
            row = store.reads.get_job(job_id)
            stdin = insert_identity(call.stdin, r.identity[job_id], reply_fetch=False)
            res = r.run(call, stdin)
            assert res.returncode == 0 and res.stdout == b"" and res.stderr == b""
            assert store.reads.get_job(job_id) == row
            last = store.reads.events(job_id)[-1]
            assert last.to_status is None and (last.reason or "").startswith("stale"), last

    # The unmodified recorded stdin names no job of ours: every hook leaves it alone (one call
    # per hook, argv and job of the scenario, to keep the number of processes down).
    unique = {(c.hook, tuple(c.argv), c.cluster_id): c for c in r.unmodified}
    r.unmodified = list(unique.values())
    before = dump(store)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda c: (c, r.run(c, c.stdin)), r.unmodified))
    for call, res in results:
        assert res.returncode == 0, (call.number, res)
        assert res.stdout == b"" and res.stderr == b"", (call.number, res)
    assert dump(store) == before, "a job ad without Jobstore* attributes changed the database"

    # Final states.
    expected = expected_for(folder)
    if expected is not None:
        assert set(expected) == set(r.jobs), (expected, r.jobs)
    for cluster, job_id in r.jobs.items():
        want = dict((expected or {}).get(cluster, {}))
        reap = want.pop("reap", False)
        job = store.reads.get_job(job_id)
        for key, value in want.items():
            assert getattr(job, key) == value, (folder.name, cluster, key, getattr(job, key), value)
        if reap:
            assert job.attempts == 0
            # the lease has not run out yet
            assert store.maintenance.reap(now=time.time() - 1) == []
            assert store.reads.get_job(job_id).status == "accepted"
            outcomes = store.maintenance.reap(now=time.time() + 10_000)
            assert [o.job_id for o in outcomes] == [job_id]
            job = store.reads.get_job(job_id)
            assert job.status == "idle" and job.attempts == 1
            assert job.token is None
        check_event_chain(store, job_id)
        assert by_job[job_id] == cluster

    # Secrets (attempt tokens, ClaimId) never reach the hook log.
    log = replay_env.log.read_bytes() if replay_env.log.exists() else b""
    no_traceback(log)
    for secret in r.secrets:
        assert secret not in log, secret


@pytest.mark.parametrize("folder", scenario_dirs(), ids=lambda p: p.name)
def test_recorded_ads_parse(folder: Path) -> None:
    """Sanity of the fixtures themselves: our parser reads every recorded stdin."""
    for call in load_calls(folder):
        text = classads.decode(call.stdin)
        if call.hook in ("reply_fetch", "evict_claim"):
            reply = classads.split_reply_fetch(text)
            assert reply.has_claim_id == (call.argv == ["accept"])
            assert "ClaimId" not in reply.slot
        else:
            classads.parse_ad(text)


def test_scenarios_found(fixtures_dir: Path) -> None:
    found = scenario_dirs()
    assert found, f"no scenario folders in {fixtures_dir / 'htcondor-transcripts'}"
    assert {p.parent for p in found} == {fixtures_dir / "htcondor-transcripts"}


def test_root_job_is_held_not_fetched(store: JobStore, hook_dir: Path, env_for) -> None:
    """08-owner-root: a job owned by root (inserted bypassing the CLI check) is never handed
    out: fetch_job prints nothing and puts it on hold with a reason."""
    slot = (TRANSCRIPTS / "08-owner-root" / "01-FETCH_WORK.stdin").read_bytes()
    ad = recorded_job_ad((TRANSCRIPTS / "08-owner-root" / "01-FETCH_WORK.stdout").read_bytes())
    assert ad is not None and ad.eval("Owner") == "root"
    job_id = submit_like(store, ad, owner="root")
    result = run_hook(hook_dir, "fetch_job", slot, env=env_for())
    assert result.returncode == 0
    assert result.stdout == b""
    no_traceback(result.stderr)
    job = store.reads.get_job(job_id)
    assert job.status == Status.HELD.value
    assert job.reason and "root" in job.reason
    assert job.claims == 0 and job.token is None
    events = check_event_chain(store, job_id)
    assert [e.event for e in events] == ["submit", "hold"]
    # Held stays held: the next fetch neither hands it out nor touches it.
    before = dump(store)
    result = run_hook(hook_dir, "fetch_job", slot, env=env_for())
    assert result.stdout == b"" and result.returncode == 0
    assert dump(store) == before

