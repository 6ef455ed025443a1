#!/usr/bin/env python3
"""The schedd's surface at a production pool's scale: listing and acting on a job
store of 1,000,000 finished jobs (a busy pool's month) and one cluster of 100,000 idle jobs.

A PostgreSQL database `jobstore_bench_scale_<hex>` gets the finished jobs by INSERT ... SELECT
generate_series (finished over the last 30 days), the idle cluster by Submissions.submit. Then:

* each listing (`jobstore history -limit 10`, `q -limit 10`, `q -totals`,
  `Schedd.history(match=10)`, `Schedd.query(limit=10)`) runs as its own process: its wall time
  and peak memory (ru_maxrss), against the same command on the empty store (the baseline: what
  starting Python and connecting cost), and against the issue's bars (1 s, 200 MiB);
* Schedd.query of every idle job projected to three column attributes (the stored ads left
  unread: projection in SQL) against three attributes one of which is in the stored ad;
* `jobstore rm CLUSTER` of the 100,000 idle jobs, against one bare UPDATE of the same rows and
  one INSERT ... SELECT of their events (the least any removal that records its events costs);
* while the rm runs, FETCH_WORK in agent mode (the installed hook process, fed the recorded
  slot ad, through a running `jobstore agent`) on another queue: its p99 against the same loop
  without the rm; then the same for Negotiator.claim alone, in this process, during an rm of a
  second cluster as big (the claim's share, with no hook process around it);
* one-job `Schedd.submit`s at 50/s through one Schedd: the PostgreSQL server's CPU per submit
  (all its processes, from /proc) against bare INSERTs of the same rows at the same rate.

Usage: .venv/bin/python bench/schedd_scale.py [--finished N] [--idle N] [--db-url ADMIN_URL]
       [--only listings|rm|submits]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from jobstore.db.engine import upgrade
from jobstore.db.store import JobStore
from jobstore.submit.description import parse_submit_text
from jobstore.testing.factories import claim_request, take_every
from jobstore.testing.support import libpq_url

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common, hookcost

DEFAULT_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
BAR_SECONDS, BAR_MIB, BAR_RM = 1.0, 200.0, 30.0
FINAL_SQL = ("CASE WHEN g %% 10 < 8 THEN 'completed' WHEN g %% 10 = 8 THEN 'removed'"
             " ELSE 'failed' END")


def populate_finished(url: str, n: int) -> None:
    """n finished jobs in 1,000-job clusters of 50 owners, finished over the last 30 days."""
    ad = json.dumps({"Cmd": "/bin/sleep", "Args": "10", "Iwd": "/tmp", "Out": "out.txt",
                     "Err": "err.txt", "UserLog": "/tmp/log", "JobBatchName": "month"})
    now = time.time()
    with psycopg.connect(libpq_url(url)) as conn:
        conn.execute("INSERT INTO clusters (owner, queue, num_procs, submitted_at)"
                     " SELECT 'user' || (c %% 50), 'default', 1000, %s"
                     " FROM generate_series(0, %s::int - 1) AS c", (now, (n + 999) // 1000))
        conn.execute(
            "INSERT INTO jobs (cluster_id, proc_id, queue, status, priority, owner, ad, cmd,"
            " request_cpus, request_memory, request_disk, max_attempts, success_exit_code,"
            " claims, attempts, exit_code, submitted_at, updated_at, finished_at, num_starts,"
            " wall_clock)"
            f" SELECT g / 1000 + 1, g %% 1000, 'default', {FINAL_SQL}, 0,"
            " 'user' || ((g / 1000) %% 50), %s::json, '/bin/sleep', 1, 128, 1024, 5, 0, 1, 1,"
            " 0, %s - 2592000 + g * (2592000.0 / %s) - 60, %s - 2592000 + g * (2592000.0 / %s),"
            " %s - 2592000 + g * (2592000.0 / %s), 1, 60"
            " FROM generate_series(0, %s::int - 1) AS g",
            (ad, now, n, now, n, now, n, n))
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def submit_idle(store: JobStore, n: int, queue: str = "default") -> int:
    """One cluster of n idle jobs, submitted as `queue N` is (a template on PostgreSQL)."""
    specs = parse_submit_text("executable = /bin/sleep\narguments = 60\n"
                              f"transfer_executable = false\nqueue {n}\n", base_dir="/tmp")
    cluster, _ = store.submissions.submit(specs, owner="alice", queue=queue, max_attempts=3)
    return cluster


def run_measured(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, peak resident MiB and stdout of one process."""
    t = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        dt = time.perf_counter() - t
        out.seek(0)
        text = out.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} failed: {text[-500:]}")
    return dt, usage.ru_maxrss / 1024, text


