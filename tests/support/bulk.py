"""Many jobs fast for the tests: copies of a submitted job, made in the database itself."""

from __future__ import annotations

import sqlalchemy as sa

from jobstore.core.jobs import JOB_COLUMNS
from jobstore.db.store import JobStore

_COPIED = [c for c in JOB_COLUMNS if c not in ("id", "proc_id", "status", "priority")]


def clone(store: JobStore, job_id: int, n: int, *, status: str = "idle",
          priority: str = "priority") -> None:
    """`n` copies of job `job_id` with proc ids after its cluster's last, in `status`;
    `priority` is an SQL expression of the copy's number `i` (default: the job's own)."""
    pg = store.engine.dialect.name == "postgresql"
    if pg:
        series, prefix = f"generate_series(1, {n}) AS g(i)", ""
    else:
        series = "s"
        prefix = f"WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {n}) "
    cols = ", ".join(_COPIED)
    with store.engine.begin() as conn:
        base = conn.execute(sa.text("SELECT max(proc_id) FROM jobs WHERE cluster_id = "
                                    "(SELECT cluster_id FROM jobs WHERE id = :id)"),
                            {"id": job_id}).scalar_one()
        conn.execute(sa.text(
            f"INSERT INTO jobs (proc_id, status, priority, {cols}) {prefix}"
            f"SELECT {base} + i, :status, {priority}, {cols} FROM jobs, {series} WHERE id = :id"
        ), {"id": job_id, "status": status})
        conn.exec_driver_sql("ANALYZE")
