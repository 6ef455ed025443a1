#!/usr/bin/env python3
"""How fast `jobstore watch` sees a transition, and what an idle watcher costs, on PostgreSQL.

1. Latency: a job's JOB_EXIT report is committed through Reports.report (after a claim), and
   the time from the report's return to the moment the watcher process (`jobstore watch --json`,
   a separate process reading job_events) has printed the `exit` line is measured; p50/p99 over
   --events reports, spaced by a random 0-50 ms so that poll phases are spread. LISTEN/NOTIFY
   versus the poll fallback (`--poll`, --interval seconds), with the poll interval as the yardstick.
2. Idle cost: statements and transactions per second that an idle subscriber sends to the
   database in each mode (counted on its engine for --idle seconds; the LISTEN connection sends
   nothing while it waits).

Usage: .venv/bin/python bench/watch_latency.py [--db-url ADMIN_URL] [--events 200]
The bench creates its own database `jobstore_bench_watch_<hex>` there and drops it at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid

import psycopg
from sqlalchemy import event as sa_event
from sqlalchemy.engine import make_url

from jobstore.api.watch import subscribe
from jobstore.core.claims import Verdict
from jobstore.core.policy import exit_verdict
from jobstore.core.states import Event
from jobstore.db.engine import upgrade
from jobstore.db.store import JobStore
from jobstore.testing.factories import claim, claim_request, report, submit
from jobstore.testing.support import libpq_url

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
REQ = claim_request(slot="slot1@bench")
EXIT = {"ExitCode": 0, "ExitBySignal": False}


def report_exit(store: JobStore, job: int) -> float:
    """Claim `job`, commit its JOB_EXIT; the time the report returned (committed)."""
    claimed = claim(store, REQ, judge=lambda row: Verdict(take=row.id == job))
    assert claimed is not None and claimed.id == job
    report(store, claimed, Event.EXIT, changes={"exit_code": 0, "exit_by_signal": False},
           exit_policy=lambda row: exit_verdict(row, EXIT))
    return time.time()


class WatchProcess:
    def __init__(self, url: str, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jobstore.cli", "--db", url, "watch", "--json", *args],
            stdout=subprocess.PIPE, text=True, bufsize=1)
        self.seen: dict[tuple[int, str], float] = {}
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.time()
            rec = json.loads(line)
            with self.cond:
                self.seen[(rec["job_id"], rec["event"])] = now
                self.cond.notify_all()

    def wait_for(self, key: tuple[int, str], timeout: float = 60) -> float:
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.seen, timeout):
                raise TimeoutError(f"the watcher never printed {key}")
            return self.seen[key]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def latency(url: str, store: JobStore, args: list[str], n: int) -> list[float]:
    jobs = submit(store, n + 1, max_attempts=5, iwd="", request_memory=64)
    w = WatchProcess(url, [*args, "--since", str(store.reads.last_event_id())])
    try:
        # ready: a sentinel transition is printed (--since: even if it precedes the start)
        store.actions.admin(jobs[0], Event.HOLD)
        w.wait_for((jobs[0], "hold"))
        out = []
        rng = random.Random(1)
        for job in jobs[1:]:
            done = report_exit(store, job)
            out.append(w.wait_for((job, "exit")) - done)
            time.sleep(rng.uniform(0, 0.05))
        return out
    finally:
        w.stop()


def idle_cost(url: str, seconds: float, poll: bool, interval: float) -> tuple[float, float]:
    """(statements/s, transactions/s) an idle subscriber sends on its query engine."""
    sub = subscribe(url, poll=poll, interval=interval)
    counts = {"stmt": 0, "tx": 0}
    sa_event.listen(sub.store.db.engine, "before_cursor_execute",
                    lambda *a: counts.__setitem__("stmt", counts["stmt"] + 1))
    sa_event.listen(sub.store.db.engine, "commit",
                    lambda *a: counts.__setitem__("tx", counts["tx"] + 1))
    t = threading.Thread(target=lambda: [None for _ in sub], daemon=True)
    t.start()
    time.sleep(1.0)  # past the start-up reads
    s0, x0, t0 = counts["stmt"], counts["tx"], time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    s1, x1 = counts["stmt"], counts["tx"]
    sub.close()
    t.join(10)
    return (s1 - s0) / elapsed, (x1 - x0) / elapsed


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db-url", default=DEFAULT_ADMIN_URL)
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--interval", type=float, default=0.25, help="poll interval (s)")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle measurement")
    opts = ap.parse_args()
    name = f"jobstore_bench_watch_{uuid.uuid4().hex[:12]}"
    admin = libpq_url(opts.db_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(opts.db_url).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        store = JobStore.from_url(url)
        modes = [("LISTEN/NOTIFY", []),
                 (f"poll {opts.interval:g}s", ["--poll", "--interval", str(opts.interval)])]
        print(f"watch latency, report committed -> line printed, {opts.events} events each")
        for label, args in modes:
            lat = latency(url, store, args, opts.events)
            p50, p99 = pct(lat, 50), pct(lat, 99)
            print(f"  {label:14s} p50 {p50 * 1000:7.1f} ms  p99 {p99 * 1000:7.1f} ms  "
                  f"mean {statistics.mean(lat) * 1000:7.1f} ms  "
                  f"(p50 = {p50 / opts.interval:.2f} x poll interval)")
        print(f"idle watcher, database cost over {opts.idle:g} s")
        for label, poll in (("LISTEN/NOTIFY", False), (f"poll {opts.interval:g}s", True)):
            stmts, txs = idle_cost(url, opts.idle, poll, opts.interval)
            print(f"  {label:14s} {stmts:6.2f} statements/s  {txs:6.2f} transactions/s")
        store.db.engine.dispose()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
