"""Condor's FETCH_WORK through the agent while other accounts flood it.

Measures the wall time of the real `fetch_job` hook, run as a service account against a
`jobstore agent` on SQLite, first with the agent otherwise idle (the baseline, in the same run),
then while four ordinary accounts each hold 40 idle connections and one of them keeps sending
requests of 4 MB. Prints p50/p99 of both and their ratio. Needs root: it creates the accounts
jsalice, jsbob, jscarol and jsdave (if missing) and runs the floods as them.

    .venv/bin/python bench/flood.py [--samples 40]
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jobstore.testing.support import ensure_account

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jobstore.agent.hooktemplates import install_hooks  # noqa: E402
from jobstore.db.engine import upgrade  # noqa: E402

USERS = ("jsalice", "jsbob", "jscarol", "jsdave")
SLOT = (b'Name = "slot1@bench"\nMachine = "bench"\nState = "Unclaimed"\nActivity = "Idle"\n'
        b"Cpus = 1\nMemory = 1024\nDisk = 1000000\nSlotTypeID = 0\nStart = true\n")
FLOOD = ROOT / "tests" / "support" / "agent_flood.py"  # the client of tests/system/test_security.py


def account(name: str) -> pwd.struct_passwd:
    return ensure_account(name, home=False)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def fetch_times(hook: Path, env: dict[str, str], samples: int) -> list[float]:
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        done = subprocess.run([str(hook)], input=SLOT, capture_output=True, env=env, timeout=60)
        times.append(time.perf_counter() - start)
        if done.stderr:
            raise SystemExit(f"fetch_job said: {done.stderr.decode(errors='replace').strip()}")
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=40)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/flood.py needs root (it runs floods as other accounts)", file=sys.stderr)
        return 2
    users = [account(u) for u in USERS]
    base = Path(tempfile.mkdtemp(prefix="jobstore-flood-"))
    os.chmod(base, 0o755)
    agent = None
    floods: list[subprocess.Popen] = []
    try:
        url = f"sqlite:///{base / 'jobstore.db'}"
        upgrade(url)
        (base / "log").mkdir()
        config = base / "condor_config"
        config.write_text(f"UID_DOMAIN = localdomain\nSTARTD_JOB_HOOK_KEYWORD = JOBSTORE\n"
                          f"LOG = {base / 'log'}\nJOBSTORE_AGENT_READ_TIMEOUT = 30\n")
        hooks = base / "hooks"
        install_hooks(hooks, sys.executable)
        sock = str(base / "agent.sock")
        env = {"PATH": "/usr/bin:/bin", "CONDOR_CONFIG": str(config),
               "JOBSTORE_DATABASE_URL": url, "JOBSTORE_AGENT_SOCKET": sock,
               "JOBSTORE_SPOOL": str(base / "spool"), "JOBSTORE_HOOK_MODE": "agent"}
        log = open(base / "agent.log", "ab")  # noqa: SIM115 - closed with the directory
        agent = subprocess.Popen([sys.executable, "-m", "jobstore.cli", "agent", "-f"],
                                 env=dict(env, PYTHONPATH=str(ROOT)), stdout=log, stderr=log)
        while not os.path.exists(sock):
            time.sleep(0.05)
        fetch = hooks / "fetch_job"
        fetch_times(fetch, env, 5)  # warm up
        idle = fetch_times(fetch, env, args.samples)
        for i, u in enumerate(users):
            floods.append(subprocess.Popen(
                [sys.executable, str(FLOOD), sock, "40", "16" if i == 0 else "0", "0"],
                stdout=subprocess.PIPE, user=u.pw_uid, group=u.pw_gid, extra_groups=[],
                env={"PYTHONPATH": str(ROOT)}))
        for p in floods:
            assert p.stdout is not None and p.stdout.readline() == b"flooding\n"
        time.sleep(1.0)
        flooded = fetch_times(fetch, env, args.samples)
    finally:
        for p in floods:
            p.kill()
            p.wait()
        if agent is not None:
            agent.terminate()
            agent.wait(30)
        shutil.rmtree(base, ignore_errors=True)
    rows = [("agent idle (baseline)", idle), ("4 accounts flooding", flooded)]
    print(f"FETCH_WORK through the agent, {args.samples} calls each (wall time of the hook)")
    for name, values in rows:
        print(f"  {name:24} p50 {pct(values, 0.5) * 1000:7.1f} ms   "
              f"p99 {pct(values, 0.99) * 1000:7.1f} ms")
    r50 = pct(flooded, 0.5) / pct(idle, 0.5)
    r99 = pct(flooded, 0.99) / pct(idle, 0.99)
    verdict = "PASS" if r99 <= 2.0 else "MISS"
    print(f"  ratio flooded/idle: p50 {r50:.2f}x, p99 {r99:.2f}x (target p99 <= 2x): {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
