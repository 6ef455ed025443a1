#!/usr/bin/env python3
"""DAGs through the emulated startd with the agent and the real hook executables, on
PostgreSQL: the throughput of a chain of no-op jobs (one slot: a chain runs one node at a time)
and of a wide DAG (a root, then the rest at once; 8 slots), each against the same number of
jobs without dependencies on the same slots, in the same run.

Usage: .venv/bin/python bench/dag_emulated.py [--db-url ADMIN_URL] [--chain N] [--wide N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import KEYWORD, OWNER, cleanup, create_pg, make_env, node_env, stop_agent  # noqa: E402
from hookcost import agent_missing, start_agent  # noqa: E402
from schedd_scale import DEFAULT_ADMIN_URL  # noqa: E402

from jobstore.api.dags import submit_dag  # noqa: E402
from jobstore.api.submission import submit_path  # noqa: E402
from jobstore.db.store import JobStore  # noqa: E402
from jobstore.emulator import Emulator, EmulatorConfig  # noqa: E402
from jobstore.node import config  # noqa: E402
from jobstore.node.hooktable import CONDOR_NAMES  # noqa: E402

SUB = "executable = /bin/true\nrequest_memory = 64\nqueue\n"


def run(env, store: JobStore, slots: int) -> float:  # type: ignore[no-untyped-def]
    """Run the store's queue to its end through an emulated node of `slots` static slots with
    the agent's hooks: the seconds it took."""
    hooks = {condor: str(env.hooks / ours) for ours, condor in CONDOR_NAMES.items()}
    cfg = EmulatorConfig(
        hooks=hooks, work_dir=str(env.tmp / f"node-{time.monotonic_ns()}"), keyword=KEYWORD,
        static_slots=slots, cpus=slots, memory=1024 * slots, initial_update_interval=1.0,
        update_interval=5.0,
        fetch_work_delay='ifThenElse(State == "Claimed" && Activity == "Idle",0,1)',
        env=node_env(env, env.pg_url, {}))

    def done() -> bool:
        return not store.reads.list_jobs()  # nothing unfinished, waiting nodes included

    t0 = time.monotonic()
    Emulator(cfg).run(until=done, timeout=600, wait_for_jobs=True)
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db-url", default=DEFAULT_ADMIN_URL)
    ap.add_argument("--chain", type=int, default=40)
    ap.add_argument("--wide", type=int, default=200)
    args = ap.parse_args()
    missing = agent_missing()
    if missing:
        print(f"the agent is not available here: {missing}")
        return 1
    env = make_env(args.db_url)
    try:
        create_pg(env)
        os.environ["JOBSTORE_DATABASE_URL"] = env.pg_url
        settings = config.load_settings(None)
        store = JobStore.from_url(env.pg_url)
        agent = start_agent(env, env.pg_url)
        sub = env.tmp / "n.sub"
        sub.write_text(SUB)
        chain = env.tmp / "chain.dag"
        chain.write_text("".join(f"JOB C{i} n.sub\n" for i in range(args.chain))
                         + "".join(f"PARENT C{i} CHILD C{i + 1}\n"
                                   for i in range(args.chain - 1)))
        wide = env.tmp / "wide.dag"
        wide.write_text("JOB root n.sub\n" + "".join(f"JOB W{i} n.sub\n"
                                                     for i in range(args.wide - 1))
                        + "PARENT root CHILD " + " ".join(f"W{i}" for i in range(args.wide - 1))
                        + "\n")
        for label, dag, count, slots in (("chain", chain, args.chain, 1),
                                         ("wide", wide, args.wide, 8)):
            plain = env.tmp / f"{label}.sub"
            plain.write_text(SUB.replace("queue", f"queue {count}"))
            submit_path(store, plain, settings, owner=OWNER)
            base = run(env, store, slots)
            submit_dag(store, str(dag), settings, owner=OWNER)
            took = run(env, store, slots)
            print(f"{label} of {count} no-op nodes on {slots} slot(s), emulator + agent: "
                  f"{count / took:.1f} nodes/s against {count / base:.1f} plain jobs/s "
                  f"(ratio {base / took:.2f})")
        stop_agent(env, agent)
        store.db.engine.dispose()
    finally:
        cleanup(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
