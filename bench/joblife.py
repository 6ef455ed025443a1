#!/usr/bin/env python3
"""What one job's life costs the database through the real hooks and the agent: the commits
and the WAL bytes of fetch, reply accept, update (no pid), prepare, update (pid), exit, each hook
a real process talking to `jobstore agent`, against the targets (at most 4 commits and 2,700 B
of WAL per life, procrastinate's). Twice: jobs that waited in the queue (submitted together
first, so that nothing but the hooks and the agent writes while they live; the verdicts are
theirs), then jobs run as soon as each is submitted (their submits' cost subtracted: their rows
still have room in their pages). The agent's own background work (its watch, policy and prune
ticks), measured over an idle window as long as the lives took, is subtracted from each. The
commits that wrote are the transaction ids used; "read-only ones too" is pg_stat_database's
count, read after the backends' statistics came in (it also counts a new connection's start).

Then what a long job costs while it runs: UPDATE_JOB_INFO every STARTER_UPDATE_INTERVAL (300 s)
with new usage, LEASE_DURATION 900 s, the reaper running before each, on simulated time
through the store as the agent calls it: the commits, WAL and index entries per update.

With --wal-detail, where the WAL of a life goes (pg_walinspect, which needs a superuser): the
bytes of each relation and record type.

PostgreSQL (fsync and synchronous_commit as the server has them).
Usage: .venv/bin/python bench/joblife.py [--lives N] [--db-url URL] [--wal-detail]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import NamedTuple

import psycopg
from common import (
    DEFAULT_ADMIN_URL,
    DEFAULT_TRANSCRIPT,
    KEYWORD,
    OWNER,
    cleanup,
    create_pg,
    make_env,
    say,
    table,
    verdict,
)
from hookcost import check_completed, load_calls, run_life, start_agent

from jobstore.testing.support import ensure_account, libpq_url

COMMITS_TARGET = 4.0
WAL_TARGET = 2700.0


# An idle backend (the agent between calls) reports its transactions to pg_stat_database only
# after PostgreSQL's idle interval (10 s); one that is busy, at most once a second.
SETTLE = 11.0


def counters(url: str, settle: float = 1.5) -> tuple[int, int, int]:
    """(the cluster's WAL position in bytes, this database's commits so far (read-only ones
    too), the next transaction id: the transactions that wrote get one), after `settle`
    seconds for the backends' statistics to come in."""
    time.sleep(settle)
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, xact_commit,"
            " pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
            " FROM pg_stat_database WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def lsn(position: int) -> str:
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"


WAL_RECORDS = """
SELECT coalesce(pg_filenode_relation(
           0, substring(block_ref from 'rel \\d+/\\d+/(\\d+)')::oid)::text, '-') AS relation,
       resource_manager || ' ' || split_part(record_type, ' ', 1) AS kind,
       count(*), sum(record_length), sum(fpi_length)
  FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn)
 GROUP BY 1, 2
"""


def wal_records(url: str, start: int, end: int) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(relation, record kind) -> (records, bytes, of which full-page images) between two WAL
    positions."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        rows = conn.execute(WAL_RECORDS, (lsn(start), lsn(end))).fetchall()
    return {(r[0], r[1]): (int(r[2]), int(r[3]), int(r[4])) for r in rows}


def wal_detail(lives: dict, n: int) -> list[list[str]]:
    """The table rows of `wal_records` per life, biggest first."""
    out = []
    for key, (count, size, fpi) in lives.items():
        if size:
            out.append((size / n, count / n, fpi / n, *key))
    out.sort(reverse=True)
    rows = [[rel, kind, f"{count:.2f}", f"{size:.0f}", f"{fpi:.0f}"]
            for size, count, fpi, rel, kind in out]
    rows.append(["all", "", f"{sum(r[1] for r in out):.2f}", f"{sum(r[0] for r in out):.0f}",
                 f"{sum(r[2] for r in out):.0f}"])
    return rows


class Cost(NamedTuple):
    """WAL bytes, commits (read-only ones too) and commits that wrote."""

    wal: float
    commits: float
    writes: float

    @classmethod
    def between(cls, a: tuple[int, int, int], b: tuple[int, int, int]) -> Cost:
        return cls(*(y - x for x, y in zip(a, b, strict=True)))

    def __sub__(self, other: tuple[float, ...]) -> Cost:  # type: ignore[override]
        return Cost(*(x - y for x, y in zip(self, other, strict=True)))

    def __truediv__(self, n: float) -> Cost:
        return Cost(*(x / n for x in self))


PERIODIC_UPDATES = 30


