"""Section 5: an emulated node (8 static slots) running short jobs, agent and direct hooks."""

from __future__ import annotations

import statistics
import time

from common import KEYWORD, OWNER, Env, first, node_env

from jobstore.node.hooktable import CONDOR_NAMES
from jobstore.testing.support import (
    libpq_url,
)


def emulate_rate(env: Env, jobs: int, mode: str) -> tuple[float, int, int, int]:
    """`jobs` jobs of `sleep 0.1` through jobstore.emulator with 8 static slots: (jobs finished
    per s, finished, max and median connections to the bench database held meanwhile)."""
    import psycopg

    from jobstore.core.jobs import JobSpec
    from jobstore.db.store import JobStore
    from jobstore.emulator import Emulator, EmulatorConfig

    store = JobStore.from_url(env.pg_url)
    queue = "default"  # the agent reads its own configuration: keep the default queue
    new = [JobSpec(cmd="/bin/sleep", args="0.1", iwd="/tmp", request_memory=64, proc_id=i)
           for i in range(jobs)]
    _, ids = store.submissions.submit(new, owner=OWNER, queue=queue, max_attempts=3)
    store.db.engine.dispose()
    hooks = {condor: str(env.hooks / ours) for ours, condor in CONDOR_NAMES.items()}
    cfg = EmulatorConfig(
        hooks=hooks, work_dir=str(env.tmp / f"node-{mode}"), keyword=KEYWORD, static_slots=8,
        cpus=8, memory=8192, initial_update_interval=1.0, update_interval=5.0,
        fetch_work_delay='ifThenElse(State == "Claimed" && Activity == "Idle",0,1)',
        env=node_env(env, env.pg_url, {}),
    )
    counts: list[int] = []
    with psycopg.connect(libpq_url(env.pg_url), autocommit=True) as mon:

        def done() -> bool:
            # the agent's one LISTEN connection (stopped attempts) is not counted
            n = first(mon.execute("SELECT count(*) FROM pg_stat_activity WHERE datname ="
                            " current_database() AND pid <> pg_backend_pid()"
                            " AND query NOT LIKE 'LISTEN %%'"))
            counts.append(int(n))
            left = first(mon.execute("SELECT count(*) FROM jobs WHERE queue = %s AND status NOT IN"
                               " ('completed', 'failed', 'held', 'removed')",
                               (queue,)))
            return left == 0

        completed = ("SELECT count(*) FROM jobs WHERE queue = %s AND status = 'completed'"
                     " AND cmd = '/bin/sleep' AND ad::text LIKE '%%0.1%%'")
        before = first(mon.execute(completed, (queue,)))  # earlier runs' jobs
        t0 = time.monotonic()
        Emulator(cfg).run(until=done, timeout=150, wait_for_jobs=True)
        span = time.monotonic() - t0
        finished = first(mon.execute(completed, (queue,))) - before
    _remove_unfinished(env, ids)  # (a slow machine): later sections find the queue empty
    counts = counts[len(counts) // 5:] or [0]  # steady state: skip the start
    return finished / span, finished, max(counts), int(statistics.median(counts))


def _remove_unfinished(env: Env, ids: list[int]) -> None:
    from jobstore.core.states import FINAL, Event
    from jobstore.db.store import JobStore

    store = JobStore.from_url(env.pg_url)
    try:
        for job_id in ids:
            if store.reads.get_job(job_id).status not in {s.value for s in FINAL}:
                store.actions.admin(job_id, Event.REMOVE, "bench: not finished in time")
    finally:
        store.db.engine.dispose()
