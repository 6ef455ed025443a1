"""The job event logs an access point's `jobstore schedd` writes: those of the jobs submitted
there (`clusters.home`) whose log no committing process writes (`jobs.user_log` NULL: the
submit kept the log, `UserLog`, in the ad alone), and the own log of each DAG submitted there
(`dagman_logs`: what of it was written)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from sqlalchemy import and_, or_, select

from jobstore.db.schema import clusters, dagman_logs, dags, jobs, logged_events
from jobstore.db.transactions import Transactions

MAX_PATH = 4096


class HomeLog(NamedTuple):
    """One job's event log, as its access point writes it: the path (None: the job has none,
    or what its ad holds is no absolute path), the account it is written as, and the last of
    the job's events appended to it (0: none)."""

    owner: str
    path: str | None
    through: int = 0


class DagLog(NamedTuple):
    """A DAG whose own log is due: its DAGManJobId, owner, DAG file, how it stands, and what
    of its log was written (0 nothing, 1 its start, 2 its end too)."""

    dag_id: int
    owner: str
    path: str
    status: str
    exit_code: int | None
    created_at: float
    finished_at: float | None
    written: int


DAG_ENDED = ("completed", "failed", "removed")
DAG_STARTED, DAG_DONE = 1, 2


class EventLogs:
    """Which jobs' event logs an access point writes, and where."""

    def __init__(self, db: Transactions) -> None:
        self.db = db

    def logs_of(self, job_ids: Sequence[int], home: str) -> dict[int, HomeLog]:
        """The jobs among `job_ids` whose event log the access point `home` writes, by id;
        a job whose ad cannot be read has no log (never raised)."""
        q = (select(jobs.c.id, jobs.c.owner, jobs.c.ad, logged_events.c.event_id)
             .join(clusters, and_(clusters.c.id == jobs.c.cluster_id, clusters.c.home == home))
             .outerjoin(logged_events, logged_events.c.job_id == jobs.c.id)
             .where(jobs.c.id.in_(job_ids), jobs.c.user_log.is_(None)))
        try:
            with self.db.transaction() as conn:
                return {r.id: HomeLog(r.owner, _path(r.ad), r.event_id or 0)
                        for r in conn.execute(q)}
        except (ValueError, TypeError):  # an ad written past the door (SQLite): one at a time
            pass
        found: dict[int, HomeLog] = {}
        for job_id in job_ids:
            one = select(jobs.c.id, jobs.c.owner, logged_events.c.event_id).join(
                clusters, and_(clusters.c.id == jobs.c.cluster_id, clusters.c.home == home),
            ).outerjoin(logged_events, logged_events.c.job_id == jobs.c.id).where(
                jobs.c.id == job_id, jobs.c.user_log.is_(None))
            with self.db.transaction() as conn:
                row = conn.execute(one).first()
            if row is None:
                continue
            try:
                with self.db.transaction() as conn:
                    ad = conn.execute(select(jobs.c.ad).where(jobs.c.id == job_id)).scalar()
            except (ValueError, TypeError):
                ad = None
            found[job_id] = HomeLog(row.owner, _path(ad), row.event_id or 0)
        return found

    def logged(self, through: Mapping[int, int]) -> None:
        """Record the last event of each job (`through`: job id -> event id) appended to its
        log, or given up."""
        if not through:
            return
        with self.db.transaction() as conn:
            self.db.backend.upsert(conn, logged_events, [
                {"job_id": job_id, "event_id": event_id}
                for job_id, event_id in sorted(through.items())], "job_id", ["event_id"])

    def dags_due(self, home: str, *, owner: str | None = None, since: float = 0.0,
                 limit: int = 100) -> list[DagLog]:
        """The DAGs submitted on `home` (of `owner` alone, if given) that began or ended at
        `since` or later and whose own log lacks what they did, oldest first."""
        target = and_(dags.c.status.in_(DAG_ENDED), dagman_logs.c.written < DAG_DONE)
        q = (select(dags.c.id, dags.c.owner, dags.c.path, dags.c.status, dags.c.exit_code,
                    dags.c.created_at, dags.c.finished_at, dagman_logs.c.written)
             .join(clusters, and_(clusters.c.id == dags.c.id, clusters.c.home == home))
             .outerjoin(dagman_logs, dagman_logs.c.dag_id == dags.c.id)
             .where(or_(dags.c.created_at >= since, dags.c.finished_at >= since),
                    or_(dagman_logs.c.written.is_(None), target))
             .order_by(dags.c.id).limit(limit))
        if owner is not None:
            q = q.where(dags.c.owner == owner)
        with self.db.transaction() as conn:
            return [DagLog(r.id, r.owner, r.path, r.status, r.exit_code, r.created_at,
                           r.finished_at, r.written or 0) for r in conn.execute(q)]

    def dag_logged(self, dag_id: int, written: int, now: float) -> None:
        """Record what of the DAG's own log is written."""
        with self.db.transaction() as conn:
            self.db.backend.upsert(conn, dagman_logs, [
                {"dag_id": dag_id, "written": written, "updated_at": now}], "dag_id",
                ["written", "updated_at"])


def _path(ad: object) -> str | None:
    """The ad's UserLog when it is an absolute path of one line."""
    value = ad.get("UserLog") if isinstance(ad, dict) else None
    if (not isinstance(value, str) or not value.startswith("/") or len(value) > MAX_PATH
            or any(c in value for c in "\0\n\r")):
        return None
    return value


__all__ = ["DAG_DONE", "DAG_ENDED", "DAG_STARTED", "DagLog", "EventLogs", "HomeLog"]