def periodic_updates(url: str, store) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    """(commits, WAL bytes, index entries of jobs) per periodic update of a running job."""
    from common import submit_one

    from jobstore.core.claims import Offer
    from jobstore.core.states import Event
    from jobstore.testing.factories import claim, claim_request, report

    job_id = submit_one(store)
    job = claim(store, claim_request(offer=Offer(cpus=1, memory=1024, disk=1 << 20),
                                     slot="slot1@bench", keyword=KEYWORD, claim_lease=120))
    if job is None or job.id != job_id:
        raise RuntimeError(f"the periodic-update job {job_id} was not the one claimed")
    t0 = time.time()
    report(store, job, Event.ACCEPT, lease=120, now=t0)
    report(store, job, Event.START, lease=900, changes={"job_pid": 4242}, now=t0 + 1)

    def entries() -> int:  # index tuples inserted into jobs' indexes (all of them)
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(n_tup_upd - n_tup_hot_upd), 0) FROM pg_stat_user_tables"
                " WHERE relname = 'jobs'").fetchone()
            return int(row[0]) if row else 0

    wal0, commits0, _ = counters(url, SETTLE)
    cold0 = entries()
    for k in range(1, PERIODIC_UPDATES + 1):
        at = t0 + 1 + 300 * k
        if store.maintenance.reap(now=at):
            raise RuntimeError(f"the lease of job {job_id} ran out at update {k}")
        report(store, job, Event.START, lease=900,
               changes={"job_pid": 4242, "remote_user_cpu": 10.0 * k}, now=at)
    wal1, commits1, _ = counters(url, SETTLE)
    cold = entries() - cold0
    n = PERIODIC_UPDATES
    return (commits1 - commits0) / n, (wal1 - wal0) / n, cold / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lives", type=int, default=50)
    ap.add_argument("--db-url", default=os.environ.get("JOBSTORE_BENCH_DATABASE_URL"))
    ap.add_argument("--wal-detail", action="store_true",
                    help="where the WAL of a life goes, by relation and record (pg_walinspect)")
    args = ap.parse_args()
    ensure_account(OWNER, uid=1001)
    env = make_env(args.db_url or DEFAULT_ADMIN_URL)
    try:
        create_pg(env)
        url = env.pg_url
        from jobstore.db.store import JobStore

        start_agent(env, url)
        calls = load_calls(DEFAULT_TRANSCRIPT)
        store = JobStore.from_url(url)
        run_life(env, url, store, calls, None)  # warm-up
        from common import submit_one

        wal_s0, commits_s0, xid_s0 = counters(url, SETTLE)
        submitted = [submit_one(store) for _ in range(args.lives)]
        wal_s1, commits_s1, xid_s1 = counters(url, SETTLE)
        submit = Cost(wal_s1 - wal_s0, commits_s1 - commits_s0, xid_s1 - xid_s0) / args.lives
        detail: list[list[str]] | None = None

        def queued() -> list[int]:
            return [run_life(env, url, store, calls, None, check=False, job_id=job_id)
                    for job_id in submitted]

        def at_once() -> list[int]:
            return [run_life(env, url, store, calls, None, check=False)
                    for _ in range(args.lives)]

        costs = {}
        for shape, lives in (("queued", queued), ("at once", at_once)):
            before = counters(url, SETTLE)
            start = time.monotonic()
            lived = lives()
            took = time.monotonic() - start
            after = counters(url, SETTLE)
            for job_id in lived:  # read after the count: the bench's own transactions
                check_completed(store, job_id)
            idle = counters(url, 0.0)
            time.sleep(took)  # the agent alone, as long as the lives took
            idled = counters(url, SETTLE)
            cost = (Cost.between(before, after) - Cost.between(idle, idled)) / args.lives
            if shape == "at once":  # each life submitted its job
                cost = cost - submit
            elif args.wal_detail:
                detail = wal_detail(wal_records(url, before[0], after[0]), args.lives)
            costs[shape] = cost
        upd_commits, upd_wal, upd_cold = periodic_updates(url, store)
        store.db.engine.dispose()
        say(f"{args.lives} job lives through the real hooks and the agent, twice: jobs that"
            " waited in the queue (submitted together first), then jobs run as each is"
            " submitted (a one-job submit's cost subtracted); the agent's own background work"
            " over as long subtracted from each")
        say(f"a one-job submit alone: {submit.commits:.2f} commits ({submit.writes:.2f} that"
            f" wrote), {submit.wal:.0f} B of WAL")
        queued_cost, at_once_cost = costs["queued"], costs["at once"]
        say(table(["per job life", "queued", "at once", "target", "verdict"], [
            ["commits that wrote (transaction ids)", f"{queued_cost.writes:.2f}",
             f"{at_once_cost.writes:.2f}", f"<= {COMMITS_TARGET:g}",
             verdict(queued_cost.writes <= COMMITS_TARGET)],
            ["commits, read-only ones too", f"{queued_cost.commits:.2f}",
             f"{at_once_cost.commits:.2f}", f"<= {COMMITS_TARGET:g}",
             verdict(queued_cost.commits <= COMMITS_TARGET)],
            ["WAL bytes", f"{queued_cost.wal:.0f}", f"{at_once_cost.wal:.0f}",
             f"<= {WAL_TARGET:g}", verdict(queued_cost.wal <= WAL_TARGET)],
        ]))
        if detail:
            say("where a queued job's life's WAL goes (the agent's idle work included; records'"
                " own sizes, without page headers and alignment):")
            say(table(["relation", "record", "records", "bytes", "of which page images"],
                      detail))
        say(f"a running job's periodic update (new usage every 300 s, lease 900 s, the reaper"
            f" before each), {PERIODIC_UPDATES} of them: {upd_commits:.2f} commits (read-only"
            f" ones too), {upd_wal:.0f} B of WAL, {upd_cold:.2f} row versions that were not"
            " HOT (each a new entry in every index of jobs) per update")
        return 0
    finally:
        cleanup(env)


if __name__ == "__main__":
    sys.exit(main())
