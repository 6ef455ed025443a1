"""Section 2: claim + EXIT throughput through JobStore against a bare psycopg loop."""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import secrets
import statistics
import threading
import time
from contextlib import suppress

import psycopg
from common import KEYWORD, TP_CLAIMERS, Env, first, populate, progress, say, table, verdict

from jobstore.db.backends.postgresql.queries import without_begin
from jobstore.testing.support import (
    libpq_url,
)

SHAPE = "bench-slot"  # a slot shape, as the hooks give one: verdicts are remembered per shape
WARMUP = 5  # claim + EXIT cycles each claimer runs before the clock starts, on either side


def machine_busy() -> float | None:
    """CPU seconds the whole machine spent busy since boot (every process, the server's and the
    kernel's included: /proc/stat, not idle or iowait); None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def capture_cycle(url: str, queue: str) -> list[list[tuple[str, dict]]]:
    """The statements one claim + EXIT issues through the pooled JobStore in its steady state
    (the second cycle: the autocluster's verdict is known), with their parameters, split into
    transactions where the package commits. `queue` needs two idle jobs."""
    import sqlalchemy as sa

    from jobstore.core.states import Event
    from jobstore.db.engine import make_engine
    from jobstore.db.store import JobStore, Offer
    from jobstore.testing.factories import claim_request, take_every

    store = JobStore(make_engine(url, pool=True))
    seen: list[tuple[str, dict] | None] = []  # None: a commit
    req = claim_request(queue=queue, offer=Offer(cpus=1, memory=1024, disk=1 << 20),
                        slot="slot0@node", keyword=KEYWORD, shape=SHAPE)
    for cycle in range(2):
        if cycle == 1:
            sa.event.listen(store.db.engine, "before_cursor_execute",
                            lambda _c, _cur, stmt, params, *_a: seen.append(
                                (stmt, dict(params or {}))))
            sa.event.listen(store.db.engine, "commit", lambda _conn: seen.append(None))
        job = store.negotiator.claim(req, take_every)
        if job is None:
            raise RuntimeError("no idle job to capture a claim with")
        store.reports.report(job.id, Event.EXIT, token=job.token, attempt=job.claims)
    store.db.engine.dispose()
    txs: list[list[tuple[str, dict]]] = [[]]
    for item in seen:
        if item is None:
            txs.append([])
        else:
            txs[-1].append(item)
    return [tx for tx in txs if tx]


def fill(tpl: dict, job_id: int | None, token: str, now: float, slot: str,
         version: str | None) -> dict:
    """A captured parameter set for another job, slot, time and row version (by parameter
    name)."""
    out = {}
    for k, v in tpl.items():
        if k in ("id_1", "job_id") and job_id is not None:
            v = job_id
        elif k == "payload" and job_id is not None:
            v = str(job_id)
        elif k == "version" and v is not None:
            v = version
        elif k == "token" and v is not None:
            v = token
        elif k == "slot" and v is not None:
            v = slot
        elif isinstance(v, float):
            v = now + 600 if k == "lease_expires_at" else now
        out[k] = v
    return out


def bare_cycle(conn, cycle: list[list[tuple[str, dict]]], queue: str,  # type: ignore[no-untyped-def]
               slot: str) -> bool:
    """One claim + EXIT replayed from `cycle` (capture_cycle) on the psycopg connection `conn`:
    per transaction, the captured statements (the first opens the transaction, as driver.begin
    does; with this job's id, token, slot, time and row version), reading the rows the package
    reads, COMMIT. False: no idle job was left."""
    job_id, token, now = None, secrets.token_hex(16), time.time()
    idle: list[int] = []
    heads: list[int] = []
    version = None
    for tx in cycle:
        for stmt, tpl in tx:
            params = fill(tpl, job_id, token, now, slot, version)
            if "queue" in params:
                params["queue"] = queue
            if "autoclusters" in params:  # those the menu just listed
                params["autoclusters"] = idle
            if "ids" in params:  # and their first jobs
                params["ids"] = heads
            opening = stmt.startswith("BEGIN;")  # one simple query, driver.begin
            cur: psycopg.Cursor = (psycopg.ClientCursor(conn) if opening else conn.cursor())
            cur.execute(stmt, params)
            while opening and cur.nextset():
                pass
            if "WITH RECURSIVE idle" in stmt:
                menu = cur.fetchall()
                idle, heads = [r[0] for r in menu], [r[3] for r in menu]
            elif stmt.startswith("SELECT * FROM jobs"):  # the heads, to judge
                cur.fetchall()
            elif stmt.startswith("WITH cand"):
                row = cur.fetchone()
                if row is None:
                    break
                job_id = row[0]
            elif "row_version" in stmt:  # the report's read: the row's version
                read = cur.fetchone()
                version = None if read is None else read[-1]
            elif stmt.startswith("WITH changed") and cur.rowcount != 1:
                raise RuntimeError(f"job {job_id}: {cur.rowcount} rows updated")
        conn.commit()
        if job_id is None:
            return False
        now = time.time()
    return True


def tp_worker(  # type: ignore[no-untyped-def]
    mode: str, url: str, queue: str, slot: str, seconds: float, barrier, results, cycle
):
    """One claiming process: WARMUP cycles before the clock starts (the connection and what a
    long-running claimer makes once), then claim + complete until `seconds` have passed or the
    queue is empty. `bare` replays `cycle` (bare_cycle) with psycopg."""
    count, t0, t1, err, cpu, preempted = 0, 0.0, 0.0, None, 0.0, 0
    try:
        if mode == "bare":
            # as make_engine connects: no server-side prepared statements (PgBouncer); and as
            # the package runs a transaction: its first statement opens it (autocommit: psycopg
            # sends no BEGIN of its own)
            conn = psycopg.connect(libpq_url(url), connect_timeout=30, prepare_threshold=None,
                                   autocommit=True)

            def one() -> bool:
                return bare_cycle(conn, cycle, queue, slot)
        else:
            from jobstore.core.states import Event
            from jobstore.db.engine import make_engine
            from jobstore.db.store import JobStore, Offer
            from jobstore.testing.factories import claim_request, take_every

            store = JobStore(make_engine(url, connect_timeout=30, pool=mode == "pooled"))
            req = claim_request(queue=queue, offer=Offer(cpus=1, memory=1024, disk=1 << 20),
                                slot=slot, host="node", keyword=KEYWORD, shape=SHAPE)

            def one() -> bool:
                job = store.negotiator.claim(req, take_every)
                if job is None:
                    return False
                out = store.reports.report(job.id, Event.EXIT, token=job.token, attempt=job.claims)
                if out.after != "completed" or out.stale:
                    raise RuntimeError(f"job {job.id}: EXIT gave {out}")
                return True
        for _ in range(WARMUP):
            one()
        barrier.wait(120)
        t0, cpu0 = time.monotonic(), time.process_time()
        switches0 = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw
        stop = t0 + seconds
        while time.monotonic() < stop and one():
            count += 1
        t1, cpu = time.monotonic(), time.process_time() - cpu0
        preempted = resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - switches0
        if mode == "bare":
            conn.close()
        else:
            store.db.engine.dispose()
    except Exception as exc:
        err = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
        t1 = time.monotonic()
        with suppress(Exception):
            barrier.abort()  # a worker that never got going must not keep the others waiting
    results.put((count, t0, t1, err, cpu, preempted))


def section_throughput(
    env: Env, seconds: float, jobs_per_run: int, ad: str, rounds: int = 4
) -> dict:
    say("")
    say(f"== 2. Claim throughput on PostgreSQL: claim + EXIT per second, {rounds} rounds of"
        f" {seconds:g} s per cell, package and bare back to back in each, alternating which"
        " goes first")
    ctx = mp.get_context("fork")
    modes = ("pooled", "bare")
    done: dict[tuple[str, int], float] = {}
    spent: dict[tuple[str, int], float] = {}
    client: dict[tuple[str, int], float] = {}  # the claimers' own CPU seconds
    preempted: dict[tuple[str, int], int] = {}  # ... and involuntary context switches
    machine: dict[tuple[str, int], float] = {}  # the whole machine's busy CPU seconds
    paired: dict[int, list[float]] = {}  # package/bare of each round
    errors: list[str] = []
    exhausted: list[str] = []
    with psycopg.connect(libpq_url(env.pg_url), autocommit=True) as admin:
        durability = {
            s: first(admin.execute(f"SHOW {s}"))
            for s in ("synchronous_commit", "fsync", "full_page_writes", "wal_sync_method")
        }
        populate(admin, "tp_capture", 2, ad)
        cycle = capture_cycle(env.pg_url, "tp_capture")
        for n in TP_CLAIMERS:
            for rnd in range(rounds):
                round_rate: dict[str, float] = {}
                for mode in modes if rnd % 2 == 0 else modes[::-1]:
                    queue = f"tp_{mode}_{n}_{rnd}"
                    populate(admin, queue, jobs_per_run, ad)
                    admin.execute("CHECKPOINT")  # no cell pays for the writes of the one before
                    progress(f"throughput {mode} x{n}, round {rnd + 1}")
                    barrier = ctx.Barrier(n + 1)
                    results = ctx.Queue()
                    procs = [
                        ctx.Process(target=tp_worker,
                                    args=(mode, env.pg_url, queue, f"slot{i}@node", seconds,
                                          barrier, results, cycle), daemon=True)
                        for i in range(n)
                    ]
                    env.workers = procs
                    for p in procs:
                        p.start()
                    with suppress(threading.BrokenBarrierError):  # a worker failed: it says why
                        barrier.wait(120)
                    busy0 = machine_busy()
                    got = [results.get(timeout=seconds + 120) for _ in procs]
                    busy1 = machine_busy()
                    if busy0 is not None and busy1 is not None:
                        machine[(mode, n)] = machine.get((mode, n), 0.0) + busy1 - busy0
                    for p in procs:
                        p.join(30)
                    env.workers = []
                    errs = [g[3] for g in got if g[3]]
                    errors += [f"{mode} x{n}: {e}" for e in errs]
                    total = sum(g[0] for g in got)
                    starts = [g[1] for g in got if g[1]]
                    span = max(g[2] for g in got) - min(starts) if total and starts else 0
                    done[(mode, n)] = done.get((mode, n), 0) + total
                    spent[(mode, n)] = spent.get((mode, n), 0.0) + span
                    client[(mode, n)] = client.get((mode, n), 0.0) + sum(g[4] for g in got)
                    preempted[(mode, n)] = preempted.get((mode, n), 0) + sum(g[5] for g in got)
                    if total + n * WARMUP >= jobs_per_run:
                        exhausted.append(f"{mode} x{n}")
                    round_rate[mode] = total / span if span > 0 else 0.0
                if round_rate["bare"] > 0:
                    paired.setdefault(n, []).append(round_rate["pooled"] / round_rate["bare"])
    rates = {k: done[k] / spent[k] if spent[k] > 0 else 0.0 for k in done}
    per_cycle = {k: 1000 * client[k] / done[k] if done[k] else 0.0 for k in done}
    switches = {k: preempted[k] / done[k] if done[k] else 0.0 for k in done}
    whole = {k: 1000 * machine[k] / done[k] if done.get(k) else 0.0 for k in machine}
    rows = []
    ratios = {}
    for n in TP_CLAIMERS:
        each = sorted(paired.get(n, [0.0]))
        r = ratios[n] = statistics.median(each)
        rows.append([str(n), f"{rates[('pooled', n)]:.0f}", f"{rates[('bare', n)]:.0f}",
                     f"{r:.2f}", f"{each[0]:.2f} to {each[-1]:.2f}", verdict(r >= 0.9),
                     f"{per_cycle[('pooled', n)]:.2f} / {per_cycle[('bare', n)]:.2f}",
                     f"{switches[('pooled', n)]:.1f} / {switches[('bare', n)]:.1f}",
                     (f"{whole[('pooled', n)]:.2f} / {whole[('bare', n)]:.2f}"
                      if whole.get(("bare", n)) else "-")])
    say(table(["claimers", "package/s", "bare/s", "package/bare", "rounds", "target >= 0.90",
               "client CPU ms/cycle, package / bare", "preempted/cycle",
               "machine CPU ms/cycle, package / bare"], rows))
    say("   package/bare: the median over the rounds of the ratio of the two cells measured back"
        " to back in that round (rounds: the lowest and the highest); package/s and bare/s: all"
        " rounds together")
    nstmt = sum(len(tx) for tx in cycle)
    say(f"   each claimer connects and runs {WARMUP} cycles before the clock starts (either side:"
        " a long-running claimer, as the agent is, connects and fills its caches once); each"
        " cell starts after a CHECKPOINT (its queue's jobs are inserted just before it, and no"
        " cell pays for the writes of the one before it)")
    say("   client CPU: each claimer's own CPU time over its loop (user and system), per cycle;"
        " preempted: its involuntary context switches (getrusage), per cycle; machine CPU: the"
        f" whole machine's busy CPU time ({os.cpu_count()} CPUs: the claimers, the server, the"
        " kernel) from the start to the end of the cell, per cycle. Where the machine is busy"
        " the whole time, package/bare is about the inverse ratio of the machine CPU")
    say(f"   package = JobStore(make_engine(url, pool=True)): claim (judge takes every job; one"
        " slot shape, as the hooks give one, so that the verdict is remembered as in the agent)"
        f" + report(EXIT); bare = the same {nstmt} statements in the same {len(cycle)}"
        " transactions, text captured from the package's second cycle in this run, replayed by"
        " a psycopg loop"
        " that reads the rows the package reads and passes on what it needs (the menu's"
        " autoclusters and heads, the claimed job, the row version the report read), on one"
        " persistent connection per claimer, connected as make_engine connects"
        " (prepare_threshold=None: no server-side prepared statements, as PgBouncer in"
        " transaction mode needs). Both make the same round trips: the statements, the first of"
        " which opens the transaction (BEGIN, its timeout and the transaction's first read in"
        " one simple query, bound on the client), then COMMIT (the package pings no pooled"
        " connection before use):")
    for tx in cycle:
        say("     tx: " + "; ".join(("BEGIN, timeout + " if st.startswith("BEGIN;") else "")
                                   + " ".join(without_begin(st).split())[:50] for st, _ in tx)
            + "; COMMIT")
    say("   durability: " + ", ".join(f"{k}={v}" for k, v in durability.items()))
    if exhausted:
        say("   queue ran dry (rate measured up to that point): " + ", ".join(exhausted))
    for e in errors:
        say(f"   ERROR {e}")
    return {"rates": rates, "ratios": ratios, "client_ms": per_cycle, "preempted": switches,
            "machine_ms": whole,
            "durability": durability, "errors": errors, "cycle": cycle}
