#!/usr/bin/env python3
"""Pull against push on a real HTCondor (as root; HTCONDOR_PREFIX or condor_master on PATH).

Two personal pools on loopback, one after the other in the same run, each with 4 static slots
of one core:

* **pull**: the job store installed by the README's install lines (PostgreSQL with peer
  authentication on a socket of its own, the agent, the shipped drop-ins, nothing tuned);
  jobs submitted with `jobstore submit` as alice;
* **push**: HTCondor's own path, a schedd and a negotiator beside the startd, tuned as
  HTCondor's test harness (ornithology) tunes its pools (the update, polling and negotiation
  intervals at 2 s); jobs submitted with `condor_submit` as alice.

Measured on each: submit -> the job's own process (its first line writes the time), single
jobs into the idle pool, p50 and p99, after the account's first submit (reported alone: with
the job store it starts the account's command server), and from `Schedd.submit` in a running
program (jobstore.Schedd, htcondor2.Schedd); for pull, the medians of a job's start
part by part (from the events' times); the first job's start after `condor_restart`; the time
to run N `/bin/true` jobs (one `queue N`) to their end.

Usage: bench/live_pool.py [--jobs 20] [--burst 1000] [--only pull|push] [--keep] [--each]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from jobstore.testing.livepool import (
    HOW_TO_POINT,
    LivePool,
    htcondor_prefix,
    install_node,
    wait_for,
)
from jobstore.testing.peerpg import PORT, PeerServer, pg_bin
from jobstore.testing.support import RECORDED_OWNER, RECORDED_UID, ensure_account

REPO = Path(__file__).resolve().parent.parent
SLOTS = "NUM_CPUS = 4\nNUM_SLOTS_TYPE_1 = 4\nSLOT_TYPE_1 = cpus=1, memory=1024, disk=20%\n"
# HTCondor's own test harness (ornithology) sets these for its personal pools.
PUSH = """\
DAEMON_LIST = MASTER, COLLECTOR, STARTD, SCHEDD, NEGOTIATOR
UPDATE_INTERVAL = 2
POLLING_INTERVAL = 2
NEGOTIATOR_INTERVAL = 2
STARTER_UPDATE_INTERVAL = 2
STARTER_INITIAL_UPDATE_INTERVAL = 2
NEGOTIATOR_CYCLE_DELAY = 2
MachineMaxVacateTime = 2
"""


@dataclass
class Result:
    p50: float
    p99: float
    restart: float
    burst: float
    first: float  # the account's first submit (pull: no command server yet)
    program_p50: float  # from a running program's Schedd.submit
    program_p99: float
    parts: dict[str, float]  # pull: the medians of a job's start, part by part


@dataclass
class Single:
    started: float  # the submit command's start
    returned: float  # its end
    process: float  # the job's process
    cluster: int


class Side:
    """One pool and how a job is submitted to it and counted."""

    env: dict[str, str]  # what alice's commands run with

    def __init__(self, name: str, pool: LivePool, work: Path) -> None:
        self.name, self.pool, self.work = name, pool, work
        self.user = ensure_account(RECORDED_OWNER, uid=RECORDED_UID, home=True)

    def as_alice(self, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, timeout=300,
                              cwd=str(self.work), user=self.user.pw_uid,
                              group=self.user.pw_gid, extra_groups=[],
                              env={**env, "HOME": self.user.pw_dir})

    def submit(self, text: str) -> int:
        """Submit as alice; the cluster made."""
        raise NotImplementedError

    def events(self, cluster: int) -> dict[str, float]:
        """When each first event of job CLUSTER.0 was recorded (pull only)."""
        return {}

    def python(self) -> Path:
        """An interpreter with this side's Python API, alice may run."""
        return Path(sys.executable)

    def left(self) -> int:
        """Jobs not finished yet."""
        raise NotImplementedError

    def ready(self) -> bool:
        """Whether a submit would be taken now."""
        return True

    def file(self, name: str, text: str) -> Path:
        path = self.work / name
        path.write_text(text)
        os.chown(path, self.user.pw_uid, self.user.pw_gid)
        return path


