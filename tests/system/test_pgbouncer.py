"""The job store behind PgBouncer in TRANSACTION pooling mode: no server-side prepared statements,
no session state, so claims and reports from many processes work through a pool of 5 server
connections: the store API (pooled engines, as the per-node agent keeps, and unpooled ones, as the
hooks use), the real hook executables, and `jobstore watch` (which finds LISTEN unusable there
and polls) alike."""

from __future__ import annotations

import json
import multiprocessing
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import clirun
import psycopg
import pytest
import sqlalchemy as sa
from hookrun import hook_env
from hookseq import ordinary_owner, run_sequence, submit_jobs
from sqlalchemy.engine import make_url

from jobstore.core.states import Event
from jobstore.db.engine import DatabaseError, make_engine, upgrade
from jobstore.db.schema import job_events, jobs
from jobstore.db.store import JobStore, Offer
from jobstore.testing.factories import claim, claim_request, report

PGBOUNCER = "/usr/sbin/pgbouncer"
ADMIN_USER = "postgres"
JOBS = 200
WORKERS = 8
HOOK_JOBS = 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def pgbouncer(pg_url: str):
    """(URL through PgBouncer, direct URL, admin console libpq URI); PgBouncer stopped after."""
    if not os.path.exists(PGBOUNCER):
        pytest.skip(f"{PGBOUNCER} is not installed (apt-get install pgbouncer)")
    direct = make_url(pg_url)
    port = _free_port()
    base = Path(tempfile.mkdtemp(prefix="jobstore-pgbouncer-"))
    ini = base / "pgbouncer.ini"
    (base / "userlist.txt").write_text(f'"{direct.username}" ""\n"{ADMIN_USER}" ""\n')
    ini.write_text(
        "[databases]\n"
        f"{direct.database} = host={direct.host} port={direct.port or 5432} "
        f"dbname={direct.database}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {base / 'userlist.txt'}\n"
        "pool_mode = transaction\nmax_client_conn = 200\ndefault_pool_size = 5\n"
        f"admin_users = {ADMIN_USER}\n"
        f"logfile = {base / 'pgbouncer.log'}\npidfile = {base / 'pgbouncer.pid'}\n"
    )
    cmd = [PGBOUNCER, str(ini)]
    if os.geteuid() == 0:  # pgbouncer refuses to run as root
        pg = pwd.getpwnam("postgres")
        for path in (base, *base.iterdir()):
            os.chown(path, pg.pw_uid, pg.pw_gid)
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    # Its output goes to the logfile; a pipe nobody reads would stall it once full.
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    admin = f"postgresql://{ADMIN_USER}@127.0.0.1:{port}/pgbouncer"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = (base / "pgbouncer.log")
                    pytest.fail(f"pgbouncer did not start (exit {proc.poll()}): "
                                f"{log.read_text() if log.exists() else ''}")
                time.sleep(0.1)
        yield direct.set(port=port).render_as_string(hide_password=False), pg_url, admin
    finally:
        pidfile = base / "pgbouncer.pid"
        if pidfile.exists():  # the pgbouncer process itself, not the runuser wrapper
            try:
                os.kill(int(pidfile.read_text().strip()), 15)
            except (OSError, ValueError):
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(base, ignore_errors=True)


