#!/usr/bin/env python3
"""What an idle execute node costs, on a real HTCondor (as root; HTCONDOR_PREFIX or
condor_master on PATH): 32 static slots, the README's install, the shipped drop-ins, the agent
under condor_master, PostgreSQL with peer authentication, an empty queue.

Over a window of --seconds (after --settle seconds for every slot's first fetch), in % of one
core: the agent (with its children), the hooks (the startd's reaped children), the startd
itself, and against them the same pool with no hooks configured (the baseline, measured in the
same run, after); the hook processes started, and the database's transactions that wrote
(a claim writes; an idle node should make none) and that committed at all.

Usage: bench/idle_node.py [--slots 32] [--seconds 600] [--settle 90] [--no-baseline]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import psycopg

from jobstore.testing.livepool import (
    HOW_TO_POINT,
    LivePool,
    htcondor_prefix,
    install_node,
    wait_for,
)
from jobstore.testing.peerpg import PORT, PeerServer, pg_bin

REPO = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def slots_config(n: int) -> str:
    return (f"NUM_CPUS = {n}\nMEMORY = {n * 128}\nNUM_SLOTS_TYPE_1 = {n}\n"
            "SLOT_TYPE_1 = cpus=1, memory=128, disk=2%\nSLOT_TYPE_1_PARTITIONABLE = FALSE\n")


def cpu(pid: int | None) -> tuple[float, float]:
    """(CPU seconds of `pid` itself, of its reaped children)."""
    if pid is None:
        return 0.0, 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    return ((int(fields[11]) + int(fields[12])) / TICK,
            (int(fields[13]) + int(fields[14])) / TICK)


def counters(server: PeerServer) -> tuple[int, int]:
    """(the next transaction id, the job store database's commits so far)."""
    time.sleep(1.5)  # statistics are flushed at most once a second
    with psycopg.connect(server.libpq("postgres")) as conn:
        row = conn.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint, xact_commit"
            " FROM pg_stat_database WHERE datname = 'jobstore'").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def fetch_hooks(pool: LivePool) -> int:
    """FETCH_WORK hook processes the startd has reaped so far."""
    return sum(1 for line in pool.log("StartLog").splitlines()
               if "fetch_job (pid" in line and "exited" in line)


def measure(pool: LivePool, seconds: float, server: PeerServer | None) -> dict[str, float]:
    startd, agent = pool.child_pid("condor_startd"), pool.child_pid("jobstore")
    fetches0 = fetch_hooks(pool)
    s0, a0 = cpu(startd), cpu(agent)
    db0 = counters(server) if server else (0, 0)
    started = time.monotonic()
    time.sleep(seconds)
    took = time.monotonic() - started
    s1, a1 = cpu(startd), cpu(agent)
    db1 = counters(server) if server else (0, 0)
    return {
        "agent": 100 * (sum(a1) - sum(a0)) / took,
        "hooks": 100 * (s1[1] - s0[1]) / took,
        "startd": 100 * (s1[0] - s0[0]) / took,
        "fetch hooks": fetch_hooks(pool) - fetches0,
        "writing transactions": db1[0] - db0[0],
        "commits": db1[1] - db0[1],  # this bench's own second read among them
        "seconds": took,
    }


def run(prefix: Path, args: argparse.Namespace, hooks: bool) -> dict[str, float]:
    server = PeerServer(agent="root") if hooks else None
    extra = {"PGHOST": str(server.socket), "PGPORT": str(PORT)} if server else {}
    pool = LivePool(prefix, slots=slots_config(args.slots), extra_env=extra)
    try:
        if server:
            install_node(pool, REPO / "README.md", REPO, extra)
        else:
            pool.start()
        wait_for(f"{args.slots} slots", lambda: len(pool.slots()) >= args.slots, 120, 1.0)
        time.sleep(args.settle)
        return measure(pool, args.seconds, server)
    finally:
        pool.stop()
        if server:
            server.stop()
        pool.remove()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--settle", type=float, default=90)
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args()
    prefix = htcondor_prefix()
    if prefix is None:
        sys.exit(HOW_TO_POINT)
    if os.geteuid() != 0 or pg_bin() is None:
        sys.exit("bench/idle_node.py runs a pool and a PostgreSQL server as root")
    ours = run(prefix, args, hooks=True)
    print(f"idle {args.slots}-slot node with the job store, {ours['seconds']:.0f} s: agent "
          f"{ours['agent']:.2f} %, hooks {ours['hooks']:.2f} %, startd {ours['startd']:.2f} % "
          f"of a core; {ours['fetch hooks']:.0f} FETCH_WORK calls; "
          f"{ours['writing transactions']:.0f} writing transactions, {ours['commits']:.0f} "
          "commits", flush=True)
    if not args.no_baseline:
        base = run(prefix, args, hooks=False)
        print(f"the same pool without hooks: startd {base['startd']:.2f} % of a core; "
              f"with the job store, agent + hooks + startd: "
              f"{ours['agent'] + ours['hooks'] + ours['startd']:.2f} % against "
              f"{base['startd']:.2f} %", flush=True)


if __name__ == "__main__":
    main()