class Pull(Side):
    def __init__(self, pool: LivePool, work: Path, venv: Path, env: dict[str, str],
                 server: PeerServer) -> None:
        super().__init__("pull", pool, work)
        self.server = server
        self.argv = [str(venv / "bin" / "jobstore"), "--db", "postgresql+psycopg:///jobstore"]
        self.env = env
        self.venv = venv

    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def submit(self, text: str) -> int:
        self.file("job.sub", text)
        done = self.as_alice([*self.argv, "submit", "job.sub"], self.env)
        if done.returncode != 0:
            raise SystemExit(f"jobstore submit: {done.stderr.strip()}")
        return cluster_of(done.stdout)

    def events(self, cluster: int) -> dict[str, float]:
        with psycopg.connect(self.server.libpq("postgres")) as conn:
            rows = conn.execute(
                "SELECT e.event, min(e.time) FROM job_events e JOIN jobs j ON j.id = e.job_id"
                " WHERE j.cluster_id = %s AND j.proc_id = 0 GROUP BY e.event",
                (cluster,)).fetchall()
        return {event: float(at) for event, at in rows}

    def left(self) -> int:
        done = self.as_alice([*self.argv, "q", "-totals"], self.env)
        total = done.stdout.split("Total for query:")[-1].split("jobs;")[0].strip()
        return int(total) if total.isdigit() else 1


class Push(Side):
    def __init__(self, pool: LivePool, work: Path) -> None:
        super().__init__("push", pool, work)
        self.env = {**pool.env}

    def submit(self, text: str) -> int:
        self.file("job.sub", "should_transfer_files = NO\n" + text)
        done = self.as_alice([str(self.pool.prefix / "bin" / "condor_submit"), "job.sub"],
                             self.env)
        if done.returncode != 0:
            raise SystemExit(f"condor_submit: {done.stderr.strip()}")
        return cluster_of(done.stdout)

    def left(self) -> int:
        done = self.pool.tool("condor_q", "-allusers", "-af", "ClusterId")
        return len(done.stdout.split()) if done.returncode == 0 else 1

    def ready(self) -> bool:
        return self.pool.tool("condor_q", "-allusers", "-totals").returncode == 0


def cluster_of(said: str) -> int:
    """The cluster in `N job(s) submitted to cluster C.`"""
    return int(said.rsplit("cluster", 1)[-1].strip().rstrip("."))


# A running program that submits one job per line read (the line: the stamp file's path) with
# its Schedd's submit, printing when each call began: `jobstore.Schedd` (pull) or
# `htcondor2.Schedd` (push), imported and connected before the first.
PROGRAM = """\
import sys, time
if sys.argv[1] == "pull":
    import jobstore
    schedd, Submit = jobstore.Schedd(sys.argv[2]), jobstore.Submit
else:
    import htcondor2
    schedd, Submit = htcondor2.Schedd(), htcondor2.Submit
print("ready", flush=True)
for line in sys.stdin:
    began = time.time()
    schedd.submit(Submit({"executable": "/bin/sh", "should_transfer_files": "NO",
                          "arguments": f"\\"-c 'date +%s.%N > {line.strip()}'\\""}))
    print(began, flush=True)
"""


