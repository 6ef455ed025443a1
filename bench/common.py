"""What every benchmark section shares: constants, the environment (hooks, configuration,
databases), small helpers."""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobstore.node.hooktable import CONDOR_NAMES, OUTPUT_HOOKS
from jobstore.testing.support import (  # noqa: F401 - first: for the benches
    first,
    hook_env,
    libpq_url,
    with_database,
)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
DEFAULT_TRANSCRIPT = REPO / "tests" / "fixtures" / "htcondor-transcripts" / "01-normal-job"
KEYWORD = "TEST"  # the keyword of the recording node; the recorded ads say HookKeyword = "TEST"
OWNER = "alice"  # the recorded job owner (uid 1001 on the recording node)
CLOSED_OUTPUT = {ours for ours, condor in CONDOR_NAMES.items() if condor not in OUTPUT_HOOKS}
IDENTITY = (b"JobstoreAttempt", b"JobstoreJobId", b"JobstoreToken")
# (label, executable, transcript file, argv); the order of one job's life
LIFE: tuple[tuple[str, str, str, list[str]], ...] = (
    ("fetch_job (work)", "fetch_job", "01-FETCH_WORK", []),
    ("reply_fetch accept", "reply_fetch", "02-REPLY_FETCH", ["accept"]),
    ("update_job_info (no pid)", "update_job_info", "03-UPDATE_JOB_INFO", []),
    ("prepare_job", "prepare_job", "04-PREPARE_JOB", []),
    ("update_job_info (pid)", "update_job_info", "05-UPDATE_JOB_INFO", []),
    ("job_exit exit", "job_exit", "08-JOB_EXIT", ["exit"]),
)
EMPTY_FETCH = "fetch_job (no work)"
TP_CLAIMERS = (1, 8, 32)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


# ---- small helpers -----------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def ms(x: float) -> str:
    return f"{x * 1000:.1f}"


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    out = []
    for n, r in enumerate(cells):
        pairs = enumerate(zip(r, widths, strict=True))
        just = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs]
        out.append("  ".join(just))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join("  " + line for line in out)


def say(msg: str = "") -> None:
    print(msg, flush=True)


def progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def job_ad_json() -> str:
    """The stored ad of a job like the recorded one (sleep 10), as submit would store it."""
    from jobstore.formats.jobads import submitted_ad

    return json.dumps(submitted_ad(recorded_spec()))


def recorded_spec():  # type: ignore[no-untyped-def]
    from jobstore.core.jobs import JobSpec

    return JobSpec(cmd="/bin/sleep", args="10", iwd="/tmp", request_memory=64, request_disk=1024)


def submit_one(store) -> int:  # type: ignore[no-untyped-def]
    _, ids = store.submissions.submit([recorded_spec()], owner=OWNER, queue="default",
                                      max_attempts=5)
    return ids[0]


def populate(conn, queue: str, n: int, ad: str) -> None:  # type: ignore[no-untyped-def]
    """N idle jobs in `queue`, one autocluster, inserted by one INSERT ... SELECT
    generate_series (PostgreSQL)."""
    now = time.time()
    with conn.transaction():
        cid = first(conn.execute(
            "INSERT INTO clusters (owner, queue, num_procs, submitted_at) "
            "VALUES (%s, %s, %s, %s) RETURNING id",
            (OWNER, queue, n, now),
        ))
        ac = first(conn.execute(
            "INSERT INTO autoclusters (signature, queue, owner, submitter, request_cpus,"
            " request_memory, request_disk, created_at) VALUES (%s, %s, %s, %s, 1, 64, 1024, %s)"
            " ON CONFLICT (owner, signature) DO UPDATE SET queue = EXCLUDED.queue RETURNING id",
            (f"bench:{queue}", queue, OWNER, OWNER, now),
        ))
        conn.execute("INSERT INTO submitters (name, updated_at) VALUES (%s, %s)"
                     " ON CONFLICT DO NOTHING", (OWNER, now))
        conn.execute(
            "INSERT INTO jobs (cluster_id, proc_id, queue, status, priority, owner, ad, cmd,"
            " request_cpus, request_memory, request_disk, max_attempts, success_exit_code,"
            " claims, attempts, submitted_at, updated_at, submitter, autocluster_id)"
            " SELECT %s, g, %s, 'idle', 0, %s, %s::json, '/bin/sleep', 1, 64, 1024, 5, 0, 0, 0,"
            " %s, %s, %s, %s FROM generate_series(0, %s::int - 1) AS g",
            (cid, queue, OWNER, ad, now, now, OWNER, ac, n),
        )
    conn.execute("ANALYZE jobs")


# ---- the environment: hooks, configuration, databases ------------------------------------------


