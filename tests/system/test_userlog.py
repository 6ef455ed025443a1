"""HTCondor job event logs: jobs submitted with `log` run through the emulated node while the
access point's `jobstore schedd` writes their log, which the real htcondor2.JobEventLog reads
exactly like one a schedd wrote."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import clirun
import htcondor2
import pytest
from apnode import hers, schedd_cmd, wait_for_events
from backends import BOTH_BACKENDS
from emulatornode import give_node

from jobstore.agent.hooktemplates import install_hooks
from jobstore.api.submission import submit_path
from jobstore.cli.demo import write_node_config
from jobstore.core.jobs import JobSpec
from jobstore.core.states import Event
from jobstore.db.engine import upgrade
from jobstore.db.store import JobStore
from jobstore.emulator import Emulator, EmulatorConfig
from jobstore.formats.userlog import LogEvent, aborted_body, evicted_body, log_events
from jobstore.node import config
from jobstore.testing.factories import a_job
from jobstore.testing.support import ensure_account, own_node_dirs

ET = htcondor2.JobEventType
OWNER = "jsalice"

# proc 0 exits 0, 1 exits 3, 2 is killed by SIGKILL, 3 runs until it is evicted and then exits 0,
# 4 is held and released before it runs, 5 is removed.
JOB = """\
#!/bin/sh
case "$1" in
  1) exit 3 ;;
  2) kill -9 $$ ;;
  3) [ -e "$2/evicted-once" ] && exit 0; touch "$2/evicted-once"; sleep 120 ;;
esac
exit 0
"""
SUBMIT = """\
executable = job.sh
arguments = $(Process) {run}
initialdir = run
log = jobs.log
queue 6
"""


def _account(name: str) -> pwd.struct_passwd:
    return ensure_account(name, home=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def node(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A directory every account can traverse, with the job store in it or on PostgreSQL."""
    base = Path(tempfile.mkdtemp(prefix="jobstore-userlog-"))
    os.chmod(base, 0o777)
    if request.param == "sqlite":
        db_url = f"sqlite:///{base / 'jobstore.db'}"
    else:
        db_url = request.getfixturevalue("pg_url")
    upgrade(db_url)
    condor_config = write_node_config(base, db_url)
    node_dirs = own_node_dirs(condor_config)
    monkeypatch.setenv("CONDOR_CONFIG", str(condor_config))
    store = JobStore.from_url(db_url)
    yield store, base, db_url
    store.db.engine.dispose()
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(node_dirs, ignore_errors=True)


def _read(path: Path) -> list[htcondor2.JobEvent]:
    return list(htcondor2.JobEventLog(str(path)).events(0))


