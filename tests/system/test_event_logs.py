"""Job event logs on the access point: the jobs submitted there (not spooled) run on an emulated
node with the real hooks and the agent, which write nothing to their logs; `jobstore schedd`
appends every transition, in order, once, as the owner, and goes on where it stopped when it
is run again; a spooled job's log is written by whoever commits each transition, as before."""

from __future__ import annotations

import dataclasses
import os
import pwd
import time
from pathlib import Path

import clirun
import htcondor2
import pytest
from apnode import hers, schedd_cmd, submit_dir, submit_in, wait_for_events
from emulatornode import job_owner, node_db, run_node  # noqa: F401

from jobstore.db.schema import jobs

ET = htcondor2.JobEventType
BACKENDS = pytest.mark.parametrize(
    "node_db", ["sqlite", pytest.param("postgresql", marks=pytest.mark.matrix)], indirect=True)
LOG = "log = jobs.log\n"
ENDED = {ET.JOB_TERMINATED}


def _kinds(events: list[htcondor2.JobEvent]) -> dict[int, list[htcondor2.JobEventType]]:
    out: dict[int, list[htcondor2.JobEventType]] = {}
    for e in events:
        if e.type != ET.IMAGE_SIZE:
            out.setdefault(e.proc, []).append(e.type)
    return out


