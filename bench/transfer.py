#!/usr/bin/env python3
"""A fetched job's files, on PostgreSQL, each against a baseline of the same run:

* stage-in (PREPARE_JOB's filling of a sandbox) of a 1 MB and a 100 MB input, through a
  running `jobstore agent` (cold: its node copy made from the database first, checked against
  the hash; warm: copied from the node copy) and in direct mode (the hook's own database
  session, hashes checked), against `cp` of the same file on this machine;
* stage-out (JOB_EXIT's sending) of a 10 MB output, the same ways, against `cp`;
* a cluster of 1,000 jobs sharing one 10 MB input: what the store grew by against one copy of
  the file, and the submit's time against the same submit without file transfer;
* the CPU of a job's whole life through the six hook processes in agent mode (fed the
  recorded transcript's stdin, as the startd and starter run them), with a 512 KB input in a
  sandbox against the same job without file transfer: the hooks' CPU and the agent's;
* the database's own part, which no transport can beat: a file's chunks streamed to a client,
  and 10 MB of chunks inserted and committed, by psycopg alone.

Usage: .venv/bin/python bench/transfer.py [--db-url ADMIN_URL] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common, hookcost, schedd_scale

from common import first  # noqa: E402
from schedd_scale import DEFAULT_ADMIN_URL, make_db  # noqa: E402

from jobstore.agent.client import _AgentFiles  # noqa: E402
from jobstore.core.claims import Offer  # noqa: E402
from jobstore.db.store import JobStore  # noqa: E402
from jobstore.node.sandbox import (  # noqa: E402
    Files,
    attempt_of,
    remove_sandbox,
    stage_in,
    stage_out,
)
from jobstore.node.sandboxdirect import DirectFiles  # noqa: E402
from jobstore.node.sandboxroot import CACHE  # noqa: E402
from jobstore.submit.description import parse_submit_text  # noqa: E402
from jobstore.testing.factories import claim, claim_request  # noqa: E402
from jobstore.testing.support import libpq_url  # noqa: E402

REQ = claim_request(offer=Offer(cpus=1, memory=1024, disk=10**9), slot="slot1@bench",
                    shape="bench")
TABLES = ("sandbox_files", "sandbox_chunks", "job_files")


def median(fn: Callable[[], float], repeat: int) -> float:
    return statistics.median(fn() for _ in range(repeat))


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def attempt_ad(job, iwd: Path) -> bytes:  # type: ignore[no-untyped-def]
    return (f"JobstoreJobId = {job.id}\nJobstoreAttempt = {job.claims}\n"
            f'JobstoreToken = "{job.token}"\nJobstoreSandbox = true\nIwd = "{iwd}"\n'
            f'HookKeyword = "JOBSTORE"\nRequestDisk = {10**9}\n').encode()


def owner() -> str:
    return "alice" if os.geteuid() == 0 else os.environ.get("USER", "root")


def claimed_job(store: JobStore, tmp: Path, size_mb: int):  # type: ignore[no-untyped-def]
    """A job with one input of `size_mb` MB, claimed: (job, its input file)."""
    src = tmp / f"in{size_mb}.bin"
    src.write_bytes(os.urandom(size_mb << 20))
    specs = parse_submit_text(f"executable = /bin/true\ntransfer_executable = false\n"
                              f"transfer_input_files = {src}\nrequest_disk = 1GB\nqueue\n",
                              base_dir=tmp)
    store.submissions.submit(specs, owner=owner(), queue="default", max_attempts=3)
    job = claim(store, REQ)
    assert job is not None
    return job, src


def stage_in_once(ad: bytes, files: Files, size_mb: int, cache: Path | None = None) -> float:
    """One stage-in; `cache`: the agent's node copies, emptied first (a cold node)."""
    iwd = Path(attempt_of(ad)[3])  # type: ignore[index]
    if cache is not None and cache.exists():
        for copy in cache.iterdir():
            copy.unlink()
    t = timed(lambda: stage_in(ad, files.manifest, files.read, files.open_input))
    assert cache is None or len(list(cache.iterdir())) == 1, "the agent made no node copy"
    assert next(iwd.iterdir()).stat().st_size == size_mb << 20
    remove_sandbox(str(iwd))
    return t


def stage_out_once(job, out: Path, files: Files) -> float:  # type: ignore[no-untyped-def]
    out.mkdir(exist_ok=True)
    (out / "result.bin").write_bytes(os.urandom(10 << 20))
    sent = attempt_ad(job, out) + b'TransferOutput = "result.bin"\n'
    t = timed(lambda: stage_out(sent, files.manifest, files.send))
    assert not out.exists()  # sent, and the sandbox removed
    return t


