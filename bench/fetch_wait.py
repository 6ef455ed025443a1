#!/usr/bin/env python3
"""Waiting fetches (issue 32), through the emulated startd with the agent and the real hooks:

* submit -> fetched, p50 and p99, of single jobs submitted one at a time into an idle 4-slot
  node, on PostgreSQL and SQLite, with the shipped settings (JOBSTORE_FETCH_WAIT 5 s,
  FetchWorkDelay 1 s for an idle slot) against today's (no wait, FetchWorkDelay 30 s);
* the transactions per second an idle 32-slot node costs the PostgreSQL database, both ways.

Usage: .venv/bin/python bench/fetch_wait.py [--db-url ADMIN_URL] [--jobs N] [--baseline-jobs N]
       [--idle-seconds S]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    KEYWORD,
    OWNER,
    cleanup,
    create_pg,
    create_sqlite,
    first,
    make_env,
    node_env,
    stop_agent,
)
from hookcost import agent_missing, start_agent  # noqa: E402
from schedd_scale import DEFAULT_ADMIN_URL  # noqa: E402

from jobstore.core.jobs import JobSpec  # noqa: E402
from jobstore.db.store import JobStore  # noqa: E402
from jobstore.emulator import Emulator, EmulatorConfig  # noqa: E402
from jobstore.node.hooktable import CONDOR_NAMES  # noqa: E402
from jobstore.testing.support import libpq_url  # noqa: E402

SHIPPED = ("5", 'ifThenElse(State == "Claimed" && Activity == "Idle", 0, 1)')
TODAY = ("0", 'ifThenElse(State == "Claimed" && Activity == "Idle", 0, 30)')


def _node(env: Any, url: str, slots: int, delay: str,
          name: str) -> tuple[Emulator, threading.Event]:
    """An emulated node of `slots` static slots, started in a thread; set the event to stop."""
    hooks = {condor: str(env.hooks / ours) for ours, condor in CONDOR_NAMES.items()}
    cfg = EmulatorConfig(
        hooks=hooks, work_dir=str(env.tmp / name), keyword=KEYWORD, static_slots=slots,
        cpus=slots, memory=1024 * slots, initial_update_interval=0.5, update_interval=60.0,
        fetch_work_delay=delay, env=node_env(env, url, {}))
    emulator, stop = Emulator(cfg), threading.Event()
    thread = threading.Thread(target=emulator.run, kwargs={
        "until": stop.is_set, "timeout": 3600, "wait_for_jobs": True}, daemon=True)
    thread.start()
    stop.thread = thread  # type: ignore[attr-defined]
    return emulator, stop


def latencies(env: Any, url: str, jobs: int, wait: str, delay: str) -> list[float]:
    """Seconds from each job's submit to its fetch, one job at a time into an idle node."""
    agent = start_agent(env, url, {"_CONDOR_JOBSTORE_FETCH_WAIT": wait})
    store = JobStore.from_url(url)
    _, stop = _node(env, url, 4, delay, f"node-{time.monotonic_ns()}")
    out = []
    try:
        time.sleep(2.0)  # the node's first fetches (each slot idle, waiting or not)
        for _ in range(jobs):
            _, (job_id,) = store.submit([JobSpec(cmd="/bin/true", iwd="/tmp", request_memory=64)],
                                        owner=OWNER, queue="default", max_attempts=3)
            deadline = time.monotonic() + 120
            while (job := store.get_job(job_id)).fetched_at is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"job {job_id} not fetched in 120 s")
                time.sleep(0.002)
            out.append(job.fetched_at - job.submitted_at)
            while store.get_job(job_id).status not in ("completed", "failed", "held"):
                time.sleep(0.01)
            time.sleep(0.3)  # idle again: every slot back to fetching
    finally:
        stop.set()
        stop.thread.join(60)  # type: ignore[attr-defined]
        stop_agent(env, agent)
        store.engine.dispose()
    return out


def idle_cost(env: Any, url: str, seconds: float, wait: str, delay: str) -> float:
    """Transactions per second of the database while a 32-slot node idles (queue empty)."""
    import psycopg

    agent = start_agent(env, url, {"_CONDOR_JOBSTORE_FETCH_WAIT": wait})
    _, stop = _node(env, url, 32, delay, f"idle-{time.monotonic_ns()}")
    try:
        time.sleep(5.0)  # settle: the first fetches
        with psycopg.connect(libpq_url(url), autocommit=True) as mon:
            count = ("SELECT xact_commit + xact_rollback FROM pg_stat_database"
                     " WHERE datname = current_database()")
            mon.execute("SELECT pg_stat_clear_snapshot()")
            before = first(mon.execute(count))
            time.sleep(seconds)
            mon.execute("SELECT pg_stat_clear_snapshot()")
            after = first(mon.execute(count))
        return (after - before - 2) / seconds  # less the monitor's own two
    finally:
        stop.set()
        stop.thread.join(60)  # type: ignore[attr-defined]
        stop_agent(env, agent)


def q(values: list[float], pct: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1] * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db-url", default=DEFAULT_ADMIN_URL)
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--baseline-jobs", type=int, default=6)
    ap.add_argument("--idle-seconds", type=float, default=60.0)
    args = ap.parse_args()
    if missing := agent_missing():
        print(f"the agent is not available here: {missing}")
        return 1
    env = make_env(args.db_url)
    try:
        create_pg(env)
        create_sqlite(env)
        for label, url in (("PostgreSQL", env.pg_url), ("SQLite", env.sqlite_url)):
            new = latencies(env, url, args.jobs, *SHIPPED)
            line = (f"{label}: submit -> fetched, idle 4-slot node, {len(new)} jobs: p50 "
                    f"{q(new, 50):.0f} ms, p99 {q(new, 99):.0f} ms (wait 5 s, delay 1 s)")
            if label == "PostgreSQL" and args.baseline_jobs:
                old = latencies(env, url, args.baseline_jobs, *TODAY)
                line += (f"; today's (no wait, delay 30 s), {len(old)} jobs: p50 "
                         f"{q(old, 50):.0f} ms, p99 {q(old, 99):.0f} ms")
            print(line, flush=True)
        new_cost = idle_cost(env, env.pg_url, args.idle_seconds, *SHIPPED)
        old_cost = idle_cost(env, env.pg_url, args.idle_seconds, *TODAY)
        print(f"idle 32-slot node, queue empty, {args.idle_seconds:.0f} s: {new_cost:.2f} "
              f"transactions/s of its database (wait 5 s, delay 1 s) against {old_cost:.2f} "
              "today (no wait, delay 30 s)")
    finally:
        cleanup(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
