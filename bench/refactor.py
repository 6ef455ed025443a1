#!/usr/bin/env python3
"""A change that only moves code costs no speed: claim + exit throughput, an agent-mode
FETCH_WORK and a submit of 100,000 jobs, through this checkout's package and through another
checkout's (`--before DIR`: say a `git worktree add DIR <commit>` of the commit before the
change), alternated round by round in one run; printed as ratios this / before (target: at
least 0.98 each, throughput and jobs/s; the FETCH_WORK ratio is before / this, so higher is
better there too).

Usage: .venv/bin/python bench/refactor.py --before DIR [--rounds 3] [--jobs 100000]
       [--seconds 4] [--db-url ADMIN_URL]

Each measurement runs in a process of its own whose `jobstore` is the tree's (PYTHONPATH), on a
PostgreSQL database of its own; the agent and the hooks of the FETCH_WORK runs are the tree's.
Only what both trees have is used: JobStore's parts (`submissions.submit` with every argument
given), ClaimRequest, jobstore.Schedd, the agent's command line and install_hooks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import (
    DEFAULT_ADMIN_URL,
    HOOK_MODE_ENV,
    OWNER,
    cleanup,
    create_pg,
    make_env,
    node_env,
    say,
    table,
)
from hookcost import load_calls

from jobstore.testing.support import ensure_account

HERE = Path(__file__).resolve().parent
TRANSCRIPT = HERE.parent / "tests" / "fixtures" / "htcondor-transcripts" / "01-normal-job"
FETCHES = 60  # FETCH_WORK runs per round, one job each

CLAIM = """
import sys, time
from jobstore.core.jobs import JobSpec
from jobstore.core.states import Event
from jobstore.db.engine import make_engine
from jobstore.core.claims import ClaimRequest, Offer, Verdict
from jobstore.db.store import JobStore
url, seconds = sys.argv[1], float(sys.argv[2])
store = JobStore(make_engine(url, pool=True))
store.submissions.submit([JobSpec(proc_id=i, cmd="/bin/true", iwd="/tmp") for i in range(20000)],
                         owner=sys.argv[3], queue="default", max_attempts=1, submit_file=None,
                         now=time.time(), connection=None, idempotency_key=None, check=None)
req = ClaimRequest(queue="default", offer=Offer(cpus=1, memory=1024, disk=1 << 20),
                   slot="slot1@node", host="node", keyword="TEST", claim_lease=600, shape="s")
take = lambda _job: Verdict(take=True)
for _ in range(20):  # warm
    job = store.negotiator.claim(req, take)
    store.reports.report(job.id, Event.EXIT, token=job.token, attempt=job.claims)
done, end = 0, time.perf_counter() + seconds
start = time.perf_counter()
while time.perf_counter() < end:
    job = store.negotiator.claim(req, take)
    store.reports.report(job.id, Event.EXIT, token=job.token, attempt=job.claims)
    done += 1
print(done / (time.perf_counter() - start))
"""

SUBMIT = """
import sys, time
import htcondor2, jobstore
url, n, owner = sys.argv[1], int(float(sys.argv[2])), sys.argv[3]
schedd = jobstore.Schedd(url=url, owner=owner)
sub = htcondor2.Submit({"executable": "/bin/echo", "arguments": "item $(x)",
                        "transfer_executable": "false"})
start = time.perf_counter()
schedd.submit(sub, itemdata=({"x": str(i)} for i in range(n)))
print(n / (time.perf_counter() - start))
"""

SUBMIT_FEW = """
import sys, time
from jobstore.core.jobs import JobSpec
from jobstore.db.store import JobStore
store = JobStore.from_url(sys.argv[1])
store.submissions.submit([JobSpec(proc_id=i, cmd="/bin/sleep", args="10", iwd="/tmp",
                                  request_memory=64, request_disk=1024)
                          for i in range(int(sys.argv[2]))],
                         owner=sys.argv[3], queue="default", max_attempts=1, submit_file=None,
                         now=time.time(), connection=None, idempotency_key=None, check=None)