def _admin_show(admin: str, what: str) -> list[dict]:
    # The admin console speaks only the simple query protocol: a ClientCursor uses it.
    with psycopg.connect(admin, autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
        cur = conn.execute(f"SHOW {what}")
        names = [d.name for d in cur.description or []]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _worker(url: str, slot: str, queue, pooled: bool) -> None:  # type: ignore[no-untyped-def]
    """Claim and run jobs (PREPARE, START, EXIT with the token) until none is left."""
    ids: list[int] = []
    errors: list[str] = []
    store = JobStore(make_engine(url, connect_timeout=30, pool=pooled))
    # the whole negotiator: two submitters (fair share) and a concurrency limit (locked, counted)
    req = claim_request(offer=Offer(cpus=1, memory=1024, disk=1 << 20), slot=slot, host="node",
                        limit=lambda _name: 1000.0)
    try:
        while (job := claim(store, req)) is not None:
            for event, changes in ((Event.PREPARE, {}), (Event.START, {"job_pid": 4242}),
                                   (Event.EXIT, {"exit_code": 0})):
                out = report(store, job, event, changes=changes, lease=600)
                if out.stale or not out.changed:
                    errors.append(f"job {job.id}: {event}: {out}")
            ids.append(job.id)
    except (DatabaseError, Exception) as exc:
        errors.append(f"{slot}: {type(exc).__name__}: {exc}")
    finally:
        store.db.engine.dispose()
        queue.put((ids, errors))


@pytest.mark.slow
def test_transaction_pooling(pgbouncer, condor_config: Path, hook_dir: Path,
                             tmp_path: Path) -> None:
    bouncer_url, direct_url, admin = pgbouncer

    # Really transaction pooling (asked from PgBouncer itself, not just our ini file).
    config = {r["key"]: r["value"] for r in _admin_show(admin, "CONFIG")}
    assert config["pool_mode"] == "transaction"
    assert config["default_pool_size"] == "5"

    # The migration goes through PgBouncer too: Alembic runs its DDL and the version table
    # update in one transaction and needs no session state, so transaction mode is fine.
    upgrade(bouncer_url)

    owner = ordinary_owner()
    store = JobStore.from_url(bouncer_url)
    try:
        half = (JOBS - HOOK_JOBS) // 2
        ids = submit_jobs(store, half, owner, concurrency_limits="lic")
        ids += submit_jobs(store, JOBS - HOOK_JOBS - half, "pgbouncer_other")
        # The hook executables pull from their own queue, at the same time as the workers.
        hook_ids = submit_jobs(store, HOOK_JOBS, owner, queue="hooks")
        ids += hook_ids
    finally:
        store.db.engine.dispose()
    hook_config = tmp_path / "condor_config_hooks"
    hook_config.write_text(Path(condor_config).read_text() + "JOBSTORE_QUEUE = hooks\n")
    # Follows the hook queue's jobs from their first event (--since 0: whenever it gets going),
    # through PgBouncer, until they are all done.
    watcher = clirun.popen(
        [sys.executable, "-m", "jobstore.cli", "--db", bouncer_url, "watch", "--until-done",
         "--since", "0",
         "--json", "-q", "hooks"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "CONDOR_CONFIG": str(hook_config)},
    )
    # A private spool: the default one is shared with every other test on this machine.
    env = hook_env(bouncer_url, hook_config, JOBSTORE_SPOOL=str(tmp_path / "spool"),
                   JOBSTORE_HOOK_LOG=str(tmp_path / "hook.log"))
    sequences: list = []

    empty_fetches: list[int] = []

    def hook_slot(n: int) -> None:
        # A claim locks its whole candidate batch (FOR UPDATE SKIP LOCKED, up to 16 rows), so a
        # slot fetching at the same moment may find nothing although jobs are idle; the startd
        # simply fetches again after FetchWorkDelay, and so do we.
        try:
            for _ in range(20):
                seq = run_sequence(hook_dir, env, f"slot{n}@node01.example.org")
                if seq.job_id is not None:
                    break
                empty_fetches.append(n)
                time.sleep(0.5)
            sequences.append(seq)
        except Exception as exc:  # surfaces in the assertions below
            sequences.append(exc)

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(bouncer_url, f"slot{n}@node", queue, n % 2 == 0))
             for n in range(1, WORKERS + 1)]
    threads = [threading.Thread(target=hook_slot, args=(n,)) for n in range(1, HOOK_JOBS + 1)]
    start = time.monotonic()
    for p in procs:
        p.start()
    for t in threads:
        t.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    for t in threads:
        t.join(timeout=300)
    seconds = time.monotonic() - start
    claimed = [i for ids_, _ in results for i in ids_]
    errors = [e for _, errs in results for e in errs]
    for seq in sequences:
        if isinstance(seq, Exception) or seq.job_id is None:
            errors.append(f"hook sequence: {seq!r}")
            continue
        claimed.append(seq.job_id)
        for c in seq.calls:
            if c.returncode != 0 or c.stderr:
                errors.append(f"{c.hook}: rc={c.returncode} {c.stderr!r}")
    hook_log = tmp_path / "hook.log"
    log_text = hook_log.read_text(errors="replace") if hook_log.exists() else ""
    errors += [line for line in log_text.splitlines() if "error" in line.lower()]
    print(f"\n[pgbouncer] {JOBS - HOOK_JOBS} jobs by {WORKERS} store-API processes and "
          f"{HOOK_JOBS} by the hook executables, all through PgBouncer (transaction mode, "
          f"pool size 5), in {seconds:.2f} s; {len(empty_fetches)} empty fetch(es) retried")
    assert not [e for e in errors if "prepared" in e.lower()], errors
    assert "prepared statement" not in log_text
    assert not errors, errors
    assert len(claimed) == len(set(claimed)), "a job was handed out twice"
    assert sorted(claimed) == sorted(ids)
    pools = _admin_show(admin, "POOLS")
    assert {p["pool_mode"] for p in pools if p["database"] != "pgbouncer"} == {"transaction"}

    # Check on the server directly: every job completed exactly once.
    engine = sa.create_engine(direct_url)
    try:
        with engine.connect() as conn:
            states = dict(conn.execute(sa.select(jobs.c.id, jobs.c.status)).all())
            exits: dict[int, int] = dict(conn.execute(
                sa.select(job_events.c.job_id, sa.func.count())
                .where(job_events.c.event == "exit", job_events.c.to_status.is_not(None))
                .group_by(job_events.c.job_id)).all())
            fetches: dict[int, int] = dict(conn.execute(
                sa.select(job_events.c.job_id, sa.func.count())
                .where(job_events.c.event == "fetch").group_by(job_events.c.job_id)).all())
            stale = [dict(r._mapping) for r in conn.execute(sa.select(job_events).where(
                job_events.c.reason.like("stale%")))]
    finally:
        engine.dispose()
    assert states == dict.fromkeys(ids, "completed")
    assert exits == dict.fromkeys(ids, 1)
    assert fetches == dict.fromkeys(ids, 1)
    assert stale == []

    out, err = watcher.communicate(timeout=120)
    assert watcher.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert sorted(x["job_id"] for x in lines if x["event"] == "finished") == sorted(hook_ids)
    watched_exits = [x["job_id"] for x in lines if x["event"] == "exit" and x["to_status"]]
    assert sorted(watched_exits) == sorted(hook_ids), "an exit was missed or shown twice"
