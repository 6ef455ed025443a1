#!/usr/bin/env python3
"""What identity enforcement costs: the same code and database, in alternating
rounds, with the enforcement on and off; the figure is the median of the rounds' ratios.

1. claim + exit throughput of the agent's role (`jobstore grant`) with row-level security on /
   off (the owner turns it off and on between runs: what the role cost before migration
   0012), at 1 and 8 claimers (target: at least 0.95);
2. FETCH_WORK's latency through the real agent on the agent's role, on / off (p50 of each run's
   calls; target: at most 1 / 0.95);
3. submit of N jobs as a submitter's own role (`grant-user`: the policies check every row, the
   events in a statement of their own, an API submit's COPY through a staging table) / as the
   owner with --owner, as every submitter did before (target: at most 1.2): `jobstore submit`
   of a `queue N` file and `Schedd.submit` of N items.

N = 100,000 (20,000 with --quick). PostgreSQL only.
Usage: .venv/bin/python bench/identity.py [--quick] [--db-url URL]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import secrets
import statistics
import subprocess
import sys
import time

import psycopg
from common import (
    DEFAULT_ADMIN_URL,
    REPO,
    cleanup,
    create_pg,
    job_ad_json,
    make_env,
    populate,
    say,
    table,
    verdict,
)
from hookcost import spawn, start_agent
from submit import SUBMIT, api_submit
from throughput import tp_worker

from jobstore.testing.support import ensure_account, libpq_url

OWNER = "alice"
JOBSTORE = str(REPO / ".venv" / "bin" / "jobstore")
SLOT = (b'Name = "slot1@bench"\nMachine = "bench"\nCpus = 1\nMemory = 1024\nDisk = 1000000\n'
        b'SlotTypeID = 1\nState = "Unclaimed"\nActivity = "Idle"\nRequirements = true\n'
        b'Start = true\nStartdIpAddr = "<127.0.0.1:9618>"\nMyType = "Machine"\n')


def role_url(url: str, role: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(username=role).render_as_string(hide_password=False)


def make_roles(url: str) -> dict[str, str]:
    from jobstore.db.backends import UserRights
    from jobstore.db.store import JobStore

    suffix = secrets.token_hex(4)
    roles = {"agent": f"jobstore_bench_agent_{suffix}", "user": f"jobstore_bench_user_{suffix}"}
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        for role in roles.values():
            conn.execute(f"CREATE ROLE {role} LOGIN")
    owner = JobStore.from_url(url)
    granted = owner.db.backend.roles()
    granted.grant_hook(roles["agent"])
    granted.grant_user(roles["user"], UserRights(account=OWNER))
    owner.db.engine.dispose()
    return roles


def drop_roles(url: str, roles: dict[str, str]) -> None:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        for role in roles.values():
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE IF EXISTS {role}")


OWNER_URL: list[str] = []  # the owner's URL, once the database is made


def cycles_per_second(url: str, claimers: int, seconds: float) -> float:
    """claim + exit cycles per second of `claimers` processes on `url` (pooled stores)."""
    queue = f"q{secrets.token_hex(4)}"
    with psycopg.connect(libpq_url(OWNER_URL[0]), autocommit=True) as conn:
        populate(conn, queue, int(claimers * seconds * 900) + 200, job_ad_json())
        conn.execute("CHECKPOINT")
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(claimers), ctx.Queue()
    procs = [ctx.Process(target=tp_worker, args=("pooled", url, queue, f"slot{i}@bench", seconds,
                                                 barrier, results, None))
             for i in range(claimers)]
    for p in procs:
        p.start()
    got = [results.get(timeout=seconds + 180) for _ in procs]
    for p in procs:
        p.join(30)
    errors = [g[3] for g in got if g[3]]
    if errors:
        raise RuntimeError(errors[0])
    count = sum(g[0] for g in got)
    span = max(g[2] for g in got) - min(g[1] for g in got)
    return count / span


TABLES = ("clusters", "autoclusters", "autocluster_limits", "jobs", "job_events")


def enforce(on: bool) -> None:
    """Row-level security on (migration 0012's state) or off (before it), by the owner."""
    with psycopg.connect(libpq_url(OWNER_URL[0]), autocommit=True) as conn:
        for name in TABLES:
            conn.execute(f"ALTER TABLE {name} {'ENABLE' if on else 'DISABLE'} ROW LEVEL SECURITY")


def paired(rounds: int, measure) -> tuple[list[float], list[dict[str, float]]]:  # type: ignore[no-untyped-def]
    """`measure()` with the enforcement on and off, in alternating order per round; the ratios
    on / off and the pairs."""
    ratios, pairs = [], []
    for r in range(rounds):
        pair = {}
        for side in (("on", "off") if r % 2 == 0 else ("off", "on")):
            enforce(side == "on")
            pair[side] = measure()
        enforce(True)
        ratios.append(pair["on"] / pair["off"])
        pairs.append(pair)
    return ratios, pairs


def section_throughput(url: str, roles: dict[str, str], seconds: float, rounds: int
                       ) -> list[list[object]]:
    rows: list[list[object]] = []
    agent = role_url(url, roles["agent"])
    for claimers in (1, 8):
        ratios, pairs = paired(rounds, lambda c=claimers: cycles_per_second(agent, c, seconds))
        for r, pair in enumerate(pairs):
            say(f"  {claimers} claimer(s), round {r + 1}: enforced {pair['on']:.0f}/s,"
                f" not {pair['off']:.0f}/s")
        median = statistics.median(ratios)
        rows.append([f"claim + exit, {claimers} claimer(s)", f"{median:.2f}",
                     f"{min(ratios):.2f} to {max(ratios):.2f}", verdict(median >= 0.95)])
    return rows


def fetch_p50(env, url: str, calls: int) -> float:  # type: ignore[no-untyped-def]
    """p50 wall seconds of `calls` FETCH_WORK hooks (each hands out a job) through an agent on
    `url`."""
    from common import node_env

    with psycopg.connect(libpq_url(OWNER_URL[0]), autocommit=True) as conn:
        populate(conn, "default", calls + 10, job_ad_json())
    agent = start_agent(env, url)
    try:
        hook = str(env.hooks / "fetch_job")
        walls = []
        for _ in range(calls):
            wall, _, proc = spawn([hook], SLOT, {**node_env(env, url, {}),
                                                 "JOBSTORE_AGENT_SOCKET": str(env.tmp /
                                                                              "agent.sock")},
                                  False)
            if b"JobstoreJobId" not in proc.stdout:
                raise RuntimeError(f"fetch_job handed out nothing: {proc.stderr[-300:]!r}")
            walls.append(wall)
    finally:
        from common import stop_agent

        stop_agent(env, agent)
    return statistics.median(walls)


def section_fetch(env, url: str, roles: dict[str, str], calls: int, rounds: int  # type: ignore[no-untyped-def]
                  ) -> list[list[object]]:
    agent = role_url(url, roles["agent"])
    ratios, pairs = paired(rounds, lambda: fetch_p50(env, agent, calls))
    for r, pair in enumerate(pairs):
        say(f"  round {r + 1}: FETCH_WORK p50 enforced {pair['on'] * 1000:.1f} ms,"
            f" not {pair['off'] * 1000:.1f} ms")
    median = statistics.median(ratios)
    return [["FETCH_WORK p50 through the agent (time)", f"{median:.2f}",
             f"{min(ratios):.2f} to {max(ratios):.2f}", verdict(median <= 1 / 0.95)]]


def cli_submit(url: str, path: str, owner: bool) -> float:
    start = time.perf_counter()
    done = subprocess.run([JOBSTORE, "--db", url, "submit", path,
                           *(["--owner", OWNER] if owner else [])], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip())
    return time.perf_counter() - start


def section_submit(env, url: str, roles: dict[str, str], n: int, rounds: int  # type: ignore[no-untyped-def]
                   ) -> list[list[object]]:
    user = role_url(url, roles["user"])
    path = env.tmp / f"queue-{n}.sub"
    path.write_text(SUBMIT.format(n=n))
    os.chmod(path, 0o644)
    rows: list[list[object]] = []
    for what, run in ((f"jobstore submit, queue {n}",
                       lambda u, o: cli_submit(u, str(path), o)),
                      (f"Schedd.submit of {n} items",
                       lambda u, o: api_submit(u, n, OWNER if o else ""))):
        ratios = []
        for r in range(rounds):
            pair = {}
            for side in (("user", "owner") if r % 2 == 0 else ("owner", "user")):
                pair[side] = run(user, False) if side == "user" else run(url, True)
            ratios.append(pair["user"] / pair["owner"])
            say(f"  {what}, round {r + 1}: submitter's role {pair['user']:.2f} s,"
                f" owner {pair['owner']:.2f} s")
        median = statistics.median(ratios)
        rows.append([f"{what} (time)", f"{median:.2f}", f"{min(ratios):.2f} to {max(ratios):.2f}",
                     verdict(median <= 1.2)])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--db-url", default=os.environ.get("JOBSTORE_BENCH_DATABASE_URL"))
    args = ap.parse_args()
    n = 20_000 if args.quick else 100_000
    ensure_account(OWNER, uid=1001)
    env = make_env(args.db_url or DEFAULT_ADMIN_URL)
    roles: dict[str, str] = {}
    try:
        create_pg(env)
        url = env.pg_url
        OWNER_URL.append(url)
        roles = make_roles(url)
        rows = []
        say("claim + exit throughput (the agent's role, enforced / not):")
        rows += section_throughput(url, roles, 2.0 if args.quick else 5.0,
                                   2 if args.quick else 4)
        say("FETCH_WORK through the agent (the agent's role, enforced / not):")
        rows += section_fetch(env, url, roles, 30 if args.quick else 100, 2 if args.quick else 4)
        say("submit (submitter's role / owner):")
        rows += section_submit(env, url, roles, n, 2)
        say(table(["measure (enforced / not)", "median ratio", "range", "verdict"], rows))
    finally:
        if roles:
            drop_roles(env.pg_url, roles)
        cleanup(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
