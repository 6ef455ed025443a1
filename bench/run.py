#!/usr/bin/env python3
"""Benchmarks of htcondor-jobstore, printed as RATIOS against baselines measured in the same run.

The machine this runs on is noisy, so nothing here is an absolute pass/fail: every figure is set
against a baseline taken in the same run, interleaved with the measurement where possible.

1. Hook cost: each hook executable run as HTCondor runs it (signals blocked; fds 1/2 closed for
   REPLY_FETCH and UPDATE_JOB_INFO) with the recorded ads of transcript 01-normal-job, versus
   `python -c pass` spawned the same way. PostgreSQL and SQLite.
2. Claim throughput: claim + EXIT per second through JobStore at 1/8/16/32 processes, versus the
   same SQL from a bare psycopg loop on persistent connections.
3. Fetch latency: p50/p99 of JobStore.claim with 10 and with 1,000,000 idle jobs (100,000 with
   --quick), claim + reject (back to idle) loop.
4. Database connections opened per job by the hook path.

Usage: .venv/bin/python bench/run.py [--quick] [--db-url postgresql+psycopg://user@host:port/db]
       [--no-sqlite] [--only throughput]
`--db-url` names the PostgreSQL server and an account that may CREATE DATABASE; the bench always
creates its own database `jobstore_bench_<hex>` there and drops it at the end. Everything else it
makes (hook directory, configuration, spool, SQLite file) lives in one temporary directory.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import random
import resource
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobstore.emulator.spawn import hook_preexec
from jobstore.node.hooktable import CONDOR_NAMES, OUTPUT_HOOKS

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
DEFAULT_TRANSCRIPT = REPO / "tests" / "fixtures" / "htcondor-transcripts" / "01-normal-job"
KEYWORD = "TEST"  # the keyword of the recording node; the recorded ads say HookKeyword = "TEST"
OWNER = "alice"  # the recorded job owner (uid 1001 on the recording node)
CLOSED_OUTPUT = {ours for ours, condor in CONDOR_NAMES.items() if condor not in OUTPUT_HOOKS}
IDENTITY = (b"JobstoreAttempt", b"JobstoreJobId", b"JobstoreToken")
# (label, executable, transcript file, argv); the order of one job's life
LIFE = (
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


def libpq(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def with_database(url: str, name: str) -> str:
    from sqlalchemy.engine import make_url

    u = make_url(url)
    if u.get_driver_name() != "psycopg":
        u = u.set(drivername="postgresql+psycopg")
    return u.set(database=name).render_as_string(hide_password=False)


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
    _, ids = store.submit([recorded_spec()], owner=OWNER, queue="default", max_attempts=5)
    return ids[0]


def populate(conn, queue: str, n: int, ad: str) -> None:  # type: ignore[no-untyped-def]
    """N idle jobs in `queue`, inserted by one INSERT ... SELECT generate_series (PostgreSQL)."""
    now = time.time()
    with conn.transaction():
        cid = conn.execute(
            "INSERT INTO clusters (owner, queue, num_procs, submitted_at) "
            "VALUES (%s, %s, %s, %s) RETURNING id",
            (OWNER, queue, n, now),
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO jobs (cluster_id, proc_id, queue, status, priority, owner, ad, cmd,"
            " request_cpus, request_memory, request_disk, max_attempts, success_exit_code,"
            " claims, attempts, submitted_at, updated_at)"
            " SELECT %s, g, %s, 'idle', 0, %s, %s::json, '/bin/sleep', 1, 64, 1024, 5, 0, 0, 0,"
            " %s, %s FROM generate_series(0, %s::int - 1) AS g",
            (cid, queue, OWNER, ad, now, now, n),
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
    pg_url: str | None = None
    pg_name: str | None = None
    sqlite_url: str | None = None
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
    with psycopg.connect(libpq(env.admin_url), connect_timeout=5, autocommit=True) as conn:
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
    from jobstore.node import handlers

    for store in list(handlers._stores.values()):
        with suppress(Exception):
            store.engine.dispose()
    if env.pg_name:
        import psycopg
        from psycopg import sql

        try:
            with psycopg.connect(libpq(env.admin_url), connect_timeout=5, autocommit=True) as c:
                c.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(env.pg_name)
                    )
                )
        except Exception as exc:  # say so: the database is left behind
            print(f"warning: could not drop database {env.pg_name}: {exc}", file=sys.stderr)
    shutil.rmtree(env.tmp, ignore_errors=True)


# ---- section 1: hook cost ---------------------------------------------------------------------


@dataclass
class Call:
    stdin: bytes
    env: dict[str, str]


def load_calls(transcript: Path) -> dict[str, Call]:
    calls = {}
    for _, _, stem, _ in LIFE:
        meta = json.loads((transcript / f"{stem}.meta.json").read_text())
        env = {k: v for k, v in meta["env"].items() if k not in ("CONDOR_CONFIG", "HOME")}
        calls[stem] = Call((transcript / f"{stem}.stdin").read_bytes(), env)
    return calls


def insert_identity(stdin: bytes, identity: list[bytes], *, reply_fetch: bool) -> bytes:
    """Our identity lines, in sorted position in the job ad; every recorded byte is kept."""
    lines = stdin.split(b"\n")
    end = lines.index(b"-----") if reply_fetch else len(lines)
    for new in sorted(identity, key=lambda b: b.lower()):
        name = new.split(b" = ", 1)[0].lower()
        pos = next(
            (i for i in range(end) if lines[i] and lines[i].split(b" = ", 1)[0].lower() > name),
            end,
        )
        lines.insert(pos, new)
        end += 1
    return b"\n".join(lines)


def spawn(
    argv: list[str], stdin: bytes, env: dict[str, str], close_output: bool
) -> tuple[float, float, subprocess.CompletedProcess]:
    """Run one process as HTCondor runs a hook; (wall s, CPU s of the child, result)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        argv,
        input=stdin,
        capture_output=not close_output,
        env=env,
        cwd="/tmp",
        timeout=60,
        preexec_fn=hook_preexec(close_output),
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc


# how the hooks reach the database in this part of the run: JOBSTORE_HOOK_MODE=direct, or
# JOBSTORE_AGENT_SOCKET of the agent started by the bench
HOOK_MODE_ENV: dict[str, str] = {}
JOBSTORE_EXE = Path(sys.executable).with_name("jobstore")


def agent_missing() -> str | None:
    """None when `jobstore agent` exists, else why agent mode is not measured."""
    try:
        r = subprocess.run([str(JOBSTORE_EXE), "agent", "--help"], capture_output=True,
                           timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"jobstore agent --help failed: {exc}"
    return None if r.returncode == 0 else "`jobstore agent --help` fails: no agent in this tree"


def start_agent(env: Env, db_url: str) -> subprocess.Popen:
    """`jobstore agent --socket S` in the foreground, as a subprocess; waits for its socket."""
    sock = env.tmp / "agent.sock"
    log = open(env.tmp / "agent.log", "ab")  # noqa: SIM115 - lives as long as the agent
    proc = subprocess.Popen(
        [str(JOBSTORE_EXE), "agent", "--socket", str(sock), "--foreground"],
        env={**hook_env(env, db_url, {}), "JOBSTORE_AGENT_SOCKET": str(sock)},
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/tmp",
    )
    env.agents.append(proc)
    deadline = time.monotonic() + 30
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (env.tmp / "agent.log").read_text(errors="replace")[-300:]
            raise RuntimeError(f"the agent did not start (exit {proc.poll()}): {tail}")
        time.sleep(0.05)
    HOOK_MODE_ENV.clear()
    HOOK_MODE_ENV["JOBSTORE_AGENT_SOCKET"] = str(sock)
    return proc


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


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) a live process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def hook_env(env: Env, db_url: str, extra: dict[str, str]) -> dict[str, str]:
    return {
        **HOOK_MODE_ENV,
        "PATH": "/usr/bin:/bin",
        "HOME": "/root",
        "CONDOR_CONFIG": str(env.condor_config),
        "JOBSTORE_DATABASE_URL": db_url,
        "JOBSTORE_HOOK_LOG": str(env.hook_log),
        "JOBSTORE_SPOOL": str(env.spool),
        **extra,
    }


class LifeError(RuntimeError):
    pass


def run_life(
    env: Env, db_url: str, store, calls: dict[str, Call], samples: dict | None
) -> int:  # type: ignore[no-untyped-def]
    """Submit one job and take it through every hook of its life as real processes."""
    job_id = submit_one(store)
    identity: list[bytes] = []
    for label, exe, stem, argv in LIFE:
        call = calls[stem]
        stdin = call.stdin
        if exe != "fetch_job":
            stdin = insert_identity(stdin, identity, reply_fetch=exe == "reply_fetch")
        close = exe in CLOSED_OUTPUT
        wall, cpu, proc = spawn(
            [str(env.hooks / exe), *argv], stdin, hook_env(env, db_url, call.env), close
        )
        if proc.returncode != 0 or (proc.stderr or b"").strip():
            raise LifeError(f"{label}: exit {proc.returncode}, stderr {proc.stderr!r}")
        if exe == "fetch_job":
            identity = [
                ln for ln in proc.stdout.split(b"\n") if ln.split(b" = ")[0] in IDENTITY
            ]
            if len(identity) != 3 or f"JobstoreJobId = {job_id}".encode() not in identity:
                raise LifeError(f"fetch_job did not hand out job {job_id}: {proc.stdout[:200]!r}")
        if samples is not None:
            samples.setdefault(label, []).append((wall, cpu))
    job = store.get_job(job_id)
    if job.status != "completed" or job.exit_code != 0:
        raise LifeError(f"job {job_id} ended {job.status} exit_code={job.exit_code}")
    return job_id