@pytest.mark.slow
def test_emulated_jobs_write_a_schedd_style_event_log(node) -> None:  # type: ignore[no-untyped-def]
    store, base, db_url = node
    root = os.geteuid() == 0
    owner = _account(OWNER) if root else None
    sub, run = base / "submit", base / "submit" / "run"
    run.mkdir(parents=True)
    (run / "job.sh").write_text(JOB)  # relative executable and log: against initialdir
    os.chmod(run / "job.sh", 0o755)
    (sub / "jobs.sub").write_text(SUBMIT.format(run=run))
    if owner:
        for d in (sub, run):
            os.chown(d, owner.pw_uid, owner.pw_gid)
    settings = config.load_settings("JOBSTORE", db_url)
    cluster, ids = submit_path(
        store, sub / "jobs.sub", settings, owner=owner.pw_name if owner else None
    )
    jobs = store.reads.find_jobs(cluster)  # the access point writes it: no committer does
    assert {(j.user_log, j.ad["UserLog"]) for j in jobs} == {(None, str(run / "jobs.log"))}
    store.actions.admin(ids[4], Event.HOLD, "held for the test")
    store.actions.admin(ids[4], Event.RELEASE, "released for the test")
    store.actions.admin(ids[5], Event.REMOVE, "removed for the test")

    cfg = EmulatorConfig(
        hooks=install_hooks(base / "hooks", sys.executable),
        work_dir=str(base / "node"),
        static_slots=4,
        initial_update_interval=0.5,
        update_interval=2.0,
        min_rearm=0.2,
        fetch_work_delay='ifThenElse(State == "Claimed" && Activity == "Idle",0,1)',
        env={"PATH": "/usr/bin:/bin", "HOME": "/", "CONDOR_CONFIG": os.environ["CONDOR_CONFIG"]},
    )
    if owner:  # as root: the service account runs the hooks, or on SQLite the jobs' owner
        give_node(cfg, store, base, owner.pw_name, personal=True)
    emulator = Emulator(cfg)
    vacated: list[str] = []

    def until() -> bool:
        job = store.reads.get_job(ids[3])
        if not vacated and job.status == "running":  # evict proc 3 once it really runs
            vacated.append(job.slot)
            emulator.vacate(job.slot)
        return not store.reads.list_jobs()

    hers(store, owner.pw_name if owner else None)
    service = clirun.popen(schedd_cmd(store), stderr=subprocess.DEVNULL)
    try:
        emulator.run(until=until, timeout=600, wait_for_jobs=True)
        assert vacated and not store.reads.list_jobs(), [
            (j.proc_id, j.status, j.reason, j.exit_code)
            for j in store.reads.list_jobs(include_final=True)
        ]
        events = wait_for_events(run / "jobs.log", {
            p: {ET.JOB_TERMINATED, ET.JOB_ABORTED} for p in range(6)})
    finally:
        service.terminate()
        assert service.wait(timeout=20) == 0
    assert {e.cluster for e in events} == {cluster}
    by_proc: dict[int, list[htcondor2.JobEvent]] = {}
    for e in events:
        by_proc.setdefault(e.proc, []).append(e)
    kinds = {p: [e.type for e in evs if e.type != ET.IMAGE_SIZE] for p, evs in by_proc.items()}
    run_once = [ET.SUBMIT, ET.EXECUTE, ET.JOB_TERMINATED]
    assert kinds == {
        0: run_once,
        1: run_once,
        2: run_once,
        3: [ET.SUBMIT, ET.EXECUTE, ET.JOB_EVICTED, ET.EXECUTE, ET.JOB_TERMINATED],
        4: [ET.SUBMIT, ET.JOB_HELD, ET.JOB_RELEASED, ET.EXECUTE, ET.JOB_TERMINATED],
        5: [ET.SUBMIT, ET.JOB_ABORTED],
    }
    ends = {p: evs[-1] for p, evs in by_proc.items()}
    assert [ends[p]["ReturnValue"] for p in (0, 1, 3, 4)] == [0, 3, 0, 0]
    assert all(ends[p]["TerminatedNormally"] for p in (0, 1, 3, 4))
    assert not ends[2]["TerminatedNormally"] and ends[2]["TerminatedBySignal"] == 9
    held = next(e for e in by_proc[4] if e.type == ET.JOB_HELD)
    assert held["HoldReason"] == "held for the test" and held["HoldReasonCode"] == 1
    assert ends[5]["Reason"] == "removed for the test"
    evicted = next(e for e in by_proc[3] if e.type == ET.JOB_EVICTED)
    assert not evicted["TerminatedAndRequeued"]
    # proc 3 ran until it was evicted: its first START reported a real image size
    sizes = [e for e in by_proc[3] if e.type == ET.IMAGE_SIZE]
    assert sizes and sizes[0]["Size"] > 0
    execute = next(e for e in by_proc[0] if e.type == ET.EXECUTE)
    assert execute["SlotName"].endswith("@" + cfg.host)
    # in the order of the job store's events, with their times
    for proc, evs in by_proc.items():
        assert [e.timestamp for e in evs] == sorted(e.timestamp for e in evs), proc
    if owner:  # written as the owner, never as root
        assert (run / "jobs.log").stat().st_uid == owner.pw_uid