def listings(url: str) -> list[tuple[str, list[str]]]:
    cli = [PY, "-m", "jobstore.cli", "--db", url]
    schedd = ("import jobstore; s = jobstore.Schedd(url={url!r}); "
              "print(len(s.{call}))")
    return [
        ("jobstore history -limit 10", [*cli, "history", "-limit", "10"]),
        ("jobstore q -limit 10", [*cli, "q", "-limit", "10"]),
        ("jobstore q -totals", [*cli, "q", "-totals"]),
        ("Schedd.history(match=10)", [PY, "-c", schedd.format(url=url, call="history(match=10)")]),
        ("Schedd.query(limit=10)", [PY, "-c", schedd.format(url=url, call="query(limit=10)")]),
    ]


def measure_listings(url: str, empty_url: str, env: dict[str, str], repeat: int) -> bool:
    ok = True
    print(f"\nlistings (median of {repeat}; each its own process; baseline: the same on an "
          "empty store)")
    header = f"{'command':<30} {'s':>7} {'MiB':>7} {'empty s':>8} {'ratio':>6}  bar"
    print(header + "\n" + "-" * len(header))
    for (label, argv), (_, base_argv) in zip(listings(url), listings(empty_url), strict=True):
        runs = [run_measured(argv, env) for _ in range(repeat)]
        base = [run_measured(base_argv, env) for _ in range(repeat)]
        t = statistics.median(r[0] for r in runs)
        mib = max(r[1] for r in runs)
        bt = statistics.median(r[0] for r in base)
        good = t <= BAR_SECONDS and mib <= BAR_MIB
        ok &= good
        print(f"{label:<30} {t:>7.2f} {mib:>7.0f} {bt:>8.2f} {t / bt:>6.2f}  "
              f"{'PASS' if good else 'MISS'} (<= {BAR_SECONDS:.0f} s, <= {BAR_MIB:.0f} MiB)")
    return ok


def measure_projection(url: str, env: dict[str, str], repeat: int) -> None:
    """Schedd.query of every idle job: whole ads (the baseline); three attributes one of which
    is in the stored ad (only those built); three column attributes (the stored ads not even
    read: projection in SQL)."""
    call = ("import jobstore; s = jobstore.Schedd(url={url!r});"
            " print(len(s.query('true', {proj!r})))")
    print(f"\nSchedd.query of every idle job (median of {repeat}; each its own process;"
          " baseline: whole ads)")
    base = None
    for label, proj in (("whole ads", []), ("ClusterId ProcId Cmd", ["ClusterId", "ProcId", "Cmd"]),
                        ("ClusterId ProcId JobStatus", ["ClusterId", "ProcId", "JobStatus"])):
        runs = [run_measured([PY, "-c", call.format(url=url, proj=proj)], env)
                for _ in range(repeat)]
        t, mib = statistics.median(r[0] for r in runs), max(r[1] for r in runs)
        base = base or t
        print(f"{label:<28} {runs[0][2].strip()} ads {t:>6.2f} s {mib:>5.0f} MiB"
              f"  ratio {t / base:.2f}")


def claim_latencies(store: JobStore, stop: threading.Event, seconds: float) -> list[float]:
    """Negotiator.claim on queue `other` (in this process) for `seconds` or until stop."""
    req = claim_request(queue="other", slot="slot1@bench", shape="bench")
    out: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end and not stop.is_set():
        t = time.perf_counter()
        job = store.negotiator.claim(req, take_every)
        out.append(time.perf_counter() - t)
        if job is None:
            break
    return out


class Node:
    """A node in agent mode: `jobstore agent` and the installed FETCH_WORK hook, fed the slot ad
    a real startd gave it (the recorded transcript), taking jobs of queue `other`."""

    def __init__(self, url: str) -> None:
        from common import make_env
        from hookcost import start_agent

        self.env = make_env(DEFAULT_ADMIN_URL)
        with self.env.condor_config.open("a") as cfg:
            cfg.write("TEST_JOBSTORE_QUEUE = other\n")
        self.url = url
        self.agent = start_agent(self.env, url)
        from common import DEFAULT_TRANSCRIPT

        self.stdin = (DEFAULT_TRANSCRIPT / "01-FETCH_WORK.stdin").read_bytes()

    def fetch(self) -> tuple[float, bool]:
        """One FETCH_WORK as the startd runs it: wall seconds, and whether it printed a job."""
        from common import node_env
        from hookcost import spawn

        wall, _, proc = spawn([str(self.env.hooks / "fetch_job")], self.stdin,
                              node_env(self.env, self.url, {}), False)
        if proc.returncode != 0:
            raise RuntimeError(f"fetch_job failed: {proc.stderr[-300:]!r}")
        return wall, b"JobstoreJobId" in proc.stdout

    def fetches(self, stop: threading.Event, seconds: float) -> list[float]:
        """FETCH_WORK after FETCH_WORK for `seconds` or until stop; each must hand out a job."""
        out: list[float] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end and not stop.is_set():
            wall, got = self.fetch()
            if not got:
                raise RuntimeError("FETCH_WORK found no job of queue other")
            out.append(wall)
        return out

    def close(self) -> None:
        from common import cleanup

        cleanup(self.env)


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 100 else max(values)