def run_empty_fetch(env: Env, db_url: str, calls: dict[str, Call]) -> tuple[float, float]:
    call = calls["01-FETCH_WORK"]
    wall, cpu, proc = spawn(
        [str(env.hooks / "fetch_job")], call.stdin, hook_env(env, db_url, call.env), False
    )
    if proc.returncode != 0 or proc.stdout or proc.stderr.strip():
        raise LifeError(f"empty fetch printed {proc.stdout[:200]!r} {proc.stderr[:200]!r}")
    return wall, cpu


def section_hooks(
    env: Env, backends: list[tuple[str, str]], runs: int, calls, budget: float,
    mode: str = "direct", agent_pid: int | None = None,
) -> dict:
    from jobstore.db.store import JobStore

    say(f"== 1{'ab'[mode != 'direct']}. Hook cost, {mode} mode ("
        + ("JOBSTORE_HOOK_MODE=direct" if mode == "direct" else
           "`jobstore agent` subprocess, hooks get JOBSTORE_AGENT_SOCKET")
        + f"): one process per call, as HTCondor runs it (median of {runs}; baseline"
        f" `{Path(sys.executable).name} -c pass`, spawned the same way)")
    results: dict[str, dict] = {}
    for name, url in backends:
        store = JobStore.from_url(url)
        samples: dict[str, list[tuple[float, float]]] = {}
        base_open: list[tuple[float, float]] = []
        base_closed: list[tuple[float, float]] = []
        imports: list[tuple[float, float]] = []
        agent_cpu: list[float] = []
        pass_env = hook_env(env, url, {})
        driver = "psycopg" if name == "postgresql" else "sqlite3"
        import_only = f"import jobstore.node.hookmain, jobstore.node.handlers, htcondor2, {driver}"
        run_life(env, url, store, calls, None)  # warm-up: page cache, spool dir, first connect
        stop_at = time.monotonic() + budget / len(backends)
        for i in range(runs):
            if i >= 3 and time.monotonic() > stop_at:
                say(f"   ({name}: stopped after {i} job lives, the time budget is spent)")
                break
            progress(f"hooks on {name}: job life {i + 1}/{runs}")
            for closed, bucket in ((False, base_open), (True, base_closed)):
                w, c, _ = spawn([sys.executable, "-c", "pass"], b"", pass_env, closed)
                bucket.append((w, c))
            w, c, _ = spawn([sys.executable, "-c", import_only], b"", pass_env, False)
            imports.append((w, c))
            a0 = proc_cpu(agent_pid) if agent_pid else 0.0
            run_life(env, url, store, calls, samples)
            if agent_pid:
                agent_cpu.append(proc_cpu(agent_pid) - a0)
            samples.setdefault(EMPTY_FETCH, []).append(run_empty_fetch(env, url, calls))
            for closed, bucket in ((False, base_open), (True, base_closed)):
                w, c, _ = spawn([sys.executable, "-c", "pass"], b"", pass_env, closed)
                bucket.append((w, c))
        store.engine.dispose()

        def med(pairs: list[tuple[float, float]]) -> tuple[float, float]:
            return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)

        bo, bc, im = med(base_open), med(base_closed), med(imports)
        rows = [
            ["python -c pass (fds open)", ms(bo[0]), ms(bo[1]), "1.0", "1.0"],
            ["python -c pass (fds 1/2 closed)", ms(bc[0]), ms(bc[1]), "1.0", "1.0"],
            [f"imports only (jobstore, htcondor2, {driver})", ms(im[0]), ms(im[1]),
             f"{im[0] / bo[0]:.1f}", f"{im[1] / bo[1]:.1f}"],
        ]
        per: dict[str, tuple[float, float, float, float]] = {}
        for label, exe, *_ in [(EMPTY_FETCH, "fetch_job"), *LIFE]:
            w, c = med(samples[label])
            b = bc if exe in CLOSED_OUTPUT else bo
            per[label] = (w, c, w / b[0], c / b[1])
            rows.append([label, ms(w), ms(c), f"{w / b[0]:.1f}", f"{c / b[1]:.1f}"])
        life_cpu = sum(per[label][1] for label, *_ in LIFE)
        life_wall = sum(per[label][0] for label, *_ in LIFE)
        rows.append(["whole job life (6 calls)", ms(life_wall), ms(life_cpu),
                     f"{life_wall / bo[0]:.1f}", f"{life_cpu / bo[1]:.1f}"])
        say(f"-- {name}, {mode} mode")
        if agent_pid:
            say(f"   the agent process itself used {ms(statistics.mean(agent_cpu))} ms CPU per"
                " job life (mean; the work moved there from the hooks)")
        say(table(["hook", "wall ms", "CPU ms", "x base wall", "x base CPU"], rows))
        results[f"{name} {mode}"] = {
            "per": per, "base": bo, "imports": im, "life_cpu": life_cpu, "life_wall": life_wall,
            "agent_cpu": statistics.mean(agent_cpu) if agent_cpu else None}
    say("   (whole job life = fetch with work + reply accept + 2 updates + prepare + job_exit;"
        " ratios against the fds-open baseline)")
    return results


# ---- section 2: claim throughput -------------------------------------------------------------


