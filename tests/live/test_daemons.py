"""The daemons around a running job restarted or killed: condor_restart (the agent's nudge makes
the new startd fetch at once), the agent killed by SIGKILL and restarted by condor_master, the
startd killed by SIGKILL. Nothing is lost: every job ends, once."""

from __future__ import annotations

import os
import shutil
import signal
import time
from typing import Any

from jobstore.testing.livepool import wait_for

from .conftest import MEASURED, Live


def _events(live: Live, job: str) -> list[str]:
    done = live.jobstore("events", job)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _pid_of(live: Live, pattern: str) -> int:
    return wait_for(f"a process `{pattern}`", lambda: live.pool.child_pid(pattern), 60)


def test_the_first_job_after_condor_restart_runs_within_seconds(live: Live) -> None:
    before = _pid_of(live, "condor_startd")
    started = time.monotonic()
    assert live.pool.tool("condor_restart").returncode == 0
    wait_for("a new startd", lambda: (live.pool.child_pid("condor_startd") or before) != before,
             60)
    (job,) = live.submit("executable = /bin/true\nqueue\n")
    live.wait_status(job, "completed", timeout=120)
    took = time.monotonic() - started
    MEASURED.append(f"condor_restart -> the first job completed: {took:.1f} s "
                    "(the startd's own first fetch: UPDATE_INTERVAL, 300 s)")
    assert took < 90, f"the first job after condor_restart took {took:.0f} s"


def _killed_mid_job(live: Live, daemon: str, code: int) -> tuple[dict[str, Any], list[str]]:
    """A job running while `daemon` (a child of the master) is killed with SIGKILL and
    restarted by condor_master: the job as it ended, and its events."""
    marker = live.marker(15)
    (job,) = live.submit(f"executable = /bin/sh\narguments = \"-c 'sleep {marker}; "
                         f"exit {code}'\"\nqueue\n")
    live.wait_process(marker)
    pid = _pid_of(live, daemon)
    os.kill(pid, signal.SIGKILL)
    wait_for(f"condor_master restarts {daemon}",
             lambda: (live.pool.child_pid(daemon) or pid) != pid, 120)
    done = live.wait_status(job, "completed", timeout=180)
    assert done["exit_code"] == code
    events = _events(live, job)
    exits = [line for line in events if line.split()[2:3] == ["exit"]]
    assert len(exits) == 1, events  # ended once
    return done, events


def test_the_agent_killed_mid_job_is_restarted_and_the_job_ends_once(live: Live) -> None:
    done, _ = _killed_mid_job(live, "jobstore agent", 7)
    assert done["NumJobStarts"] == 1  # its reports waited in the spool: the same attempt


def test_the_startd_killed_mid_job_brings_the_job_back_by_its_lease(live: Live) -> None:
    _, events = _killed_mid_job(live, "condor_startd", 4)
    assert any(line.split()[2:3] == ["lease_expired"] for line in events), events


def test_a_job_exit_hook_past_the_starters_timeout(live: Live) -> None:
    """`<Keyword>_HOOK_JOB_EXIT_TIMEOUT`: the starter stops waiting for JOB_EXIT. Whether the
    hook is then killed or its report still arrives, the job ends once."""
    hooks = live.pool.base / "libexec-jobstore"
    hook, real = hooks / "job_exit", hooks / "job_exit.real"
    marks = live.pool.base / "job_exit_marks"
    marks.mkdir(mode=0o1777, exist_ok=True)
    marks.chmod(0o1777)
    timeout_conf = live.pool.config_dir / "91-job-exit-timeout.conf"
    shutil.copy2(hook, real)
    hook.write_text(f"#!/bin/sh\necho $$ >> {marks}/started\nsleep 6\n"
                    f"echo $$ >> {marks}/finished\nexec {real} \"$@\"\n")
    timeout_conf.write_text("JOBSTORE_HOOK_JOB_EXIT_TIMEOUT = 2\n")
    try:
        (job,) = live.submit("executable = /bin/sh\narguments = \"-c 'exit 5'\"\nqueue\n")
        wait_for("JOB_EXIT runs", lambda: (marks / "started").exists(), 60)
        wait_for("the starter gives up on JOB_EXIT and exits", lambda: any(
            "Daemon exiting before all child processes gone" in p.read_text(errors="replace")
            for p in live.pool.log_dir.glob("StarterLog.slot*")), 30)
    finally:
        shutil.copy2(real, hook)
        real.unlink()
        timeout_conf.unlink()
    done = live.wait_status(job, "completed", timeout=120)
    assert done["exit_code"] == 5
    killed = not (marks / "finished").exists()
    MEASURED.append("JOB_EXIT past its timeout: " + (
        "killed with the starter's processes; the job came back by its lease and ran again"
        if killed else "left running; its report arrived after the starter had gone"))
    assert done["NumJobStarts"] >= 1
