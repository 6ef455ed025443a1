#!/usr/bin/env python3
"""What polling costs the database: `jobstore q` summaries and constraints, and a watcher's poll,
set against a plain full `SELECT * FROM jobs` fetched completely, in the same run.

A PostgreSQL database `jobstore_bench_q_<hex>` is created with 1,000,000 jobs (100,000 with
--quick) and one event per job, bulk-loaded with INSERT ... SELECT generate_series (not through
Submissions.submit), then ANALYZEd. Each query is the SQL the job store itself runs (captured from
SQLAlchemy while JobStore runs it), timed (median of --repeat runs, interleaved with the
baseline) and run once more under EXPLAIN (ANALYZE, BUFFERS) for shared buffers hit/read. The
figures are printed as ratios to the baseline; the database is dropped at the end.

Usage: .venv/bin/python bench/queries.py [--quick] [--repeat N] [--db-url ADMIN_URL]
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy import event, select
from sqlalchemy.engine import make_url

from jobstore.db.backends.postgresql.queries import without_begin
from jobstore.db.constraint import plan
from jobstore.db.engine import upgrade
from jobstore.db.schema import jobs
from jobstore.db.store import JobStore
from jobstore.testing.support import libpq_url

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
OWNERS = 50
SELECTIVE = 'Owner == "user7" && JobStatus == 5 && RequestCpus > 2'
BROAD = "RequestCpus >= 1 && JobStatus =!= 4"
# status by g % 20: mostly finished, as in a queue that has run for a while
STATUS_SQL = (
    "CASE WHEN g %% 20 < 12 THEN 'completed' WHEN g %% 20 < 16 THEN 'idle'"
    " WHEN g %% 20 < 18 THEN 'running' WHEN g %% 20 = 18 THEN 'held' ELSE 'failed' END"
)


def populate(url: str, n: int) -> None:
    """n jobs in 1,000-job clusters with varied owners, requests and statuses; one event each."""
    ad = json.dumps({"Cmd": "/bin/sleep", "Arguments": "10", "Iwd": "/tmp", "Project": "bench"})
    now = time.time()
    with psycopg.connect(libpq_url(url)) as conn:
        conn.execute(
            "INSERT INTO clusters (owner, queue, num_procs, submitted_at)"
            " SELECT 'user' || (c %% %s), 'default', 1000, %s"
            " FROM generate_series(0, %s::int - 1) AS c",
            (OWNERS, now, (n + 999) // 1000),
        )
        conn.execute(
            "INSERT INTO jobs (cluster_id, proc_id, queue, status, priority, owner, ad, cmd,"
            " request_cpus, request_memory, request_disk, max_attempts, success_exit_code,"
            " claims, attempts, exit_code, submitted_at, updated_at)"
            f" SELECT g / 1000 + 1, g %% 1000, CASE WHEN g %% 7 = 0 THEN 'gpu' ELSE 'default' END,"
            f" {STATUS_SQL}, g %% 3, 'user' || ((g / 1000) %% %s), %s::json, '/bin/sleep',"
            " 1 + g %% 4, 128 * (1 + g %% 8), 1024, 5, 0, 1, 1,"
            " CASE WHEN g %% 20 < 12 THEN 0 END, %s, %s"
            " FROM generate_series(0, %s::int - 1) AS g",
            (OWNERS, ad, now, now, n),
        )
        conn.execute(
            "INSERT INTO job_events (job_id, time, event, from_status, to_status, attempt)"
            " SELECT id, %s, 'submit', NULL, 'idle', 0 FROM jobs ORDER BY id",
            (now,),
        )
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


class Capture:
    """The statements a JobStore call sends, to EXPLAIN exactly those."""

    def __init__(self, store: JobStore) -> None:
        self.last: tuple[str, Any] | None = None
        event.listen(store.db.engine, "before_cursor_execute", self._hook)

    def _hook(self, conn: Any, cursor: Any, statement: str, params: Any, *_a: Any) -> None:
        statement = without_begin(statement)  # the transaction's first statement
        if statement.lstrip().upper().startswith(("SELECT", "WITH")):
            self.last = (statement, params)


def explain(store: JobStore, statement: str, params: Any) -> tuple[int, int]:
    """Shared buffers (hit, read) of one EXPLAIN (ANALYZE, BUFFERS) run of `statement`."""
    with store.db.engine.connect() as conn:
        out = conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params
        ).scalar()
    if out is None:
        raise RuntimeError("EXPLAIN returned nothing")
    top = (json.loads(out) if isinstance(out, str) else out)[0]["Plan"]
    return int(top.get("Shared Hit Blocks", 0)), int(top.get("Shared Read Blocks", 0))


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    result = fn()
    return time.perf_counter() - t, result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100,000 jobs instead of 1,000,000")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs of each query")
    ap.add_argument("--db-url", default=DEFAULT_ADMIN_URL, help="server and CREATEDB account")
    args = ap.parse_args()
    n = 100_000 if args.quick else 1_000_000
    name = f"jobstore_bench_q_{secrets.token_hex(6)}"
    admin = libpq_url(args.db_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_url(args.db_url).set(database=name).render_as_string(hide_password=False)
    store = None
    try:
        upgrade(url)
        t0 = time.perf_counter()
        populate(url, n)
        print(f"{n:,} jobs and {n:,} events loaded in {time.perf_counter() - t0:.1f} s", flush=True)
        store = JobStore.from_url(url, statement_timeout_ms=None)
        cap = Capture(store)
        last_id = n - 50  # a watcher that is 50 events behind

        def full() -> int:
            with store.db.engine.connect() as conn:
                return len(conn.execute(select(jobs)).fetchall())

        def poll() -> int:
            with store.db.engine.connect() as conn:
                return len(
                    conn.exec_driver_sql(
                        "SELECT * FROM job_events WHERE id > %(last)s ORDER BY id LIMIT 100",
                        {"last": last_id},
                    ).fetchall()
                )

        cases: list[tuple[str, Callable[[], Any]]] = [
            ("full SELECT * FROM jobs (baseline)", full),
            ("q -autocluster (not finished)", lambda: store.reads.autoclusters()),
            ("q -autocluster -a (all jobs)", lambda: store.reads.autoclusters(include_final=True)),
            (
                f"q -a -constraint '{SELECTIVE}'",
                lambda: store.reads.list_jobs(include_final=True, where=plan(SELECTIVE).where),
            ),
            (
                f"q -a -constraint '{BROAD}'",
                lambda: store.reads.list_jobs(include_final=True, where=plan(BROAD).where),
            ),
            ("watch poll: job_events id > last LIMIT 100", poll),
        ]
        times: dict[str, list[float]] = {label: [] for label, _ in cases}
        sizes: dict[str, int] = {}
        statements: dict[str, tuple[str, Any]] = {}
        for _ in range(args.repeat):  # interleaved: the machine's noise hits all alike
            for label, fn in cases:
                cap.last = None
                dt, result = timed(fn)
                times[label].append(dt)
                sizes[label] = result if isinstance(result, int) else len(result)
                if cap.last:
                    statements[label] = cap.last
        base_t = statistics.median(times[cases[0][0]])
        base_hit, base_read = explain(store, *statements[cases[0][0]])
        base_buf = max(1, base_hit + base_read)
        print(f"\nPostgreSQL, {n:,} jobs; median of {args.repeat} runs; buffers = shared hit+read")
        header = f"{'query':<58} {'rows':>9} {'ms':>9} {'time':>7}"
        header += f" {'hit':>8} {'read':>8} {'buf':>7}"
        print(header)
        print("-" * len(header))
        for label, _ in cases:
            t = statistics.median(times[label])
            hit, read = explain(store, *statements[label])
            print(
                f"{label[:58]:<58} {sizes[label]:>9,} {t * 1000:>9.1f} {t / base_t:>7.4f}"
                f" {hit:>8,} {read:>8,} {(hit + read) / base_buf:>7.4f}"
            )
        print("\ntime and buf are ratios to the baseline (full SELECT of the jobs table)")
        return 0
    finally:
        if store is not None:
            store.db.engine.dispose()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


if __name__ == "__main__":
    sys.exit(main())
