#!/usr/bin/env python3
"""Side by side with procrastinate and pgqueuer on the same PostgreSQL: a no-op job's
whole life in each, as each is meant to be driven.

* jobstore: submit, then what the hooks do per job: the claim (FETCH_WORK), REPLY_FETCH accept,
  UPDATE_JOB_INFO with JobPid, JOB_EXIT exit; each worker a process with a pooled JobStore, as
  the agent holds it. An idle worker polls the claim every 10 ms (a startd polls FETCH_WORK; the
  store has no wake-up for it).
* procrastinate: batch_defer, then `run_worker` (concurrency 1) per worker process, LISTEN/NOTIFY
  on, the jobs kept (its default).
* pgqueuer: enqueue, then a QueueManager per worker process (drain mode for the throughput,
  continuous for the latency), its default batch size.

For each: jobs per second with 1, 8 and 32 worker processes over N queued jobs (N = 4,000; 1,000
with --quick); WAL bytes and commits per job over submit + processing (one worker, the cluster's
WAL position and the database's xact_commit); pickup latency p50/p99 with one idle worker and
jobs enqueued one by one at RATE per second for a while. The ratios are against jobstore's own
figures of the same run.

Needs the optional `bench` extra (`.venv/bin/pip install -e '.[bench]'`). PostgreSQL.
Usage: .venv/bin/python bench/peers.py [--quick] [--db-url URL] [--only SYSTEM]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from common import DEFAULT_ADMIN_URL, pct, say, table

from jobstore.testing.support import libpq_url

SYSTEMS = ("jobstore", "procrastinate", "pgqueuer")
logging.getLogger("procrastinate").setLevel(logging.ERROR)  # "App is instantiated in main"
WORKERS = (1, 8, 32)
RATE = 50.0  # jobs per second in the latency run
POLL = 0.01  # seconds between two claims of an idle jobstore worker
HERE = Path(__file__).resolve()


# ---- each system: install, enqueue, work -----------------------------------------------------


def install(system: str, url: str) -> None:
    if system == "jobstore":
        from jobstore.db.engine import upgrade

        upgrade(url)
    elif system == "procrastinate":
        app = _procrastinate_app(url)
        with app.open():
            app.schema_manager.apply_schema()
    else:
        async def go() -> None:
            from pgqueuer import PsycopgDriver, Queries

            async with await psycopg.AsyncConnection.connect(libpq_url(url),
                                                             autocommit=True) as conn:
                await Queries(PsycopgDriver(conn)).install()
        asyncio.run(go())


def enqueue(system: str, url: str, n: int) -> None:
    """n jobs, each carrying the time it was queued."""
    if system == "jobstore":
        from jobstore.db.store import JobStore
        from jobstore.testing.factories import submit

        store = JobStore.from_url(url)
        for start in range(0, n, 1000):
            submit(store, min(1000, n - start))
        store.db.engine.dispose()
    elif system == "procrastinate":
        app = _procrastinate_app(url)
        with app.open():
            task = app.tasks["noop"]
            for start in range(0, n, 1000):
                task.batch_defer(*[{"ts": time.time()} for _ in range(min(1000, n - start))])
    else:
        async def go() -> None:
            from pgqueuer import PsycopgDriver, Queries

            async with await psycopg.AsyncConnection.connect(libpq_url(url),
                                                             autocommit=True) as conn:
                q = Queries(PsycopgDriver(conn))
                for start in range(0, n, 1000):
                    k = min(1000, n - start)
                    await q.enqueue(["noop"] * k, [str(time.time()).encode()] * k, [0] * k)
        asyncio.run(go())


def enqueue_one(system: str, url: str, handle: object) -> None:
    if system == "jobstore":
        from jobstore.core.jobs import JobSpec

        handle.submissions.submit([JobSpec(cmd="/bin/true", iwd="/tmp")], owner="alice",  # type: ignore
                                  queue="default", max_attempts=3)
    elif system == "procrastinate":
        handle.tasks["noop"].defer(ts=time.time())  # type: ignore[attr-defined]
    else:
        raise AssertionError("pgqueuer enqueues in its own loop")


def _procrastinate_app(url: str, out: str | None = None):  # type: ignore[no-untyped-def]
    import procrastinate

    connector = procrastinate.PsycopgConnector(conninfo=libpq_url(url), min_size=1, max_size=2)
    app = procrastinate.App(connector=connector)

    @app.task(name="noop")
    def noop(ts: float) -> None:
        if out:
            _record(out, time.time() - ts)

    return app


def _record(out: str, latency: float) -> None:
    with open(out, "a") as fh:
        fh.write(f"{latency}\n")


def work(system: str, url: str, drain: bool, out: str | None, until: float) -> None:
    """One worker process: drain the queue (throughput) or serve until `until` (latency)."""
    if system == "jobstore":
        from jobstore.core.claims import Offer
        from jobstore.core.states import Event
        from jobstore.db.store import JobStore
        from jobstore.testing.factories import claim, claim_request, report

        store = JobStore.from_url(url, pool=True)
        req = claim_request(offer=Offer(cpus=1, memory=1024, disk=1 << 20),
                            slot=f"slot{os.getpid()}@bench", claim_lease=120)
        while True:
            job = claim(store, req)
            if job is None:
                if drain or time.time() > until:
                    break
                time.sleep(POLL)
                continue
            if out:
                _record(out, time.time() - job.submitted_at)
            report(store, job, Event.ACCEPT, lease=120)
            report(store, job, Event.START, changes={"job_pid": os.getpid()}, lease=900)
            report(store, job, Event.EXIT, changes={"exit_code": 0})
        store.db.engine.dispose()
    elif system == "procrastinate":
        app = _procrastinate_app(url, out)
        if drain:
            app.run_worker(concurrency=1, wait=False, install_signal_handlers=False)
        else:
            async def serve() -> None:
                async with app.open_async():
                    worker = asyncio.create_task(app.run_worker_async(
                        concurrency=1, install_signal_handlers=False))
                    await asyncio.sleep(max(until - time.time(), 0))
                    worker.cancel()
                    try:
                        await worker
                    except asyncio.CancelledError:
                        pass
            asyncio.run(serve())
    else:
        async def go() -> None:
            from pgqueuer import PsycopgDriver, Queries, QueueManager
            from pgqueuer.types import QueueExecutionMode

            async with await psycopg.AsyncConnection.connect(libpq_url(url),
                                                             autocommit=True) as conn:
                qm = QueueManager(Queries(PsycopgDriver(conn)))

                @qm.entrypoint("noop")
                async def noop(job) -> None:  # type: ignore[no-untyped-def]
                    if out and job.payload:
                        _record(out, time.time() - float(job.payload.decode()))

                if drain:
                    await qm.run(mode=QueueExecutionMode.drain)
                else:
                    runner = asyncio.create_task(qm.run())
                    await asyncio.sleep(max(until - time.time(), 0))
                    qm.shutdown.set()
                    await asyncio.wait_for(runner, 30)
        asyncio.run(go())


# ---- measuring ---------------------------------------------------------------------------------


def database(admin: str, name: str) -> str:
    from sqlalchemy.engine import make_url

    with psycopg.connect(libpq_url(admin), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return make_url(admin).set(database=name).render_as_string(hide_password=False)


def drop(admin: str, name: str) -> None:
    with psycopg.connect(libpq_url(admin), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def counters(url: str) -> tuple[int, int]:
    """(the cluster's WAL position in bytes, this database's commits so far)."""
    time.sleep(1.2)  # the backends' statistics are flushed at most once a second
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, xact_commit"
                           " FROM pg_stat_database WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def spawn(system: str, url: str, drain: bool, out: str | None, until: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HERE), "--worker", system, "--url", url,
                             "--drain" if drain else "--serve", "--out", out or "",
                             "--until", str(until)], cwd=HERE.parent)


def throughput(system: str, admin: str, n: int, workers: int) -> tuple[float, float, float]:
    """(jobs/s, WAL bytes per job, commits per job) of n jobs with `workers` processes."""
    name = f"jobstore_peers_{system}"
    url = database(admin, name)
    try:
        install(system, url)
        wal0, commits0 = counters(url)
        enqueue(system, url, n)
        start = time.perf_counter()
        procs = [spawn(system, url, True, None, 0) for _ in range(workers)]
        for p in procs:
            if p.wait(600) != 0:
                raise RuntimeError(f"{system} worker failed")
        seconds = time.perf_counter() - start
        wal1, commits1 = counters(url)
        done = finished(system, url)
        if done != n:
            raise RuntimeError(f"{system}: {done} of {n} jobs done")
        return n / seconds, (wal1 - wal0) / n, (commits1 - commits0) / n
    finally:
        drop(admin, name)


def finished(system: str, url: str) -> int:
    sql = {"jobstore": "SELECT count(*) FROM jobs WHERE status = 'completed'",
           "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
           "pgqueuer": "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"}[system]
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0


def latency(system: str, admin: str, seconds: float, tmp: Path) -> list[float]:
    """Pickup latencies (s) with one idle worker and jobs queued one by one at RATE/s."""
    name = f"jobstore_peers_{system}_lat"
    url = database(admin, name)
    out = tmp / f"{system}.lat"
    out.unlink(missing_ok=True)
    try:
        install(system, url)
        until = time.time() + seconds + 8
        worker = spawn(system, url, False, str(out), until)
        time.sleep(3)  # the worker is up and idle
        if system == "pgqueuer":
            asyncio.run(_pgqueuer_trickle(url, seconds))
        else:
            trickle(system, url, seconds)
        worker.wait(120)
        return [float(x) for x in out.read_text().split()]
    finally:
        drop(admin, name)


def trickle(system: str, url: str, seconds: float) -> None:
    if system == "jobstore":
        from jobstore.db.store import JobStore

        handle: object = JobStore.from_url(url, pool=True)
    else:
        handle = _procrastinate_app(url)
        handle.open()  # type: ignore[attr-defined]
    start = time.perf_counter()
    for k in range(int(seconds * RATE)):
        time.sleep(max(start + k / RATE - time.perf_counter(), 0))
        enqueue_one(system, url, handle)
    if system == "jobstore":
        handle.db.engine.dispose()  # type: ignore[attr-defined]
    else:
        handle.close()  # type: ignore[attr-defined]


async def _pgqueuer_trickle(url: str, seconds: float) -> None:
    from pgqueuer import PsycopgDriver, Queries

    async with await psycopg.AsyncConnection.connect(libpq_url(url), autocommit=True) as conn:
        q = Queries(PsycopgDriver(conn))
        start = time.perf_counter()
        for k in range(int(seconds * RATE)):
            await asyncio.sleep(max(start + k / RATE - time.perf_counter(), 0))
            await q.enqueue("noop", str(time.time()).encode())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--db-url", default=os.environ.get("JOBSTORE_BENCH_DATABASE_URL"))
    ap.add_argument("--only", choices=SYSTEMS, action="append")
    ap.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--drain", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--until", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        work(args.worker, args.url, args.drain, args.out or None, args.until or 0.0)
        return 0
    try:
        import pgqueuer  # noqa: F401
        import procrastinate  # noqa: F401
    except ImportError:
        say("bench/peers.py needs the `bench` extra: .venv/bin/pip install -e '.[bench]'")
        return 2
    admin = args.db_url or DEFAULT_ADMIN_URL
    n = 1000 if args.quick else 4000
    seconds = 10.0 if args.quick else 30.0
    systems = args.only or list(SYSTEMS)
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    rows: list[list[str]] = []
    raw: dict[str, tuple[list[float], float, float]] = {}
    for system in systems:
        per = {w: throughput(system, admin, n, w) for w in WORKERS}
        lat = latency(system, admin, seconds, tmp)
        figures = [per[w][0] for w in WORKERS]
        raw[system] = (figures, per[1][1], per[1][2])
        rows.append([system, *[f"{x:.0f}" for x in figures],
                     f"{statistics.median(lat) * 1000:.1f}", f"{pct(lat, 0.99) * 1000:.1f}",
                     f"{per[1][1]:.0f}", f"{per[1][2]:.1f}", str(len(lat))])
        say(f"{system}: done")
    say(f"{n} no-op jobs per throughput run; latency: one idle worker, {RATE:g} jobs/s for"
        f" {seconds:g} s")
    say(table(["system", *[f"jobs/s {w}w" for w in WORKERS], "pickup p50 ms", "p99 ms",
               "WAL B/job", "commits/job", "latency samples"], rows))
    if "jobstore" in raw and len(raw) > 1:
        base_jobs, base_wal, base_commits = raw["jobstore"]
        ratios = [[name, *[f"{f[i] / base_jobs[i]:.2f}" for i in range(len(WORKERS))],
                   f"{wal / base_wal:.2f}", f"{commits / base_commits:.2f}"]
                  for name, (f, wal, commits) in raw.items()]
        say("ratios to jobstore (jobs/s: above 1 is faster than jobstore; WAL, commits: below 1"
            " is less than jobstore)")
        say(table(["system", *[f"jobs/s {w}w" for w in WORKERS], "WAL/job", "commits/job"],
                  ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
