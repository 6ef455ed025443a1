#!/usr/bin/env python3
"""Retention and bloat over a long steady run (issue 14): jobs submitted, claimed, started and
completed at a steady rate through JobStore (as the hooks drive it), finished history pruned as
the agents prune it (JOBSTORE_HISTORY_RETENTION short here), autovacuum with the schema's
per-table settings. Every sample gives each table's live and dead tuples and its size with its
indexes; the verdict compares the last samples with the first after warm-up (the size at the end /
the size after warm-up, per table: flat is about 1).

Default one hour at 20 jobs/s with a retention of 120 s; --quick: 6 minutes.
PostgreSQL. Usage: .venv/bin/python bench/bloat.py [--quick] [--minutes M] [--rate R]
                   [--retention S] [--db-url URL]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import psycopg
from common import DEFAULT_ADMIN_URL, cleanup, create_pg, make_env, say, table

from jobstore.core.claims import ClaimRequest, Offer, Verdict
from jobstore.core.jobs import JobSpec
from jobstore.core.states import Event
from jobstore.db.store import JobStore
from jobstore.testing.support import libpq_url

TABLES = ("jobs", "job_events", "clusters")
PRUNE_EVERY = 10.0  # seconds; the agents' JOBSTORE_PRUNE_INTERVAL, shortened with the retention
FLAT = 1.25  # the largest end / warm-up size ratio still called flat


def sample(url: str) -> dict[str, tuple[int, int, int]]:
    """Per table: (live tuples, dead tuples, bytes with indexes and TOAST)."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname, n_live_tup, n_dead_tup, pg_total_relation_size(relid)"
            " FROM pg_stat_user_tables WHERE relname = ANY(%s)", (list(TABLES),)).fetchall()
    return {r[0]: (int(r[1]), int(r[2]), int(r[3])) for r in rows}


def vacuums(url: str) -> dict[str, int]:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        rows = conn.execute("SELECT relname, autovacuum_count FROM pg_stat_user_tables"
                            " WHERE relname = ANY(%s)", (list(TABLES),)).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def run(url: str, minutes: float, rate: float, retention: float) -> int:
    store = JobStore.from_url(url, pool=True)
    req = ClaimRequest(queue="default", offer=Offer(cpus=1, memory=1024, disk=1 << 20),
                       slot="slot1@bench", host="bench", keyword="JOBSTORE", claim_lease=600)
    start = time.monotonic()
    end = start + minutes * 60
    warm = start + max(3 * retention, minutes * 60 / 4)
    sample_every = max(minutes * 60 / 24, 10.0)
    next_sample = start
    next_prune = start + PRUNE_EVERY
    done = pruned = 0
    samples: list[tuple[float, dict[str, tuple[int, int, int]]]] = []
    while (now := time.monotonic()) < end:
        if now >= next_sample:
            samples.append((now - start, sample(url)))
            next_sample += sample_every
        if now >= next_prune:
            pruned += store.prune(time.time() - retention).jobs
            next_prune += PRUNE_EVERY
        due = int((now - start) * rate) - done
        if due <= 0:
            time.sleep(min(0.05, 1 / rate))
            continue
        store.submit([JobSpec(cmd="/bin/true", iwd="/tmp", args="x", proc_id=i)
                      for i in range(due)], owner="alice", queue="default", max_attempts=3)
        for _ in range(due):
            job = store.claim(req, lambda _j: Verdict(take=True))
            assert job is not None
            store.report(job.id, Event.ACCEPT, token=job.token, attempt=job.claims)
            store.report(job.id, Event.START, token=job.token, attempt=job.claims,
                         changes={"job_pid": 4242})
            store.report(job.id, Event.EXIT, token=job.token, attempt=job.claims,
                         changes={"exit_code": 0})
        done += due
    samples.append((time.monotonic() - start, sample(url)))
    store.engine.dispose()
    rows = [[f"{t:.0f}", *[f"{s[name][0]}/{s[name][1]}/{s[name][2] // 1024}" for name in TABLES]]
            for t, s in samples]
    say(f"{done} jobs at {rate:g}/s over {minutes:g} min, retention {retention:g} s,"
        f" pruned every {PRUNE_EVERY:g} s: {pruned} jobs pruned; autovacuum runs {vacuums(url)}")
    say(table(["t (s)", *[f"{n} live/dead/KiB" for n in TABLES]], rows))
    after_warm = next(s for t, s in samples if t >= warm - start)
    last = samples[-1][1]
    verdicts = []
    for name in TABLES:
        ratio = last[name][2] / max(after_warm[name][2], 1)
        peak_dead = max(s[name][1] for t, s in samples if t >= warm - start)
        verdicts.append([name, f"{after_warm[name][2] // 1024}", f"{last[name][2] // 1024}",
                         f"{ratio:.2f}", str(peak_dead), "PASS" if ratio <= FLAT else "FAIL"])
    say(table(["table", "KiB after warm-up", "KiB at end", "end / warm-up", "peak dead after"
               " warm-up", f"flat (<= {FLAT})"], verdicts))
    return 0 if all(v[-1] == "PASS" for v in verdicts) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 minutes")
    ap.add_argument("--minutes", type=float)
    ap.add_argument("--rate", type=float, default=20.0, help="jobs per second")
    ap.add_argument("--retention", type=float, default=120.0, help="seconds")
    ap.add_argument("--db-url", default=os.environ.get("JOBSTORE_BENCH_DATABASE_URL"))
    args = ap.parse_args()
    minutes = args.minutes or (6.0 if args.quick else 60.0)
    env = make_env(args.db_url or DEFAULT_ADMIN_URL)
    try:
        create_pg(env)
        return run(env.pg_url, minutes, args.rate, args.retention)
    finally:
        cleanup(env)


if __name__ == "__main__":
    sys.exit(main())
