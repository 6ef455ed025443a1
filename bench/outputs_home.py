#!/usr/bin/env python3
"""How soon a completed job's outputs are in its Iwd with `jobstore schedd` running, against
the user running `jobstore transfer-data JOB` the moment it completes (the baseline, in the
same run), and what the service costs per delivered job.

Each job is claimed, sends one output and has its JOB_EXIT committed through the store (as the
agent does); the time runs from the commit to the moment the output file is there (looked for
every millisecond). The two ways alternate job by job, on PostgreSQL (the service is told by
LISTEN/NOTIFY) and on SQLite (it looks every 0.5 s). The service runs as root and writes as the
job's owner, as on an access point. Its CPU (its own and its children's, which write the files)
is read from /proc before and after.

Usage (as root): .venv/bin/python bench/outputs_home.py [--jobs 40] [--db-url ADMIN_URL]
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import OWNER, as_root_on_both_backends, cpu_seconds, pct, say
from common import table as render

from jobstore.db.store import JobStore
from jobstore.testing.factories import completed, job_spec

HOME = "bench-ap.example.org"
TARGET_P50 = 1.0
CLI = [sys.executable, "-m", "jobstore.cli"]


def _complete(store: JobStore, scratch: Path) -> tuple[str, str, float]:
    """Run the next idle job to its JOB_EXIT with one output; (its id, its output's name,
    when the exit committed)."""
    source = scratch / f"out.{time.monotonic_ns()}"
    source.write_bytes(b"x" * 4096)
    job = completed(store, {source.name: source})
    return f"{job.cluster_id}.{job.proc_id}", source.name, time.time()


def _arrived(path: Path, since: float, timeout: float = 30.0) -> float:
    while not path.exists():
        if time.time() - since > timeout:
            raise SystemExit(f"{path} did not come in {timeout:g} s")
        time.sleep(0.001)
    return time.time() - since


def _run(url: str, jobs: int, tmp: Path) -> list[list[str]]:
    user = pwd.getpwnam(OWNER)
    iwd = tmp / f"iwd-{url.split(':', 1)[0]}"
    iwd.mkdir()
    os.chown(iwd, user.pw_uid, user.pw_gid)
    scratch = tmp / "scratch"
    scratch.mkdir(exist_ok=True)
    store = JobStore.from_url(url)
    store.submissions.submit([job_spec(i, iwd=str(iwd)) for i in range(jobs)],
                             owner=OWNER, queue="default", max_attempts=3, home=HOME)
    env = {**os.environ, "JOBSTORE_SCHEDD_NAME": HOME}
    service = subprocess.Popen([*CLI, "--db", url, "schedd"], env=env,
                               stderr=subprocess.DEVNULL)
    time.sleep(2.0)  # started and listening
    served: list[float] = []
    asked: list[float] = []
    cpu0 = cpu_seconds(service.pid)
    try:
        for n in range(jobs):
            job_id, name, committed = _complete(store, scratch)
            if n % 2:
                done = subprocess.run([*CLI, "--db", url, "transfer-data", job_id],
                                      capture_output=True, text=True)
                if done.returncode:
                    raise SystemExit(f"transfer-data {job_id}: {done.stderr.strip()}")
                asked.append(_arrived(iwd / name, committed))
            else:
                served.append(_arrived(iwd / name, committed))
        time.sleep(3.0)  # the asked ones, which the service delivers too
        cpu = cpu_seconds(service.pid) - cpu0
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=30)
        store.db.engine.dispose()
    backend = url.split(":", 1)[0].split("+", 1)[0]
    return [
        [f"{backend}: jobstore schedd", f"{pct(served, 0.5) * 1000:.0f}",
         f"{pct(served, 0.99) * 1000:.0f}", f"{pct(served, 0.5) / pct(asked, 0.5):.2f}",
         f"{cpu / jobs * 1000:.1f}",
         "PASS" if pct(served, 0.5) <= TARGET_P50 else "MISS"],
        [f"{backend}: transfer-data at once", f"{pct(asked, 0.5) * 1000:.0f}",
         f"{pct(asked, 0.99) * 1000:.0f}", "1.00", "", ""],
    ]


def main() -> int:
    jobs, rows = as_root_on_both_backends(__doc__, _run)
    say(f"a completed job's output in its Iwd, from its JOB_EXIT's commit ({jobs} jobs per"
        " backend, the two ways alternating)")
    say(render(["way", "p50 ms", "p99 ms", "p50 / transfer-data's", "service CPU ms per job",
                f"p50 <= {TARGET_P50:g} s"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
