"""Helpers for the fault and PgBouncer tests: an ordinary job owner, idle jobs, a slot ad, and one
job's whole hook sequence (FETCH_WORK .. JOB_EXIT) through the real hook executables."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hookrun import CLOSED_OUTPUT, hook_preexec

from jobstore.db.store import JobStore
from jobstore.formats import classads
from jobstore.testing.factories import submit
from jobstore.testing.support import ordinary_owner  # noqa: F401 - for the tests


def submit_jobs(store: JobStore, n: int, owner: str, *, max_attempts: int = 5,
                cmd: str = "/bin/true", queue: str = "default",
                concurrency_limits: str | None = None) -> list[int]:
    """One cluster of `n` idle jobs through the store API (each with its submit event)."""
    return submit(store, n, owner=owner, queue=queue, max_attempts=max_attempts, cmd=cmd,
                  request_memory=64, concurrency_limits=concurrency_limits)


def slot_ad(name: str, machine: str = "node01.example.org") -> bytes:
    return (
        f'Name = "{name}"\nMachine = "{machine}"\nState = "Unclaimed"\nActivity = "Idle"\n'
        "Cpus = 1\nMemory = 1024\nDisk = 1000000\nSlotTypeID = 0\nStart = true\n"
    ).encode()


@dataclass
class Call:
    hook: str
    argv: list[str]
    returncode: int
    stdout: bytes
    stderr: bytes
    killed: bool
    seconds: float


# (hook name) -> seconds after which to SIGKILL it, or None to let it finish
Killer = Callable[[str], float | None]


def run_hook_killable(hook_dir: Path, name: str, stdin: bytes, *, argv: list[str] | None = None,
                      env: dict[str, str], kill_after: float | None = None,
                      timeout: float = 60) -> Call:
    """Run a hook as HTCondor does (see hookrun.run_hook); SIGKILL it after `kill_after` s."""
    close_output = name in CLOSED_OUTPUT
    pipe = None if close_output else subprocess.PIPE
    start = time.monotonic()
    proc = subprocess.Popen([str(hook_dir / name), *(argv or [])], stdin=subprocess.PIPE,
                            stdout=pipe, stderr=pipe, env=env,
                            preexec_fn=hook_preexec(close_output))
    killed = False
    try:
        if kill_after is None:
            out, err = proc.communicate(stdin, timeout=timeout)
        else:
            try:
                out, err = proc.communicate(stdin, timeout=kill_after)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                killed = True
                out, err = proc.communicate(timeout=timeout)
            except BrokenPipeError:  # cannot happen before the kill; kept for safety
                out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Call(name, list(argv or []), proc.returncode, out or b"", err or b"", killed,
                time.monotonic() - start)


@dataclass
class Sequence:
    """What happened to one fetched attempt."""

    job_id: int | None = None
    attempt: int | None = None
    calls: list[Call] = field(default_factory=list)


def run_sequence(hook_dir: Path, env: dict[str, str], slot: str, *, exit_code: int = 0,
                 killer: Killer | None = None) -> Sequence:
    """FETCH_WORK for `slot`; with a job: REPLY_FETCH accept, UPDATE_JOB_INFO, PREPARE_JOB,
    UPDATE_JOB_INFO with JobPid, JOB_EXIT exit (or JOB_EXIT evict when PREPARE_JOB failed), as
    the startd and starter would. `job_id` stays None when FETCH_WORK printed no job."""
    seq = Sequence()
    sad = slot_ad(slot)

    def call(name: str, stdin: bytes, argv: list[str] | None = None) -> Call:
        c = run_hook_killable(hook_dir, name, stdin, argv=argv, env=env,
                              kill_after=killer(name) if killer else None)
        seq.calls.append(c)
        return c

    fetched = call("fetch_job", sad)
    if not fetched.stdout:
        return seq
    ad = classads.parse_ad(classads.decode(fetched.stdout))
    seq.job_id = classads.get_int(ad, "JobstoreJobId")
    seq.attempt = classads.get_int(ad, "JobstoreAttempt")
    job = fetched.stdout if fetched.stdout.endswith(b"\n") else fetched.stdout + b"\n"
    call("reply_fetch", job + b"-----\n" + sad + b'ClaimId = "<1.2.3.4:5>#1#2#secret"\n',
         ["accept"])
    call("update_job_info", job + b"JobState = \"Idle\"\n")
    prepared = call("prepare_job", job)
    if prepared.returncode != 0:  # failed or killed: the starter gives up, JOB_EXIT evict
        call("job_exit", job + b'JobState = "Exited"\n', ["evict"])
        return seq
    running = job + f"JobPid = {random.randint(1000, 60000)}\nJobStartDate = {int(time.time())}\n"\
        .encode()
    call("update_job_info", running + b'JobState = "Running"\n')
    call("job_exit",
         running + f"ExitCode = {exit_code}\nExitBySignal = false\nJobState = \"Exited\"\n"
         .encode(), ["exit"])
    return seq
