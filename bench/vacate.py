#!/usr/bin/env python3
"""rm of a running job, through the agent: how long until its process is gone, and
what the agent costs while it watches.

Both in the agent's two modes: LISTEN (PostgreSQL notifies it of every hold or rm of a handed-out
job; it polls every 30 s besides) and poll (JOBSTORE_AGENT_WATCH_LISTEN = false: one query every
JOBSTORE_AGENT_WATCH_INTERVAL, 2 s).

1. An emulated node (8 static slots) with the agent runs N jobs of `sleep 600` (N = 50; 20 with
   --quick). Each job is removed as soon as it runs; the time from `rm` to the JOB_EXIT of its
   vacated attempt (the job's processes are gone then) is taken per job: p50 and p99, also as a
   ratio to the watch interval.
2. The agent's idle cost over a quiet window: its CPU and the database's transactions per
   second, with no job running and with 32 running (32 slots, STARTER_UPDATE_INTERVAL long
   enough that no report falls into the window).

PostgreSQL. Usage: .venv/bin/python bench/vacate.py [--quick] [--db-url URL]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import psycopg
from common import (
    DEFAULT_ADMIN_URL,
    KEYWORD,
    OWNER,
    Env,
    cleanup,
    create_pg,
    first,
    make_env,
    node_env,
    pct,
    progress,
    say,
    stop_agent,
    table,
)
from hookcost import proc_cpu, start_agent

from jobstore.node.hooktable import CONDOR_NAMES
from jobstore.testing.support import ensure_account, libpq_url

WATCH = 2.0


def emulator(env: Env, slots: int, name: str, update_interval: float) -> Any:
    from jobstore.emulator import Emulator, EmulatorConfig

    hooks = {condor: str(env.hooks / ours) for ours, condor in CONDOR_NAMES.items()}
    control = env.tmp / f"control-{name}"
    control.mkdir(exist_ok=True)
    cfg = EmulatorConfig(
        hooks=hooks, work_dir=str(env.tmp / f"node-{name}"), keyword=KEYWORD,
        static_slots=slots, cpus=slots, memory=slots * 1024, initial_update_interval=1.0,
        update_interval=update_interval, control_dir=str(control),
        fetch_work_delay='ifThenElse(State == "Claimed" && Activity == "Idle",0,1)',
        env=node_env(env, env.pg_url, {}),
    )
    return Emulator(cfg)


def submit(env: Env, n: int) -> list[int]:
    from jobstore.core.jobs import JobSpec
    from jobstore.db.store import JobStore

    store = JobStore.from_url(env.pg_url)
    try:
        specs = [JobSpec(cmd="/bin/sleep", args="600", iwd="/tmp", request_memory=64, proc_id=i)
                 for i in range(n)]
        return store.submissions.submit(specs, owner=OWNER, queue="default", max_attempts=3)[1]
    finally:
        store.db.engine.dispose()


def section_rm(env: Env, jobs: int, mode: str) -> list[float]:
    from jobstore.core.states import Event
    from jobstore.db.store import JobStore

    say(f"== 1. ({mode}) rm of a running job to its process gone: {jobs} jobs of `sleep 600`,"
        " 8 slots")
    ids = set(submit(env, jobs))
    store = JobStore.from_url(env.pg_url, pool=True)
    removed: dict[int, float] = {}
    gone: dict[int, float] = {}

    def until() -> bool:
        with psycopg.connect(libpq_url(env.pg_url), autocommit=True) as conn:
            running = [r[0] for r in conn.execute(
                "SELECT id FROM jobs WHERE status = 'running' AND id = ANY(%s)", (list(ids),))]
            for job_id in running:
                if job_id not in removed:
                    removed[job_id] = time.time()
                    store.actions.admin(job_id, Event.REMOVE, "bench rm")
            waiting = [i for i in removed if i not in gone]
            if waiting:
                for job_id, at in conn.execute(
                    "SELECT job_id, min(time) FROM job_events WHERE job_id = ANY(%s) AND"
                    " event IN ('exit', 'evict') AND to_status IS NULL GROUP BY job_id",
                    (waiting,)):
                    gone[job_id] = at
        return len(gone) == len(ids)

    try:
        emulator(env, 8, f"rm-{mode}", 300.0).run(until=until, timeout=60 + jobs * 3)
    finally:
        store.db.engine.dispose()
    latencies = [gone[i] - removed[i] for i in gone]
    if len(latencies) < len(ids):
        say(f"   only {len(latencies)} of {len(ids)} jobs were seen gone in time")
    return latencies


def quiet_cost(env: Env, agent_pid: int, seconds: float) -> tuple[float, float]:
    """(agent CPU %, database transactions per second) over `seconds` of quiet."""
    with psycopg.connect(libpq_url(env.pg_url), autocommit=True) as conn:
        query = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s"
        name = conn.info.dbname
        conn.execute("SELECT pg_stat_clear_snapshot()")
        x0, c0, t0 = first(conn.execute(query, (name,))), proc_cpu(agent_pid), time.monotonic()
        time.sleep(seconds)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        x1, c1, t1 = first(conn.execute(query, (name,))), proc_cpu(agent_pid), time.monotonic()
    # the monitor's own two reads are not the agent's
    return 100 * (c1 - c0) / (t1 - t0), max(0, x1 - x0 - 2) / (t1 - t0)


def section_idle(env: Env, agent_pid: int, seconds: float,
                 mode: str) -> dict[str, tuple[float, float]]:
    import threading

    say("")
    say(f"== 2. ({mode}) The agent's cost while it watches, {seconds:g} s windows")
    time.sleep(5)  # the last node's shutdown reports settle
    out = {"no job running": quiet_cost(env, agent_pid, seconds)}
    ids = submit(env, 32)
    node = emulator(env, 32, f"idle-{mode}", 3600.0)
    result: dict[str, tuple[float, float]] = {}

    def measure() -> None:
        deadline = time.monotonic() + 120
        with psycopg.connect(libpq_url(env.pg_url), autocommit=True) as conn:
            while time.monotonic() < deadline:
                n = first(conn.execute("SELECT count(*) FROM jobs WHERE status = 'running'"
                                       " AND id = ANY(%s)", (ids,)))
                if n == len(ids):
                    break
                time.sleep(0.5)
        time.sleep(3)  # the last UPDATE_JOB_INFO calls settle
        result["32 jobs running"] = quiet_cost(env, agent_pid, seconds)

    t = threading.Thread(target=measure)
    t.start()
    node.run(until=lambda: not t.is_alive(), timeout=200)
    t.join()
    remove_all(env, ids)  # not left for the next mode's node to fetch
    out.update(result)
    return out


def remove_all(env: Env, ids: list[int]) -> None:
    from jobstore.core.states import Event
    from jobstore.db.store import JobStore

    store = JobStore.from_url(env.pg_url)
    try:
        for job_id in ids:
            store.actions.admin(job_id, Event.REMOVE, "bench: done")
    finally:
        store.db.engine.dispose()


def run_mode(env: Env, mode: str, quick: bool) -> tuple[list[float], dict[str, Any]]:
    """Both sections with the agent in `mode` (listen or poll)."""
    with open(env.condor_config, "a") as fh:
        fh.write(f"JOBSTORE_AGENT_WATCH_LISTEN = {'true' if mode == 'listen' else 'false'}\n")
    agent = start_agent(env, env.pg_url)
    try:
        # the vacate command writes into vacate.sh.d; each emulated node reads its own control
        # directory, so point that at the node that runs (one at a time)
        link = env.tmp / "vacate.sh.d"
        progress(f"{mode}: rm section")
        os.symlink(env.tmp / f"control-rm-{mode}", link)
        lat = section_rm(env, 20 if quick else 50, mode)
        os.unlink(link)
        os.symlink(env.tmp / f"control-idle-{mode}", link)
        progress(f"{mode}: idle section")
        idle = section_idle(env, agent.pid, 10.0 if quick else 30.0, mode)
        os.unlink(link)
    finally:
        stop_agent(env, agent)
    return lat, idle


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--db-url", default=os.environ.get("JOBSTORE_BENCH_DATABASE_URL"))
    args = ap.parse_args()
    ensure_account(OWNER, uid=1001)
    env = make_env(args.db_url or DEFAULT_ADMIN_URL)
    try:
        create_pg(env)
        with open(env.condor_config, "a") as fh:
            script = env.tmp / "vacate.sh"
            script.write_text('#!/bin/sh\nprintf %s "$1" > "$0.d/.vacate-$2"'
                              ' && mv "$0.d/.vacate-$2" "$0.d/vacate-$2"\n')
            script.chmod(0o755)
            fh.write(f"JOBSTORE_AGENT_VACATE_COMMAND = {script}\n"
                     f"JOBSTORE_AGENT_WATCH_INTERVAL = {WATCH:g}\n")
        results = {mode: run_mode(env, mode, args.quick) for mode in ("listen", "poll")}
        rows = []
        for mode, (lat, _) in results.items():
            if lat:
                rows.append([mode, str(len(lat)), f"{statistics.median(lat):.2f}",
                             f"{pct(lat, 0.99):.2f}", f"{statistics.median(lat) / WATCH:.2f}",
                             f"{pct(lat, 0.99) / WATCH:.2f}"])
        say(table(["agent mode", "jobs", "rm->gone p50 (s)", "p99 (s)", "p50/watch",
                   "p99/watch"], rows))
        say(table(["agent mode", "watching", "agent CPU %", "db transactions/s"],
                  [[mode, k, f"{v[0]:.2f}", f"{v[1]:.2f}"]
                   for mode, (_, idle) in results.items() for k, v in idle.items()]))
        return 0
    finally:
        cleanup(env)


if __name__ == "__main__":
    sys.exit(main())
