"""NumJobStarts of an attempt whose exit report came before its start report, and subscribe()
without the harmless repeats unless asked."""

from __future__ import annotations

import time

import pytest

from jobstore.api.watch import JobFinished, watch
from jobstore.core.jobs import JobEvent
from jobstore.core.states import Event
from jobstore.db.store import JobStore
from jobstore.formats import views
from jobstore.testing.factories import claim, claim_request, report, submit
from jobstore.testing.support import ordinary_owner

REQ = claim_request(shape="s")


def _ran_without_a_start_report(store: JobStore) -> int:
    """A job whose attempt exited before its start report came; then the late start report."""
    (job_id,) = submit(store, owner=ordinary_owner())
    job = claim(store, REQ)
    assert job is not None
    report(store, job, Event.ACCEPT, lease=600)
    done = report(store, job, Event.EXIT, changes={"exit_code": 0})
    assert done.after == "completed"
    late = report(store, job, Event.START)
    assert late.stale
    return job_id


def test_an_attempt_that_exited_counts_as_started(store: JobStore) -> None:
    job_id = _ran_without_a_start_report(store)
    ad = views.job_ad(store.reads.get_job(job_id), keyword="JOBSTORE", uid_domain="x")
    assert ad["NumJobStarts"] == 1 and ad["JobStartDate"] > 0


@pytest.mark.parametrize("repeats", [False, True])
def test_subscribe_leaves_out_the_harmless_repeats_unless_asked(store: JobStore,
                                                                repeats: bool) -> None:
    job_id = _ran_without_a_start_report(store)
    job = store.reads.get_job(job_id)
    records: list[object] = []
    sub = watch(store, records.append, jobs=[f"{job.cluster_id}.{job.proc_id}"], since=0,
                poll=True, interval=0.05, repeats=repeats)
    try:
        end = time.monotonic() + 10
        while not any(isinstance(r, JobFinished) for r in records):
            assert time.monotonic() < end
            time.sleep(0.05)
        time.sleep(1.0)  # the stale report's event comes after the job's end
    finally:
        sub.close()
    events = [r.event for r in records if isinstance(r, JobEvent)]
    expected = ["submit", "fetch", "accept", "exit"] + (["start"] if repeats else [])
    assert events == expected
