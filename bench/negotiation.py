#!/usr/bin/env python3
"""The negotiator in the claim, as ratios against baselines measured in the same run.

1. Starvation: a fetch that finds the one matching job behind N idle jobs that cannot match (a
   GPU autocluster at higher priority), against a fetch in a queue of that one job; N = 20,000 and
   1,000,000 (200,000 with --quick). PostgreSQL, the agent's pooled store, verdicts remembered.
2. 10,000 distinct autoclusters: fetch p50/p99 with every one of them matching, remembered
   verdicts (agent) and none (a direct-mode hook judges every autocluster), against a queue of
   one autocluster.
3. Claim + EXIT throughput at 1, 8 and 32 claimers with fair share and concurrency limits on,
   against the same run with them off (two submitters, half the jobs naming a limit that never
   binds), interleaved: a warm-up pair, then four pairs; medians.
4. Shares: a 32-slot node (32 slots fetching in turn, jobs of 5 to 15 ticks) with two and with
   five submitters of different priority factors; after a warm-up, the mean distance between
   each submitter's share of the held slots and its target share (1/factor, normalised).

Usage: .venv/bin/python bench/negotiation.py [--quick] [--db-url URL]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg
from common import (
    DEFAULT_ADMIN_URL,
    OWNER,
    Env,
    first,
    make_env,
    pct,
    progress,
    say,
    table,
    verdict,
)
from common import cleanup as cleanup_env
from common import create_pg as create_pg_db

from jobstore.testing.support import ensure_account, libpq_url

SLOT_AD = {"Name": "slot1@node", "Machine": "node", "Cpus": 1, "Memory": 4096, "Disk": 10**7,
           "OpSys": "LINUX", "Arch": "X86_64", "Start": True}
TP_CLAIMERS = (1, 8, 32)


# ---- filling the database --------------------------------------------------------------------


def add_autoclusters(conn: psycopg.Connection, queue: str, owner: str, count: int,
                     jobs_each: int, *, requirements: str | None = None, priority: int = 0,
                     limits: str | None = None, tag: str = "") -> None:
    """`count` autoclusters of `jobs_each` idle jobs in `queue`; `requirements` may use {i} (the
    autocluster's number). One INSERT ... SELECT per table (PostgreSQL)."""
    now = time.time()
    ad = json.dumps({"Cmd": "/bin/true", "Iwd": "/tmp"})
    req_sql = "NULL" if requirements is None else "replace(%s, '{i}', g::text)"
    req_args = () if requirements is None else (requirements,)
    with conn.transaction():
        cid = first(conn.execute(
            "INSERT INTO clusters (owner, queue, num_procs, submitted_at) VALUES (%s, %s, %s, %s)"
            " RETURNING id", (owner, queue, count * jobs_each, now)))
        conn.execute("INSERT INTO submitters (name, updated_at) VALUES (%s, %s)"
                     " ON CONFLICT DO NOTHING", (owner, now))
        conn.execute(
            "INSERT INTO autoclusters (signature, queue, owner, submitter, request_cpus,"
            " request_memory, request_disk, requirements, concurrency_limits, created_at)"
            f" SELECT %s || ':' || g, %s, %s, %s, 1, 64, 1024, {req_sql}, %s, %s"
            " FROM generate_series(1, %s) AS g",
            (f"bench:{queue}:{owner}:{tag}", queue, owner, owner, *req_args, limits, now, count))
        if limits:
            conn.execute("INSERT INTO concurrency_limits (name) VALUES (%s)"
                         " ON CONFLICT DO NOTHING", (limits,))
            conn.execute("INSERT INTO autocluster_limits (autocluster_id, name, amount)"
                         " SELECT id, %s, 1 FROM autoclusters WHERE signature LIKE %s",
                         (limits, f"bench:{queue}:{owner}:{tag}:%"))
        conn.execute(
            "INSERT INTO jobs (cluster_id, proc_id, queue, status, priority, owner, ad, cmd,"
            " request_cpus, request_memory, request_disk, requirements, max_attempts,"
            " success_exit_code, claims, attempts, submitted_at, updated_at, submitter,"
            " autocluster_id, concurrency_limits)"
            " SELECT %s, row_number() OVER () - 1 + coalesce((SELECT max(proc_id) + 1 FROM jobs"
            "   WHERE cluster_id = %s), 0), %s, 'idle', %s, %s, %s::json, '/bin/true', 1, 64,"
            "   1024, a.requirements, 5, 0, 0, 0, %s, %s, %s, a.id, a.concurrency_limits"
            " FROM autoclusters AS a, generate_series(1, %s) AS k WHERE a.signature LIKE %s",
            (cid, cid, queue, priority, owner, ad, now, now, owner, jobs_each,
             f"bench:{queue}:{owner}:{tag}:%"))
    conn.execute("ANALYZE")


# ---- claiming as a fetch does -----------------------------------------------------------------


def make_judge() -> Callable[[Any], Any]:
    """What FETCH_WORK judges an autocluster's first job by: both Requirements, ClassAds."""
    from classad2 import ClassAd

    from jobstore.core.claims import Verdict
    from jobstore.formats.jobads import job_classad
    from jobstore.formats.matching import matches

    slot = ClassAd(SLOT_AD)

    def judge(job: Any) -> Verdict:
        ad = job_classad(job, keyword="JOBSTORE", uid_domain="localdomain",
                         job_lease_duration=2400)
        return Verdict(take=matches(ad, slot))

    return judge


def request(queue: str, shape: str | None, **kw: Any):  # type: ignore[no-untyped-def]
    from jobstore.core.claims import Offer
    from jobstore.testing.factories import claim_request

    return claim_request(queue=queue, offer=Offer(cpus=1, memory=4096, disk=10**7),
                         slot="slot1@node", shape=shape, **kw)


def timed_fetches(
    store: Any, queue: str, shape: str | None, n: int, *, release: bool
) -> list[float]:
    """`n` claims of `queue` through the store, each timed; with `release` the job goes back to
    idle after each (outside the timing), so the queue stays the same."""
    import sqlalchemy as sa

    judge = make_judge()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        job = store.negotiator.claim(request(queue, shape), judge)
        times.append(time.perf_counter() - t0)
        if job is None:
            raise RuntimeError(f"queue {queue}: no matching job found")
        if release:
            with store.db.engine.begin() as conn:
                conn.execute(sa.text("UPDATE jobs SET status = 'idle', token = NULL"
                                     " WHERE id = :id"), {"id": job.id})
    return times


# ---- 1 and 2 ----------------------------------------------------------------------------------


def section_starvation(env: Env, sizes: list[int], samples: int) -> dict[int, float]:
    from jobstore.db.store import JobStore

    say("== 1. A matching job behind N idle jobs that cannot match (PostgreSQL, agent's store)")
    with psycopg.connect(libpq_url(env.pg_url), autocommit=True) as conn:
        add_autoclusters(conn, "one", OWNER, 1, 1, tag="fit")
        for n in sizes:
            progress(f"filling {n:,} GPU jobs")
            queue = f"starve{n}"
            add_autoclusters(conn, queue, OWNER, 1, n, priority=10, tag="gpu",
                             requirements="TARGET.HasGPU =?= true")
            add_autoclusters(conn, queue, OWNER, 1, 1, tag="fit")
    store = JobStore.from_url(env.pg_url, pool=True)
    ratios: dict[int, float] = {}
    rows = []
    try:
        timed_fetches(store, "one", "s", 20, release=True)  # warm the connection and caches
        for n in sizes:
            queue = f"starve{n}"
            timed_fetches(store, queue, "s", 5, release=True)
            base, big = [], []
            for _ in range(samples // 10):  # interleaved, ten at a time
                base += timed_fetches(store, "one", "s", 10, release=True)
                big += timed_fetches(store, queue, "s", 10, release=True)
            r50 = statistics.median(big) / statistics.median(base)
            ratios[n] = r50
            rows.append([f"{n:,}", f"{statistics.median(base) * 1000:.2f}",
                         f"{statistics.median(big) * 1000:.2f}", f"{r50:.2f}",
                         f"{pct(big, 0.99) / pct(base, 0.99):.2f}"])
    finally:
        store.db.engine.dispose()
    say(table(["idle jobs that cannot match", "queue of one p50 ms", "p50 ms", "p50 ratio",
               "p99 ratio"], rows))
    return ratios


def section_many(env: Env, samples: int) -> dict[str, float]:
    from jobstore.db.store import JobStore

    say("")
    say("== 2. 10,000 distinct autoclusters, all matching (PostgreSQL)")
    with psycopg.connect(libpq_url(env.pg_url), autocommit=True) as conn:
        progress("filling 10,000 autoclusters")
        add_autoclusters(conn, "many", OWNER, 10_000, 3, tag="many",
                         requirements="TARGET.Memory >= {i} - {i} + 1")
        add_autoclusters(conn, "single", OWNER, 1, samples * 3, tag="single")
    out = {}
    rows = []
    for label, shape, n in (("agent (verdicts remembered)", "s", samples),
                            ("direct hook (judges all)", None, max(10, samples // 10))):
        store = JobStore.from_url(env.pg_url, pool=True)
        try:
            timed_fetches(store, "single", shape, 5, release=False)
            if shape:
                timed_fetches(store, "many", shape, 1, release=False)  # the first judges all
            base = timed_fetches(store, "single", shape, n, release=False)
            many = timed_fetches(store, "many", shape, n, release=False)
        finally:
            store.db.engine.dispose()
        out[label] = pct(many, 0.99)
        rows.append([label, f"{pct(base, 0.5) * 1000:.2f}", f"{pct(many, 0.5) * 1000:.2f}",
                     f"{pct(many, 0.99) * 1000:.2f}", f"{pct(many, 0.99) / pct(base, 0.99):.2f}"])
    say(table(["fetch", "1 autocluster p50 ms", "10,000 p50 ms", "10,000 p99 ms",
               "p99 ratio"], rows))
    return out


# ---- 3. throughput with the negotiator on and off ---------------------------------------------


def tp_worker(url: str, queue: str, slot: str, on: bool, seconds: float, barrier: Any,
              results: Any) -> None:  # pragma: no cover - a subprocess
    from jobstore.core.states import Event
    from jobstore.db.store import JobStore
    from jobstore.testing.factories import report, take_every

    store = JobStore.from_url(url, pool=True, connect_timeout=30)
    kw: dict[str, Any] = {"fair_share": on, "limit": (lambda _name: 1e9) if on else None}
    req = request(queue, "s", **kw)
    req = dataclasses.replace(req, slot=slot)
    count = 0
    barrier.wait(120)
    t0 = time.monotonic()
    while time.monotonic() < t0 + seconds:
        job = store.negotiator.claim(req, take_every)
        if job is None:
            break
        report(store, job, Event.EXIT)
        count += 1
    results.put((count, time.monotonic() - t0))
    store.db.engine.dispose()


def section_throughput(env: Env, seconds: float, jobs: int) -> dict[int, float]:
    say("")
    say("== 3. claim + EXIT throughput, fair share and limits on / off (PostgreSQL, pooled)")
    ctx = mp.get_context("spawn")
    ratios: dict[int, float] = {}
    rows = []
    for n in TP_CLAIMERS:
        rates: dict[bool, list[float]] = {True: [], False: []}
        for rep in range(5):  # a warm-up pair, then on and off alternating who goes first
            for on in (True, False) if rep % 2 == 0 else (False, True):
                queue = f"tp{n}{'on' if on else 'off'}{rep}"
                with psycopg.connect(libpq_url(env.pg_url), autocommit=True) as conn:
                    for owner in (OWNER, "bob"):
                        add_autoclusters(conn, queue, owner, 1, jobs // 4, tag="plain")
                        add_autoclusters(conn, queue, owner, 1, jobs // 4, tag="lic",
                                         limits="lic")
                barrier = ctx.Barrier(n)
                results = ctx.Queue()
                procs = [ctx.Process(target=tp_worker, args=(env.pg_url, queue, f"slot{k}@node",
                                                             on, seconds, barrier, results))
                         for k in range(n)]
                for p in procs:
                    p.start()
                got = [results.get(timeout=300) for _ in procs]
                for p in procs:
                    p.join(60)
                if rep:
                    rates[on].append(sum(c for c, _ in got) / max(t for _, t in got))
        on_rate, off_rate = statistics.median(rates[True]), statistics.median(rates[False])
        ratios[n] = on_rate / off_rate
        rows.append([str(n), f"{on_rate:.0f}", f"{off_rate:.0f}", f"{ratios[n]:.2f}"])
        progress(f"{n} claimers: {ratios[n]:.2f}")
    say(table(["claimers", "on: claims/s", "off: claims/s", "on / off"], rows))
    return ratios


# ---- 4. shares ----------------------------------------------------------------------------------


def section_shares(env: Env, ticks: int) -> dict[str, float]:
    from jobstore.core.states import Event
    from jobstore.db.store import JobStore
    from jobstore.testing.factories import report, take_every

    say("")
    say("== 4. Shares of a 32-slot node by priority factor (PostgreSQL)")
    out = {}
    rows = []
    # submitters of their own per case: what a submitter holds counts across all queues
    for label, factors in (("2 submitters", {"a1": 1.0, "a2": 2.0}),
                           ("5 submitters", {"b1": 1.0, "b2": 1.0, "b3": 2.0, "b4": 4.0,
                                             "b5": 8.0})):
        queue = f"shares{len(factors)}"
        with psycopg.connect(libpq_url(env.pg_url), autocommit=True) as conn:
            for name in factors:
                add_autoclusters(conn, queue, name, 1, ticks * 4, tag="j")
        store = JobStore.from_url(env.pg_url, pool=True)
        for name, f in factors.items():
            store.admin_settings.set_factor(name, f)
        inv = {n: 1 / f for n, f in factors.items()}
        target = {n: v / sum(inv.values()) for n, v in inv.items()}
        rng = random.Random(11)
        running: dict[int, tuple[Any, int]] = {}  # slot -> (job, tick it ends)
        distances = []
        warmup = ticks // 4
        try:
            for tick in range(ticks):
                for slot, (job, end) in list(running.items()):
                    if end <= tick:
                        report(store, job, Event.EXIT)
                        del running[slot]
                for slot in range(32):
                    if slot not in running:
                        req = request(queue, "s")
                        req = dataclasses.replace(req, slot=f"slot{slot}@node")
                        job = store.negotiator.claim(req, take_every)
                        if job is not None:
                            running[slot] = (job, tick + rng.randint(5, 15))
                if tick >= warmup:
                    held = {n: 0 for n in factors}
                    for job, _ in running.values():
                        held[job.owner] += 1
                    total = sum(held.values()) or 1
                    distances.append(sum(abs(held[n] / total - target[n]) for n in factors)
                                     / len(factors))
        finally:
            store.db.engine.dispose()
        out[label] = statistics.mean(distances)
        final = {n: 0 for n in factors}
        for job, _ in running.values():
            final[job.owner] += 1
        rows.append([label, " ".join(f"{f:g}" for f in factors.values()),
                     " ".join(f"{target[n] * 32:.1f}" for n in factors),
                     " ".join(str(final[n]) for n in factors), f"{out[label]:.3f}"])
    say(table(["case", "factors", "target slots", "slots held at the end",
               "mean |share - target|"], rows))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--db-url", default=os.environ.get("JOBSTORE_BENCH_DATABASE_URL"))
    args = ap.parse_args()
    sizes = [20_000, 200_000 if args.quick else 1_000_000]
    samples = 100 if args.quick else 300
    ensure_account(OWNER, uid=1001)
    env = make_env(args.db_url or DEFAULT_ADMIN_URL)
    started = time.monotonic()
    try:
        create_pg_db(env)
        say(f"jobstore negotiation bench ({'quick' if args.quick else 'full'}), "
            f"{os.cpu_count()} CPUs")
        say("")
        starve = section_starvation(env, sizes, samples)
        many = section_many(env, samples)
        tp = section_throughput(env, 2.0 if args.quick else 4.0, 20_000)
        shares = section_shares(env, 120 if args.quick else 300)
        say("")
        say("SUMMARY (against the targets):")
        rows = [[f"fetch behind {n:,} that cannot match / queue of one (p50)", f"{r:.2f}",
                 "<= 1.5", verdict(r <= 1.5)] for n, r in starve.items()]
        rows += [[f"fetch p99 with 10,000 autoclusters, {k} (ms)", f"{v * 1000:.1f}", "-",
                  "info"] for k, v in many.items()]
        rows += [[f"claim+EXIT, {n} claimers, fair share and limits on / off", f"{r:.2f}",
                  ">= 0.80", verdict(r >= 0.8)] for n, r in tp.items()]
        rows += [[f"shares, {k}: mean distance from target", f"{v:.3f}", "-", "info"]
                 for k, v in shares.items()]
        say(table(["figure", "value", "target", "result"], rows))
        say(f"  total bench time {time.monotonic() - started:.0f} s")
        return 0
    finally:
        cleanup_env(env)


if __name__ == "__main__":
    sys.exit(main())
