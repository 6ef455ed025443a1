"""A claiming process for test_concurrency: claim until none is left, complete each job.

Usage: claim_worker.py URL SLOT. Prints "ready", waits for a line on stdin (the start signal),
then prints one JSON object: {"ids": [...], "start": t0, "end": t1}.
"""

from __future__ import annotations

import json
import sys
import time

from jobstore.db import make_engine
from jobstore.states import Event
from jobstore.store import ClaimRequest, JobStore, Offer, Verdict


def main(url: str, slot: str) -> None:
    # One connection per transaction, as the hooks use the store (make_engine's default).
    store = JobStore(make_engine(url, connect_timeout=30))
    req = ClaimRequest(queue="default", offer=Offer(cpus=1, memory=1024, disk=1 << 20), slot=slot,
                       host="node", keyword="JOBSTORE", claim_lease=600)
    print("ready", flush=True)
    sys.stdin.readline()
    ids = []
    start = time.time()
    while (job := store.claim(req, lambda _row: Verdict(take=True))) is not None:
        out = store.report(job["id"], Event.EXIT, token=job["token"], attempt=job["claims"])
        if out.after != "completed" or out.stale:
            raise SystemExit(f"job {job['id']}: EXIT gave {out}")
        ids.append(job["id"])
    end = time.time()
    store.engine.dispose()
    print(json.dumps({"ids": ids, "start": start, "end": end}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
