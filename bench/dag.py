#!/usr/bin/env python3
"""DAGs in the job store, on PostgreSQL, each against a baseline of the same run:

* the submit of a DAG of N nodes (a root, a fan-out of N-2 nodes, and a fan-in to one sink)
  against the submit of N plain jobs (`queue N`, what the store does fastest);
* a node's JOB_EXIT report (which decides the node and releases its child in the same
  transaction) against a plain job's, p50 and p99; and whether the child was claimable the
  moment the report returned;
* the throughput of a chain and of a wide DAG of no-op jobs run to their end by one claiming
  slot (claim, start, exit), against as many plain jobs;
* the exit report of a job followed by a chain of NOOP nodes (all done in that transaction),
  against the same with a chain a quarter as long: linear is 4.

Usage: .venv/bin/python bench/dag.py [--db-url ADMIN_URL] [--nodes N] [--chain N] [--wide N]
       [--noop N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))  # schedd_scale

from schedd_scale import DEFAULT_ADMIN_URL, make_db  # noqa: E402

from jobstore.api.dags import submit_dag  # noqa: E402
from jobstore.api.submission import submit_path  # noqa: E402
from jobstore.core import policy  # noqa: E402
from jobstore.core.jobs import Job  # noqa: E402
from jobstore.core.states import Event  # noqa: E402
from jobstore.db.store import JobStore  # noqa: E402
from jobstore.formats import views  # noqa: E402
from jobstore.node import config  # noqa: E402
from jobstore.testing.factories import claim, claim_request, report  # noqa: E402
from jobstore.testing.support import libpq_url  # noqa: E402

REQ = claim_request(slot="slot1@bench", shape="bench")
SUB = "executable = /bin/true\narguments = $(JOB)\nqueue\n"


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def exit_report(store: JobStore, job: Job) -> float:
    """JOB_EXIT exit 0 of `job`, as the hook's handler reports it: its seconds."""
    attrs = {"ExitCode": 0, "ExitBySignal": False}
    return timed(lambda: store.reports.report(
        job.id, Event.EXIT, token=job.token, attempt=job.claims,
        changes={"exit_code": 0, "exit_by_signal": False}, attrs=attrs,
        exit_policy=lambda row: policy.exit_verdict(row, attrs, views.policy_ad(row, attrs))))


def drain(store: JobStore) -> tuple[int, float, list[float]]:
    """Run every claimable job to its end with one slot: (jobs, seconds, the exit reports'
    seconds). A DAG's next node is claimable the moment its parent's report returns, or the
    loop would stop early."""
    n, reports = 0, []
    started = time.perf_counter()
    while (job := claim(store, REQ)) is not None:
        report(store, job, Event.START)
        reports.append(exit_report(store, job))
        n += 1
    return n, time.perf_counter() - started, reports


def fresh(admin: str, names: list[str]) -> tuple[JobStore, config.Settings]:
    name, url = make_db(admin, "jobstore_bench_dag")
    names.append(name)
    os.environ["JOBSTORE_DATABASE_URL"] = url
    return JobStore.from_url(url, statement_timeout_ms=None), config.load_settings(None)


def write(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text)
    return str(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db-url", default=DEFAULT_ADMIN_URL)
    ap.add_argument("--nodes", type=int, default=20_000)
    ap.add_argument("--chain", type=int, default=300)
    ap.add_argument("--wide", type=int, default=2_000)
    ap.add_argument("--noop", type=int, default=4_000,
                    help="the longer chain of NOOP nodes after one job (the shorter: a quarter)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="jobstore-bench-dag-"))
    (tmp / "condor_config").write_text("")
    os.environ["CONDOR_CONFIG"] = str(tmp / "condor_config")
    write(tmp, "n.sub", SUB)
    names: list[str] = []
    try:
        n = args.nodes
        middle = " ".join(f"M{i}" for i in range(n - 2))
        big = write(tmp, "big.dag", "JOB root n.sub\nJOB sink n.sub\n"
                    + "".join(f"JOB M{i} n.sub\n" for i in range(n - 2))
                    + f"PARENT root CHILD {middle}\nPARENT {middle} CHILD sink\n")
        plain = write(tmp, "plain.sub", f"executable = /bin/true\narguments = $(Process)\n"
                      f"queue {n}\n")
        store, settings = fresh(args.db_url, names)
        base = timed(lambda: submit_path(store, plain, settings, owner="alice"))
        store, settings = fresh(args.db_url, names)
        dag = timed(lambda: submit_dag(store, big, settings, owner="alice"))
        print(f"submit of {n:,} nodes (a fan-out and a fan-in of {n - 2:,}): {dag:.2f} s; "
              f"{n:,} plain jobs {base:.2f} s; ratio {dag / base:.1f}")

        for label, text, count in (
                ("chain", "".join(f"JOB C{i} n.sub\n" for i in range(args.chain))
                 + "".join(f"PARENT C{i} CHILD C{i + 1}\n" for i in range(args.chain - 1)),
                 args.chain),
                ("wide", "JOB root n.sub\n" + "".join(f"JOB W{i} n.sub\n"
                                                       for i in range(args.wide - 1))
                 + "PARENT root CHILD " + " ".join(f"W{i}" for i in range(args.wide - 1))
                 + "\n", args.wide)):
            store, settings = fresh(args.db_url, names)
            submit_path(store, write(tmp, f"{label}.sub", "executable = /bin/true\n"
                                     f"queue {count}\n"), settings, owner="alice")
            jobs0, secs0, reports0 = drain(store)
            store, settings = fresh(args.db_url, names)
            submit_dag(store, write(tmp, f"{label}.dag", text), settings, owner="alice")
            jobs1, secs1, reports1 = drain(store)
            assert jobs1 == count, (label, jobs1)  # every node ran: each release was at once
            q0 = statistics.quantiles(reports0, n=100)
            q1 = statistics.quantiles(reports1, n=100)
            rate0, rate1 = jobs0 / secs0, jobs1 / secs1
            print(f"{label} of {count:,}: {rate1:,.0f} nodes/s against {rate0:,.0f} plain "
                  f"jobs/s (ratio {rate1 / rate0:.2f}); exit report "
                  f"p50 {q1[49] * 1000:.2f} ms (plain {q0[49] * 1000:.2f}), p99 "
                  f"{q1[98] * 1000:.2f} ms (plain {q0[98] * 1000:.2f}); the child claimable "
                  "when the parent's report returned: always (one slot ran them all)")
        took = {}
        for count in (args.noop // 4, args.noop):
            store, settings = fresh(args.db_url, names)
            submit_dag(store, write(tmp, f"noop{count}.dag", "JOB A n.sub\n" + "".join(
                f"JOB N{i} n.sub NOOP\n" for i in range(count)) + "PARENT A CHILD N0\n"
                + "".join(f"PARENT N{i} CHILD N{i + 1}\n" for i in range(count - 1))),
                settings, owner="alice")
            job = claim(store, REQ)
            assert job is not None
            report(store, job, Event.START)
            took[count] = exit_report(store, job)
        short, long_ = args.noop // 4, args.noop
        print(f"a chain of NOOP nodes after one job, that job's exit report: {took[short]:.2f} s"
              f" ({short:,} nodes), {took[long_]:.2f} s ({long_:,}); ratio "
              f"{took[long_] / took[short]:.1f} for 4x the nodes (linear: 4)")
    finally:
        with psycopg.connect(libpq_url(args.db_url), autocommit=True) as conn:
            for name in names:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main())
