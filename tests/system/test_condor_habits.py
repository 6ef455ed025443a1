"""condor_q / condor_rm habits: users as arguments, -all,
-constraint, -wide, -af:FLAGS, ids with filters; an action on many jobs is set-based in pages,
acts on the members it can, reports the rest, and records one event per job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from backends import BOTH_BACKENDS
from jobstorecli import cli, db, submit  # noqa: F401 - the db fixture
from sqlalchemy import func, select

from jobstore.core.states import Event
from jobstore.db import actions
from jobstore.db.engine import upgrade
from jobstore.db.schema import job_events, jobs
from jobstore.db.store import JobStore
from jobstore.submit.description import parse_submit_text
from jobstore.testing.factories import claim, claim_request
from jobstore.testing.support import ordinary_owner

REQ = claim_request(slot="slot1@node", shape="node")


def _sub(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.sub"
    path.write_text(f"executable = /bin/echo\ntransfer_executable = false\n{text}")
    return path


def _q(db_url: str, *args: str) -> list[dict]:
    r = cli(db_url, "q", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_users_all_and_constraints(db: str, tmp_path: Path) -> None:  # noqa: F811
    me = ordinary_owner()
    assert submit(db, _sub(tmp_path, "arguments = a long argument list\nqueue 3\n")).returncode == 0
    assert submit(db, _sub(tmp_path, "priority = 5\nqueue 2\n")).returncode == 0
    assert len(_q(db, me)) == 5 and _q(db, "nosuchuser") == []
    assert [j["proc_id"] for j in _q(db, "2", "-s", "idle")] == [0, 1]  # ids honour the filters
    assert _q(db, "2", "--owner", "nosuchuser") == [] and _q(db, "2", "-q", "other") == []
    wide = cli(db, "q", "-wide").stdout
    assert "/bin/echo a long argument list" in wide
    header, *rows = cli(db, "q", "-af:jh", "Owner", "JobPrio").stdout.splitlines()
    assert header == "ID Owner JobPrio" and rows[-1] == f"2.1 {me} 5"
    assert cli(db, "q", "-af:z", "Owner").returncode == 1
    held = cli(db, "hold", "-constraint", "JobPrio == 5", "-reason", "wait")
    assert held.returncode == 0 and "2 job(s) held" in held.stdout
    assert {j["status"] for j in _q(db, "2")} == {"held"}
    released = cli(db, "release", "-constraint", "JobPrio > 1")
    assert released.returncode == 0 and "2 job(s) released" in released.stdout
    one = cli(db, "rm", "1.0")
    assert one.returncode == 0 and "Job 1.0: idle -> removed" in one.stdout
    # a cluster of which one member is finished: the others are removed, the command succeeds
    cluster = cli(db, "rm", "1")
    assert cluster.returncode == 0, cluster.stderr
    assert "Job 1.1: idle -> removed" in cluster.stdout and "1.0" not in cluster.stdout
    again = cli(db, "rm", "1")
    assert again.returncode == 1 and "no unfinished job 1" in again.stderr
    everything = cli(db, "rm", "-all")
    assert everything.returncode == 0 and "2 job(s) removed" in everything.stdout
    assert _q(db) == []
    events = json.loads(cli(db, "q", "--json", "--all", "1.1").stdout)
    assert events and events[0]["status"] == "removed"
    lines = cli(db, "events", "1.1").stdout
    assert "removed by " in lines and "administrator" not in lines  # by the account acting
    nothing = cli(db, "rm")
    assert nothing.returncode == 1 and "name the jobs: JOB, USER" in nothing.stderr


def _page_times(store: JobStore, event: str, ids: list[int]) -> int:
    """How many transactions wrote `event` for `ids` (a page's events share its time)."""
    with store.db.engine.connect() as conn:
        return int(conn.execute(select(func.count(job_events.c.time.distinct())).where(
            job_events.c.event == event, job_events.c.job_id.in_(ids))).scalar_one())


@BOTH_BACKENDS
def test_a_big_cluster_is_acted_on_in_pages(db_url: str) -> None:
    """Pages of 100 here: every job removed, one event each, in as many transactions."""
    upgrade(db_url)
    store = JobStore.from_url(db_url)
    try:
        specs = parse_submit_text("executable = /bin/true\nqueue 1050\n", base_dir="/tmp")
        cluster, ids = store.submissions.submit(specs, owner=ordinary_owner(), queue="default",
                                                max_attempts=3)
        store.actions.admin(ids[7], Event.HOLD, "held first")
        store.actions.admin(ids[8], Event.REMOVE, "gone first")
        totals = store.actions.act_where(jobs.c.cluster_id == cluster, Event.REMOVE, "all of it",
                                         page=100)
        assert (totals.success, totals.already_done, totals.bad_status, totals.denied) == (
            1049, 0, 0, 0)
        assert _page_times(store, "remove", ids[9:]) == 11  # 1,050 jobs, 100 a page
        assert len(totals.outcomes) == actions.SHOWN
        with store.db.engine.connect() as conn:
            statuses: dict[str, int] = dict(conn.execute(select(jobs.c.status, func.count()).where(
                jobs.c.cluster_id == cluster).group_by(jobs.c.status)).all())
            removes = conn.execute(select(func.count()).select_from(job_events).where(
                job_events.c.event == "remove", job_events.c.job_id.in_(ids))).scalar()
        assert statuses == {"removed": 1050} and removes == 1050
        held = store.reads.get_job(ids[7])
        assert held.hold_code is None and held.reason == "all of it"
        # nothing left to act on: nothing done, nothing counted
        assert store.actions.act_where(jobs.c.cluster_id == cluster, Event.HOLD, "x").acted_on == 0
    finally:
        store.db.engine.dispose()


@BOTH_BACKENDS
def test_a_big_cluster_is_edited_in_pages(db: str) -> None:  # noqa: F811
    """condor_qedit of a cluster: the waiting jobs edited a page per transaction, one event
    each, moved to their new autocluster together; a running member left as it is."""
    store = JobStore.from_url(db)
    try:
        specs = parse_submit_text("executable = /bin/true\nqueue 1050\n", base_dir="/tmp")
        cluster, ids = store.submissions.submit(specs, owner=ordinary_owner(), queue="default",
                                                max_attempts=3)
        store.actions.admin(ids[3], Event.HOLD, "held first")
        running = claim(store, REQ)
        assert running is not None and running.id == ids[0]
        before = store.reads.get_job(ids[5]).autocluster_id
        totals = store.actions.edit_where(jobs.c.cluster_id == cluster, "RequestMemory", "2048",
                                          page=100)
        assert (totals.success, totals.bad_status, totals.denied) == (1049, 1, 0)
        edited = store.reads.find_jobs(cluster)
        assert {j.request_memory for j in edited[1:]} == {2048}
        assert edited[0].request_memory != 2048 and edited[0].status == "fetched"
        assert len({j.autocluster_id for j in edited[1:]}) == 1
        assert edited[5].autocluster_id != before and edited[3].status == "held"
        assert _page_times(store, "edit", ids) == 11
        assert [e.reason for e in store.reads.events(ids[9]) if e.event == "edit"] == [
            "RequestMemory = 2048"]
        with pytest.raises(ValueError, match="cannot be edited"):
            store.actions.edit_where(jobs.c.cluster_id == cluster, "Owner", '"root"')
    finally:
        store.db.engine.dispose()
    r = cli(db, "qedit", str(cluster), "MyTag", '"blue"')
    assert r.returncode == 0 and "for 1049 job(s)" in r.stdout, r.stderr
    tags = cli(db, "q", str(cluster), "-af", "MyTag").stdout.split()
    assert tags.count("blue") == 1049 and tags.count("undefined") == 1
