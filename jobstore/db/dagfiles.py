"""A DAG's NODE_STATUS_FILE on the access point: which DAGs' status files are due (a running
DAG's every `status_every` seconds, an ended DAG's once more), and when each was written
(`dag_files`), so that a restarted service goes on where it stopped."""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import and_, case, func, or_, select

from jobstore.db.eventlogs import DAG_ENDED
from jobstore.db.schema import clusters, dag_files, dags
from jobstore.db.transactions import Transactions

DEFAULT_EVERY = 60  # DAGMan's minimumUpdateTime
LEAST_EVERY = 5  # seconds between two writes of one file, whatever the DAG asks


class DagFile(NamedTuple):
    """A DAG whose node status file is due."""

    dag_id: int
    owner: str
    ended: bool
    path: str


class DagFiles:
    """The node status files an access point keeps current."""

    def __init__(self, db: Transactions) -> None:
        self.db = db

    def due(self, home: str, now: float, *, owner: str | None = None,
            limit: int = 100) -> list[DagFile]:
        """The DAGs submitted on `home` (of `owner` alone, if given) with a node status file
        to write: those running whose file was written `status_every` seconds ago or more
        (LEAST_EVERY at least; or never), and those ended whose file was not written since;
        least recently written first."""
        ended = dags.c.status.in_(DAG_ENDED)
        asked = func.coalesce(dags.c.status_every, DEFAULT_EVERY)
        every = case((asked < LEAST_EVERY, LEAST_EVERY), else_=asked)
        q = (select(dags.c.id, dags.c.owner, dags.c.status, dags.c.status_file)
             .join(clusters, and_(clusters.c.id == dags.c.id, clusters.c.home == home))
             .outerjoin(dag_files, dag_files.c.dag_id == dags.c.id)
             .where(dags.c.status_file.is_not(None),
                    or_(dag_files.c.dag_id.is_(None),
                        and_(ended, dag_files.c.final.is_(False)),
                        and_(~ended, dag_files.c.written_at + every <= now)))
             .order_by(dag_files.c.written_at.nulls_first(), dags.c.id).limit(limit))
        if owner is not None:
            q = q.where(dags.c.owner == owner)
        with self.db.transaction() as conn:
            return [DagFile(r.id, r.owner, r.status in DAG_ENDED, r.status_file)
                    for r in conn.execute(q)]

    def written(self, dag: DagFile, at: float) -> None:
        """Record the DAG's status file written (or given up) at `at`; after its end, for the
        last time."""
        with self.db.transaction() as conn:
            self.db.backend.upsert(conn, dag_files, [
                {"dag_id": dag.dag_id, "written_at": at, "final": dag.ended}], "dag_id",
                ["written_at", "final"])


__all__ = ["DEFAULT_EVERY", "DagFile", "DagFiles"]