def life_cpu(env, url: str, store: JobStore, calls, sandbox: bool,  # type: ignore[no-untyped-def]
             agent_pid: int, src: Path) -> tuple[float, float]:
    """One job's life through the six hook processes: (the hooks' CPU, the agent's CPU)."""
    from common import IDENTITY, LIFE, OWNER, node_env, recorded_spec
    from hookcost import proc_cpu, spawn

    from jobstore.core.jobs import InputFile
    from jobstore.testing.support import insert_identity

    spec = recorded_spec()
    if sandbox:
        spec.inputs = (InputFile(src.name, str(src)),)
        spec.custom = {"ShouldTransferFiles": '"YES"', "TransferExecutable": "false"}
    _, (job_id,) = store.submissions.submit([spec], owner=OWNER, queue="default", max_attempts=5)
    hooks = cpu = 0.0
    agent0 = proc_cpu(agent_pid)
    carried: list[bytes] = []
    for _label, exe, stem, argv in LIFE:
        stdin = calls[stem].stdin
        if exe != "fetch_job":
            stdin = insert_identity(stdin, [c for c in carried if c.split(b" = ")[0] in IDENTITY],
                                    reply_fetch=exe == "reply_fetch")
            for line in carried:
                if line.startswith(b"Iwd = ") and exe != "reply_fetch":
                    stdin = b"\n".join(line if old.startswith(b"Iwd = ") else old
                                       for old in stdin.split(b"\n"))
                elif line.startswith(b"JobstoreSandbox") and exe != "reply_fetch":
                    stdin = stdin.rstrip(b"\n") + b"\n" + line + b"\n"
        _, cpu, proc = spawn([str(env.hooks / exe), *argv], stdin,
                             node_env(env, url, calls[stem].env), False)
        if proc.returncode != 0 or (proc.stderr or b"").strip():
            raise RuntimeError(f"{exe}: exit {proc.returncode}, stderr {proc.stderr!r}")
        hooks += cpu
        if sandbox and exe == "prepare_job":  # the sandbox was made and filled
            iwd = next(ln for ln in carried if ln.startswith(b"Iwd = "))[7:-1].decode()
            assert (Path(iwd) / src.name).stat().st_size == src.stat().st_size, iwd
        if exe == "fetch_job":
            carried = [ln for ln in proc.stdout.split(b"\n")
                       if ln.split(b" = ")[0] in (*IDENTITY, b"Iwd", b"JobstoreSandbox")]
    job = store.reads.get_job(job_id)
    if job.status != "completed":
        raise RuntimeError(f"job {job_id} ended {job.status}: {job.reason}")
    return hooks, proc_cpu(agent_pid) - agent0


def cp(src: Path, dst: Path) -> float:
    def run() -> None:
        subprocess.run(["cp", str(src), str(dst)], check=True)
        dst.unlink()

    return timed(run)


def database_read(url: str, owner: str, src: Path) -> float:
    """The database's own part of a cold stage-in: the file's chunks streamed to this process
    (psycopg, binary, one statement), kept nowhere."""
    import hashlib

    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    with psycopg.connect(libpq_url(url)) as conn:
        def run() -> None:
            for _ in conn.cursor(binary=True).stream(
                    "SELECT data FROM sandbox_chunks WHERE owner = %s AND sha256 = %s"
                    " ORDER BY seq", (owner, sha)):
                pass
            conn.rollback()

        return timed(run)