@dataclass
class Env:
    tmp: Path
    hooks: Path
    condor_config: Path
    hook_log: Path
    spool: Path
    admin_url: str
    pg_url: str = ""  # made by create_pg
    pg_name: str | None = None
    sqlite_url: str = ""  # made by create_sqlite
    workers: list[Any] = field(default_factory=list)
    agents: list[Any] = field(default_factory=list)


def make_env(admin_url: str) -> Env:
    tmp = Path(tempfile.mkdtemp(prefix="jobstore-bench-"))
    os.chmod(tmp, 0o755)
    hooks = tmp / "hooks"
    hooks.mkdir(mode=0o755)
    cfg = tmp / "condor_config"
    cfg.write_text(
        f"UID_DOMAIN = localdomain\nSTARTD_JOB_HOOK_KEYWORD = {KEYWORD}\nLOG = {tmp}\n"
    )
    env = Env(tmp, hooks, cfg, tmp / "hooks.log", tmp / "spool", admin_url)
    # in-process hook calls (section 4) read the same configuration as the hook executables
    os.environ["CONDOR_CONFIG"] = str(cfg)
    os.environ["JOBSTORE_SPOOL"] = str(env.spool)
    os.environ["JOBSTORE_HOOK_LOG"] = str(env.hook_log)
    from jobstore.agent.hooktemplates import install_hooks

    install_hooks(hooks, sys.executable)
    return env


def create_pg(env: Env) -> None:
    import psycopg
    from psycopg import sql

    from jobstore.db.engine import upgrade

    name = f"jobstore_bench_{secrets.token_hex(6)}"
    with psycopg.connect(libpq_url(env.admin_url), connect_timeout=5, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    env.pg_name = name
    env.pg_url = with_database(env.admin_url, name)
    upgrade(env.pg_url)


def create_sqlite(env: Env) -> None:
    from jobstore.db.engine import upgrade

    env.sqlite_url = f"sqlite:///{env.tmp / 'jobstore.db'}"
    upgrade(env.sqlite_url)


def cleanup(env: Env) -> None:
    for proc in list(env.agents):
        with suppress(Exception):
            stop_agent(env, proc)
    for p in env.workers:
        with suppress(Exception):
            if p.is_alive():
                p.kill()
            p.join(5)
    from jobstore.node.services import direct

    with suppress(Exception):
        direct().drop_stores()
    if env.pg_name:
        import psycopg
        from psycopg import sql

        try:
            with psycopg.connect(libpq_url(env.admin_url), connect_timeout=5, autocommit=True) as c:
                c.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(env.pg_name)
                    )
                )
        except Exception as exc:  # say so: the database is left behind
            print(f"warning: could not drop database {env.pg_name}: {exc}", file=sys.stderr)
    shutil.rmtree(env.tmp, ignore_errors=True)


# The hooks' mode for the runs now in progress (JOBSTORE_HOOK_MODE or the agent's socket).
HOOK_MODE_ENV: dict[str, str] = {}


def stop_agent(env: Env, proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    with suppress(ValueError):
        env.agents.remove(proc)
    HOOK_MODE_ENV.clear()
    HOOK_MODE_ENV["JOBSTORE_HOOK_MODE"] = "direct"


def node_env(env: Env, db_url: str, extra: dict[str, str]) -> dict[str, str]:
    """A hook's (and the bench's agent's) environment; the agent keeps reports back as shipped,
    not as the tests have it (hook_env applies each at once)."""
    out = hook_env(db_url, env.condor_config, spool=env.spool, hook_log=env.hook_log,
                   **{**HOOK_MODE_ENV, **extra})
    if "_CONDOR_JOBSTORE_AGENT_REPORT_DELAY" not in extra:
        del out["_CONDOR_JOBSTORE_AGENT_REPORT_DELAY"]
    return out


def cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and of its children it has waited for (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def as_root_on_both_backends(doc: str, run: Callable[[str, int, Path], list[list[str]]],
                             ) -> tuple[int, list[list[str]]]:
    """Parse `--jobs` and `--db-url`, and return (jobs, the rows of `run(url, jobs, tmp)` on a
    fresh PostgreSQL database, then on a fresh SQLite file), as root with the job owner's
    account made; the databases are dropped after."""
    import argparse

    from jobstore.testing.support import ensure_account

    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--db-url", default=os.environ.get("JOBSTORE_BENCH_DATABASE_URL"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the service writes as the job's owner")
    ensure_account(OWNER, uid=1001)
    env = make_env(args.db_url or DEFAULT_ADMIN_URL)
    try:
        create_pg(env)
        create_sqlite(env)
        return args.jobs, run(env.pg_url, args.jobs, env.tmp) + run(env.sqlite_url, args.jobs,
                                                                    env.tmp)
    finally:
        cleanup(env)
