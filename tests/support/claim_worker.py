"""A claiming process for test_concurrency: claim until none is left, complete each job.

Usage: claim_worker.py URL SLOT. Prints "ready", waits for a line on stdin (the start signal),
then prints one JSON object: {"ids": [...], "start": t0, "end": t1}.
"""

from __future__ import annotations

import json
import sys
import time

from jobstore.core.states import Event
from jobstore.db.engine import DatabaseError, make_engine
from jobstore.db.store import JobStore, Offer
from jobstore.testing.factories import claim, claim_request, report


def main(url: str, slot: str) -> None:
    # One connection per transaction, as the hooks use the store (make_engine's default).
    store = JobStore(make_engine(url, connect_timeout=30))
    req = claim_request(offer=Offer(cpus=1, memory=1024, disk=1 << 20), slot=slot, host="node")
    print("ready", flush=True)
    sys.stdin.readline()
    ids = []
    locked = 0

    def retry(fn):  # type: ignore[no-untyped-def]
        # SQLite's busy handler is not fair: under heavy load a process can wait out the 30 s
        # busy timeout at BEGIN IMMEDIATE. Nothing was written then, so trying again is safe
        # (a hook would simply run again later); the count is reported.
        nonlocal locked
        while True:
            try:
                return fn()
            except DatabaseError as exc:
                if "database is locked" not in str(exc):
                    raise
                locked += 1

    start = time.time()
    while (job := retry(lambda: claim(store, req))) is not None:
        out = retry(lambda job=job: report(store, job, Event.EXIT))
        if out.after != "completed" or out.stale:
            raise SystemExit(f"job {job.id}: EXIT gave {out}")
        ids.append(job.id)
    end = time.time()
    store.db.engine.dispose()
    print(json.dumps({"ids": ids, "start": start, "end": end, "locked": locked}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