def database_write(url: str, size_mb: int) -> float:
    """The database's own part of a stage-out: `size_mb` new 1 MB chunks inserted and
    committed in one transaction (psycopg, binary), into a table like sandbox_chunks (the
    bench's database goes at its end)."""
    with psycopg.connect(libpq_url(url)) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_floor_chunks"
                     " (LIKE sandbox_chunks INCLUDING ALL)")
        conn.commit()
        pieces = [os.urandom(1 << 20) for _ in range(size_mb)]

        def run() -> None:
            key = os.urandom(32).hex()
            with conn.cursor() as cur:
                for seq, data in enumerate(pieces):
                    cur.execute("INSERT INTO bench_floor_chunks (owner, sha256, seq, data)"
                                " VALUES (%s, %s, %s, %b)", ("bench", key, seq, data))
            conn.commit()

        return timed(run)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db-url", default=DEFAULT_ADMIN_URL)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    from common import OWNER

    from jobstore.testing.support import ensure_account

    ensure_account(OWNER, uid=1001)  # the agent hands out only jobs of accounts it knows
    tmp = Path(tempfile.mkdtemp(prefix="jobstore-bench-transfer-"))
    name, url = make_db(args.db_url, "jobstore_bench_transfer")
    (tmp / "condor_config").write_text("")
    os.environ.update(CONDOR_CONFIG=str(tmp / "condor_config"), JOBSTORE_DATABASE_URL=url)
    store = JobStore.from_url(url, statement_timeout_ms=None)
    agent = None
    try:
        from common import make_env
        from hookcost import start_agent

        env = make_env(args.db_url)
        with env.condor_config.open("a") as cfg:
            cfg.write(f"TEST_JOBSTORE_SANDBOX_ROOT = {tmp / 'node-sandboxes'}\n"
                      f"JOBSTORE_SANDBOX_ROOT = {tmp / 'node-sandboxes'}\n")
        agent = start_agent(env, url)
        sock = env.tmp / "agent.sock"
        root = tmp / "sandboxes"
        root.mkdir(mode=0o755)
        cache = tmp / "node-sandboxes" / CACHE  # the agent's node copies of inputs
        print(f"stage-in and stage-out (median of {args.repeat}), against cp of the same file")
        for size_mb in (1, 100):
            job, src = claimed_job(store, tmp, size_mb)
            ad = attempt_ad(job, root / f"job{size_mb}")
            base = median(lambda: cp(src, tmp / "copy.bin"), args.repeat)  # noqa: B023
            floor = median(lambda: database_read(url, owner(), src), args.repeat)  # noqa: B023
            print(f"  {size_mb:>3} MB: the database's own read of the chunks"
                  f" {floor * 1000:7.1f} ms ({floor / base:5.2f} x cp)")
            agent_files = _AgentFiles(str(sock), (os.geteuid(),), ad)
            for label, files, cold in (("agent, cold", agent_files, cache),
                                       ("agent, warm", agent_files, None),
                                       ("direct", DirectFiles(ad), None)):
                got = median(lambda: stage_in_once(ad, files, size_mb, cold), args.repeat)  # noqa: B023
                print(f"  stage-in {size_mb:>3} MB, {label:<11}: {got * 1000:8.1f} ms; cp"
                      f" {base * 1000:7.1f} ms; ratio {got / base:5.2f}; over cp"
                      f" {(got - base) * 1000:7.1f} ms")
        (tmp / "o.bin").write_bytes(os.urandom(10 << 20))
        base = median(lambda: cp(tmp / "o.bin", tmp / "o2.bin"), args.repeat)
        floor = median(lambda: database_write(url, 10), args.repeat)
        print(f"   10 MB: the database's own insert and commit of the chunks"
              f" {floor * 1000:7.1f} ms ({floor / base:5.2f} x cp)")
        for label, files in (("agent", _AgentFiles(str(sock), (os.geteuid(),), ad)),
                             ("direct", DirectFiles(ad))):
            got = median(lambda: stage_out_once(job, root / "out", files), args.repeat)  # noqa: B023
            print(f"  stage-out 10 MB, {label:<11}: {got * 1000:8.1f} ms; cp"
                  f" {base * 1000:7.1f} ms; ratio {got / base:5.2f}")
        shared = tmp / "shared10.bin"
        shared.write_bytes(os.urandom(10 << 20))
        with psycopg.connect(libpq_url(url)) as conn:
            before = sum(first(conn.execute("SELECT pg_total_relation_size(%s)", (t,)))
                         for t in TABLES)
        with_files = timed(lambda: store.submissions.submit(parse_submit_text(
            f"executable = /bin/true\ntransfer_executable = false\n"
            f"transfer_input_files = {shared}\narguments = $(Process)\nqueue 1000\n",
            base_dir=tmp), owner=owner(), queue="other", max_attempts=3))
        without = timed(lambda: store.submissions.submit(parse_submit_text(
            "executable = /bin/true\ntransfer_executable = false\narguments = $(Process)\n"
            "queue 1000\n", base_dir=tmp), owner=owner(), queue="other", max_attempts=3))
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
            after = sum(first(conn.execute("SELECT pg_total_relation_size(%s)", (t,)))
                        for t in TABLES)
        grown = after - before
        print(f"\n1,000 jobs sharing one 10 MB input: the store grew {grown / 2**20:.1f} MB"
              f" ({grown / (10 << 20):.2f} x one copy); submit {with_files:.2f} s against"
              f" {without:.2f} s without file transfer (ratio {with_files / without:.2f})")
        from common import DEFAULT_TRANSCRIPT
        from hookcost import load_calls

        calls = load_calls(DEFAULT_TRANSCRIPT)
        small = tmp / "in512k.bin"
        small.write_bytes(os.urandom(512 << 10))
        print(f"\na job's life through the six hook processes, agent mode (median of"
              f" {args.repeat}; CPU ms)")
        plain = (1.0, 1.0)
        for sandbox in (False, True):
            runs = [life_cpu(env, url, store, calls, sandbox, agent.pid, small)
                    for _ in range(args.repeat)]
            hooks = statistics.median(r[0] for r in runs)
            agent_ms = statistics.median(r[1] for r in runs)
            label = "with a 512 KB input in a sandbox" if sandbox else "without file transfer"
            plain = plain if sandbox else (hooks, agent_ms)
            print(f"  {label:<34}: hooks {hooks * 1000:6.1f}, agent {agent_ms * 1000:6.1f};"
                  f" ratio {hooks / plain[0]:.2f} and {agent_ms / max(plain[1], 1e-9):.2f}")
        return 0
    finally:
        if agent is not None:
            from common import cleanup

            cleanup(env)
        store.db.engine.dispose()
        shutil.rmtree(tmp, ignore_errors=True)
        with psycopg.connect(libpq_url(args.db_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