def capture_cycle(url: str, queue: str) -> list[list[tuple[str, dict]]]:
    """The statements one claim + EXIT issues through the pooled JobStore, with their
    parameters, split into transactions (each starts with SET LOCAL statement_timeout)."""
    import sqlalchemy as sa

    from jobstore.core.states import Event
    from jobstore.db.engine import make_engine
    from jobstore.db.store import ClaimRequest, JobStore, Offer, Verdict

    store = JobStore(make_engine(url, pool=True))
    seen: list[tuple[str, dict]] = []
    sa.event.listen(store.engine, "before_cursor_execute",
                    lambda _c, _cur, stmt, params, *_a: seen.append((stmt, dict(params or {}))))
    req = ClaimRequest(queue=queue, offer=Offer(cpus=1, memory=1024, disk=1 << 20),
                       slot="slot0@node", host="node", keyword=KEYWORD, claim_lease=600)
    job = store.claim(req, lambda _row: Verdict(take=True))
    store.report(job.id, Event.EXIT, token=job.token, attempt=job.claims)
    store.engine.dispose()
    txs: list[list[tuple[str, dict]]] = []
    for stmt, params in seen:
        if stmt.startswith("SET LOCAL") or not txs:
            txs.append([])
        txs[-1].append((stmt, params))
    return txs


def fill(tpl: dict, job_id: int | None, token: str, now: float, slot: str) -> dict:
    """A captured parameter set for another job, slot and time (by parameter name)."""
    out = {}
    for k, v in tpl.items():
        if k in ("id_1", "job_id") and job_id is not None:
            v = job_id
        elif k == "p" and job_id is not None:
            v = str(job_id)
        elif k == "token" and v is not None:
            v = token
        elif k == "slot" and v is not None:
            v = slot
        elif isinstance(v, float):
            v = now + 600 if k == "lease_expires_at" else now
        out[k] = v
    return out


def tp_worker(  # type: ignore[no-untyped-def]
    mode: str, url: str, queue: str, slot: str, seconds: float, barrier, results, cycle
):
    """One claiming process: claim + complete until `seconds` have passed or the queue is empty.
    `bare` replays `cycle` (capture_cycle) with psycopg: per transaction, psycopg's implicit
    BEGIN, the captured statements (with this job's id, token, slot and time), COMMIT."""
    count, t0, t1, err = 0, 0.0, 0.0, None
    try:
        if mode == "bare":
            import psycopg

            # as make_engine connects: no server-side prepared statements (PgBouncer)
            conn = psycopg.connect(libpq(url), connect_timeout=30, prepare_threshold=None)
        else:
            from jobstore.core.states import Event
            from jobstore.db.engine import make_engine
            from jobstore.db.store import ClaimRequest, JobStore, Offer, Verdict

            store = JobStore(make_engine(url, connect_timeout=30, pool=mode == "pooled"))
            req = ClaimRequest(queue=queue, offer=Offer(cpus=1, memory=1024, disk=1 << 20),
                               slot=slot, host="node", keyword=KEYWORD, claim_lease=600)
            take = Verdict(take=True)
        barrier.wait(120)
        t0 = time.monotonic()
        stop = t0 + seconds
        while time.monotonic() < stop:
            if mode == "bare":  # the package's own statements, replayed
                job_id, token, now = None, secrets.token_hex(16), time.time()
                for tx in cycle:
                    for stmt, tpl in tx:
                        params = fill(tpl, job_id, token, now, slot)
                        if "queue" in params:
                            params["queue"] = queue
                        cur = conn.execute(stmt, params)
                        if stmt.startswith("WITH cand"):
                            row = cur.fetchone()
                            if row is None:
                                break
                            job_id = row[0]
                        elif stmt.startswith(("UPDATE", "WITH upd")) and cur.rowcount != 1:
                            raise RuntimeError(f"job {job_id}: {cur.rowcount} rows updated")
                    conn.commit()
                    if job_id is None:
                        break
                    now = time.time()
                if job_id is None:
                    break
            else:
                job = store.claim(req, lambda _row: take)
                if job is None:
                    break
                out = store.report(job.id, Event.EXIT, token=job.token,
                                   attempt=job.claims)
                if out.after != "completed" or out.stale:
                    raise RuntimeError(f"job {job.id}: EXIT gave {out}")
            count += 1
        t1 = time.monotonic()
        if mode == "bare":
            conn.close()
        else:
            store.engine.dispose()
    except Exception as exc:
        err = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
        t1 = time.monotonic()
        with suppress(Exception):
            barrier.abort()  # a worker that never got going must not keep the others waiting
    results.put((count, t0, t1, err))