"""

INSTALL = "import sys; from jobstore.agent.hooktemplates import install_hooks; " \
          "install_hooks(sys.argv[1], sys.executable)"


def tree_env(tree: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = str(tree)
    return env


def run_python(tree: Path, code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], env=tree_env(tree),
                          capture_output=True, text=True, cwd="/tmp", timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: {done.stderr.strip()[-600:]}")
    return done.stdout.strip()


def fresh_db(admin_url: str):  # type: ignore[no-untyped-def]
    env = make_env(admin_url)
    create_pg(env)
    return env


def rate(tree: Path, admin_url: str, code: str, amount: float) -> float:
    """What `code` prints (a rate), run by the tree on a database of its own."""
    env = fresh_db(admin_url)
    try:
        return float(run_python(tree, code, env.pg_url, str(amount), OWNER))
    finally:
        cleanup(env)


def fetch_p50(tree: Path, admin_url: str) -> float:
    """p50 wall seconds of the tree's FETCH_WORK hook handing out a job through its agent."""
    env = fresh_db(admin_url)
    HOOK_MODE_ENV.clear()  # the last run's stop_agent left the hooks in direct mode
    try:
        hooks = env.tmp / "tree-hooks"
        hooks.mkdir(mode=0o755)
        run_python(tree, INSTALL, str(hooks))
        run_python(tree, SUBMIT_FEW, env.pg_url, str(FETCHES), OWNER)
        sock = env.tmp / "agent.sock"
        agent_env = tree_env(tree, node_env(env, env.pg_url, {}))
        agent_env["JOBSTORE_AGENT_SOCKET"] = str(sock)
        log = open(env.tmp / "agent.log", "ab")  # noqa: SIM115 - as long as the agent
        agent = subprocess.Popen(
            [sys.executable, "-m", "jobstore.cli", "agent", "--socket", str(sock), "-f"],
            env=agent_env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/tmp")
        env.agents.append(agent)
        deadline = time.monotonic() + 60
        while not sock.exists():
            if agent.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{tree}: the agent did not start")
            time.sleep(0.05)
        call = load_calls(TRANSCRIPT)["01-FETCH_WORK"]
        hook_env = tree_env(tree, node_env(env, env.pg_url, {
            **call.env, "JOBSTORE_AGENT_SOCKET": str(sock)}))
        walls = []
        for _ in range(FETCHES):
            start = time.perf_counter()
            done = subprocess.run([str(hooks / "fetch_job")], input=call.stdin, env=hook_env,
                                  capture_output=True, timeout=60)
            walls.append(time.perf_counter() - start)
            if b"JobstoreJobId" not in done.stdout:
                raise RuntimeError(f"{tree}: FETCH_WORK handed out nothing: "
                                   f"{done.stderr.decode(errors='replace')[-300:]}")
        through_agent = env.hook_log.read_text().count("(agent,")
        if through_agent < FETCHES:
            raise RuntimeError(f"{tree}: {FETCHES - through_agent} FETCH_WORK runs did not go "
                               "through the agent")
        return statistics.median(walls)
    finally:
        cleanup(env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="the other checkout")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=100_000, help="jobs of the submit")
    ap.add_argument("--seconds", type=float, default=4.0, help="of claim + exit per round")
    ap.add_argument("--db-url", default=os.environ.get("JOBSTORE_BENCH_DATABASE_URL",
                                                       DEFAULT_ADMIN_URL))
    args = ap.parse_args()
    before = args.before.resolve()
    this = HERE.parent
    if not (before / "jobstore" / "__init__.py").is_file():
        raise SystemExit(f"refactor: {before} is no checkout of htcondor-jobstore")
    ensure_account(OWNER)
    figures: dict[str, dict[str, list[float]]] = {}
    for round_ in range(args.rounds):
        order = (("before", before), ("this", this))
        for label, tree in order if round_ % 2 == 0 else order[::-1]:
            got = figures.setdefault(label, {"claim": [], "fetch": [], "submit": []})
            got["claim"].append(rate(tree, args.db_url, CLAIM, args.seconds))
            got["fetch"].append(fetch_p50(tree, args.db_url))
            got["submit"].append(rate(tree, args.db_url, SUBMIT, args.jobs))
            say(f"round {round_ + 1} {label}: " + json.dumps(
                {k: round(v[-1], 4) for k, v in got.items()}))
    med = {label: {k: statistics.median(v) for k, v in got.items()}
           for label, got in figures.items()}
    rows = [
        ["claim + exit, jobs/s", f"{med['before']['claim']:.0f}", f"{med['this']['claim']:.0f}",
         f"{med['this']['claim'] / med['before']['claim']:.3f}"],
        ["agent-mode FETCH_WORK p50, ms", f"{med['before']['fetch'] * 1000:.1f}",
         f"{med['this']['fetch'] * 1000:.1f}",
         f"{med['before']['fetch'] / med['this']['fetch']:.3f}"],
        [f"Schedd.submit of {args.jobs} jobs, jobs/s", f"{med['before']['submit']:.0f}",
         f"{med['this']['submit']:.0f}",
         f"{med['this']['submit'] / med['before']['submit']:.3f}"],
    ]
    say(table(["median of rounds", "before", "this", "ratio (>= 0.98)"], rows))


if __name__ == "__main__":
    main()
