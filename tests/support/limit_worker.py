"""A claiming process for the concurrency limit test: claim jobs that use limit `lic` (maximum 3)
until none is left, hold each a little, then complete it.

Usage: limit_worker.py URL SLOT. Prints "ready", waits for a line on stdin (the start signal),
then prints one JSON object: {"held": [[job id, claimed at, completing at], ...]}.
"""

from __future__ import annotations

import json
import math
import sys
import time

from jobstore.core.states import Event
from jobstore.db.engine import DatabaseError, make_engine
from jobstore.db.store import JobStore, Offer
from jobstore.testing.factories import claim, claim_request, report

LIMIT = 3
HOLD = 0.2  # long enough that three holds overlap even on a loaded machine


def main(url: str, slot: str) -> None:
    store = JobStore(make_engine(url, connect_timeout=30))
    req = claim_request(
        offer=Offer(cpus=1, memory=1024, disk=1 << 20), slot=slot, host="node", shape="s",
        limit=lambda name: LIMIT if name == "lic" else math.inf,
    )
    print("ready", flush=True)
    sys.stdin.readline()
    held = []
    idle_rounds = 0

    def retry(fn):  # type: ignore[no-untyped-def]
        while True:  # SQLite's busy timeout under 32 writers: nothing was written, try again
            try:
                return fn()
            except DatabaseError as exc:
                if "database is locked" not in str(exc):
                    raise
    while idle_rounds < 20:
        job = retry(lambda: claim(store, req))
        if job is None:  # every job held elsewhere or done: wait for one to come free
            idle_rounds += 1
            time.sleep(0.02)
            continue
        idle_rounds = 0
        claimed = time.time()
        time.sleep(HOLD)
        done = time.time()
        out = retry(lambda job=job: report(store, job, Event.EXIT))
        if out.after != "completed" or out.stale:
            raise SystemExit(f"job {job.id}: EXIT gave {out}")
        held.append([job.id, claimed, done])
    store.db.engine.dispose()
    print(json.dumps({"held": held}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
