"""Section 1: the cost of each hook process, run as HTCondor runs it, against `python -c pass`."""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from common import (
    CLOSED_OUTPUT,
    EMPTY_FETCH,
    HOOK_MODE_ENV,
    IDENTITY,
    LIFE,
    Env,
    ms,
    node_env,
    progress,
    say,
    submit_one,
    table,
)

from jobstore.emulator.spawn import hook_preexec
from jobstore.testing.support import (
    insert_identity,
)


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
JOBSTORE_EXE = Path(sys.executable).with_name("jobstore")


def agent_missing() -> str | None:
    """None when `jobstore agent` exists, else why agent mode is not measured."""
    try:
        r = subprocess.run([str(JOBSTORE_EXE), "agent", "--help"], capture_output=True,
                           timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"jobstore agent --help failed: {exc}"
    return None if r.returncode == 0 else "`jobstore agent --help` fails: no agent in this tree"


def start_agent(env: Env, db_url: str, extra: dict[str, str] | None = None,
                name: str = "agent") -> subprocess.Popen:
    """`jobstore agent --socket S` in the foreground, as a subprocess (with `extra` in its
    environment); waits for its socket. The hooks of the runs that follow use the one named
    `agent`; another node's (its own `name`) is for hooks given its socket."""
    sock = env.tmp / f"{name}.sock"
    log = open(env.tmp / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the agent
    proc = subprocess.Popen(
        [str(JOBSTORE_EXE), "agent", "--socket", str(sock), "--foreground"],
        env={**node_env(env, db_url, extra or {}), "JOBSTORE_AGENT_SOCKET": str(sock)},
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/tmp",
    )
    env.agents.append(proc)
    deadline = time.monotonic() + 30
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (env.tmp / f"{name}.log").read_text(errors="replace")[-300:]
            raise RuntimeError(f"the agent did not start (exit {proc.poll()}): {tail}")
        time.sleep(0.05)
    if name == "agent":
        HOOK_MODE_ENV.clear()
        HOOK_MODE_ENV["JOBSTORE_AGENT_SOCKET"] = str(sock)
    return proc


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) a live process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class LifeError(RuntimeError):
    pass


def run_life(
    env: Env, db_url: str, store, calls: dict[str, Call], samples: dict | None,
    check: bool = True, job_id: int | None = None,
) -> int:  # type: ignore[no-untyped-def]
    """Submit one job (or take `job_id`, submitted already and the oldest idle one) through
    every hook of its life as real processes (with `check`, then read that it completed: a
    transaction of the bench's own)."""
    if job_id is None:
        job_id = submit_one(store)
    identity: list[bytes] = []
    for label, exe, stem, argv in LIFE:
        call = calls[stem]
        stdin = call.stdin
        if exe != "fetch_job":
            stdin = insert_identity(stdin, identity, reply_fetch=exe == "reply_fetch")
        close = exe in CLOSED_OUTPUT
        wall, cpu, proc = spawn(
            [str(env.hooks / exe), *argv], stdin, node_env(env, db_url, call.env), close
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
    if check:
        check_completed(store, job_id)
    return job_id


def check_completed(store, job_id: int) -> None:  # type: ignore[no-untyped-def]
    job = store.reads.get_job(job_id)
    if job.status != "completed" or job.exit_code != 0:
        raise LifeError(f"job {job_id} ended {job.status} exit_code={job.exit_code}")


def run_empty_fetch(env: Env, db_url: str, calls: dict[str, Call]) -> tuple[float, float]:
    call = calls["01-FETCH_WORK"]
    wall, cpu, proc = spawn(
        [str(env.hooks / "fetch_job")], call.stdin, node_env(env, db_url, call.env), False
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
        pass_env = node_env(env, url, {})
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
        store.db.engine.dispose()

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
        for label, exe in [(EMPTY_FETCH, "fetch_job"), *((lb, ex) for lb, ex, *_ in LIFE)]:
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