def during_rm(url: str, cluster: int, env: dict[str, str],
              loop: Callable[[threading.Event, float], list[float]],
              ) -> tuple[float, float, str, list[float], list[float]]:
    """`loop` for 20 s alone, then while `jobstore rm CLUSTER` runs: rm seconds, MiB, its last
    line, the latencies without and during."""
    quiet = loop(threading.Event(), 20.0)
    box: dict[str, Any] = {}
    stop = threading.Event()
    thread = threading.Thread(target=lambda: box.update(l=loop(stop, 600)))
    thread.start()
    try:
        t, mib, out = run_measured([PY, "-m", "jobstore.cli", "--db", url, "rm", str(cluster)],
                                   env)
    finally:
        stop.set()
        thread.join()
    return t, mib, out.strip().splitlines()[-1], quiet, box["l"]


def measure_rm(url: str, store: JobStore, cluster: int, env: dict[str, str]) -> bool:
    print("\nrm of the idle cluster, and the fetch path on another queue meanwhile")
    node = Node(url)
    try:
        node.fetch()  # the agent connected
        t, mib, last, quiet, busy = during_rm(url, cluster, env, node.fetches)
    finally:
        node.close()
    with psycopg.connect(libpq_url(url)) as conn:
        count = conn.execute("SELECT count(*) FROM jobs WHERE cluster_id = %s AND status ="
                             " 'removed'", (cluster,)).fetchone()
        events = conn.execute("SELECT count(*) FROM job_events e JOIN jobs j ON j.id = e.job_id"
                              " WHERE j.cluster_id = %s AND e.event = 'remove'",
                              (cluster,)).fetchone()
    n = int(count[0]) if count else 0
    base_cluster = submit_idle(store, n)
    with psycopg.connect(libpq_url(url)) as conn:
        b = time.perf_counter()
        conn.execute("UPDATE jobs SET status = 'removed', finished_at = %s, updated_at = %s,"
                     " reason = 'bare' WHERE cluster_id = %s AND status = 'idle'",
                     (time.time(), time.time(), base_cluster))
        conn.execute("INSERT INTO job_events (job_id, time, event, from_status, to_status,"
                     " attempt) SELECT id, %s, 'remove', 'idle', 'removed', 0 FROM jobs"
                     " WHERE cluster_id = %s", (time.time(), base_cluster))
        conn.commit()
        bare = time.perf_counter() - b
    print(f"jobstore rm: {n:,} jobs removed, {events[0] if events else 0:,} remove events,"
          f" {t:.1f} s, {mib:.0f} MiB; bare UPDATE + INSERT of the same: {bare:.1f} s;"
          f" ratio {t / bare:.2f}; {'PASS' if t <= BAR_RM else 'MISS'} (<= {BAR_RM:.0f} s)")
    print(f"  {last}")
    print(f"agent-mode FETCH_WORK (the hook process, through the agent) p99 during the rm:"
          f" {p99(busy) * 1000:.1f} ms ({len(busy)} fetches, p50"
          f" {statistics.median(busy) * 1000:.1f}); without: {p99(quiet) * 1000:.1f} ms"
          f" ({len(quiet)}, p50 {statistics.median(quiet) * 1000:.1f}); ratio"
          f" {p99(busy) / p99(quiet):.2f}")
    # the same with the claim alone, in this process: no hook process to hide its share
    second = submit_idle(store, n)
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE jobs")
    _, _, _, quiet, busy = during_rm(url, second, env,
                                     lambda stop, s: claim_latencies(store, stop, s))
    print(f"Negotiator.claim alone p99 during an rm of as many: {p99(busy) * 1000:.1f} ms"
          f" ({len(busy)} claims, p50 {statistics.median(busy) * 1000:.1f}); without:"
          f" {p99(quiet) * 1000:.1f} ms ({len(quiet)}, p50"
          f" {statistics.median(quiet) * 1000:.1f}); ratio {p99(busy) / p99(quiet):.2f}")
    return t <= BAR_RM


