#!/usr/bin/env python3
"""One node's peak through its agent, against procrastinate's on the same PostgreSQL.

* node: a real `jobstore agent` on a fresh database with N jobs queued; W worker processes,
  one per slot, each speaking the hooks' own protocol to the agent's socket (the bytes a hook
  executable sends, the recorded ads of transcript 01-normal-job with the slot's name), a job's
  whole life per loop: FETCH_WORK, REPLY_FETCH accept, UPDATE_JOB_INFO, PREPARE_JOB,
  UPDATE_JOB_INFO with the pid, JOB_EXIT exit. No process per hook call: what is measured is
  the agent and the database, not the interpreter's start.
* procrastinate: the same N no-op jobs, W `run_worker` processes (bench/peers.py).

Alternated for --rounds rounds; prints jobs/s of each, their ratio, and the database server's
CPU per job (every `postgres` process's CPU over the run) and the agent's. With `--before DIR`
(a `git worktree add DIR <commit>` of another commit) the same node run with that checkout's
agent is alternated in too, and this / before printed.

Usage: .venv/bin/python bench/node_peak.py [--jobs N] [--workers W] [--rounds R] [--db-url URL]
       [--before DIR] [--profile FILE]
Needs root (the agent's socket is trusted when root serves it) and the `bench` extra.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import peers
import psycopg
from common import (
    DEFAULT_ADMIN_URL,
    DEFAULT_TRANSCRIPT,
    IDENTITY,
    LIFE,
    OWNER,
    cleanup,
    create_pg,
    first,
    job_ad_json,
    make_env,
    populate,
    say,
    stop_agent,
    table,
)
from hookcost import load_calls, proc_cpu, start_agent

from jobstore.agent.client import ask
from jobstore.agent.protocol import HOLD, OK, encode, encode_env
from jobstore.testing.support import ensure_account, insert_identity, libpq_url

QUEUE = "default"


def slot_calls(slot: int) -> list[tuple[str, bytes, list[bytes], bytes]]:
    """(hook, stdin, argv, env) of one life, for slot `slot` of the recording node."""
    calls = load_calls(DEFAULT_TRANSCRIPT)
    out = []
    for _, exe, stem, argv in LIFE:
        stdin = calls[stem].stdin
        stdin = re.sub(rb"slot2@", f"slot{slot}@".encode(), stdin)
        stdin = re.sub(rb"(?m)^SlotID = 2$", f"SlotID = {slot}".encode(), stdin)
        env = encode_env({"_CONDOR_SLOT": f"slot{slot}"})
        out.append((exe, stdin, [a.encode() for a in argv], env))
    return out


def slot_worker(sock: str, slot: int, done: Any) -> None:
    """Lives until the agent has no job for this slot."""
    life = slot_calls(slot)
    lives = 0
    while True:
        identity: list[bytes] = []
        for hook, stdin, argv, env in life:
            if hook != "fetch_job":
                stdin = insert_identity(stdin, identity, reply_fetch=hook == "reply_fetch")
            answer = ask(sock, encode([hook.encode(), env, stdin, *argv]),
                         time.monotonic() + 60, (0,))
            if answer is None or answer[0] == HOLD:  # nothing to fetch: the queue is empty
                break
            if answer[0] != OK or (len(answer) > 3 and answer[3]):
                raise RuntimeError(f"slot{slot} {hook}: {answer[:4]!r}")
            if hook == "fetch_job":
                identity = [ln for ln in answer[2].split(b"\n")
                            if ln.split(b" = ")[0] in IDENTITY]
                if len(identity) != 3:
                    break
        else:
            lives += 1
            continue
        break
    with done.get_lock():
        done.value += lives


def server_cpu() -> float:
    """CPU seconds the database server has used: every `postgres` process alive, and what the
    postmaster's exited children (sessions that ended) used."""
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "postgres":
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks = int(fields[11]) + int(fields[12])
        if Path(f"/proc/{fields[1]}/comm").read_text().strip() != "postgres":  # the postmaster
            ticks += int(fields[13]) + int(fields[14])
        total += ticks / os.sysconf("SC_CLK_TCK")
    return total


