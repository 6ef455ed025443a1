"""Retention: finished jobs, their events, their sandbox files and their emptied clusters are
removed once they are older than the history's retention, in small batches (one short
transaction each), oldest first.

A batch locks its jobs (SKIP LOCKED: an admin command on one of them is never waited for) and
deletes their events by job id, the jobs, then the clusters left without a job. Events of one
job are written close together, so a batch of the oldest jobs deletes a nearly contiguous range of
`job_events` ids, and the pages autovacuum frees are reused by new events.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from sqlalchemy import Connection, delete, exists, func, or_, select, tuple_

from jobstore.core.states import FINAL
from jobstore.db.phases import status_in
from jobstore.db.schema import (
    clusters,
    dag_categories,
    dag_edges,
    dag_nodes,
    dagman_logs,
    dags,
    deliveries,
    job_events,
    job_files,
    jobs,
    logged_events,
    sandbox_chunks,
    sandbox_files,
    vacate_requests,
)
from jobstore.db.transactions import Transactions

FINAL_VALUES = tuple(s.value for s in FINAL)
PRUNE_BATCH = 500  # jobs per transaction


class Pruned(NamedTuple):
    """What a prune removed (or, on a dry run, would remove), and whether it stopped at its time
    budget with more left."""

    jobs: int = 0
    events: int = 0
    clusters: int = 0
    more: bool = False

    def __add__(self, other: object) -> Pruned:  # type: ignore[override]
        assert isinstance(other, Pruned)
        return Pruned(self.jobs + other.jobs, self.events + other.events,
                      self.clusters + other.clusters, other.more)


def _prunable(before: float):  # type: ignore[no-untyped-def]
    return (status_in(FINAL_VALUES), jobs.c.finished_at < before,
            jobs.c.winding_down_until.is_(None))


class Retention:
    """Removes history older than a cutoff."""

    def __init__(self, db: Transactions) -> None:
        self.db = db

    def prune(
        self,
        before: float,
        *,
        batch: int = PRUNE_BATCH,
        budget: float | None = None,
        dry_run: bool = False,
    ) -> Pruned:
        """Remove the jobs that finished before `before` (epoch seconds), with their events and
        emptied clusters, `batch` jobs per transaction, until none is left or `budget` seconds
        have passed. `dry_run` counts what would go and removes nothing."""
        if dry_run:
            return self._count(before)
        done = Pruned()
        deadline = None if budget is None else time.monotonic() + budget
        while True:
            step = self._prune_batch(before, batch)
            done += step
            if not step.more:
                return done
            if deadline is not None and time.monotonic() >= deadline:
                return done

    def _prune_batch(self, before: float, batch: int) -> Pruned:
        with self.db.transaction() as conn:
            rows = conn.execute(
                select(jobs.c.id, jobs.c.cluster_id, jobs.c.proc_id)
                .where(*_prunable(before))
                .order_by(jobs.c.finished_at)
                .limit(batch)
                .with_for_update(skip_locked=True)
            ).all()
            if not rows:
                return Pruned()
            ids = [r.id for r in rows]
            cluster_ids = sorted({r.cluster_id for r in rows})
            events = conn.execute(delete(job_events).where(job_events.c.job_id.in_(ids))).rowcount
            conn.execute(delete(jobs).where(jobs.c.id.in_(ids)))
            conn.execute(delete(deliveries).where(deliveries.c.job_id.in_(ids)))
            conn.execute(delete(logged_events).where(logged_events.c.job_id.in_(ids)))
            conn.execute(delete(vacate_requests).where(vacate_requests.c.job_id.in_(ids)))
            emptied = list(conn.execute(
                delete(clusters).where(
                    clusters.c.id.in_(cluster_ids),
                    ~exists().where(jobs.c.cluster_id == clusters.c.id),
                ).returning(clusters.c.id)
            ).scalars())
            _prune_files(conn, [(r.cluster_id, r.proc_id) for r in rows], emptied)
            _prune_dags(conn, before)
            return Pruned(len(ids), events, len(emptied), more=len(ids) == batch)

    def _count(self, before: float) -> Pruned:
        with self.db.transaction() as conn:
            old = select(jobs.c.id).where(*_prunable(before)).subquery()
            found = conn.execute(select(func.count()).select_from(old)).scalar_one()
            events = conn.execute(
                select(func.count()).select_from(job_events)
                .where(job_events.c.job_id.in_(select(old.c.id)))
            ).scalar_one()
        return Pruned(int(found), int(events), 0)


def _prune_dags(conn: Connection, before: float) -> None:
    """The DAGs that ended before `before` and whose nodes' jobs are all gone: their rows and
    their own cluster id."""
    node_jobs = (select(1).select_from(dag_nodes.join(jobs, jobs.c.cluster_id
                                                       == dag_nodes.c.cluster_id))
                 .where(dag_nodes.c.dag_id == dags.c.id))
    gone = list(conn.execute(select(dags.c.id).where(
        dags.c.finished_at < before, ~exists(node_jobs)).limit(PRUNE_BATCH)).scalars())
    if not gone:
        return
    for table in (dag_edges, dag_categories, dag_nodes, dagman_logs):
        conn.execute(delete(table).where(table.c.dag_id.in_(gone)))
    conn.execute(delete(dags).where(dags.c.id.in_(gone)))
    conn.execute(delete(clusters).where(clusters.c.id.in_(gone)))


def _prune_files(conn: Connection, pruned: list[tuple[int, int]], emptied: list[int]) -> None:
    """The sandbox files of pruned jobs: their outputs and checkpoints, the inputs of their
    emptied clusters, and the contents no job lists any more."""
    gone = conn.execute(delete(job_files).where(
        or_(tuple_(job_files.c.cluster_id, job_files.c.proc_id).in_(pruned)
            & (job_files.c.direction != "in"),
            job_files.c.cluster_id.in_(emptied)),
    ).returning(job_files.c.owner, job_files.c.sha256)).all()
    for owner, sha in sorted({(r.owner, r.sha256) for r in gone}):
        listed = exists().where(job_files.c.owner == owner, job_files.c.sha256 == sha)
        if not conn.execute(select(listed)).scalar():
            conn.execute(delete(sandbox_chunks).where(sandbox_chunks.c.owner == owner,
                                                      sandbox_chunks.c.sha256 == sha))
            conn.execute(delete(sandbox_files).where(sandbox_files.c.owner == owner,
                                                     sandbox_files.c.sha256 == sha))
