"""jobstore.Schedd: htcondor2.Schedd's calls (submit, query, act, edit, history) against the job
store on SQLite and PostgreSQL, with htcondor2's return types and totals; a submit inside the
caller's transaction; an idempotency key."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import classad2
import htcondor2
import pytest
from backends import BOTH_BACKENDS
from scheddapi import schedd  # noqa: F401 - the fixture
from sqlalchemy import text

import jobstore
from jobstore.core.states import Event
from jobstore.db.engine import upgrade
from jobstore.submit import SubmitError
from jobstore.testing.factories import claim, claim_request, claimed, report
from jobstore.testing.support import ordinary_owner

REQ = claim_request(shape="s")


def sleep_job(**extra: str) -> htcondor2.Submit:
    return htcondor2.Submit({"executable": "/bin/sleep", "arguments": "60",
                             "transfer_executable": "false", **extra})


@BOTH_BACKENDS
def test_submit_and_query_as_htcondor2(schedd: Any) -> None:  # noqa: F811
    result = schedd.submit(sleep_job(), count=3)
    assert isinstance(result, jobstore.SubmitResult)
    assert (result.first_proc(), result.num_procs()) == (0, 3)
    cluster = result.cluster()
    ad = result.clusterad()
    assert isinstance(ad, classad2.ClassAd)
    assert (ad["ClusterId"], ad["NumProcs"], ad["Cmd"]) == (cluster, 3, "/bin/sleep")
    ads = schedd.query(f"ClusterId == {cluster}")
    assert [a["ProcId"] for a in ads] == [0, 1, 2]
    first = ads[0]
    assert isinstance(first, classad2.ClassAd)
    assert (first["JobStatus"], first["Owner"], first["Cmd"], first["NumJobStarts"]) == (
        1, ordinary_owner(), "/bin/sleep", 0)
    projected = schedd.query(f"ClusterId == {cluster}", ["ProcId", "JobStatus"], limit=2)
    assert [sorted(a.keys()) for a in projected] == [["JobStatus", "ProcId"]] * 2
    procs = schedd.query(classad2.ExprTree(f"ClusterId == {cluster}"),
                         callback=lambda a: a["ProcId"] * 10)
    assert procs == [0, 10, 20]
    assert schedd.query("ClusterId == -1") == []


@BOTH_BACKENDS
def test_submit_takes_text_dicts_itemdata_and_a_queue_override(schedd: Any) -> None:  # noqa: F811
    text_job = schedd.submit("executable = /bin/echo\narguments = hi\n"
                             "transfer_executable = false\nqueue 2\n")
    assert text_job.num_procs() == 2
    items = schedd.submit(sleep_job(arguments="$(secs) $(tag)"),
                          itemdata=iter([{"secs": "1", "tag": "a"}, {"secs": "2", "tag": "b"}]))
    args = [a["Args"] for a in schedd.query(f"ClusterId == {items.cluster()}")]  # old syntax
    assert args == ["1 a", "2 b"]
    lines = schedd.submit(
        htcondor2.Submit("executable = /bin/echo\narguments = $(x)-$(y)\n"
                         "transfer_executable = false\nqueue x, y from (\n  p q\n)\n"),
        itemdata=["1 one", "2 two"])
    assert [a["Args"] for a in schedd.query(f"ClusterId == {lines.cluster()}")] == [
        "1-one", "2-two"]
    inline = schedd.submit(htcondor2.Submit(
        "executable = /bin/echo\narguments = $(x)\ntransfer_executable = false\n"
        "queue x from (\n  a\n  b\n  c\n)\n"))
    assert inline.num_procs() == 3
    override = schedd.submit(sleep_job(), queue="queue 4")
    assert override.num_procs() == 4
    plain = schedd.submit({"executable": "/bin/true", "transfer_executable": "false"})
    assert plain.num_procs() == 1
    with pytest.raises(SubmitError, match="control character"):
        schedd.submit(sleep_job(), itemdata=[{"x": "a\nb"}])
    spooled = schedd.submit(sleep_job(), spool=True)  # the inputs are in the store anyway
    assert schedd.spool(spooled) is None and spooled.num_procs() == 1


@BOTH_BACKENDS
def test_act_returns_htcondor2_totals(schedd: Any) -> None:  # noqa: F811
    cluster = schedd.submit(sleep_job(), count=3).cluster()
    held = schedd.act(htcondor2.JobAction.Hold, [f"{cluster}.0", f"{cluster}.1"], "wait")
    assert isinstance(held, classad2.ClassAd)
    assert {n: held[n] for n in ("TotalSuccess", "TotalJobAds", "TotalNotFound",
                                 "TotalChangedAds")} == {
        "TotalSuccess": 2, "TotalJobAds": 2, "TotalNotFound": 0, "TotalChangedAds": 1}
    (ad,) = schedd.query(f"ClusterId == {cluster} && ProcId == 0", ["HoldReason",
                                                                    "HoldReasonCode"])
    assert (ad["HoldReason"], ad["HoldReasonCode"]) == ("wait", 1)
    again = schedd.act(htcondor2.JobAction.Hold, f"{cluster}.0")
    assert (again["TotalAlreadyDone"], again["TotalSuccess"]) == (1, 0)
    bad = schedd.act(htcondor2.JobAction.Release, f"{cluster}.2")  # idle: not held
    assert bad["TotalBadStatus"] == 1
    released = schedd.act(htcondor2.JobAction.Release, f"ClusterId == {cluster} && JobStatus == 5")
    assert released["TotalSuccess"] == 2
    missing = schedd.act(htcondor2.JobAction.Remove, [f"{cluster}.0", f"{cluster + 99}.0"])
    assert (missing["TotalSuccess"], missing["TotalNotFound"]) == (1, 1)
    gone = schedd.act(jobstore.JobAction.Remove, cluster)  # an int: the whole cluster
    # its removed member has left the queue: condor_rm of the cluster does not count it
    assert (gone["TotalJobAds"], gone["TotalSuccess"], gone["TotalAlreadyDone"]) == (2, 2, 0)
    with pytest.raises(ValueError, match="Suspend is not supported"):
        schedd.act(htcondor2.JobAction.Suspend, cluster)
    # htcondor2's own checks of what it is given
    for action in ("Hold", 1, None):
        with pytest.raises(TypeError, match="action must be a JobAction"):
            schedd.act(action, cluster)
    with pytest.raises(TypeError, match="flags must be a TransactionFlag"):
        schedd.edit(f"{cluster}.0", "JobPrio", "1", flags=1)
    with pytest.raises(ValueError):
        schedd.act(htcondor2.JobAction.Hold, [f"{cluster}.0", "1.2.3"])
    assert schedd.edit(f"{cluster + 99}.0", "JobPrio", "1",
                       flags=htcondor2.TransactionFlag.Default) == 0


@BOTH_BACKENDS
def test_edit_follows_condor_qedit(schedd: Any) -> None:  # noqa: F811
    cluster = schedd.submit(sleep_job(), count=2).cluster()
    assert schedd.edit(f"{cluster}.0", "JobPrio", "7") == 1
    assert schedd.edit(f"ClusterId == {cluster}", "MyTag", '"blue"') == 2
    ads = schedd.query(f"ClusterId == {cluster}", ["ProcId", "JobPrio", "MyTag"])
    assert [(a["JobPrio"], a["MyTag"]) for a in ads] == [(7, "blue"), (0, "blue")]
    reads = schedd.store.reads
    before = reads.get_job(reads.find_jobs(cluster, 1)[0].id).autocluster_id
    assert schedd.edit(f"{cluster}.1", "RequestMemory", 2048) == 1
    job = schedd.store.reads.find_jobs(cluster, 1)[0]
    assert (job.request_memory, job.autocluster_id != before) == (2048, True)
    events = schedd.store.reads.events(job.id)
    assert events[-1].event == "edit" and events[-1].reason == "RequestMemory = 2048"
    for attr in ("Owner", "ClusterId", "JobStatus", "JobstoreJobId", "ConcurrencyLimits"):
        with pytest.raises(ValueError, match="cannot be edited"):
            schedd.edit(f"{cluster}.0", attr, "1")
    with pytest.raises(ValueError, match="not a ClassAd expression"):
        schedd.edit(f"{cluster}.0", "MyTag", "(((")
    running = claim(schedd.store, REQ)
    assert running is not None
    assert schedd.edit(f"{running.cluster_id}.{running.proc_id}", "JobPrio", "9") == 0


@BOTH_BACKENDS
def test_history_newest_first_with_match_and_since(schedd: Any) -> None:  # noqa: F811
    cluster = schedd.submit(sleep_job(), count=3).cluster()
    for proc in (1, 0, 2):
        schedd.act(htcondor2.JobAction.Remove, f"{cluster}.{proc}")
    ads = schedd.history(f"ClusterId == {cluster}", ["ProcId", "JobStatus"])
    assert [(a["ProcId"], a["JobStatus"]) for a in ads] == [(2, 3), (0, 3), (1, 3)]
    assert [a["ProcId"] for a in schedd.history(None, ["ProcId"], match=1)] == [2]
    assert [a["ProcId"] for a in schedd.history(None, ["ProcId"], since=f"{cluster}.0")] == [2]
    assert schedd.query(f"ClusterId == {cluster}") == []  # finished: history only


@BOTH_BACKENDS
def test_submit_commits_and_rolls_back_with_the_callers_transaction(schedd: Any) -> None:  # noqa: F811
    engine = schedd.store.db.engine
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE workflow_steps (name VARCHAR(20))"))
    with pytest.raises(RuntimeError), engine.begin() as conn:
        conn.execute(text("INSERT INTO workflow_steps VALUES ('lost')"))
        lost = schedd.submit(sleep_job(), count=2, connection=conn)
        assert lost.num_procs() == 2
        raise RuntimeError("the workflow engine fails before its commit")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO workflow_steps VALUES ('kept')"))
        kept = schedd.submit(sleep_job(), count=2, connection=conn)
    with engine.connect() as conn:
        steps = [r[0] for r in conn.execute(text("SELECT name FROM workflow_steps"))]
    assert steps == ["kept"]
    queued = schedd.query(projection=["ClusterId", "ProcId"])  # the rolled-back jobs: gone
    assert [(a["ClusterId"], a["ProcId"]) for a in queued] == [(kept.cluster(), 0),
                                                              (kept.cluster(), 1)]
    submits = [e for j in kept.job_ids for e in schedd.store.reads.events(j) if e.event == "submit"]
    assert len(submits) == 2
    with engine.connect() as idle, pytest.raises(ValueError, match="inside a transaction"):
        schedd.submit(sleep_job(), connection=idle)


@BOTH_BACKENDS
def test_an_idempotency_key_queues_once(schedd: Any) -> None:  # noqa: F811
    first = schedd.submit(sleep_job(), count=2, idempotency_key="run-42/step-1")
    again = schedd.submit(sleep_job(), count=2, idempotency_key="run-42/step-1")
    assert (again.cluster(), again.job_ids) == (first.cluster(), first.job_ids)
    other = schedd.submit(sleep_job(), idempotency_key="run-42/step-2")
    assert other.cluster() != first.cluster()
    assert len(schedd.query()) == 3


@BOTH_BACKENDS
def test_owner_rules_as_submit(db_url: str, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    upgrade(db_url)
    monkeypatch.chdir(tmp_path)
    import os

    with jobstore.Schedd(url=db_url) as schedd:  # noqa: F811
        if os.geteuid() == 0:
            with pytest.raises(SubmitError, match="may not run as root"):
                schedd.submit(sleep_job())
        else:
            assert schedd.submit(sleep_job()).num_procs() == 1


@BOTH_BACKENDS
def test_a_user_hold_through_the_store_shows_in_query(schedd: Any) -> None:  # noqa: F811
    cluster = schedd.submit(sleep_job()).cluster()
    job = schedd.store.reads.find_jobs(cluster)[0]
    schedd.store.actions.admin(job.id, Event.HOLD, "by the admin")
    (ad,) = schedd.query(f"ClusterId == {cluster}", ["JobStatus", "HoldReason"])
    assert (ad["JobStatus"], ad["HoldReason"]) == (5, "by the admin")


def _guide_example() -> str:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "python-api.md").read_text()
    return guide.split("```python\n", 1)[1].split("```", 1)[0]


@BOTH_BACKENDS
def test_the_python_guides_htcondor2_workflow_runs(db_url: str) -> None:
    """docs/python-api.md's example, as written, run by an ordinary account in its own process."""
    import os
    import pwd
    import subprocess
    import sys
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="jobstore-guide-"))
    os.chmod(work, 0o777)
    if db_url.startswith("sqlite"):  # where the example's account can write
        db_url = f"sqlite:///{work / 'jobstore.db'}"
    upgrade(db_url)
    user = pwd.getpwnam(ordinary_owner()) if os.geteuid() == 0 else None
    if db_url.startswith("sqlite") and user is not None:  # her own store: one user's
        os.chown(work / "jobstore.db", user.pw_uid, user.pw_gid)
    code = f"DB = {db_url!r}\n" + _guide_example()
    out = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True,
                         text=True, timeout=120, user=user.pw_uid if user else None,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(work),
                              "CONDOR_CONFIG": "/dev/null"})
    try:
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[:2] == ["0 1 part 1 of a", "1 1 part 2 of a"]
        assert lines[-1] == "[1, 0]"  # both removed; the most recently finished first
    finally:
        shutil.rmtree(work, ignore_errors=True)


