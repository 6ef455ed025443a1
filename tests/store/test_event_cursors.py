"""Event logs on the access point, in the store: a job submitted there keeps its log in its ad
alone (no committing process writes it), and is that access point's to log; a cursor kept in
the store lets a restarted follower go on where it stopped, nothing missed, nothing twice; a
DAG's own log is due as the DAG starts and as it ends, and its record goes with it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from backends import BOTH_BACKENDS

from jobstore.api.feed import EventFollower
from jobstore.core.states import Event
from jobstore.db.eventcursors import EventCursor
from jobstore.db.eventlogs import HomeLog
from jobstore.db.schema import event_cursors
from jobstore.db.store import JobStore
from jobstore.testing.factories import job_spec

HOME = "ap1.example.org"


def _submit(store: JobStore, home: str | None, log: str | None = "/home/alice/jobs.log") -> int:
    return store.submissions.submit([job_spec(user_log=log)], owner="alice", queue="default",
                                    max_attempts=3, home=home)[1][0]


@BOTH_BACKENDS
def test_a_job_submitted_on_an_access_point_is_its_own_to_log(store: JobStore) -> None:
    homed, spooled, silent, elsewhere = (_submit(store, HOME), _submit(store, None),
                                         _submit(store, HOME, None), _submit(store, "ap2"))
    job = store.reads.get_job(homed)
    assert (job.user_log, job.ad["UserLog"]) == (None, "/home/alice/jobs.log")
    assert store.reads.get_job(spooled).user_log == "/home/alice/jobs.log"
    assert store.event_logs.logs_of([homed, spooled, silent, elsewhere], HOME) == {
        homed: HomeLog("alice", "/home/alice/jobs.log"), silent: HomeLog("alice", None)}


@BOTH_BACKENDS
def test_a_kept_cursor_goes_on_where_it_stopped(store: JobStore) -> None:
    first = _submit(store, HOME)
    assert store.event_cursors.get("userlog:ap1") is None
    follower = EventFollower(store, 0)
    seen = [r.event.id for r in follower.read()[0]]
    store.event_cursors.save("userlog:ap1", EventCursor(follower.high, follower.gaps), 1.0)
    second = _submit(store, HOME)
    store.actions.admin(first, Event.HOLD, "why")
    kept = store.event_cursors.get("userlog:ap1")
    assert kept is not None and kept.high == max(seen)
    again = EventFollower(store, kept.high, gaps=kept.gaps)
    later = [(r.event.job_id, r.event.event) for r in again.read()[0]]
    assert later == [(second, "submit"), (first, "hold")]
    store.event_cursors.save("userlog:ap1", EventCursor(again.high, {3: None, 4: 99}), 2.0)
    assert store.event_cursors.get("userlog:ap1") == EventCursor(again.high, {3: None, 4: 99})


def test_what_is_kept_that_is_no_cursor_keeps_no_gaps(store: JobStore) -> None:
    with store.db.engine.begin() as conn:
        conn.execute(event_cursors.insert().values(name="userlog:ap1", high=5,
                                                   gaps='{"not": "pairs"}', updated_at=0))
    assert store.event_cursors.get("userlog:ap1") == EventCursor(5, {})


@BOTH_BACKENDS
def test_a_dags_own_log_is_due_as_it_starts_and_as_it_ends(
        store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobstore.api.dags import submit_dag
    from jobstore.db.eventlogs import DAG_DONE, DAG_STARTED
    from jobstore.db.schema import dagman_logs
    from jobstore.node import config

    (tmp_path / "a.sub").write_text("executable = /bin/true\nqueue\n")
    (tmp_path / "one.dag").write_text("JOB A a.sub\n")
    monkeypatch.setenv("JOBSTORE_DATABASE_URL", store.db.engine.url.render_as_string(False))

    def queued(home: str) -> int:
        monkeypatch.setenv("JOBSTORE_SCHEDD_NAME", home)
        return submit_dag(store, str(tmp_path / "one.dag"), config.load_settings(None),
                          owner="alice").dag_id

    mine, theirs = queued(HOME), queued("ap2")
    (due,) = store.event_logs.dags_due(HOME)
    assert (due.dag_id, due.owner, due.written) == (mine, "alice", 0)
    assert due.path == str(tmp_path / "one.dag")
    assert store.event_logs.dags_due(HOME, owner="bob") == []
    store.event_logs.dag_logged(mine, DAG_STARTED, 1.0)
    assert store.event_logs.dags_due(HOME) == []  # running: nothing more until it ends
    assert store.dags.remove_dag(mine)
    (due,) = store.event_logs.dags_due(HOME)
    assert (due.status, due.written) == ("removed", DAG_STARTED)
    store.event_logs.dag_logged(mine, DAG_DONE, 2.0)
    assert store.event_logs.dags_due(HOME) == []
    assert [d.dag_id for d in store.event_logs.dags_due("ap2")] == [theirs]
    store.retention.prune(time.time() + 1)  # the record goes with its DAG
    with store.db.transaction() as conn:
        assert conn.execute(dagman_logs.select()).all() == []


def test_a_cursor_with_more_gaps_than_kept_is_kept_lower(store: JobStore,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_GAPS ids not seen yet, the cursor is kept below the first it cannot keep: a
    follower resumed from it reads again what lies past, and misses none of them."""
    from jobstore.db import eventcursors

    monkeypatch.setattr(eventcursors, "MAX_GAPS", 2)
    store.event_cursors.save("userlog:ap1", EventCursor(100, {10: 5, 20: None, 30: 7}), 1.0)
    assert store.event_cursors.get("userlog:ap1") == EventCursor(29, {10: 5, 20: None})
