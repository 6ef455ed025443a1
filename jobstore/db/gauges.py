"""What the store's metrics show (jobstore metrics), from statements whose cost does not grow
with the history: the unfinished jobs by queue and status (a scan of the partial index
ix_jobs_unfinished), the claims among the newest events (a bounded range of job_events ids),
the submitters' table, and the planner's estimate of the jobs table's rows."""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import func, select

from jobstore.core.states import FINAL, Event
from jobstore.db.phases import status_not_in
from jobstore.db.schema import job_events, jobs, submitters
from jobstore.db.transactions import Transactions

CLAIM_SCAN = 100_000  # newest events looked at for the claims of the last window


class QueueGauge(NamedTuple):
    queue: str
    status: str
    jobs: int
    oldest_submitted: float | None  # the earliest submit time among them


class SubmitterGauge(NamedTuple):
    name: str
    priority: float
    factor: float
    usage: float  # accumulated slot-seconds, decayed (condor_userprio's Usage)
    in_use: float  # weighted slots held now


class StoreGauges(NamedTuple):
    queues: list[QueueGauge]
    submitters: list[SubmitterGauge]
    claims: int  # fetch events in the last `window` seconds (among the newest CLAIM_SCAN)
    window: float
    last_event_id: int
    rows_estimate: int | None  # the jobs table's rows, as the planner estimates (PostgreSQL)


class Gauges:
    """The store's metrics."""

    def __init__(self, db: Transactions) -> None:
        self.db = db

    def gauges(self, now: float, *, window: float = 60.0) -> StoreGauges:
        active = (
            select(jobs.c.queue, jobs.c.status, func.count(), func.min(jobs.c.submitted_at))
            .where(status_not_in(FINAL))
            .group_by(jobs.c.queue, jobs.c.status)
            .order_by(jobs.c.queue, jobs.c.status)
        )
        with self.db.transaction() as conn:
            queues = [QueueGauge(r[0], r[1], int(r[2]), r[3]) for r in conn.execute(active)]
            last = int(conn.execute(select(func.coalesce(func.max(job_events.c.id), 0)))
                       .scalar_one())
            claims = int(conn.execute(
                select(func.count()).select_from(job_events).where(
                    job_events.c.id > last - CLAIM_SCAN,
                    job_events.c.event == Event.FETCH.value,
                    job_events.c.time >= now - window,
                )).scalar_one())
            users = [SubmitterGauge(r.name, r.priority, r.factor, r.usage, r.in_use)
                     for r in conn.execute(select(submitters).order_by(submitters.c.name))]
            estimate = self.db.backend.rows_estimate(conn)
        return StoreGauges(queues, users, claims, window, last, estimate)