def _record(event: Event, before: str, after: str | None, **attrs: object) -> dict[str, object]:
    return {
        "event": str(event),
        "from_status": before,
        "to_status": after,
        "time": 1.7e9,
        "reason": "why",
        "attrs": attrs,
    }


def test_retries_and_failures_map_to_requeue_and_abort(tmp_path: Path) -> None:
    """Exit with a retry -> evicted 'terminated and requeued'; out of attempts -> aborted."""
    job = a_job(cluster_id=7, proc_id=2, host="n1", slot="slot1@n1", image_size=0)
    records = [
        _record(Event.EXIT, "running", "idle", ExitCode=4, ExitBySignal=False),
        _record(Event.START, "accepted", "running", ImageSize=2048),
        _record(Event.START, "running", "running", ImageSize=0),
        _record(Event.LEASE_EXPIRED, "running", "failed"),
        _record(Event.UPDATE, "accepted", "accepted"),
        _record(Event.EXIT, "running", None),  # a stale report: nothing
    ]
    path = tmp_path / "log"
    path.write_text("".join(e.text() for r in records for e in log_events(r, job)))
    events = _read(path)
    assert [e.type for e in events] == [
        ET.JOB_EVICTED,
        ET.EXECUTE,
        ET.IMAGE_SIZE,
        ET.JOB_EVICTED,
        ET.JOB_ABORTED,
    ]
    assert events[0]["TerminatedAndRequeued"] and events[0]["ReturnValue"] == 4
    assert events[2]["Size"] == 2048 and events[4]["Reason"] == "why"
    assert {(e.cluster, e.proc) for e in events} == {(7, 2)}


WRITER = """
import sys
from jobstore.formats.userlog import LogEvent, append, evicted_body
w = int(sys.argv[2])
for i in range(int(sys.argv[3])):
    body = evicted_body((i, w), "writer %d event %d " % (w, i) + "x" * 3000, (False, i))
    assert append(sys.argv[1], LogEvent(4, w, i, 1.7e9, body).text())
"""


def test_concurrent_appends_keep_every_event_whole(tmp_path: Path) -> None:
    """Several processes append big events to one log at once; every event parses, once."""
    path, writers, each = tmp_path / "shared.log", 6, 150
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(w), str(each)])
        for w in range(writers)
    ]
    assert [p.wait(timeout=300) for p in procs] == [0] * writers
    events = _read(path)
    assert len(events) == writers * each
    seen = {(e.cluster, e.proc) for e in events}
    assert seen == {(w, i) for w in range(writers) for i in range(each)}
    assert all(e["Reason"].endswith("x" * 3000) and e["ReturnValue"] == e.proc for e in events)
    assert path.read_text().count("...\n") == writers * each


@BOTH_BACKENDS
def test_unwritable_log_never_affects_the_transition(store: JobStore, tmp_path: Path) -> None:
    bad = tmp_path / "missing-dir" / "job.log"
    nj = JobSpec("/bin/true", request_memory=1, request_disk=1, user_log=str(bad))
    _, (job_id,) = store.submissions.submit([nj], owner="nobody", queue="q", max_attempts=1)
    assert store.actions.admin(job_id, Event.REMOVE).after == "removed"
    assert not bad.exists()
    assert [e.event for e in store.reads.events(job_id)] == ["submit", "remove"]


def test_log_event_text_is_what_a_schedd_writes() -> None:
    e = LogEvent(9, 12, 3, 0.0, aborted_body("line one\nline two"))
    head, body, sep = e.text().splitlines()[0], e.text().splitlines()[1], e.text()[-4:]
    assert head.startswith("009 (012.003.000) ") and head.endswith(" Job was aborted.")
    assert body == "\tline one|line two" and sep == "...\n"
    assert evicted_body((0, 0), None).startswith("Job was evicted.\n\t(0) CPU times\n")
