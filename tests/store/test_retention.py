"""Retention: finished jobs, their events and emptied clusters are pruned in small batches once
older than the history's retention; nothing else is touched (idle, held, running jobs, attempts
still winding down, clusters with a job left)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from jobstorecli import cli, db  # noqa: F401 - the CLI fixture
from sqlalchemy import func, select, text

from jobstore.core.durations import describe, parse_duration
from jobstore.core.states import Event
from jobstore.db.schema import STORAGE_PARAMETERS, clusters, job_events, jobs
from jobstore.db.store import JobStore
from jobstore.testing.factories import report, running, submit


def _count(store: JobStore, table, *where) -> int:  # type: ignore[no-untyped-def]
    with store.db.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(table).where(*where))
                   .scalar_one())


def _complete(store: JobStore) -> int:
    job = running(store, lease=600)
    report(store, job, Event.EXIT, changes={"exit_code": 0})
    assert store.reads.get_job(job.id).status == "completed"
    return job.id


def test_prune_removes_only_finished_history(store: JobStore) -> None:
    done_a = submit(store, 2)  # cluster A: both will complete -> the cluster goes too
    (stopped,) = submit(store)
    done_b, idle_b = submit(store, 2)  # cluster B: one completes, one stays idle
    (held,) = submit(store)
    finished = [_complete(store) for _ in range(2)]
    assert running(store, lease=600).id == stopped
    store.actions.admin(stopped, Event.REMOVE, "removed while it runs")  # still winding down
    finished.append(_complete(store))
    assert sorted(finished) == sorted([*done_a, done_b])
    store.actions.admin(held, Event.HOLD, "kept")
    (removed,) = submit(store)
    store.actions.admin(removed, Event.REMOVE, "removed while idle")
    events_before = _count(store, job_events)
    kept_events = _count(store, job_events, job_events.c.job_id.in_([idle_b, held, stopped]))

    assert store.retention.prune(time.time() - 3600) == (0, 0, 0, False)  # nothing that old
    would = store.retention.prune(time.time() + 1, dry_run=True)
    assert (would.jobs, _count(store, jobs)) == (4, 7)
    done = store.retention.prune(time.time() + 1, batch=1)
    assert (done.jobs, done.events, done.clusters, done.more) == (4, would.events, 2, False)
    left = {j.id: j.status for j in store.reads.list_jobs(include_final=True)}
    assert left == {idle_b: "idle", held: "held", stopped: "removed"}
    assert _count(store, job_events) == kept_events == events_before - done.events
    assert _count(store, clusters) == 3  # cluster A and the idle-removed job's went

    # the winding-down attempt ends: then it is history like the others
    job = store.reads.get_job(stopped)
    store.reports.report(stopped, Event.EXIT, token=None, attempt=job.claims,
                         changes={"exit_code": 0})
    assert store.retention.prune(time.time() + 1).jobs == 1


def test_prune_stops_at_its_budget_and_takes_turns_pool_wide(store: JobStore) -> None:
    ids = submit(store, 5)
    for job_id in ids:
        store.actions.admin(job_id, Event.REMOVE, "gone")
    first = store.retention.prune(time.time() + 1, batch=2, budget=0)
    assert (first.jobs, first.more) == (2, True)
    now = time.time() + 10
    due = store.maintenance.prune_due(5, 60, now=now)
    assert due is not None and (due.jobs, due.more) == (3, False)
    assert store.maintenance.prune_due(5, 60, now=now + 30) is None  # another node pruned 30 s ago
    assert store.maintenance.prune_due(5, 60, now=now + 61) == (0, 0, 0, False)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_storage_parameters_are_set_on_postgresql(store: JobStore) -> None:
    with store.db.engine.connect() as conn:
        found: dict[str, Any] = dict(conn.execute(text(
            "SELECT relname, reloptions FROM pg_class WHERE relname = ANY(:names)"),
            {"names": list(STORAGE_PARAMETERS)}).all())
    for table, params in STORAGE_PARAMETERS.items():
        assert sorted(found[table]) == sorted(f"{k}={v}" for k, v in params.items()), table


def test_durations() -> None:
    assert parse_duration("2592000") == parse_duration("30d") == 30 * 86400
    assert parse_duration(" 12h ") == 43200 and parse_duration("1.5m") == 90
    assert describe(30 * 86400) == "30d" and describe(90) == "90s" and describe(7200) == "2h"
    for bad in ("", "30 days", "-1", "d"):
        with pytest.raises(ValueError, match="is not a duration"):
            parse_duration(bad)


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_prune_command(db: str, tmp_path: Path) -> None:  # noqa: F811
    store = JobStore.from_url(db)
    try:
        (gone,) = submit(store)
        (idle,) = submit(store)
        store.actions.admin(gone, Event.REMOVE, "gone")
        idle_cluster = store.reads.get_job(idle).cluster_id
    finally:
        store.db.engine.dispose()
    dry = cli(db, "prune", "--older-than", "0", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("1 job(s) finished over 0s ago would be removed, with 2 event")
    kept = cli(db, "prune")  # the default retention: 30 days
    assert kept.returncode == 0 and kept.stdout.startswith("0 job(s) finished over 30d ago")
    done = cli(db, "prune", "--older-than", "0")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("1 job(s) finished over 0s ago removed, with 2 event(s) and 1 emptied"
                           " cluster(s).\n")
    history = cli(db, "history")
    assert history.returncode == 0 and history.stdout.splitlines()[1:] == []
    q = cli(db, "q", "-af", "ClusterId", "ProcId")
    assert q.stdout.split() == [str(idle_cluster), "0"]
    bad = cli(db, "prune", "--older-than", "a month")
    assert bad.returncode == 2 and "'a month' is not a duration" in bad.stderr
    assert "Traceback" not in bad.stderr
    kept_forever = cli(db, "prune", env={"_CONDOR_JOBSTORE_HISTORY_RETENTION": "0"})
    assert kept_forever.stdout.startswith("JOBSTORE_HISTORY_RETENTION is 0")
    wrong = cli(db, "prune", env={"_CONDOR_JOBSTORE_HISTORY_RETENTION": "forever"})
    assert wrong.returncode == 1
    # the parameter the value came from, as the admin wrote it
    assert wrong.stderr.startswith(
        "jobstore: JOBSTORE_HISTORY_RETENTION: 'forever' is not a duration")


def test_init_warns_when_the_server_does_not_autovacuum(pg_url: str,
                                                          condor_config: Path) -> None:
    """The tables' autovacuum settings need autovacuum: `jobstore init` says when it is off."""
    import psycopg

    from jobstore.testing.support import first, libpq_url

    with psycopg.connect(libpq_url(pg_url), autocommit=True) as conn:
        on = first(conn.execute("SHOW autovacuum")) == "on"
    done = cli(pg_url, "init", env={"CONDOR_CONFIG": str(condor_config)})
    assert done.returncode == 0 and done.stdout.startswith("job store ready")
    warned = "jobstore: warning: autovacuum is off on this server" in done.stderr
    assert warned == (not on), done.stderr
