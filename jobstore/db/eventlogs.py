"""The job event logs an access point's `jobstore schedd` writes: those of the jobs submitted
there (`clusters.home`) whose log no committing process writes (`jobs.user_log` NULL: the
submit kept the log, `UserLog`, in the ad alone)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy import and_, select

from jobstore.db.schema import clusters, jobs
from jobstore.db.transactions import Transactions

MAX_PATH = 4096


class HomeLog(NamedTuple):
    """One job's event log, as its access point writes it: the path (None: the job has none,
    or what its ad holds is no absolute path) and the account it is written as."""

    owner: str
    path: str | None


class EventLogs:
    """Which jobs' event logs an access point writes, and where."""

    def __init__(self, db: Transactions) -> None:
        self.db = db

    def logs_of(self, job_ids: Sequence[int], home: str) -> dict[int, HomeLog]:
        """The jobs among `job_ids` whose event log the access point `home` writes, by id;
        a job whose ad cannot be read has no log (never raised)."""
        q = (select(jobs.c.id, jobs.c.owner, jobs.c.ad)
             .join(clusters, and_(clusters.c.id == jobs.c.cluster_id, clusters.c.home == home))
             .where(jobs.c.id.in_(job_ids), jobs.c.user_log.is_(None)))
        try:
            with self.db.transaction() as conn:
                return {r.id: HomeLog(r.owner, _path(r.ad)) for r in conn.execute(q)}
        except (ValueError, TypeError):  # an ad written past the door (SQLite): one at a time
            pass
        found: dict[int, HomeLog] = {}
        for job_id in job_ids:
            one = select(jobs.c.id, jobs.c.owner).join(
                clusters, and_(clusters.c.id == jobs.c.cluster_id, clusters.c.home == home),
            ).where(jobs.c.id == job_id, jobs.c.user_log.is_(None))
            with self.db.transaction() as conn:
                row = conn.execute(one).first()
            if row is None:
                continue
            try:
                with self.db.transaction() as conn:
                    ad = conn.execute(select(jobs.c.ad).where(jobs.c.id == job_id)).scalar()
            except (ValueError, TypeError):
                ad = None
            found[job_id] = HomeLog(row.owner, _path(ad))
        return found


def _path(ad: object) -> str | None:
    """The ad's UserLog when it is an absolute path of one line."""
    value = ad.get("UserLog") if isinstance(ad, dict) else None
    if (not isinstance(value, str) or not value.startswith("/") or len(value) > MAX_PATH
            or any(c in value for c in "\0\n\r")):
        return None
    return value


__all__ = ["EventLogs", "HomeLog"]
