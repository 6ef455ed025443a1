#!/usr/bin/env python3
"""Waiting fetches, through the emulated startd with the agent and the real hooks,
the shipped settings (JOBSTORE_FETCH_WAIT 120 s, FetchWorkDelay 1 s for an idle slot) against
today's (no wait, FetchWorkDelay 30 s):

* submit -> fetched, p50 and p99, of single jobs submitted one at a time into an idle 4-slot
  node, on PostgreSQL and SQLite, and into a pool of NODES nodes of SLOTS slots (one agent each)
  sharing one PostgreSQL database;
* what an idle 32-slot node costs, queue empty: transactions per second of its database, the
  claims its agent made, the hooks' CPU per slot and minute, the agent's CPU;
* the time to run 1,000 /bin/true jobs submitted at once to an idle 8-slot node.

Usage: .venv/bin/python bench/fetch_wait.py [--db-url ADMIN_URL] [--jobs N] [--baseline-jobs N]
       [--idle-seconds S] [--baseline-idle-seconds S] [--nodes N] [--slots N] [--pool-jobs N]
       [--throughput-jobs N]
"""

from __future__ import annotations

import argparse
import resource
import socket
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
from hookcost import agent_missing, proc_cpu, start_agent  # noqa: E402
from schedd_scale import DEFAULT_ADMIN_URL  # noqa: E402

from jobstore.core.jobs import JobSpec  # noqa: E402
from jobstore.db.schema import jobs as jobs_table  # noqa: E402
from jobstore.db.store import JobStore  # noqa: E402
from jobstore.emulator import Emulator, EmulatorConfig  # noqa: E402
from jobstore.node.hooktable import CONDOR_NAMES  # noqa: E402
from jobstore.testing.support import libpq_url  # noqa: E402

SHIPPED = ("120", 'ifThenElse(State == "Claimed" && Activity == "Idle", 0, 1)')
TODAY = ("0", 'ifThenElse(State == "Claimed" && Activity == "Idle", 0, 30)')


def _node(env: Any, url: str, slots: int, delay: str, name: str,
          extra: dict[str, str] | None = None) -> tuple[Emulator, threading.Event]:
    """An emulated node of `slots` static slots, started in a thread; set the event to stop.
    `extra`: its hooks' environment beyond the run's (another node's agent socket)."""
    hooks = {condor: str(env.hooks / ours) for ours, condor in CONDOR_NAMES.items()}
    cfg = EmulatorConfig(
        hooks=hooks, work_dir=str(env.tmp / name), keyword=KEYWORD, static_slots=slots,
        cpus=slots, memory=1024 * slots, initial_update_interval=0.5, update_interval=60.0,
        fetch_work_delay=delay, env=node_env(env, url, extra or {}), host=f"{name}.example.org")
    emulator, stop = Emulator(cfg), threading.Event()
    thread = threading.Thread(target=emulator.run, kwargs={
        "until": stop.is_set, "timeout": 3600, "wait_for_jobs": True}, daemon=True)
    thread.start()
    stop.thread = thread  # type: ignore[attr-defined]
    return emulator, stop


def _submit_one(store: JobStore) -> int:
    _, (job_id,) = store.submissions.submit(
        [JobSpec(cmd="/bin/true", iwd="/tmp", request_memory=64)],
        owner=OWNER, queue="default", max_attempts=3)
    return job_id


def _stop(env: Any, stops: list[threading.Event], agents: list[Any]) -> None:
    for stop in stops:
        stop.set()
    for stop in stops:
        stop.thread.join(60)  # type: ignore[attr-defined]
    for agent in agents:
        stop_agent(env, agent)


