#!/usr/bin/env python3
"""Retention and bloat over a long steady run: jobs submitted, claimed, started and
completed at a steady rate through JobStore (as the hooks drive it), finished history pruned as
the agents prune it (JOBSTORE_HISTORY_RETENTION short here), autovacuum with the schema's
per-table settings. Every sample gives each table's live and dead tuples and its size with its
indexes; the verdict compares, after warm-up, the largest size of each table in the second half of
the run with that in the first half (flat is about 1; a table that keeps growing is not).

The tables' autovacuum settings only act where autovacuum runs: on a server with autovacuum = off
the bench says so and turns it on for its run (ALTER SYSTEM, reload; reset at the end), unless
--keep-server-settings.

Default one hour at 20 jobs/s with a retention of 120 s; --quick: 6 minutes, retention 60 s.
PostgreSQL. Usage: .venv/bin/python bench/bloat.py [--quick] [--minutes M] [--rate R]
                   [--retention S] [--keep-server-settings] [--db-url URL]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import psycopg
from common import DEFAULT_ADMIN_URL, cleanup, create_pg, make_env, say, table

from jobstore.core.claims import Offer
from jobstore.core.states import Event
from jobstore.db.store import JobStore
from jobstore.testing.factories import claim, claim_request, report, submit
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


def autovacuum_on(url: str) -> bool:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
    return row is not None and row[0] == "on"


def set_autovacuum(url: str, on: bool | None) -> None:
    """ALTER SYSTEM SET autovacuum (None: RESET) and reload the configuration."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        if on is None:
            conn.execute("ALTER SYSTEM RESET autovacuum")
        else:
            conn.execute(f"ALTER SYSTEM SET autovacuum = {'on' if on else 'off'}")
        conn.execute("SELECT pg_reload_conf()")
    time.sleep(1)


def run(url: str, minutes: float, rate: float, retention: float) -> int:
    store = JobStore.from_url(url, pool=True)
    req = claim_request(offer=Offer(cpus=1, memory=1024, disk=1 << 20), slot="slot1@bench")
    start = time.monotonic()
    end = start + minutes * 60
    warm = start + min(max(2 * retention, minutes * 60 / 4), minutes * 60 / 2)
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
            pruned += store.retention.prune(time.time() - retention).jobs
            next_prune += PRUNE_EVERY
        due = int((now - start) * rate) - done
        if due <= 0:
            time.sleep(min(0.05, 1 / rate))
            continue
        submit(store, due, args="x")
        for _ in range(due):
            job = claim(store, req)
            assert job is not None
            report(store, job, Event.ACCEPT)
            report(store, job, Event.START, changes={"job_pid": 4242})
            report(store, job, Event.EXIT, changes={"exit_code": 0})
        done += due
    samples.append((time.monotonic() - start, sample(url)))
    store.db.engine.dispose()
    rows = [[f"{t:.0f}", *[f"{s[name][0]}/{s[name][1]}/{s[name][2] // 1024}" for name in TABLES]]
            for t, s in samples]
    say(f"{done} jobs at {rate:g}/s over {minutes:g} min, retention {retention:g} s,"
        f" pruned every {PRUNE_EVERY:g} s: {pruned} jobs pruned; autovacuum runs {vacuums(url)}")
    say(table(["t (s)", *[f"{n} live/dead/KiB" for n in TABLES]], rows))
    steady = [(t, s) for t, s in samples if t >= warm - start]
    first, second = steady[: len(steady) // 2], steady[len(steady) // 2:]
    verdicts = []
    for name in TABLES:
        peak1, peak2 = (max(s[name][2] for _, s in half) for half in (first, second))
        dead1, dead2 = (max(s[name][1] for _, s in half) for half in (first, second))
        ratio = peak2 / max(peak1, 1)
        verdicts.append([name, f"{peak1 // 1024}", f"{peak2 // 1024}", f"{ratio:.2f}",
                         f"{dead1} / {dead2}", "PASS" if ratio <= FLAT else "FAIL"])
    say(f"after a warm-up of {warm - start:.0f} s: the largest size (with indexes) and the most"
        " dead tuples in the first and the second half of the rest")
    say(table(["table", "KiB 1st half", "KiB 2nd half", "2nd / 1st", "dead 1st / 2nd",
               f"flat (<= {FLAT})"], verdicts))
    return 0 if all(v[-1] == "PASS" for v in verdicts) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 minutes")
    ap.add_argument("--minutes", type=float)
    ap.add_argument("--rate", type=float, default=20.0, help="jobs per second")
    ap.add_argument("--retention", type=float, help="seconds (120; 60 with --quick)")
    ap.add_argument("--keep-server-settings", action="store_true")
    ap.add_argument("--db-url", default=os.environ.get("JOBSTORE_BENCH_DATABASE_URL"))
    args = ap.parse_args()
    minutes = args.minutes or (6.0 if args.quick else 60.0)
    retention = args.retention or (60.0 if args.quick else 120.0)
    env = make_env(args.db_url or DEFAULT_ADMIN_URL)
    turned_on = False
    try:
        create_pg(env)
        if not autovacuum_on(env.pg_url):
            if args.keep_server_settings:
                say("autovacuum is off on this server: dead tuples will only grow")
            else:
                say("autovacuum is off on this server: turned on for this run")
                set_autovacuum(env.pg_url, True)
                turned_on = True
        return run(env.pg_url, minutes, args.rate, retention)
    finally:
        if turned_on:
            set_autovacuum(env.pg_url, None)
        cleanup(env)


if __name__ == "__main__":
    sys.exit(main())
