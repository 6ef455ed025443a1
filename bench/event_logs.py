#!/usr/bin/env python3
"""How soon a job's end is in its job event log on the access point, with `jobstore schedd`
running, against a plain follower of the store's events (`jobstore watch`'s subscriber, the
baseline, in the same run), and what the service costs per entry it appends.

Each job (a cluster of one, submitted on the access point, with its own `log`) is claimed,
started and has its JOB_EXIT committed through the store, as the agent does; the time runs from
the commit to the moment its `005` (terminated) entry is in its log (looked for every
millisecond), and to the moment the subscriber gets the event. On PostgreSQL both are told by
LISTEN/NOTIFY; on SQLite the service looks every 0.5 s and the subscriber every 0.1 s. The
service runs as root and appends as the job's owner, as on an access point. Its CPU (its own and
its children's, which append) is read from /proc before and after.

Usage (as root): .venv/bin/python bench/event_logs.py [--jobs 40] [--db-url ADMIN_URL]
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

from jobstore.api.watch import JobEvent, watch
from jobstore.db.store import JobStore
from jobstore.testing.factories import completed, job_spec

HOME = "bench-ap.example.org"
TARGET_P50 = 1.0
CLI = [sys.executable, "-m", "jobstore.cli"]


def _logged(path: Path, since: float, timeout: float = 30.0) -> float:
    while not (path.exists() and "\n005 (" in "\n" + path.read_text()):
        if time.time() - since > timeout:
            raise SystemExit(f"{path} had no 005 in {timeout:g} s")
        time.sleep(0.001)
    return time.time() - since


def _run(url: str, jobs: int, tmp: Path) -> list[list[str]]:
    user = pwd.getpwnam(OWNER)
    iwd = tmp / f"iwd-{url.split(':', 1)[0]}"
    iwd.mkdir()
    os.chown(iwd, user.pw_uid, user.pw_gid)
    store = JobStore.from_url(url)
    logs: dict[int, Path] = {}
    for n in range(jobs):
        cluster, _ = store.submissions.submit(
            [job_spec(0, iwd=str(iwd), user_log=str(iwd / f"{n}.log"))], owner=OWNER,
            queue="default", max_attempts=3, home=HOME)
        logs[cluster] = iwd / f"{n}.log"
    seen: dict[int, float] = {}
    def exited(record: object) -> None:
        if isinstance(record, JobEvent) and record.event == "exit":
            seen.setdefault(record.cluster, time.time())

    follower = watch(url, exited, interval=0.1)
    service = subprocess.Popen([*CLI, "--db", url, "schedd", "--name", HOME],
                               stderr=subprocess.DEVNULL)
    time.sleep(2.0)  # started, listening, and the submit events logged
    logged: list[float] = []
    followed: list[float] = []
    cpu0 = cpu_seconds(service.pid)
    entries = 0
    try:
        for _ in range(jobs):
            job = completed(store)
            committed = time.time()
            logged.append(_logged(logs[job.cluster_id], committed))
            deadline = time.time() + 30
            while job.cluster_id not in seen and time.time() < deadline:
                time.sleep(0.001)
            followed.append(seen[job.cluster_id] - committed)
        cpu = cpu_seconds(service.pid) - cpu0
        entries = sum(log.read_text().count("\n...\n") for log in logs.values())
    finally:
        follower.close()
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=30)
        store.db.engine.dispose()
    backend = url.split(":", 1)[0].split("+", 1)[0]
    return [
        [f"{backend}: jobstore schedd", f"{pct(logged, 0.5) * 1000:.0f}",
         f"{pct(logged, 0.99) * 1000:.0f}", f"{pct(logged, 0.5) / pct(followed, 0.5):.2f}",
         f"{cpu / max(1, entries) * 1000:.1f}",
         "PASS" if pct(logged, 0.5) <= TARGET_P50 else "MISS"],
        [f"{backend}: a watch subscriber", f"{pct(followed, 0.5) * 1000:.0f}",
         f"{pct(followed, 0.99) * 1000:.0f}", "1.00", "", ""],
    ]


def main() -> int:
    jobs, rows = as_root_on_both_backends(__doc__, _run)
    say(f"a job's end in its job event log on the access point, from its JOB_EXIT's commit "
        f"({jobs} jobs per backend)")
    say(render(["who", "p50 ms", "p99 ms", "p50 / a subscriber's", "service CPU ms per entry",
                f"p50 <= {TARGET_P50:g} s"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
