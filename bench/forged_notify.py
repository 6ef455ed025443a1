#!/usr/bin/env python3
"""Forged notifications: what an idle node costs while another account floods the database's
channels with NOTIFYs it made up (anyone who may connect may NOTIFY), against the same node,
quiet, measured in the same run. PostgreSQL; the emulated startd with the agent and the real
hooks, the shipped settings (JOBSTORE_FETCH_WAIT 120 s).

* an idle 32-slot node, queue empty, quiet and then flooded with RATE forged notifications a
  second (half `jobstore_work`, the shapes of work that fits every slot, half `jobstore_stops`):
  its database's transactions per second, its agent's claims per second and CPU;
* submit -> fetched, p50 and p99, of single jobs into an idle 4-slot node, quiet and flooded.

Usage: .venv/bin/python bench/forged_notify.py [--db-url ADMIN_URL] [--seconds S] [--rate N]
       [--jobs N]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402
from common import cleanup, create_pg, make_env  # noqa: E402
from fetch_wait import SHIPPED, idle_cost, latencies, q  # noqa: E402
from hookcost import agent_missing  # noqa: E402
from schedd_scale import DEFAULT_ADMIN_URL  # noqa: E402

from jobstore.testing.support import libpq_url  # noqa: E402


class Flood:
    """A connection of its own that sends `rate` forged notifications a second, BATCH to a
    transaction (distinct payloads: none folded), until stopped."""

    BATCH = 25

    def __init__(self, url: str, rate: int) -> None:
        self.url, self.rate, self.sent, self.transactions = url, rate, 0, 0
        self.started = self.ended = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Flood:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.ended = time.monotonic()

    @property
    def tx_per_second(self) -> float:
        """The flood's own transactions a second (counted by the database with the node's)."""
        return self.transactions / max(self.ended - self.started, 1e-9)

    def _run(self) -> None:
        step = self.BATCH / self.rate
        with psycopg.connect(libpq_url(self.url)) as conn:
            due = time.monotonic()
            while not self._stop.is_set():
                for _ in range(self.BATCH):
                    if self.sent % 2:
                        conn.execute("SELECT pg_notify('jobstore_stops', %s)",
                                     (str(self.sent),))
                    else:
                        conn.execute("SELECT pg_notify('jobstore_work', %s)",
                                     (f"default 1 64 {1000 + self.sent}",))
                    self.sent += 1
                conn.commit()
                self.transactions += 1
                due += step
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--db-url", default=DEFAULT_ADMIN_URL)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rate", type=int, default=500)
    ap.add_argument("--jobs", type=int, default=20)
    args = ap.parse_args()
    if missing := agent_missing():
        print(f"the agent is not available here: {missing}")
        return 1
    env = make_env(args.db_url)
    try:
        create_pg(env)
        quiet = idle_cost(env, env.pg_url, args.seconds, *SHIPPED)
        with Flood(env.pg_url, args.rate) as flood:
            loud = idle_cost(env, env.pg_url, args.seconds, *SHIPPED)
        loud["tx/s"] -= flood.tx_per_second  # the node's, without the flood's own
        for label, cost in (("quiet", quiet), (f"flooded ({flood.sent} sent)", loud)):
            print(f"idle 32-slot node, queue empty, {args.seconds:.0f} s {label}: "
                  + ", ".join(f"{v:.2f} {k}" for k, v in cost.items()), flush=True)
        if args.jobs:
            calm = latencies(env, env.pg_url, args.jobs, *SHIPPED)
            with Flood(env.pg_url, args.rate):
                under = latencies(env, env.pg_url, args.jobs, *SHIPPED)
            print(f"submit -> fetched, idle 4-slot node, {args.jobs} jobs: quiet p50 "
                  f"{q(calm, 50):.0f} ms p99 {q(calm, 99):.0f} ms; flooded p50 "
                  f"{q(under, 50):.0f} ms p99 {q(under, 99):.0f} ms", flush=True)
        print("SUMMARY (flooded / quiet, this run):")
        for key in ("tx/s", "claims/s", "agent ms/min"):
            base = max(quiet[key], 0.01)
            print(f"  {key}: {quiet[key]:.2f} -> {loud[key]:.2f} ({loud[key] / base:.2f}x)")
    finally:
        cleanup(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