def node_run(admin: str, n: int, workers: int, profile: str | None = None,
             tree: Path | None = None) -> tuple[float, float, float]:
    """(jobs/s, server CPU ms per job, agent CPU ms per job) of one node (its agent from the
    checkout `tree`, else this one's); with `profile`, the agent's stacks sampled by py-spy
    into that file (collapsed stacks)."""
    env = make_env(admin)
    try:
        create_pg(env)
        with psycopg.connect(libpq_url(env.pg_url), autocommit=True) as conn:
            populate(conn, QUEUE, n, job_ad_json())
        agent = start_agent(env, env.pg_url,  # as shipped
                            {"PYTHONPATH": str(tree)} if tree is not None else None)
        sock = str(env.tmp / "agent.sock")
        done = mp.Value("i", 0)
        ctx = mp.get_context("fork")
        spy = None if profile is None else subprocess.Popen(
            ["py-spy", "record", "--gil", "--format", "raw", "-r", "200", "-o", profile,
             "--pid", str(agent.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        a0, s0 = proc_cpu(agent.pid), server_cpu()
        start = time.perf_counter()
        procs = [ctx.Process(target=slot_worker, args=(sock, i + 1, done))
                 for i in range(workers)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(900)
            if p.exitcode != 0:
                raise RuntimeError(f"a slot worker failed (exit {p.exitcode})")
        seconds = time.perf_counter() - start
        a1, s1 = proc_cpu(agent.pid), server_cpu()
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        stop_agent(env, agent)
        with psycopg.connect(libpq_url(env.pg_url), autocommit=True) as conn:
            completed = first(conn.execute(
                "SELECT count(*) FROM jobs WHERE status = 'completed'"))
        if completed != n or done.value != n:
            raise RuntimeError(f"node: {completed} completed, {done.value} lives, of {n}")
        return n / seconds, (s1 - s0) / n * 1000, (a1 - a0) / n * 1000
    finally:
        cleanup(env)


def procrastinate_run(admin: str, n: int, workers: int) -> tuple[float, float]:
    """(jobs/s, server CPU ms per job) of procrastinate's workers."""
    s0 = server_cpu()
    rate, _wal, _commits = peers.throughput("procrastinate", admin, n, workers)
    # the install, the enqueue and the counters' pauses are in this figure too: an upper bound
    return rate, (server_cpu() - s0) / n * 1000


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--db-url", default=os.environ.get("JOBSTORE_BENCH_DATABASE_URL"))
    ap.add_argument("--before", type=Path, help="another checkout, its agent measured too")
    ap.add_argument("--profile", metavar="FILE",
                    help="the agent's stacks of the first round, by py-spy (collapsed)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        say("bench/node_peak.py needs root: the hooks trust an agent served by root")
        return 2
    ensure_account(OWNER, uid=1001)  # the recorded job's owner: a job runs as her
    admin = args.db_url or DEFAULT_ADMIN_URL
    if args.before is not None and not (args.before / "jobstore" / "__init__.py").is_file():
        say(f"node_peak: {args.before} is no checkout of htcondor-jobstore")
        return 2
    runs: dict[str, list[tuple[float, float, float]]] = {"this": [], "before": []}
    proc: list[tuple[float, float]] = []
    for r in range(args.rounds):
        runs["this"].append(node_run(admin, args.jobs, args.workers,
                                     args.profile if r == 0 else None))
        if args.before is not None:
            runs["before"].append(node_run(admin, args.jobs, args.workers,
                                           tree=args.before.resolve()))
        proc.append(procrastinate_run(admin, args.jobs, args.workers))
        say(f"round {r + 1}: " + ", ".join(f"{name} {x[-1][0]:.0f}" for name, x in runs.items()
                                           if x) + f", procrastinate {proc[-1][0]:.0f} jobs/s")
    med = statistics.median
    rows = [[f"one node ({name})", f"{med(x[0] for x in got):.0f}",
             f"{med(x[1] for x in got):.2f}", f"{med(x[2] for x in got):.2f}"]
            for name, got in runs.items() if got]
    rows.append(["procrastinate", f"{med(x[0] for x in proc):.0f}",
                 f"{med(x[1] for x in proc):.2f}", ""])
    say(f"{args.jobs} jobs, {args.workers} slots / workers, medians of {args.rounds} rounds")
    say(table(["", "jobs/s", "server CPU ms/job", "agent CPU ms/job"], rows))
    rate = {name: med(x[0] for x in got) for name, got in runs.items() if got}
    say(f"node / procrastinate: {rate['this'] / med(x[0] for x in proc):.2f}x")
    if "before" in rate:
        say(f"this / before: {rate['this'] / rate['before']:.2f}x jobs/s, agent CPU per job"
            f" {med(x[2] for x in runs['this']) / med(x[2] for x in runs['before']):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