@BOTH_BACKENDS
def test_counters_agree_in_the_ad_the_json_and_the_tables(schedd: Any) -> None:  # noqa: F811
    """NumJobStarts, JobStartDate (the first start), JobCurrentStartDate, RemoteWallClockTime
    (not counted again by an update while running) and CompletionDate over two attempts, the
    same in the ad, the JSON form and RUN_TIME."""
    from jobstore.formats import views

    store = schedd.store
    cluster = schedd.submit(sleep_job()).cluster()
    t0 = 1_800_000_000.0
    first = claimed(store, REQ)
    report(store, first, Event.START, changes={"job_pid": 1}, now=t0)
    report(store, first, Event.EVICT, now=t0 + 100)
    second = claimed(store, REQ)
    report(store, second, Event.START, changes={"job_pid": 2}, now=t0 + 200)
    # a periodic update with new usage: the running attempt's time is counted once, at its end
    report(store, second, Event.START, changes={"job_pid": 2, "remote_user_cpu": 12.0},
           now=t0 + 215)
    report(store, second, Event.EXIT, changes={"exit_code": 0}, now=t0 + 230)
    job = store.reads.get_job(second.id)
    (ad,) = schedd.history(f"ClusterId == {cluster}")
    expected = {"NumJobStarts": 2, "JobStartDate": int(t0), "JobCurrentStartDate": int(t0 + 200),
                "RemoteWallClockTime": 130, "CompletionDate": int(t0 + 230)}
    assert {k: ad[k] for k in expected} == expected
    assert {k: views.job_json(job)[k] for k in expected} == expected
    assert views.job_rows([job], finished=True)[1][0][3] == "0+00:02:10"
    (hit,) = schedd.history("NumJobStarts == 2")  # the constraint in SQL agrees
    assert hit["ProcId"] == 0