def _metrics_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _pool(env: Any, url: str, nodes: int, slots: int, wait: str, delay: str,
          port: str = "") -> tuple[list[threading.Event], list[Any]]:
    """`nodes` emulated nodes of `slots` slots, each with its own agent (the first serves its
    metrics on `port`, if given)."""
    stops, agents = [], []
    tag = time.monotonic_ns()
    for i in range(nodes):
        name = "agent" if i == 0 else f"agent{i}"
        extra = {"_CONDOR_JOBSTORE_FETCH_WAIT": wait,
                 "JOBSTORE_SPOOL": str(env.tmp / f"spool-{name}")}
        if i == 0 and port:
            extra["_CONDOR_JOBSTORE_AGENT_METRICS_PORT"] = port
        agents.append(start_agent(env, url, extra, name=name))
        _, stop = _node(env, url, slots, delay, f"n{i}-{tag}", {
            "JOBSTORE_AGENT_SOCKET": str(env.tmp / f"{name}.sock"),
            "JOBSTORE_SPOOL": extra["JOBSTORE_SPOOL"]})
        stops.append(stop)
    return stops, agents


def latencies(env: Any, url: str, jobs: int, wait: str, delay: str, nodes: int = 1,
              slots: int = 4) -> list[float]:
    """Seconds from each job's submit to its fetch, one job at a time into an idle pool."""
    store = JobStore.from_url(url)
    stops, agents = _pool(env, url, nodes, slots, wait, delay)
    out = []
    try:
        time.sleep(2.0 + nodes * slots / 50)  # the first fetches (each slot idle, waiting or not)
        for _ in range(jobs):
            job_id = _submit_one(store)
            deadline = time.monotonic() + 120
            while (job := store.reads.get_job(job_id)).fetched_at is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"job {job_id} not fetched in 120 s")
                time.sleep(0.002)
            out.append(job.fetched_at - job.submitted_at)
            while store.reads.get_job(job_id).status not in ("completed", "failed", "held"):
                time.sleep(0.01)
            time.sleep(0.3)  # idle again: every slot back to fetching
    finally:
        _stop(env, stops, agents)
        store.db.engine.dispose()
    return out


def _claims(port: str) -> float:
    """The claims the agent made so far (jobstore_agent_claims_total, from its metrics)."""
    import re
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = re.search(r"^jobstore_agent_claims_total (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def idle_cost(env: Any, url: str, seconds: float, wait: str, delay: str,
              slots: int = 32) -> dict[str, float]:
    """What an idle node of `slots` slots costs while the queue is empty: its database's
    transactions per second, its agent's claims per second, its hooks' CPU milliseconds per
    slot and minute, its agent's CPU milliseconds per minute."""
    import psycopg

    port = _metrics_port()
    stops, agents = _pool(env, url, 1, slots, wait, delay, port)
    try:
        time.sleep(15.0)  # settle: every slot's first fetch (a hook process each)
        with psycopg.connect(libpq_url(url), autocommit=True) as mon:
            count = ("SELECT xact_commit + xact_rollback FROM pg_stat_database"
                     " WHERE datname = current_database()")
            mon.execute("SELECT pg_stat_clear_snapshot()")
            before = first(mon.execute(count))
            claims = _claims(port)
            hooks = resource.getrusage(resource.RUSAGE_CHILDREN)
            agent = proc_cpu(agents[0].pid)
            time.sleep(seconds)
            agent = proc_cpu(agents[0].pid) - agent
            after_hooks = resource.getrusage(resource.RUSAGE_CHILDREN)
            claims = _claims(port) - claims
            mon.execute("SELECT pg_stat_clear_snapshot()")
            after = first(mon.execute(count))
        hook_cpu = (after_hooks.ru_utime + after_hooks.ru_stime
                    - hooks.ru_utime - hooks.ru_stime)
        minutes = seconds / 60
        return {"tx/s": (after - before - 2) / seconds,  # less the monitor's own two
                "claims/s": claims / seconds,
                "hook ms/slot/min": hook_cpu * 1000 / slots / minutes,
                "agent ms/min": agent * 1000 / minutes}
    finally:
        _stop(env, stops, agents)


