"""What every hook process does in either mode, standard library only (the hooks' hot path):
make the process sane (HTCondor starts hooks with signals blocked and some fds closed), read
stdin, write stdout, append to the hook log."""

from __future__ import annotations

import _signal
import os
import time

MAX_STDIN = 4 * 1024 * 1024  # larger stdin is ignored (a slot ad is a few KiB)
DEFAULT_SOCKET = "/run/jobstore/agent.sock"  # where the hooks find the agent


def prologue() -> bool:
    """Unblock signals, give fds 1 and 2 a home; returns whether stderr reaches HTCondor."""
    _signal.pthread_sigmask(_signal.SIG_SETMASK, [])
    stderr_open = True
    for fd in (1, 2):
        try:
            os.fstat(fd)
        except OSError:
            if fd == 2:
                stderr_open = False
            n = os.open(os.devnull, os.O_WRONLY)
            if n != fd:
                os.dup2(n, fd)
                os.close(n)
    return stderr_open


def read_stdin() -> bytes:
    chunks, total = [], 0
    try:
        while total <= MAX_STDIN:
            data = os.read(0, MAX_STDIN + 1 - total)
            if not data:
                break
            chunks.append(data)
            total += len(data)
    except OSError:
        pass
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except OSError:
            return
        view = view[n:]


def one_line(message: str) -> str:
    """A message as one line of stderr or the hook log: no line breaks, at most 2,000 chars."""
    return message.replace("\n", " ").replace("\r", " ")[:2000]


def log_entry(hook: str, pid: int, line: str, via: str = "") -> str:
    """One hook-log entry, `2026-11-22 21:00:00 fetch_job[123] <via>line`, newline ended."""
    return f"{time.strftime('%Y-%m-%d %H:%M:%S')} {hook}[{pid}] {via}{line}\n"


def append_hook_log(path: str, text: str) -> bool:
    """Append `text` (whole lines) to the hook log `path` (created 0644, never through a
    symlink); False when this account may not."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
    except OSError:
        return False
    try:
        write_all(fd, text.encode("utf-8", "replace"))
    finally:
        os.close(fd)
    return True


# UPDATE_JOB_INFO's answer (as its exit status, which HTCondor ignores) when the job store no
# longer wants this attempt to run: it was held, removed, or given to another slot.
STOP_JOB = 75


def stop_job(stdin: bytes) -> str:
    """End the process of the job whose starter ad is `stdin` (its JobPid, and its process
    group): what a starter hook of a stopped attempt does, with the job user's own rights.
    Never as root (a hook run as root could be told to signal anything). A note for the log."""
    if os.geteuid() == 0:
        return "attempt stopped; not signalling its process as root"
    pid = 0
    for line in stdin.split(b"\n"):
        name, sep, value = line.partition(b" = ")
        if sep and name.strip().lower() == b"jobpid" and value.strip().isdigit():
            pid = int(value.strip())
    if pid <= 1:
        return "attempt stopped; no JobPid to signal"
    try:
        os.killpg(pid, _signal.SIGTERM)
    except OSError:
        try:
            os.kill(pid, _signal.SIGTERM)
        except OSError as exc:
            return f"attempt stopped; cannot signal JobPid {pid}: {exc.strerror}"
    return f"attempt stopped; sent SIGTERM to the job's process {pid}"
