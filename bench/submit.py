#!/usr/bin/env python3
"""Bulk submit: `jobstore submit` of a `queue N` file and `jobstore.Schedd.submit` of
N items in one transaction, against a bare COPY of as many rows into a table of the jobs' shape
measured in the same run; and the submitting process's peak memory at N and at N / 4.

N = 100,000 (20,000 with --quick). PostgreSQL, or SQLite with --sqlite (multi-row INSERTs).
Usage: .venv/bin/python bench/submit.py [--quick] [--sqlite] [--db-url URL]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

import psycopg
from common import DEFAULT_ADMIN_URL, REPO, cleanup, create_pg, create_sqlite, make_env, say, table

from jobstore.testing.support import ensure_account, libpq_url

OWNER = "alice"
SUBMIT = """\
executable = /bin/echo
arguments = job $(Process) of $(Item)
transfer_executable = false
request_memory = 64
queue {n} Item in (bench)
"""
API = """\
import os, sys, time, htcondor2, jobstore
from sqlalchemy import create_engine
n, url, owner = int(sys.argv[1]), sys.argv[2], sys.argv[3]
schedd = jobstore.Schedd(url=url, owner=owner)
sub = htcondor2.Submit({{"executable": "/bin/echo", "arguments": "item $(x)",
                        "transfer_executable": "false"}})
engine = create_engine(url)
start = time.perf_counter()
with engine.begin() as conn:
    schedd.submit(sub, itemdata=({{"x": str(i) + sys.argv[4]}} for i in range(n)),
                  connection=conn)
print(time.perf_counter() - start)
"""


def cli_submit(url: str, path: str) -> tuple[float, int]:
    """(seconds, peak RSS in KiB) of `jobstore submit` in its own process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    done = subprocess.run([str(REPO / ".venv" / "bin" / "jobstore"), "--db", url, "submit",
                           path, "--owner", OWNER], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip())
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return seconds, max(peak, before)


def api_submit(url: str, n: int, owner: str = OWNER, suffix: str = "") -> float:
    """Seconds of `Schedd.submit` of n items in the caller's transaction (`owner` "": the
    session's own account); `suffix` after each item's number (" x": no template, each job
    made by the client)."""
    done = subprocess.run([sys.executable, "-c", API.format(), str(n), url, owner, suffix],
                          capture_output=True, text=True, cwd="/tmp")
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip()[-400:])
    return float(done.stdout.strip().splitlines()[-1])


def bare_copy(url: str, n: int) -> float:
    """COPY of n rows of the jobs' shape (the same columns a submit fills) into a copy of the
    table, in one transaction: what the database alone costs."""
    with psycopg.connect(libpq_url(url)) as conn:
        conn.execute("CREATE TABLE bare_jobs (LIKE jobs INCLUDING DEFAULTS INCLUDING GENERATED)")
        conn.commit()
        now = time.time()
        start = time.perf_counter()
        with conn.cursor() as cur, cur.copy(
                "COPY bare_jobs (id, cluster_id, proc_id, queue, status, priority, owner, ad,"
                " cmd, request_cpus, request_memory, request_disk, max_attempts,"
                " success_exit_code, claims, attempts, submitted_at, updated_at, submitter)"
                " FROM STDIN") as copy:
            for i in range(n):
                copy.write_row((i + 1, 1, i, "default", "idle", 0, OWNER,
                                f'{{"Cmd": "/bin/echo", "Arguments": "job {i} of 1"}}',
                                "/bin/echo", 1, 64, 1024, 3, 0, 0, 0, now, now, OWNER))
        conn.commit()
        return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sqlite", action="store_true")
    ap.add_argument("--db-url", default=os.environ.get("JOBSTORE_BENCH_DATABASE_URL"))
    args = ap.parse_args()
    n = 20_000 if args.quick else 100_000
    ensure_account(OWNER, uid=1001)
    env = make_env(args.db_url or DEFAULT_ADMIN_URL)
    try:
        if args.sqlite:
            create_sqlite(env)
            url = env.sqlite_url
            os.chmod(env.tmp / "jobstore.db", 0o666)
        else:
            create_pg(env)
            url = env.pg_url
        runs: list[tuple[str, float, int]] = []  # (what, seconds, jobs)
        peaks = {}
        for count in (n // 4, n):
            path = env.tmp / f"queue-{count}.sub"
            path.write_text(SUBMIT.format(n=count))
            seconds, peaks[count] = cli_submit(url, str(path))
            runs.append((f"jobstore submit, queue {count}", seconds, count))
        runs.append((f"Schedd.submit of {n} items in the caller's transaction",
                     api_submit(url, n), n))
        runs.append(("the same, items with a space (each job made by the client)",
                     api_submit(url, n, suffix=" x"), n))
        per_job_bare = None
        if not args.sqlite:
            bare = bare_copy(url, n)
            runs.append((f"bare COPY of {n} rows", bare, n))
            per_job_bare = bare / n
        say(table(["submit", "seconds", "jobs/s", "x bare COPY per job"], [
            [what, f"{seconds:.2f}", f"{jobs / seconds:,.0f}",
             "" if per_job_bare is None else f"{seconds / jobs / per_job_bare:.1f}"]
            for what, seconds, jobs in runs]))
        say(f"peak RSS of `jobstore submit`: {peaks[n // 4] / 1024:.0f} MiB at {n // 4} jobs, "
            f"{peaks[n] / 1024:.0f} MiB at {n} (ratio {peaks[n] / peaks[n // 4]:.2f})")
        return 0
    finally:
        cleanup(env)


if __name__ == "__main__":
    sys.exit(main())
