"""Many jobs fast for the tests: copies of a submitted job, made in the database itself
(`clone`), and a queue filled with them (`fill`)."""

from __future__ import annotations

import time

import sqlalchemy as sa

from jobstore.core.jobs import JOB_COLUMNS, JobSpec
from jobstore.db.engine import upgrade
from jobstore.db.schema import job_events, jobs
from jobstore.db.store import JobStore

_COPIED = [c for c in JOB_COLUMNS if c not in ("id", "proc_id", "status", "priority")]


def clone(store: JobStore, job_id: int, n: int, *, status: str = "idle",
          priority: str = "priority") -> None:
    """`n` copies of job `job_id` with proc ids after its cluster's last, in `status`;
    `priority` is an SQL expression of the copy's number `i` (default: the job's own)."""
    pg = store.db.engine.dialect.name == "postgresql"
    if pg:
        series, prefix = f"generate_series(1, {n}) AS g(i)", ""
    else:
        series = "s"
        prefix = f"WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {n}) "
    cols = ", ".join(_COPIED)
    with store.db.engine.begin() as conn:
        base = conn.execute(sa.text("SELECT max(proc_id) FROM jobs WHERE cluster_id = "
                                    "(SELECT cluster_id FROM jobs WHERE id = :id)"),
                            {"id": job_id}).scalar_one()
        conn.execute(sa.text(
            f"INSERT INTO jobs (proc_id, status, priority, {cols}) {prefix}"
            f"SELECT {base} + i, :status, {priority}, {cols} FROM jobs, {series} WHERE id = :id"
        ), {"id": job_id, "status": status})
        conn.exec_driver_sql("ANALYZE")


def fill(url: str, n: int, owner: str) -> list[int]:
    """One cluster of n idle jobs (one autocluster) with their submit events, copied in bulk."""
    upgrade(url)
    store = JobStore.from_url(url)
    try:
        _, (first,) = store.submissions.submit([JobSpec(cmd="/bin/true", iwd="/tmp")], owner=owner,
                                               queue="default", max_attempts=3)
        clone(store, first, n - 1)
        now = time.time()
        with store.db.engine.begin() as conn:
            ids = list(conn.execute(sa.select(jobs.c.id).order_by(jobs.c.id)).scalars())
            conn.execute(
                job_events.insert(),
                [
                    dict(job_id=i, time=now, event="submit", to_status="idle", attempt=0)
                    for i in ids[1:]
                ],
            )
        return ids
    finally:
        store.db.engine.dispose()