def server_cpu() -> float:
    """CPU seconds used so far by every PostgreSQL server process of this machine."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        if name.startswith("postgres"):
            fields = stat[stat.rindex(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])
    return total / tick


def paced(n: int, rate: float, fn: Callable[[int], None]) -> float:
    """Server CPU seconds of `n` calls of fn at `rate` a second."""
    before = server_cpu()
    start = time.monotonic()
    for i in range(n):
        wait = start + i / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        fn(i)
    return server_cpu() - before


def measure_submits(url: str, n: int) -> None:
    import htcondor2

    from jobstore.api.schedd import Schedd

    print(f"\none-job submits at 50/s ({n} each; PostgreSQL server CPU, all its processes)")
    sub = htcondor2.Submit({"executable": "/bin/sleep", "arguments": "1",
                            "transfer_executable": "false"})
    os.chdir(tempfile.gettempdir())
    with Schedd(url=url, owner="alice") as schedd:
        schedd.submit(sub)  # connected, identity read
        def submit_one(_: int) -> None:
            schedd.submit(sub)

        ours = paced(n, 50.0, submit_one)
    ad = json.dumps({"Cmd": "/bin/sleep", "Args": "1", "Iwd": "/tmp"})
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        def bare(i: int) -> None:
            with conn.transaction():
                now = time.time()
                (cid,) = conn.execute(
                    "INSERT INTO clusters (owner, queue, num_procs, submitted_at) VALUES"
                    " ('alice', 'default', 1, %s) RETURNING id", (now,)).fetchone() or (0,)
                (jid,) = conn.execute(
                    "INSERT INTO jobs (cluster_id, proc_id, queue, status, owner, ad, cmd,"
                    " request_cpus, request_memory, request_disk, max_attempts, submitted_at,"
                    " updated_at) VALUES (%s, 0, 'default', 'idle', 'alice', %s, '/bin/sleep',"
                    " 1, 128, 1024, 3, %s, %s) RETURNING id", (cid, ad, now, now)).fetchone() \
                    or (0,)
                conn.execute("INSERT INTO job_events (job_id, time, event, to_status, attempt)"
                             " VALUES (%s, %s, 'submit', 'idle', 0)", (jid, now))

        base = paced(n, 50.0, bare)
    print(f"Schedd.submit: {ours / n * 1000:.2f} ms of server CPU per job; bare INSERTs:"
          f" {base / n * 1000:.2f} ms; ratio {ours / max(base, 1e-9):.2f}")


def make_db(admin: str, prefix: str) -> tuple[str, str]:
    name = f"{prefix}_{secrets.token_hex(6)}"
    with psycopg.connect(libpq_url(admin), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = make_url(admin).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    return name, url


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--finished", type=int, default=1_000_000)
    ap.add_argument("--idle", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--submits", type=int, default=500)
    ap.add_argument("--db-url", default=DEFAULT_ADMIN_URL)
    ap.add_argument("--only", choices=("listings", "rm", "submits"),
                    help="Measure one part only.")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    names: list[str] = []
    store = None
    try:
        name, url = make_db(args.db_url, "jobstore_bench_scale")
        empty_name, empty_url = make_db(args.db_url, "jobstore_bench_empty")
        names += [name, empty_name]
        t = time.perf_counter()
        populate_finished(url, args.finished)
        store = JobStore.from_url(url, statement_timeout_ms=None, pool=True, max_overflow=2)
        cluster = submit_idle(store, args.idle)
        submit_idle(store, 60_000, queue="other")
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
        print(f"{args.finished:,} finished jobs and a cluster of {args.idle:,} idle ones loaded"
              f" in {time.perf_counter() - t:.0f} s")
        ok = True
        if args.only in (None, "listings"):
            ok &= measure_listings(url, empty_url, env, args.repeat)
            measure_projection(url, env, args.repeat)
        if args.only in (None, "rm"):
            ok &= measure_rm(url, store, cluster, env)
        if args.only in (None, "submits"):
            measure_submits(url, args.submits)
        return 0 if ok else 1
    finally:
        if store is not None:
            store.db.engine.dispose()
        with psycopg.connect(libpq_url(args.db_url), autocommit=True) as conn:
            for n in names:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                             .format(sql.Identifier(n)))


if __name__ == "__main__":
    sys.exit(main())
