"""Outputs home, in the store: a cluster submitted from an access point names it, its
completed jobs with outputs are due there (and nowhere else) until delivered, each taken
under a lease by one service at a time; a spooled cluster is never due; the record goes with
the job."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from backends import BOTH_BACKENDS

from jobstore.db.schema import clusters, deliveries
from jobstore.db.store import JobStore
from jobstore.errors import InvalidInput
from jobstore.testing.factories import completed, job_spec

HOME = "ap1.example.org"


def _submit(store: JobStore, home: str | None, owner: str = "alice") -> int:
    return store.submissions.submit([job_spec()], owner=owner, queue="default",
                                    max_attempts=3, home=home)[1][0]


def _complete(store: JobStore, tmp: Path, outputs: bool = True) -> int:
    """The next idle job run to completion, having sent one output."""
    path = tmp / f"out.{time.monotonic_ns()}"
    path.write_text("an output\n")
    return completed(store, {"out.txt": path} if outputs else None).id


@BOTH_BACKENDS
def test_a_completed_job_is_due_at_its_home_alone_until_delivered(store: JobStore,
                                                                  tmp_path: Path) -> None:
    job_id = _submit(store, HOME)
    with store.db.transaction() as conn:
        assert conn.execute(clusters.select()).one().home == HOME
    now = time.time()
    assert store.deliveries.due(HOME, now) == []  # idle: not yet
    _complete(store, tmp_path)
    (job,) = store.deliveries.due(HOME, time.time())
    assert job.id == job_id and job.token is None  # the attempt's token is never read
    assert store.deliveries.due("ap2.example.org", time.time()) == []
    assert store.deliveries.due(HOME, time.time(), owner="bob") == []
    assert store.deliveries.due(HOME, time.time(), since=time.time() + 60) == []
    now = time.time()
    assert store.deliveries.take(job, HOME, now, 300.0)
    assert not store.deliveries.take(job, HOME, now, 300.0)  # leased: nobody else
    assert store.deliveries.due(HOME, now) == []
    assert store.deliveries.due(HOME, now + 301) != []  # the lease of a service that died
    assert store.deliveries.take(job, HOME, now + 301, 300.0)
    store.deliveries.delivered(job_id, 1, now + 302)
    assert store.deliveries.due(HOME, now + 10_000) == []  # once delivered, never again
    assert not store.deliveries.take(job, HOME, now + 10_000, 300.0)
    record = store.deliveries.of([job_id])[job_id]
    assert (record.home, record.files, record.error) == (HOME, 1, None)
    assert record.delivered_at == now + 302


def test_a_failed_delivery_is_tried_again_later_with_its_reason(store: JobStore,
                                                                tmp_path: Path) -> None:
    _submit(store, HOME)
    job_id = _complete(store, tmp_path)
    (job,) = store.deliveries.due(HOME, time.time())
    now = time.time()
    assert store.deliveries.take(job, HOME, now, 300.0)
    store.deliveries.failed(job_id, "permission denied", now, 60.0)
    record = store.deliveries.of([job_id])[job_id]
    assert (record.error, record.failures) == ("permission denied", 1)
    assert store.deliveries.due(HOME, now + 30) == []
    later = now + 61  # due again, however long ago it finished
    assert [j.id for j in store.deliveries.due(HOME, later, since=later)] == [job_id]
    assert store.deliveries.take(job, HOME, later, 300.0)
    store.deliveries.failed(job_id, "permission denied", later, 60.0)
    assert store.deliveries.due(HOME, later + 119) == []  # twice as long after each failure
    assert [j.id for j in store.deliveries.due(HOME, later + 121)] == [job_id]
    assert store.deliveries.due("ap2.example.org", later + 121) == []


def test_a_delivery_that_keeps_failing_is_given_up(store: JobStore, tmp_path: Path) -> None:
    from jobstore.db.deliveries import GIVE_UP

    _submit(store, HOME)
    job_id = _complete(store, tmp_path)
    now = time.time()
    for n in range(GIVE_UP):
        (job,) = store.deliveries.due(HOME, now)
        assert store.deliveries.take(job, HOME, now, 300.0)
        store.deliveries.failed(job_id, f"failure {n}", now, 60.0)
        now += 60.0 * 2 ** n + 1
    assert store.deliveries.due(HOME, now + 10**6) == []
    assert store.deliveries.of([job_id])[job_id].failures == GIVE_UP


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_row_that_cannot_be_read_is_given_up_not_raised(store: JobStore,
                                                          tmp_path: Path) -> None:
    """Whoever owns a SQLite file may write any row: an ad that is no JSON is that job's
    failure, recorded once, never the reader's."""
    _submit(store, HOME)
    bad = _complete(store, tmp_path)
    _submit(store, HOME)
    good = _complete(store, tmp_path)
    with store.db.engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE jobs SET ad = 'garbage' WHERE id = {bad}")
    assert [j.id for j in store.deliveries.due(HOME, time.time())] == [good]
    assert store.deliveries.of([bad])[bad].error == "its row in the job store cannot be read"
    assert [j.id for j in store.deliveries.due(HOME, time.time())] == [good]


def test_spooled_jobs_and_jobs_without_outputs_are_never_due(store: JobStore,
                                                             tmp_path: Path) -> None:
    _submit(store, None)
    _complete(store, tmp_path)
    _submit(store, HOME)
    _complete(store, tmp_path, outputs=False)
    assert store.deliveries.due(HOME, time.time() + 10_000) == []


@BOTH_BACKENDS
def test_the_door_refuses_a_home_that_is_not_a_name(store: JobStore) -> None:
    for bad in ("", "a b", "-x", "x\ny", "h" * 256, "../etc"):
        with pytest.raises(InvalidInput, match="not the name of an access point"):
            _submit(store, bad)
    _submit(store, "schedd1@ap1.example.org")  # SCHEDD_NAME's form
    with store.db.transaction() as conn:
        assert [r.home for r in conn.execute(clusters.select())] == ["schedd1@ap1.example.org"]


def test_the_record_goes_with_its_pruned_job(store: JobStore, tmp_path: Path) -> None:
    _submit(store, HOME)
    job_id = _complete(store, tmp_path)
    (job,) = store.deliveries.due(HOME, time.time())
    assert store.deliveries.take(job, HOME, time.time(), 300.0)
    store.deliveries.delivered(job_id, 1, time.time())
    assert store.retention.prune(time.time() + 1).jobs == 1
    with store.db.transaction() as conn:
        assert conn.execute(deliveries.select()).all() == []