def section_throughput(
    env: Env, seconds: float, jobs_per_run: int, ad: str, rounds: int = 2
) -> dict:
    import psycopg

    say("")
    say(f"== 2. Claim throughput on PostgreSQL: claim + EXIT per second, {rounds} rounds of"
        f" {seconds:g} s per cell, package and bare alternating")
    ctx = mp.get_context("fork")
    modes = ("pooled", "bare")
    done: dict[tuple[str, int], float] = {}
    spent: dict[tuple[str, int], float] = {}
    errors: list[str] = []
    exhausted: list[str] = []
    with psycopg.connect(libpq(env.pg_url), autocommit=True) as admin:
        durability = {
            s: admin.execute(f"SHOW {s}").fetchone()[0]
            for s in ("synchronous_commit", "fsync", "full_page_writes", "wal_sync_method")
        }
        populate(admin, "tp_capture", 1, ad)
        cycle = capture_cycle(env.pg_url, "tp_capture")
        for n in TP_CLAIMERS:
            for rnd in range(rounds):
                for mode in modes if rnd % 2 == 0 else modes[::-1]:
                    queue = f"tp_{mode}_{n}_{rnd}"
                    populate(admin, queue, jobs_per_run, ad)
                    progress(f"throughput {mode} x{n}, round {rnd + 1}")
                    barrier = ctx.Barrier(n + 1)
                    results = ctx.Queue()
                    procs = [
                        ctx.Process(target=tp_worker,
                                    args=(mode, env.pg_url, queue, f"slot{i}@node", seconds,
                                          barrier, results, cycle), daemon=True)
                        for i in range(n)
                    ]
                    env.workers = procs
                    for p in procs:
                        p.start()
                    with suppress(threading.BrokenBarrierError):  # a worker failed: it says why
                        barrier.wait(120)
                    got = [results.get(timeout=seconds + 120) for _ in procs]
                    for p in procs:
                        p.join(30)
                    env.workers = []
                    errs = [g[3] for g in got if g[3]]
                    errors += [f"{mode} x{n}: {e}" for e in errs]
                    total = sum(g[0] for g in got)
                    starts = [g[1] for g in got if g[1]]
                    span = max(g[2] for g in got) - min(starts) if total and starts else 0
                    done[(mode, n)] = done.get((mode, n), 0) + total
                    spent[(mode, n)] = spent.get((mode, n), 0.0) + span
                    if total >= jobs_per_run:
                        exhausted.append(f"{mode} x{n}")
    rates = {k: done[k] / spent[k] if spent[k] > 0 else 0.0 for k in done}
    rows = []
    for n in TP_CLAIMERS:
        bare = rates[("bare", n)]
        r = rates[("pooled", n)] / bare if bare else 0.0
        rows.append([str(n), f"{rates[('pooled', n)]:.0f}", f"{bare:.0f}", f"{r:.2f}",
                     verdict(r >= 0.9)])
    say(table(["claimers", "package/s", "bare/s", "package/bare", "target >= 0.90"], rows))
    nstmt = sum(len(tx) for tx in cycle)
    say(f"   package = JobStore(make_engine(url, pool=True)): claim (judge takes every job) +"
        f" report(EXIT); bare = the same {nstmt} statements in the same {len(cycle)}"
        " transactions, text captured from the package in this run, replayed by a psycopg loop"
        " on one persistent connection per claimer, connected as make_engine connects"
        " (prepare_threshold=None: no server-side prepared statements, as PgBouncer in"
        " transaction mode needs). Both make the same round trips: psycopg's BEGIN, the"
        " statements, COMMIT (the package pings no pooled connection before use):")
    for tx in cycle:
        say("     tx: " + "; ".join(" ".join(st.split())[:60] for st, _ in tx) + "; COMMIT")
    say("   durability: " + ", ".join(f"{k}={v}" for k, v in durability.items()))
    if exhausted:
        say("   queue ran dry (rate measured up to that point): " + ", ".join(exhausted))
    for e in errors:
        say(f"   ERROR {e}")
    return {"rates": rates, "durability": durability, "errors": errors, "cycle": cycle}


# ---- section 3: fetch latency ----------------------------------------------------------------