@BACKENDS
def test_the_access_point_writes_the_logs_the_node_does_not(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    store, tmp = node_db
    owner = job_owner()
    home = submit_dir(tmp, "home", owner, LOG)
    spooled = submit_dir(tmp, "spooled", owner, LOG)
    ids = submit_in(store, home, owner)
    submit_in(store, spooled, owner, spool=True)
    run_node(store, tmp, owner, "agent", {"completed", "held", "failed"}, slots=2)
    assert {store.reads.get_job(i).status for i in ids} == {"completed"}
    assert not (home / "jobs.log").exists()  # neither the submit nor the node wrote it
    by_committers = wait_for_events(spooled / "jobs.log", {0: ENDED, 1: ENDED})
    hers(store, owner)
    elsewhere = clirun.run(schedd_cmd(store, "--name", "ap2.example.org", "--once"),
                           capture_output=True, text=True, timeout=60)
    assert elsewhere.stdout.splitlines()[1] == "0 event(s) appended to job event logs.", elsewhere
    assert not (home / "jobs.log").exists()
    once = clirun.run(schedd_cmd(store, "--once"), capture_output=True, text=True, timeout=60)
    assert once.returncode == 0, once.stderr
    events = wait_for_events(home / "jobs.log", {0: ENDED, 1: ENDED}, timeout=0)
    assert _kinds(events) == _kinds(by_committers) == {
        p: [ET.SUBMIT, ET.EXECUTE, ET.JOB_TERMINATED] for p in (0, 1)}
    assert once.stdout.splitlines()[1] == f"{len(events)} event(s) appended to job event logs."
    for proc in (0, 1):  # each job's in its order (two slots' commits may cross in time)
        times = [e.timestamp for e in events if e.proc == proc]
        assert times == sorted(times), proc
    assert all(e["TerminatedNormally"] and e["ReturnValue"] == 0
               for e in events if e.type == ET.JOB_TERMINATED)
    if owner:
        assert (home / "jobs.log").stat().st_uid == pwd.getpwnam(owner).pw_uid
    # it goes on where it stopped: nothing twice
    size = (home / "jobs.log").stat().st_size
    again = clirun.run(schedd_cmd(store, "--once"), capture_output=True, text=True, timeout=60)
    assert again.stdout.splitlines()[1] == "0 event(s) appended to job event logs.", again.stderr
    assert (home / "jobs.log").stat().st_size == size


@BACKENDS
@pytest.mark.skipif(os.geteuid() != 0, reason="the service writes as the owner only as root")
def test_a_log_the_owner_may_not_write_gets_nothing(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """A log whose path leads where the owner may not write (a link she put there to root's
    file, a directory of root's, what is no path at all) is written by nobody, root included;
    the others' logs are written and the service goes on."""
    from jobstore.testing.factories import job_spec

    store, tmp = node_db
    owner = job_owner()
    assert owner is not None
    sub = submit_dir(tmp, "sub", owner)
    guarded = tmp / "guarded"
    guarded.mkdir(mode=0o700)
    (guarded / "root.log").write_text("root's\n")
    (sub / "link.log").symlink_to(guarded / "root.log")
    os.lchown(sub / "link.log", pwd.getpwnam(owner).pw_uid, -1)
    paths = [str(sub / "link.log"), str(guarded / "new.log"), "relative.log", str(sub / "ok.log")]
    ids = [store.submissions.submit([job_spec(0, iwd=str(sub), user_log=path)], owner=owner,
                                    queue="default", max_attempts=1, home="ap1")[1][0]
           for path in paths]
    if store.db.engine.dialect.name == "sqlite":  # an ad written past the door
        ids += store.submissions.submit([job_spec(0, iwd=str(sub), user_log=str(sub / "x.log"))],
                                        owner=owner, queue="default", max_attempts=1,
                                        home="ap1")[1]
        with store.db.engine.begin() as conn:
            conn.execute(jobs.update().where(jobs.c.id == ids[-1]).values(ad={"UserLog": ["/x"]}))
    hers(store, owner)
    once = clirun.run(schedd_cmd(store, "--name", "ap1", "--once"), capture_output=True,
                      text=True, timeout=60)
    assert once.stdout.splitlines()[1] == "1 event(s) appended to job event logs.", once.stderr
    assert (guarded / "root.log").read_text() == "root's\n"
    assert sorted(p.name for p in guarded.iterdir()) == ["root.log"]
    assert [e.type for e in htcondor2.JobEventLog(str(sub / "ok.log")).events(0)] == [ET.SUBMIT]
    assert not (sub / "x.log").exists()
    assert "cannot write job event log" in once.stderr


@BACKENDS
def test_a_dags_nodes_come_home_with_their_log(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """A DAG submitted on the access point is its: each node's outputs are written into the
    DAG's directory and its events into the nodes' log by its `jobstore schedd`, none by the
    node."""
    from jobstore.api.dags import submit_dag
    from jobstore.node import config

    store, tmp = node_db
    owner = job_owner()
    sub = submit_dir(tmp, "dag", owner)
    for name in ("a", "b"):
        (sub / f"{name}.sub").write_text(
            f"executable = /bin/echo\ntransfer_executable = false\narguments = node {name}\n"
            f"output = {name}.out\nlog = nodes.log\nshould_transfer_files = YES\n"
            "request_memory = 32\nqueue\n")
    (sub / "two.dag").write_text("JOB A a.sub\nJOB B b.sub\nPARENT A CHILD B\n")
    settings = config.load_settings("JOBSTORE", store.db.engine.url.render_as_string(False))
    done = submit_dag(store, str(sub / "two.dag"), settings, owner=owner)
    homes = {store.reads.find_jobs(c)[0].user_log for c in done.clusters.values()}
    assert homes == {None}  # kept in the ad: the access point writes it
    run_node(store, tmp, owner, "agent", {"completed", "held", "failed"}, slots=1)
    assert not (sub / "nodes.log").exists() and not (sub / "a.out").exists()
    hers(store, owner)
    once = clirun.run(schedd_cmd(store, "--once"), capture_output=True, text=True, timeout=60)
    assert once.stdout.startswith("2 job(s)' outputs written home, 0 not.\n"), once.stderr
    assert [(sub / f"{n}.out").read_text() for n in "ab"] == ["node a\n", "node b\n"]
    events = htcondor2.JobEventLog(str(sub / "nodes.log")).events(0)
    ended = [e.cluster for e in events if e.type == ET.JOB_TERMINATED]
    assert ended == [done.clusters["A"], done.clusters["B"]]
    # DAGMan's own job's log, as the DAG tutorial reads it: its DAGManJobId to its end
    dagman = list(htcondor2.JobEventLog(str(sub / "two.dag.dagman.log")).events(0))
    assert [(e.cluster, e.type) for e in dagman] == [
        (done.dag_id, ET.SUBMIT), (done.dag_id, ET.EXECUTE), (done.dag_id, ET.JOB_TERMINATED)]
    assert dagman[-1]["ReturnValue"] == 0
    if owner:
        assert (sub / "two.dag.dagman.log").stat().st_uid == pwd.getpwnam(owner).pw_uid
    again = clirun.run(schedd_cmd(store, "--once"), capture_output=True, text=True, timeout=60)
    assert again.stdout.splitlines()[1] == "0 event(s) appended to job event logs.", again.stderr


@BACKENDS
def test_a_dags_own_log_follows_it_to_its_removal(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """Submitted and executing while it runs (once), aborted when it is removed."""
    from jobstore.api.dags import submit_dag
    from jobstore.node import config

    store, tmp = node_db
    owner = job_owner()
    sub = submit_dir(tmp, "dag", owner)
    (sub / "a.sub").write_text("executable = /bin/true\nqueue\n")
    (sub / "one.dag").write_text("JOB A a.sub\n")
    settings = config.load_settings("JOBSTORE", store.db.engine.url.render_as_string(False))
    done = submit_dag(store, str(sub / "one.dag"), settings, owner=owner)
    hers(store, owner)
    log = sub / "one.dag.dagman.log"
    for _ in range(2):
        clirun.run(schedd_cmd(store, "--once"), capture_output=True, text=True, timeout=60)
        assert [e.type for e in htcondor2.JobEventLog(str(log)).events(0)] == [
            ET.SUBMIT, ET.EXECUTE]
    assert store.dags.remove_dag(done.dag_id)
    clirun.run(schedd_cmd(store, "--once"), capture_output=True, text=True, timeout=60)
    events = list(htcondor2.JobEventLog(str(log)).events(0))
    assert [e.type for e in events] == [ET.SUBMIT, ET.EXECUTE, ET.JOB_ABORTED]
    assert events[-1]["Reason"] == "the DAG was removed"


@pytest.mark.parametrize("node_db", ["sqlite"], indirect=True)
@pytest.mark.skipif(os.geteuid() != 0, reason="the service writes as the owner only as root")
def test_no_log_of_hers_stops_the_service_or_learns_its_secrets(node_db, monkeypatch) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """A FIFO for a log, a log she keeps locked, a report's CPU time of infinity: each costs
    her own entry at most, within seconds; the other logs are written, and the next pass
    goes on. The child that writes as her gets none of root's environment."""
    import fcntl
    import subprocess
    import threading

    from jobstore.accesspoint.eventlogs import EventLogs
    from jobstore.core.states import Event
    from jobstore.formats import userlog
    from jobstore.node import config
    from jobstore.testing.factories import job_spec, report, running

    store, tmp = node_db
    owner = job_owner()
    assert owner is not None
    user = pwd.getpwnam(owner)
    sub = submit_dir(tmp, "sub", owner)
    os.mkfifo(sub / "fifo.log")
    (sub / "locked.log").write_text("")
    for path in (sub / "fifo.log", sub / "locked.log"):
        os.chown(path, user.pw_uid, user.pw_gid)
    paths = ["fifo.log", "locked.log", "poison.log", "ok.log"]
    ids = [store.submissions.submit([job_spec(0, iwd=str(sub), user_log=str(sub / p))],
                                    owner=owner, queue="default", max_attempts=1,
                                    home="ap1")[1][0] for p in paths]
    poisoned = running(store, lease=600)
    assert poisoned.id == ids[0]  # the oldest: the FIFO's
    for _ in ids[1:3]:
        job = running(store, lease=600)
        report(store, job, Event.EXIT, changes={"exit_code": 0},
               attrs={"RemoteUserCpu": float("inf"), "RemoteSysCpu": "x"})
    monkeypatch.setattr(userlog, "LOCK_WAIT", 0.5)
    held = open(sub / "locked.log", "a")  # noqa: SIM115 - held across the pass
    fcntl.lockf(held, fcntl.LOCK_EX)
    environs: list[str] = []
    real_popen = subprocess.Popen

    def spying(*args, **kwargs):  # type: ignore[no-untyped-def]
        proc = real_popen(*args, **kwargs)
        environs.append(Path(f"/proc/{proc.pid}/environ").read_bytes().decode())
        return proc

    monkeypatch.setattr(subprocess, "Popen", spying)
    monkeypatch.setenv("JOBSTORE_DATABASE_URL", "postgresql://u:SECRET@h/db")
    settings = config.load_settings("JOBSTORE", store.db.engine.url.render_as_string(False))
    service = EventLogs(store, "ap1", settings)
    passed = threading.Thread(target=service.pass_once)
    started = time.monotonic()
    passed.start()
    passed.join(timeout=60)
    assert not passed.is_alive() and time.monotonic() - started < 30
    held.close()
    assert environs and not any("SECRET" in e for e in environs)
    assert (sub / "locked.log").read_text() == ""
    kinds = {p: [e.type for e in htcondor2.JobEventLog(str(sub / p)).events(0)]
             for p in ("poison.log", "ok.log")}
    assert kinds == {"poison.log": [ET.SUBMIT, ET.EXECUTE, ET.JOB_TERMINATED],
                     "ok.log": [ET.SUBMIT]}
    (end,) = [e for e in htcondor2.JobEventLog(str(sub / "poison.log")).events(0)
              if e.type == ET.JOB_TERMINATED]
    assert end["RunRemoteUsage"] == "Usr 0 00:00:00, Sys 0 00:00:00"
    report(store, poisoned, Event.EXIT, changes={"exit_code": 0})
    store.actions.admin(ids[3], Event.HOLD, "held for the test")
    assert service.pass_once() == 1  # it goes on: the FIFO's entries are hers to lose
    assert [e.type for e in htcondor2.JobEventLog(str(sub / "ok.log")).events(0)] == [
        ET.SUBMIT, ET.JOB_HELD]


@pytest.mark.parametrize("node_db", ["sqlite"], indirect=True)
@pytest.mark.skipif(os.geteuid() != 0, reason="the service writes as the owner only as root")
def test_nothing_of_hers_holds_the_service_past_its_deadlines(node_db, monkeypatch) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """A writer that keeps its pipes open after it is killed (she may hold copies of them) is
    left, not read to its end; a hundred DAG logs that cannot be written are given up once,
    and the DAG after them gets its log in the same pass; an event read again (a cursor kept
    lower) is never appended twice."""
    from jobstore.accesspoint.dagmanlogs import DagmanLogs
    from jobstore.accesspoint.eventlogs import EventLogs
    from jobstore.api.dags import submit_dag
    from jobstore.db.eventcursors import EventCursor
    from jobstore.formats import userlog
    from jobstore.node import config
    from jobstore.submit.dag import read_dag
    from jobstore.testing.factories import job_spec

    store, tmp = node_db
    owner = job_owner()
    assert owner is not None
    sub = submit_dir(tmp, "sub", owner)
    monkeypatch.setattr(userlog, "APPEND_WAIT", 0.5)
    hold_pipes = 'import os, sys\nprint("locked", flush=True)\nif os.fork() == 0:\n' \
                 '    import time; time.sleep(60)\nsys.stdin.read()\nsys.exit(1)\n'
    monkeypatch.setattr(userlog, "_child", lambda: hold_pipes)
    started = time.monotonic()
    assert not userlog.append(str(sub / "x.log"), "text", owner=owner)
    assert time.monotonic() - started < 15
    monkeypatch.undo()
    settings = config.load_settings("JOBSTORE", store.db.engine.url.render_as_string(False))
    (sub / "a.sub").write_text("executable = /bin/true\nqueue\n")
    (sub / "d.dag").write_text("JOB A a.sub\n")
    dag = read_dag(str(sub / "d.dag"))
    for n in range(101):  # paths the door took, that are no absolute path
        store.dags.submit_dag(dataclasses.replace(dag, path=f"rel{n}.dag"), lambda _: [],
                              owner=owner, queue="default", max_attempts=1, home="ap1")
    monkeypatch.setenv("JOBSTORE_SCHEDD_NAME", "ap1")
    last = submit_dag(store, str(sub / "d.dag"),
                      config.load_settings("JOBSTORE", settings.database_url), owner=owner)
    assert DagmanLogs(store, "ap1", settings).pass_once() == 2
    assert [e.cluster for e in htcondor2.JobEventLog(str(sub / "d.dag.dagman.log")).events(0)] \
        == [last.dag_id] * 2
    assert DagmanLogs(store, "ap1", settings).pass_once() == 0  # given up, never tried again
    (job_id,) = store.submissions.submit([job_spec(0, iwd=str(sub), user_log=str(sub / "j.log"))],
                                         owner=owner, queue="default", max_attempts=1,
                                         home="ap1")[1]
    assert EventLogs(store, "ap1", settings).pass_once() == 1
    store.event_cursors.save("userlog:ap1", EventCursor(0), time.time())  # kept lower
    assert EventLogs(store, "ap1", settings).pass_once() == 0
    assert [e.type for e in htcondor2.JobEventLog(str(sub / "j.log")).events(0)] == [ET.SUBMIT]
