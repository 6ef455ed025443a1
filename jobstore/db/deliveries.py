"""Outputs home: the finished jobs whose outputs an access point's `jobstore schedd` writes
into their Iwd, each taken under a lease and marked delivered once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import and_, exists, or_, select, update

from jobstore.core.jobs import Job
from jobstore.core.states import Status
from jobstore.db.backends import Value
from jobstore.db.phases import status_in
from jobstore.db.reads import public_jobs
from jobstore.db.sandbox import OUT
from jobstore.db.schema import clusters, deliveries, job_files, jobs
from jobstore.db.transactions import Transactions

GIVE_UP = 8  # failed deliveries of a job after which none is tried (transfer-data still works)


@dataclass(frozen=True)
class Delivery:
    """What the store knows of one job's outputs home."""

    job_id: int
    attempt: int
    home: str
    leased_until: float
    delivered_at: float | None
    files: int | None
    error: str | None
    failures: int


class Deliveries:
    """The jobs an access point delivers, and the record of each delivery."""

    def __init__(self, db: Transactions) -> None:
        self.db = db

    def due(self, home: str, now: float, *, owner: str | None = None, since: float = 0.0,
            limit: int = 100) -> list[Job]:
        """Completed jobs of clusters whose home is `home` (of `owner` alone, if given) that
        stored outputs and are neither delivered nor leased: those that finished at `since` or
        later, and those whose failed delivery is due again; oldest first."""
        sent = exists().where(
            job_files.c.cluster_id == jobs.c.cluster_id, job_files.c.proc_id == jobs.c.proc_id,
            job_files.c.owner == jobs.c.owner, job_files.c.direction == OUT)
        settled = exists().where(
            deliveries.c.job_id == jobs.c.id,
            or_(deliveries.c.delivered_at.is_not(None), deliveries.c.leased_until > now,
                deliveries.c.failures >= GIVE_UP))
        again = (select(deliveries.c.job_id)
                 .where(deliveries.c.home == home, deliveries.c.delivered_at.is_(None),
                        deliveries.c.leased_until <= now, deliveries.c.failures < GIVE_UP)
                 .order_by(deliveries.c.leased_until).limit(limit))
        recent = (select(jobs.c.id)
                  .join(clusters, and_(clusters.c.id == jobs.c.cluster_id,
                                       clusters.c.home == home))
                  .where(status_in([Status.COMPLETED]), jobs.c.finished_at >= since, sent,
                         ~settled)
                  .order_by(jobs.c.finished_at, jobs.c.id).limit(limit))
        if owner is not None:
            recent = recent.where(jobs.c.owner == owner)
            again = again.where(exists().where(jobs.c.id == deliveries.c.job_id,
                                               jobs.c.owner == owner))
        with self.db.transaction() as conn:
            ids = list(conn.execute(recent).scalars())
            ids += [i for i in conn.execute(again).scalars() if i not in ids]
        found = self._read(ids, home, now)
        return sorted(found, key=lambda j: (j.finished_at or 0.0, j.id))

    def _read(self, ids: list[int], home: str, now: float) -> list[Job]:
        """The jobs of `ids`; one whose row cannot be read is given up, never raised."""
        if not ids:
            return []
        try:
            with self.db.transaction() as conn:
                return [Job.from_row(r._mapping)
                        for r in conn.execute(public_jobs().where(jobs.c.id.in_(ids)))]
        except (ValueError, TypeError, KeyError):  # a row written past the door (SQLite)
            pass
        found = []
        for job_id in ids:
            try:
                with self.db.transaction() as conn:
                    row = conn.execute(public_jobs().where(jobs.c.id == job_id)).first()
                    if row is not None:
                        found.append(Job.from_row(row._mapping))
            except (ValueError, TypeError, KeyError):
                self._give_up(job_id, home, now, "its row in the job store cannot be read")
        return found

    def _give_up(self, job_id: int, home: str, now: float, why: str) -> None:
        with self.db.transaction() as conn:
            row: dict[str, Value] = {"job_id": job_id, "attempt": 0, "home": home,
                                     "leased_until": now, "error": why, "failures": GIVE_UP}
            if not self.db.backend.insert_missing(conn, deliveries, row, ["job_id"]):
                conn.execute(update(deliveries).where(deliveries.c.job_id == job_id)
                             .values(error=why, failures=GIVE_UP))

    def take(self, job: Job, home: str, now: float, lease: float) -> bool:
        """Lease `job`'s delivery to `home` for `lease` seconds: False when it is delivered
        or another holds the lease."""
        fresh: dict[str, Value] = {"job_id": job.id, "attempt": job.claims, "home": home,
                 "leased_until": now + lease}
        with self.db.transaction() as conn:
            if self.db.backend.insert_missing(conn, deliveries, fresh, ["job_id"]):
                return True
            taken = conn.execute(
                update(deliveries)
                .where(deliveries.c.job_id == job.id, deliveries.c.delivered_at.is_(None),
                       deliveries.c.leased_until <= now)
                .values(attempt=job.claims, home=home, leased_until=now + lease))
            return taken.rowcount == 1

    def delivered(self, job_id: int, files: int, now: float) -> None:
        """Record `job_id`'s outputs written home (`files` of them)."""
        with self.db.transaction() as conn:
            conn.execute(update(deliveries)
                         .where(deliveries.c.job_id == job_id,
                                deliveries.c.delivered_at.is_(None))
                         .values(delivered_at=now, files=files, error=None))

    def failed(self, job_id: int, error: str, now: float, retry_after: float) -> None:
        """Record why `job_id`'s outputs could not be written; tried again after `retry_after`
        seconds, twice as long after each further failure, not after GIVE_UP of them."""
        with self.db.transaction() as conn:
            row = conn.execute(select(deliveries.c.failures).where(
                deliveries.c.job_id == job_id, deliveries.c.delivered_at.is_(None))).first()
            if row is None:
                return
            done = row.failures if isinstance(row.failures, int) else GIVE_UP  # an odd row
            done = min(max(done, 0), GIVE_UP)
            conn.execute(update(deliveries)
                         .where(deliveries.c.job_id == job_id,
                                deliveries.c.delivered_at.is_(None))
                         .values(error=error[:1000], failures=done + 1,
                                 leased_until=now + retry_after * 2 ** min(done, 6)))

    def of(self, job_ids: Sequence[int]) -> dict[int, Delivery]:
        """The delivery record of each of `job_ids` that has one."""
        if not job_ids:
            return {}
        q = select(deliveries).where(deliveries.c.job_id.in_(list(job_ids)))
        with self.db.transaction() as conn:
            return {r.job_id: Delivery(**r._mapping) for r in conn.execute(q)}