def throughput(env: Any, url: str, jobs: int, wait: str, delay: str, slots: int = 8) -> float:
    """Seconds from submitting `jobs` /bin/true jobs at once into an idle node to the last
    one's end."""
    store = JobStore.from_url(url)
    stops, agents = _pool(env, url, 1, slots, wait, delay)
    try:
        time.sleep(5.0)  # idle: the first fetches
        started = time.monotonic()
        specs = [JobSpec(cmd="/bin/true", iwd="/tmp", request_memory=64, proc_id=i)
                 for i in range(jobs)]
        cluster, ids = store.submissions.submit(specs, owner=OWNER, queue="default", max_attempts=3)
        last = ids[-1]
        while True:
            counts = store.reads.count_by_status(include_final=True,
                                                 where=jobs_table.c.cluster_id == cluster)
            if counts.get("completed", 0) + counts.get("failed", 0) >= jobs:
                break
            if time.monotonic() - started > 1800:
                raise RuntimeError(f"{jobs} jobs not done in 30 min (last {last}): {counts}")
            time.sleep(0.2)
        return time.monotonic() - started
    finally:
        _stop(env, stops, agents)
        store.db.engine.dispose()


def q(values: list[float], pct: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1] * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--db-url", default=DEFAULT_ADMIN_URL)
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--baseline-jobs", type=int, default=6)
    ap.add_argument("--idle-seconds", type=float, default=60.0)
    ap.add_argument("--baseline-idle-seconds", type=float, default=None,
                    help="today's idle window (default: --idle-seconds)")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--pool-jobs", type=int, default=20)
    ap.add_argument("--throughput-jobs", type=int, default=1000)
    args = ap.parse_args()
    if missing := agent_missing():
        print(f"the agent is not available here: {missing}")
        return 1
    env = make_env(args.db_url)
    shipped, today = "(wait 120 s, delay 1 s)", "(no wait, delay 30 s)"
    try:
        create_pg(env)
        create_sqlite(env)
        for label, url in (("PostgreSQL", env.pg_url), ("SQLite", env.sqlite_url)):
            if not args.jobs:
                break
            new = latencies(env, url, args.jobs, *SHIPPED)
            line = (f"{label}: submit -> fetched, idle 4-slot node, {len(new)} jobs: p50 "
                    f"{q(new, 50):.0f} ms, p99 {q(new, 99):.0f} ms {shipped}")
            if label == "PostgreSQL" and args.baseline_jobs:
                old = latencies(env, url, args.baseline_jobs, *TODAY)
                line += (f"; today's {today}, {len(old)} jobs: p50 "
                         f"{q(old, 50):.0f} ms, p99 {q(old, 99):.0f} ms")
            print(line, flush=True)
        if args.pool_jobs:
            pool = latencies(env, env.pg_url, args.pool_jobs, *SHIPPED, nodes=args.nodes,
                             slots=args.slots)
            print(f"PostgreSQL: submit -> fetched, idle pool of {args.nodes} nodes x "
                  f"{args.slots} slots (an agent each), {len(pool)} jobs: p50 "
                  f"{q(pool, 50):.0f} ms, p99 {q(pool, 99):.0f} ms {shipped}", flush=True)
        if args.idle_seconds:
            old_idle = args.baseline_idle_seconds or args.idle_seconds
            for label, settings, seconds in ((shipped, SHIPPED, args.idle_seconds),
                                             (today, TODAY, old_idle)):
                cost = idle_cost(env, env.pg_url, seconds, *settings)
                print(f"idle 32-slot node, queue empty, {seconds:.0f} s {label}: "
                      + ", ".join(f"{v:.2f} {k}" for k, v in cost.items()), flush=True)
        if args.throughput_jobs:
            new_t = throughput(env, env.pg_url, args.throughput_jobs, *SHIPPED)
            old_t = throughput(env, env.pg_url, args.throughput_jobs, *TODAY)
            print(f"{args.throughput_jobs} /bin/true jobs into an idle 8-slot node: {new_t:.1f} s "
                  f"{shipped}, {old_t:.1f} s {today}: throughput {old_t / new_t:.2f}x today's",
                  flush=True)
    finally:
        cleanup(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