@BOTH_BACKENDS
def test_htcondor2_contract_in_the_small_things(schedd: Any) -> None:  # noqa: F811
    """htcondor2's exception types, ServerTime, a callback's None, int() of a
    result, count with queue, a hold's (reason, code), jobEpochHistory, reschedule; and one
    kept connection between calls."""
    result = schedd.submit(sleep_job(), count=2)
    cluster = int(result)
    assert cluster == result.cluster()
    with pytest.raises(htcondor2.HTCondorException) as caught:
        schedd.submit({"executable": "/nonexistent/x"})
    assert isinstance(caught.value, SubmitError)  # still the package's own type
    with pytest.raises(htcondor2.HTCondorException):
        schedd.query("ClusterId ==")
    with pytest.raises(ValueError, match="count or queue"):
        schedd.submit(sleep_job(), count=2, queue="queue 3")
    (ad, _) = schedd.query(f"ClusterId == {cluster}")
    assert abs(ad["ServerTime"] - time.time()) < 60
    odd = schedd.query(f"ClusterId == {cluster}",
                       callback=lambda a: a["ProcId"] if a["ProcId"] else None)
    assert odd == [1]
    held = schedd.act(htcondor2.JobAction.Hold, f"{cluster}.0", reason=("disk full", 42))
    assert held["TotalSuccess"] == 1
    (ad,) = schedd.query(f"ClusterId == {cluster} && ProcId == 0",
                         ["HoldReason", "HoldReasonCode", "HoldReasonSubCode"])
    assert (ad["HoldReason"], ad["HoldReasonCode"], ad["HoldReasonSubCode"]) == (
        "disk full", 1, 42)
    assert schedd.reschedule() is None
    job = claim(schedd.store, REQ)
    assert job is not None and job.cluster_id == cluster
    report(schedd.store, job, Event.ACCEPT, lease=600)
    (epoch,) = schedd.jobEpochHistory(f"ClusterId == {cluster} && ProcId == 1")
    assert (epoch["ProcId"], epoch["NumShadowStarts"], epoch["RemoteHost"]) == (
        1, 1, "slot1@n")
    if schedd.store.db.can_listen:  # PostgreSQL's kept connection: one server process answers
        pids = set()
        for _ in range(3):
            with schedd.store.db.engine.connect() as conn:
                pids.add(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar())
            schedd.query(f"ClusterId == {cluster}")
        assert len(pids) == 1