def section_latency(env: Env, big: int, samples: int, ad: str, budget: float) -> dict:
    import psycopg

    from jobstore.core.states import Event
    from jobstore.db.store import ClaimRequest, JobStore, Offer, Verdict

    say("")
    say(f"== 3. Fetch latency on PostgreSQL: JobStore.claim (hook engine: connect + claim),"
        f" claim + reject-to-idle loop, up to {samples} claims")
    store = JobStore.from_url(env.pg_url)
    take = Verdict(take=True)
    out: dict[int, tuple[float, float, float]] = {}
    with psycopg.connect(libpq(env.pg_url), autocommit=True) as admin:
        for size in (10, big):
            queue = f"lat_{size}"
            t = time.perf_counter()
            populate(admin, queue, size, ad)
            fill = time.perf_counter() - t
            progress(f"latency with {size} idle jobs (populated in {fill:.1f} s)")
            req = ClaimRequest(queue=queue, offer=Offer(cpus=1, memory=1024, disk=1 << 20),
                               slot="slot1@node", host="node", keyword=KEYWORD, claim_lease=600)
            lat: list[float] = []
            stop_at = time.monotonic() + budget / 2
            for i in range(samples + 10):
                if len(lat) >= 50 and time.monotonic() > stop_at:
                    say(f"   ({size:,} idle jobs: {len(lat)} claims, the time budget is spent)")
                    break
                t = time.perf_counter()
                job = store.claim(req, lambda _row: take)
                dt = time.perf_counter() - t
                if job is None:
                    raise RuntimeError(f"no idle job in {queue}")
                store.report(job.id, Event.REJECT, token=job.token, attempt=job.claims)
                if i >= 10:  # the first few warm the caches
                    lat.append(dt)
            idle = admin.execute(
                "SELECT count(*) FROM jobs WHERE queue = %s AND status = 'idle'", (queue,)
            ).fetchone()[0]
            if idle != size:
                raise RuntimeError(f"{queue}: {idle} idle jobs after the loop, expected {size}")
            out[size] = (pct(lat, 0.5), pct(lat, 0.99), fill)
    store.engine.dispose()
    rows = [[f"{n:,}", ms(p50), ms(p99), f"{fill:.1f}"] for n, (p50, p99, fill) in out.items()]
    say(table(["idle jobs", "p50 ms", "p99 ms", "populate s"], rows))
    r50 = out[big][0] / out[10][0]
    r99 = out[big][1] / out[10][1]
    say(f"   ratio {big:,} vs 10 idle jobs: p50 x{r50:.2f}, p99 x{r99:.2f}"
        " (populated by INSERT ... SELECT generate_series, then ANALYZE)")
    return {"lat": out, "r50": r50, "r99": r99, "big": big}


# ---- section 4: connections per job ----------------------------------------------------------


def section_connections(env: Env, backends: list[tuple[str, str]], calls, jobs: int) -> dict:
    import psycopg
    from sqlalchemy import event

    from jobstore.db.store import JobStore
    from jobstore.node import config, handlers

    say("")
    say(f"== 4. Database connections opened by the hook path (mean over {jobs} jobs)")
    res: dict[str, Any] = {}
    rows = []
    # (a) the real hook processes, PostgreSQL: pg_stat_database.sessions of the bench database
    if env.pg_url:
        store = JobStore.from_url(env.pg_url)
        with psycopg.connect(libpq(env.pg_url), autocommit=True) as mon:

            def sessions() -> int:
                # a backend reports its session at exit, shortly after the client hangs up
                last, stable = -1, 0
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    mon.execute("SELECT pg_stat_clear_snapshot()")
                    n = mon.execute(
                        "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
                    ).fetchone()[0]
                    stable = stable + 1 if n == last else 0
                    if stable >= 3:
                        return int(n)
                    last = n
                    time.sleep(0.1)
                return int(last)

            life_total = empty_total = 0
            # run_life's own bookkeeping (submit, final check) uses `store`: count it apart
            own = {"n": 0}

            def listener(*_a: Any) -> None:
                own["n"] += 1

            for _ in range(jobs):
                own["n"] = 0
                event.listen(store.engine, "connect", listener)
                s0 = sessions()
                run_life(env, env.pg_url, store, calls, None)
                s1 = sessions()
                run_empty_fetch(env, env.pg_url, calls)
                s2 = sessions()
                event.remove(store.engine, "connect", listener)
                life_total += s1 - s0 - own["n"]
                empty_total += s2 - s1
            store.engine.dispose()
        res["pg_processes"] = (life_total / jobs, empty_total / jobs)
        rows.append(["postgresql: hook processes (pg_stat_database.sessions)",
                     f"{life_total / jobs:.2f}", f"{empty_total / jobs:.2f}", "-"])
    # (b) the same handlers in this process, connect events on the hook's engine, per hook
    for name, url in backends:
        os.environ["JOBSTORE_DATABASE_URL"] = url
        hstore = handlers.store_for(config.load_settings(KEYWORD))
        counter = {"n": 0}

        def on_connect(*_a: Any, _c: dict = counter) -> None:
            _c["n"] += 1

        event.listen(hstore.engine, "connect", on_connect)
        per_hook: dict[str, int] = {}
        life = empty = 0
        helper = JobStore.from_url(url)
        for _ in range(jobs):
            job_id = submit_one(helper)
            identity: list[bytes] = []
            for label, exe, stem, argv in LIFE:
                call = calls[stem]
                stdin = call.stdin
                if exe != "fetch_job":
                    stdin = insert_identity(stdin, identity, reply_fetch=exe == "reply_fetch")
                before = counter["n"]
                resp = handlers.handle(handlers.HookRequest(
                    hook=exe, argv=list(argv), stdin=stdin, env={**os.environ, **call.env}))
                if resp.error:
                    raise LifeError(f"in-process {label}: {resp.error}")
                if exe == "fetch_job":
                    identity = [ln for ln in resp.stdout.split(b"\n")
                                if ln.split(b" = ")[0] in IDENTITY]
                per_hook[label] = per_hook.get(label, 0) + counter["n"] - before
                life += counter["n"] - before
            if helper.get_job(job_id).status != "completed":
                raise LifeError(f"in-process life of job {job_id} did not complete it")
            before = counter["n"]
            slot_ad = calls["01-FETCH_WORK"].stdin
            resp = handlers.handle(handlers.HookRequest(
                hook="fetch_job", argv=[], stdin=slot_ad, env=dict(os.environ)))
            if resp.stdout or resp.error:
                raise LifeError(f"in-process empty fetch: {resp.stdout[:100]!r} {resp.error}")
            empty += counter["n"] - before
        event.remove(hstore.engine, "connect", on_connect)
        helper.engine.dispose()
        breakdown = " ".join(f"{round(per_hook[label] / jobs, 2):g}" for label, *_ in LIFE)
        res[f"{name}_inproc"] = (life / jobs, empty / jobs, breakdown)
        rows.append([f"{name}: handlers in-process (engine connect events)",
                     f"{life / jobs:.2f}", f"{empty / jobs:.2f}", breakdown])
    os.environ.pop("JOBSTORE_DATABASE_URL", None)
    say(table(["path", "per job life", "per empty fetch", "fetch/reply/upd/prep/upd/exit"], rows))
    say("   (fetch_job also reaps expired leases in 5% of calls: one more connection then;"
        " each idle slot runs an empty fetch every FetchWorkDelay)")
    return res