def program_jobs(side: Side, n: int) -> list[float]:
    """Seconds from a running program's Schedd.submit to the job's process, one at a time."""
    db = ["postgresql+psycopg:///jobstore"] if side.name == "pull" else ["-"]
    python = side.python()
    proc = subprocess.Popen([str(python), "-c", PROGRAM, side.name, *db], cwd=str(side.work),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            user=side.user.pw_uid, group=side.user.pw_gid, extra_groups=[],
                            env={**side.env, "HOME": side.user.pw_dir})
    assert proc.stdin is not None and proc.stdout is not None
    try:
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"{side.name}: the submitting program did not start")
        took = []
        for i in range(n):
            stamp = side.work / f"{side.name}.program.{i}"
            proc.stdin.write(f"{stamp}\n")
            proc.stdin.flush()
            began = float(proc.stdout.readline())
            took.append(wait_for(f"{side.name} program job {i} starts",
                                 functools.partial(stamped, stamp), 120, 0.01) - began)
            wait_for(f"{side.name} program job {i} ends", lambda: side.left() == 0, 120, 0.2)
        return took
    finally:
        proc.stdin.close()
        proc.wait(60)


def stamped(path: Path) -> float | None:
    """The time a job wrote into `path`, once it has."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return float(text) if text else None


def single_jobs(side: Side, n: int) -> list[Single]:
    """The submit command's start and end and the job's process, one job at a time."""
    took = []
    for i in range(n):
        stamp = side.work / f"{side.name}.start.{i}"
        started = time.time()
        cluster = side.submit(
            f"executable = /bin/sh\narguments = \"-c 'date +%s.%N > {stamp}'\"\nqueue\n")
        returned = time.time()
        process = wait_for(f"{side.name} job {i} starts", functools.partial(stamped, stamp),
                           120, 0.01)
        took.append(Single(started, returned, process, cluster))
        wait_for(f"{side.name} job {i} ends", lambda: side.left() == 0, 120, 0.2)
    return took


# A pulled job's start, part by part: (name, from, to); an event's time is when the agent
# (or the submitting command) recorded it.
PARTS = (
    ("the submit command to its commit", "command", "submit"),
    ("commit -> a waiting fetch has claimed it", "submit", "fetch"),
    ("claim -> REPLY_FETCH accept recorded", "fetch", "accept"),
    ("accept -> PREPARE_JOB recorded (the starter)", "accept", "prepare"),
    ("PREPARE_JOB -> the job's process", "prepare", "process"),
    ("the submit command's whole run", "command", "returned"),
)


def breakdown(side: Side, singles: list[Single], each: bool) -> dict[str, float]:
    """The medians of PARTS over `singles` (with `each`, each job's parts printed too)."""
    spans: dict[str, list[float]] = {name: [] for name, _, _ in PARTS}
    for one in singles:
        at = {**side.events(one.cluster), "command": one.started, "returned": one.returned,
              "process": one.process}
        for name, start, end in PARTS:
            if start in at and end in at:
                spans[name].append(at[end] - at[start])
        if each:
            print(f"{side.name} cluster {one.cluster}: "
                  f"{(one.process - one.started) * 1000:.0f} ms: " + ", ".join(
                      f"{start}->{end} {(at[end] - at[start]) * 1000:.0f}"
                      for _, start, end in PARTS if start in at and end in at), flush=True)
    return {name: statistics.median(v) for name, v in spans.items() if v}


def after_restart(side: Side) -> float:
    """Seconds from condor_restart to the first job's process (submitted right after)."""
    stamp = side.work / f"{side.name}.restart"
    before = side.pool.child_pid("condor_startd")
    started = time.time()
    side.pool.tool("condor_restart")
    wait_for("a new startd", lambda: (side.pool.child_pid("condor_startd") or before) != before,
             60, 0.1)
    wait_for("the collector answers again", lambda: side.pool.tool(
        "condor_status", "-collector", "-af", "Name").returncode == 0, 60, 0.2)
    wait_for(f"{side.name} takes submits again", side.ready, 60, 0.2)
    side.submit(f"executable = /bin/sh\narguments = \"-c 'date +%s.%N > {stamp}'\"\nqueue\n")
    took = wait_for(f"{side.name}: the first job after condor_restart",
                    lambda: stamped(stamp), 600, 0.05) - started
    wait_for(f"{side.name}: it ends", lambda: side.left() == 0, 120, 0.2)
    return took


def burst(side: Side, n: int) -> float:
    """Seconds from the submit of N /bin/true jobs to the last one's end."""
    started = time.monotonic()
    side.submit(f"executable = /bin/true\nqueue {n}\n")
    wait_for(f"{side.name}: {n} jobs end", lambda: side.left() == 0, 3600, 1.0)
    return time.monotonic() - started


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def run_side(name: str, prefix: Path, args: argparse.Namespace) -> Result:
    server = PeerServer(agent="root") if name == "pull" else None
    extra = {"PGHOST": str(server.socket), "PGPORT": str(PORT)} if server else {}
    pool = LivePool(prefix, slots=SLOTS + ("" if server else PUSH), extra_env=extra)
    work = pool.base / "alice"
    work.mkdir(mode=0o755)
    user = ensure_account(RECORDED_OWNER, uid=RECORDED_UID, home=True)
    os.chown(work, user.pw_uid, user.pw_gid)
    try:
        side: Side
        if server:
            venv = install_node(pool, REPO / "README.md", REPO, extra)
            side = Pull(pool, work, venv, {**pool.env, **extra}, server)
        else:
            pool.start()
            wait_for("4 slots", lambda: len(pool.slots()) >= 4, 60, 0.5)
            side = Push(pool, work)
        first, *singles = single_jobs(side, args.jobs + 1)
        took = [one.process - one.started for one in singles]
        program = program_jobs(side, args.jobs)
        restart = after_restart(side)
        many = burst(side, args.burst)
        result = Result(statistics.median(took), p99(took), restart, many,
                        first.process - first.started, statistics.median(program),
                        p99(program), breakdown(side, singles, args.each))
        print(f"{name}: {result}", flush=True)
        return result
    finally:
        pool.stop()
        if server:
            server.stop()
        if args.keep:
            print(f"{name}: the pool's directory and logs kept in {pool.base}", flush=True)
        else:
            pool.remove()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20, help="single jobs, one at a time")
    parser.add_argument("--burst", type=int, default=1000, help="/bin/true jobs at once")
    parser.add_argument("--only", choices=["pull", "push"])
    parser.add_argument("--keep", action="store_true", help="keep the pools' logs")
    parser.add_argument("--each", action="store_true", help="print each single job's parts")
    args = parser.parse_args()
    prefix = htcondor_prefix()
    if prefix is None:
        sys.exit(HOW_TO_POINT)
    if os.geteuid() != 0 or pg_bin() is None:
        sys.exit("bench/live_pool.py runs pools and a PostgreSQL server as root")
    results = {name: run_side(name, prefix, args)
               for name in ("pull", "push") if args.only in (None, name)}
    for name, r in results.items():
        print(f"{name}: submit -> running p50 {r.p50 * 1000:.0f} ms, p99 {r.p99 * 1000:.0f} ms "
              f"({args.jobs} single jobs after the account's first, which took "
              f"{r.first * 1000:.0f} ms); first job after condor_restart {r.restart:.1f} s; "
              f"{args.burst} /bin/true jobs on 4 slots {r.burst:.1f} s "
              f"({args.burst / r.burst:.1f} jobs/s)")
        print(f"{name}: Schedd.submit in a running program -> running p50 "
              f"{r.program_p50 * 1000:.0f} ms, p99 {r.program_p99 * 1000:.0f} ms")
        for part, seconds in r.parts.items():
            print(f"  {name}: {part}: {seconds * 1000:.0f} ms (median)")
    if len(results) == 2:
        pull, push = results["pull"], results["push"]
        print(f"pull / push: latency p50 {pull.p50 / push.p50:.2f}x, p99 "
              f"{pull.p99 / push.p99:.2f}x (a running program's: p50 "
              f"{pull.program_p50 / push.program_p50:.2f}x, p99 "
              f"{pull.program_p99 / push.program_p99:.2f}x), first job after condor_restart "
              f"{pull.restart / push.restart:.2f}x; throughput {push.burst / pull.burst:.2f}x")


if __name__ == "__main__":
    main()