# ---- section 5: emulated node ----------------------------------------------------------------


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
    store.submit(new, owner=OWNER, queue=queue, max_attempts=3)
    store.engine.dispose()
    hooks = {condor: str(env.hooks / ours) for ours, condor in CONDOR_NAMES.items()}
    cfg = EmulatorConfig(
        hooks=hooks, work_dir=str(env.tmp / f"node-{mode}"), keyword=KEYWORD, static_slots=8,
        cpus=8, memory=8192, initial_update_interval=1.0, update_interval=5.0,
        fetch_work_delay='ifThenElse(State == "Claimed" && Activity == "Idle",0,1)',
        env=hook_env(env, env.pg_url, {}),
    )
    counts: list[int] = []
    with psycopg.connect(libpq(env.pg_url), autocommit=True) as mon:

        def done() -> bool:
            n = mon.execute("SELECT count(*) FROM pg_stat_activity WHERE datname ="
                            " current_database() AND pid <> pg_backend_pid()").fetchone()[0]
            counts.append(int(n))
            left = mon.execute("SELECT count(*) FROM jobs WHERE queue = %s AND status NOT IN"
                               " ('completed', 'failed', 'held', 'removed')",
                               (queue,)).fetchone()[0]
            return left == 0

        completed = ("SELECT count(*) FROM jobs WHERE queue = %s AND status = 'completed'"
                     " AND cmd = '/bin/sleep' AND ad::text LIKE '%%0.1%%'")
        before = mon.execute(completed, (queue,)).fetchone()[0]  # earlier runs' jobs
        t0 = time.monotonic()
        Emulator(cfg).run(until=done, timeout=150, wait_for_jobs=True)
        span = time.monotonic() - t0
        finished = mon.execute(completed, (queue,)).fetchone()[0] - before
    counts = counts[len(counts) // 5:] or [0]  # steady state: skip the start
    return finished / span, finished, max(counts), int(statistics.median(counts))


# ---- main ------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short run (about 4 minutes at most)")
    ap.add_argument("--db-url", default=os.environ.get("JOBSTORE_BENCH_DATABASE_URL"),
                    help="PostgreSQL server and an account that may CREATE DATABASE (default "
                         f"{DEFAULT_ADMIN_URL}); a fresh database is made there and dropped")
    ap.add_argument("--no-sqlite", action="store_true", help="skip the SQLite half of section 1")
    ap.add_argument("--transcript", type=Path, default=DEFAULT_TRANSCRIPT)
    ap.add_argument("--only", choices=["throughput"],
                    help="run only this section (quick iterations while tuning)")
    args = ap.parse_args()
    quick = args.quick
    runs = 5 if quick else 11
    tp_seconds = 2.0 if quick else 5.0
    tp_jobs = 20_000 if quick else 60_000
    big = 100_000 if quick else 1_000_000
    lat_samples = 300 if quick else 1000
    conn_jobs = 2 if quick else 5
    # soft time budgets (s): on a loaded machine fewer samples are taken, never fewer than a floor
    hooks_budget = 80 if quick else 240
    lat_budget = 30 if quick else 90

    import pwd

    try:
        pwd.getpwnam(OWNER)
    except KeyError:
        print(f"bench: needs the account {OWNER} (the recorded job owner): "
              f"useradd -u 1001 -M {OWNER}", file=sys.stderr)
        return 2
    calls = load_calls(args.transcript)
    admin_url = args.db_url or DEFAULT_ADMIN_URL
    env = make_env(admin_url)

    def on_term(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    random.seed()
    started = time.monotonic()
    try:
        from jobstore.db.engine import safe_url

        create_pg(env)
        backends = [("postgresql", env.pg_url)]
        if not args.no_sqlite:
            create_sqlite(env)
            backends.append(("sqlite", env.sqlite_url))
        say(f"jobstore bench ({'quick' if quick else 'full'}): PostgreSQL "
            f"{safe_url(env.pg_url)}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
            f"ratios against baselines measured in this run")
        say("")
        if args.only == "throughput":
            section_throughput(env, tp_seconds, tp_jobs, job_ad_json())
            return 0
        HOOK_MODE_ENV["JOBSTORE_HOOK_MODE"] = "direct"
        hooks = section_hooks(env, backends, runs, calls, hooks_budget)
        missing = agent_missing()
        emu: dict[str, tuple[float, int, int, int]] = {}
        emu_jobs = 80 if quick else 300
        if missing:
            say(f"== 1b. Hook cost, agent mode: not available ({missing})")
        else:
            agent = start_agent(env, env.pg_url)
            hooks.update(section_hooks(env, backends[:1], runs, calls, hooks_budget / 2,
                                       mode="agent", agent_pid=agent.pid))
            progress("emulator, agent mode")
            emu["agent"] = emulate_rate(env, emu_jobs, "agent")
            stop_agent(env, agent)
        progress("emulator, direct mode")
        emu["direct"] = emulate_rate(env, emu_jobs, "direct")
        say("")
        say(f"== 5. Emulated node: 8 static slots, {emu_jobs} jobs of `sleep 0.1`, PostgreSQL")
        say(table(["hooks", "jobs/s", "finished", "db conns max", "db conns median"],
                  [[m, f"{r[0]:.2f}", str(r[1]), str(r[2]), str(r[3])] for m, r in emu.items()]))
        say("   db conns = pg_stat_activity rows of the bench database while the node runs"
            " (the monitor excluded)")
        tp = section_throughput(env, tp_seconds, tp_jobs, job_ad_json())
        lat = section_latency(env, big, lat_samples, job_ad_json(), lat_budget)
        conns = section_connections(env, backends, calls, conn_jobs)

        log_errors = [
            ln for ln in env.hook_log.read_text(errors="replace").splitlines()
            if "error" in ln.lower() or "gave up" in ln or "spooled" in ln
        ] if env.hook_log.exists() else []
        if log_errors:
            say("")
            say(f"hook log: {len(log_errors)} error line(s), first: {log_errors[0]}")

        say("")
        say("SUMMARY (targets of issue 5, ratios from this run):")
        rows = []
        for name, r in hooks.items():
            per = r["per"]
            rows.append([f"{name}: empty fetch CPU x python -c pass",
                         f"{per[EMPTY_FETCH][3]:.2f}", "<= 2.5",
                         verdict(per[EMPTY_FETCH][3] <= 2.5)])
            worst = max((k for k in per if k != EMPTY_FETCH), key=lambda k: per[k][3])
            rows.append([f"{name}: worst other hook CPU x ({worst})", f"{per[worst][3]:.2f}",
                         "<= 3", verdict(per[worst][3] <= 3)])
            rows.append([f"{name}: one job's life, CPU in hook processes (ms)",
                         ms(r["life_cpu"]), "<= 100", verdict(r["life_cpu"] <= 0.1)])
            if r.get("agent_cpu") is not None:
                rows.append([f"{name}: agent process CPU per job life (ms)",
                             ms(r["agent_cpu"]), "-", "info"])
        rates = tp["rates"]
        for n in TP_CLAIMERS:
            if rates[("bare", n)]:
                rr = rates[("pooled", n)] / rates[("bare", n)]
                rows.append([f"claim+EXIT throughput, {n} claimers, package / bare SQL",
                             f"{rr:.2f}", ">= 0.90", verdict(rr >= 0.9)])
        rows.append([f"fetch latency p99, {lat['big']:,} / 10 idle jobs", f"{lat['r99']:.2f}",
                     "<= 1.5", verdict(lat["r99"] <= 1.5)])
        if "pg_processes" in conns:
            rows.append(["db connections opened per job life, direct hooks",
                         f"{conns['pg_processes'][0]:.1f}", "-", "info"])
        if "agent" in emu:
            rows.append(["db connections held by the node, 8 slots, agent (max)",
                         str(emu["agent"][2]), "<= 1", verdict(emu["agent"][2] <= 1)])
            er = emu["agent"][0] / emu["direct"][0] if emu["direct"][0] else 0.0
            rows.append([f"emulator jobs/s agent / direct ({emu['agent'][0]:.2f} /"
                         f" {emu['direct'][0]:.2f})", f"{er:.2f}", ">= 1", verdict(er >= 1)])
        else:
            rows.append(["agent mode", "not available", "-", "MISS"])
        say(table(["figure", "value", "target", "result"], rows))
        say("  durability: " + ", ".join(f"{k}={v}" for k, v in tp["durability"].items()))
        say(f"  total bench time {time.monotonic() - started:.0f} s")
        return 0
    except KeyboardInterrupt:
        print("bench: interrupted, cleaning up", file=sys.stderr)
        return 130
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        cleanup(env)


if __name__ == "__main__":
    sys.exit(main())
