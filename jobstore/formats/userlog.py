"""HTCondor job event logs ("user logs", submit command `log`) for fetched jobs.

The job store writes the log itself, from its committed transitions (`on_commit` is a JobStore
commit listener): submit (000), execute (001), image size (006), evicted (004), terminated (005),
aborted (009), held (012) and released (013), in the text format a schedd writes, so that
`htcondor2.JobEventLog`, `condor_wait` and DAGMan read it unchanged. Appends are O_APPEND, one
write() per batch of events, under an fcntl lock on the file (as HTCondor does). A process that
cannot write a log says so in one line and goes on: the transition is never affected.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import logging
import math
import os
import pwd
import select
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from jobstore.core.jobs import Job
from jobstore.core.states import Event, Status

log = logging.getLogger(__name__)

SUBMIT, EXECUTE, EVICTED, TERMINATED, IMAGE_SIZE, ABORTED, HELD, RELEASED = 0, 1, 4, 5, 6, 9, 12, 13
POST_SCRIPT_TERMINATED = 16
_ZERO_USAGE = (0, 0)
_warned: set[tuple[str, int]] = set()


@dataclass(frozen=True)
class LogEvent:
    """One job event log entry: number, job id, time (epoch seconds) and the body text."""

    number: int
    cluster: int
    proc: int
    time: float
    body: str

    def text(self) -> str:
        """The event as a schedd writes it: header, body, and the `...` separator line."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.time))
        job_id = f"({self.cluster:03d}.{self.proc:03d}.000)"
        return f"{self.number:03d} {job_id} {stamp} {self.body}...\n"


# ---- event bodies (condor_utils/condor_event.cpp, formatBody) ------------------------------


def _line(text: str) -> str:
    """A free-text line as HTCondor stores a reason: newlines become `|`, CRs spaces."""
    return str(text).replace("\n", "|").replace("\r", " ").strip()


def _rusage(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 86400} {s % 86400 // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _usage(user: float, sys_: float) -> str:
    return f"\tUsr {_rusage(user)}, Sys {_rusage(sys_)}"


def submit_body(host: str) -> str:
    return f"Job submitted from host: {host}\n"


def execute_body(host: str, slot: str | None) -> str:
    body = f"Job executing on host: {host}\n"
    return body + (f"\tSlotName: {slot}\n" if slot else "")


def image_size_body(image_kb: int, memory_mb: int | None, rss_kb: int | None) -> str:
    body = f"Image size of job updated: {image_kb}\n"
    if memory_mb is not None:
        body += f"\t{memory_mb}  -  MemoryUsage of job (MB)\n"
    if rss_kb is not None:
        body += f"\t{rss_kb}  -  ResidentSetSize of job (KB)\n"
    return body


def _termination(by_signal: bool, code: int) -> str:
    if by_signal:
        return f"\t(0) Abnormal termination (signal {code})\n\t(0) No core file\n"
    return f"\t(1) Normal termination (return value {code})\n"


def evicted_body(
    cpu: tuple[float, float],
    reason: str | None,
    requeued_exit: tuple[bool, int] | None = None,
) -> str:
    """004; `requeued_exit` (by_signal, code) when the job exited and its policy requeued it."""
    kind = "(0) Job terminated and was requeued" if requeued_exit else "(0) CPU times"
    body = (
        f"Job was evicted.\n\t{kind}\n"
        f"{_usage(*cpu)}  -  Run Remote Usage\n"
        f"{_usage(*_ZERO_USAGE)}  -  Run Local Usage\n"
        "\t0  -  Run Bytes Sent By Job\n\t0  -  Run Bytes Received By Job\n"
    )
    if requeued_exit:
        body += _termination(*requeued_exit)
    return body + (f"\t{_line(reason)}\n" if reason else "")


def terminated_body(by_signal: bool, code: int, cpu: tuple[float, float]) -> str:
    """005: normal exit with its return value, or killed by a signal."""
    term = _termination(by_signal, code)
    return (
        f"Job terminated.\n{term}"
        f"{_usage(*cpu)}  -  Run Remote Usage\n"
        f"{_usage(*_ZERO_USAGE)}  -  Run Local Usage\n"
        f"{_usage(*cpu)}  -  Total Remote Usage\n"
        f"{_usage(*_ZERO_USAGE)}  -  Total Local Usage\n"
        "\t0  -  Run Bytes Sent By Job\n\t0  -  Run Bytes Received By Job\n"
        "\t0  -  Total Bytes Sent By Job\n\t0  -  Total Bytes Received By Job\n"
    )


def aborted_body(reason: str | None) -> str:
    return "Job was aborted.\n" + (f"\t{_line(reason)}\n" if reason else "")


def held_body(reason: str | None, code: int = 0, subcode: int = 0) -> str:
    why = _line(reason) if reason else "Reason unspecified"
    return f"Job was held.\n\t{why}\n\tCode {code} Subcode {subcode}\n"


def released_body(reason: str | None) -> str:
    return "Job was released.\n" + (f"\t{_line(reason)}\n" if reason else "")


def post_script_body(code: int, node: str) -> str:
    """016: a DAG node's POST script ended (`code` < 0: killed by that signal)."""
    term = (f"\t(1) Normal termination (return value {code})\n" if code >= 0
            else f"\t(0) Abnormal termination (signal {-code})\n")
    return f"POST Script terminated.\n{term}" + (f"    DAG Node: {_line(node)}\n" if node else "")


# ---- job store events -> job event log events ----------------------------------------------


class JobBefore(Protocol):
    """What an event's entries need of its job as it was before the transition (a Job)."""

    @property
    def cluster_id(self) -> int: ...
    @property
    def proc_id(self) -> int: ...
    @property
    def host(self) -> str | None: ...
    @property
    def slot(self) -> str | None: ...
    @property
    def image_size(self) -> int | None: ...


def _int(value: Any) -> int | None:
    """A report's number as an int; None for anything else (not finite, past 64 bits)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value) if abs(value) < 2**63 else None


def _seconds(value: Any) -> float:
    """A report's CPU seconds; 0 for anything that is not a number a job could use."""
    number = _int(value)
    return float(value) if number is not None and 0 <= number < 2**40 else 0.0


def _address(host: str | None) -> str:
    return f"<{host}>" if host else local_address()


@functools.cache
def local_address() -> str:
    """This host, as an event's host (`<name>`): looked up once (a DNS query), not per event."""
    return f"<{socket.getfqdn()}>"


def log_events(record: Mapping[str, Any], job: JobBefore) -> list[LogEvent]:
    """The job event log entries for one committed job store event (often none).

    `record` is the job_events row as written, `job` the job row before the transition (for
    submit: the new job). Only real transitions count; stale and ignored reports have no
    `to_status` and write nothing, so each transition appears once.
    """
    if record.get("to_status") is None:
        return []
    event, before, after = record["event"], record.get("from_status"), Status(record["to_status"])
    attrs: Mapping[str, Any] = record.get("attrs") or {}
    reason = record.get("reason")
    at = float(record["time"])
    out: list[LogEvent] = []

    def add(number: int, body: str) -> None:
        out.append(LogEvent(number, int(job.cluster_id), int(job.proc_id), at, body))

    def execute() -> None:
        add(EXECUTE, execute_body(_address(job.host), job.slot))

    def image_size(always: bool) -> None:
        size = _int(attrs.get("ImageSize"))
        if size and size > 0 and (always or size != job.image_size):
            memory = _int(attrs.get("MemoryUsage"))
            add(IMAGE_SIZE, image_size_body(size, memory, _int(attrs.get("ResidentSetSize"))))

    cpu = (_seconds(attrs.get("RemoteUserCpu")), _seconds(attrs.get("RemoteSysCpu")))
    ran = before == Status.RUNNING
    if event == Event.SUBMIT:
        add(SUBMIT, submit_body(_address(None)))
    elif event == Event.START:
        if not ran:
            execute()
        image_size(always=not ran)
    elif event == Event.EXIT:
        if not ran:  # the job ended before any UPDATE_JOB_INFO saw its pid
            execute()
        by_signal = bool(attrs.get("ExitBySignal"))
        code = _int(attrs.get("ExitSignal" if by_signal else "ExitCode")) or 0
        if after == Status.IDLE:
            add(EVICTED, evicted_body(cpu, reason, requeued_exit=(by_signal, code)))
        else:
            add(TERMINATED, terminated_body(by_signal, code, cpu))
    elif event in (Event.EVICT, Event.LEASE_EXPIRED):
        if ran:
            add(EVICTED, evicted_body(cpu, attrs.get("VacateReason") or reason))
        if after == Status.FAILED:  # out of attempts: the log must still end
            add(ABORTED, aborted_body(reason))
    elif event in (Event.HOLD, Event.HOOK_HOLD):
        # the store puts HoldReasonCode and HoldReasonSubCode in every hold's attrs
        add(HELD, held_body(reason, _int(attrs.get("HoldReasonCode")) or 0,
                            _int(attrs.get("HoldReasonSubCode")) or 0))
    elif event == Event.RELEASE:
        add(RELEASED, released_body(reason))
    elif event in (Event.REMOVE, Event.HOOK_REMOVE):
        add(ABORTED, aborted_body(reason))
    elif event == Event.POST_SCRIPT:
        add(POST_SCRIPT_TERMINATED, post_script_body(_int(attrs.get("ReturnValue")) or 0,
                                                     str(attrs.get("DAGNodeName") or "")))
    return out


def on_commit(records: Sequence[Mapping[str, Any]]) -> Callable[[bool], None] | None:
    """JobStore commit listener, called just before the commit: lock each log file the committed
    events go to, and return the step that appends them once the commit succeeded.

    Holding the lock across the commit keeps every log in the database's order: the next
    transition of the same job commits after this one, so it appends after this one too.
    """
    batches: dict[tuple[str, str | None], list[str]] = {}
    for record in records:
        job: Job | None = record.get("job")
        if job is None or not job.user_log:
            continue
        texts = [e.text() for e in log_events(record, job)]
        if texts:
            batches.setdefault((job.user_log, job.owner), []).extend(texts)
    held = []
    for (path, owner), texts in sorted(batches.items()):  # one lock order: no deadlock
        writer = open_log(path, owner=owner)
        if writer is not None:
            held.append((writer, "".join(texts)))
    if not held:
        return None

    def append_committed(committed: bool) -> None:
        for writer, text in held:
            writer.finish(text if committed else "")

    return append_committed


def append(path: str, text: str, *, owner: str | None = None) -> bool:
    """Append `text` (whole events) to the log at `path` now; False (one line logged) if not."""
    writer = open_log(path, owner=owner)
    return writer is not None and writer.finish(text)


# ---- appending ----------------------------------------------------------------------------

LOCK_WAIT = 5.0  # seconds a log's lock is waited for (whoever holds it may hold it for ever)
START_WAIT = LOCK_WAIT + 10.0  # seconds the owner's child has to start, open and lock the log
APPEND_WAIT = 10.0  # seconds it then has to append and end
MAX_WARNED = 10_000  # logs that could not be written, said once each


def _open_locked(path: str) -> int:
    """`path` opened for appending (made if missing; never through a link, never anything but
    a regular file, never waiting on a FIFO) and locked; OSError if it cannot be within
    LOCK_WAIT seconds."""
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
             | os.O_NONBLOCK)
    fd = os.open(path, flags, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    raise OSError(exc.errno, "locked by another process for too long") from None
            time.sleep(0.05)
    except OSError:
        os.close(fd)
        raise


class _FileWriter:
    """The log opened O_APPEND and locked (fcntl, as HTCondor locks it) until `finish`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = _open_locked(path)

    def finish(self, text: str) -> bool:
        """Write `text` in one write() (unless the kernel writes short), unlock, close."""
        view = memoryview(text.encode("utf-8", "surrogateescape"))
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            _warn(self.path, exc.errno or 0, exc.strerror or str(exc))
            return False
        finally:
            os.close(self.fd)  # releases the lock
        return True


# Root never writes into a directory the user controls: a short child (stdlib only, no site,
# no environment of root's) opens and locks the log as the job's owner with _open_locked's own
# source, says so, then appends what it is sent.
@functools.cache
def _child() -> str:
    """The child's program."""
    import inspect

    return f"""
import errno, fcntl, os, stat, sys, time
LOCK_WAIT = float(sys.argv[2])
{inspect.getsource(_open_locked)}
try:
    fd = _open_locked(sys.argv[1])
except OSError as exc:
    sys.stderr.write(exc.strerror or "cannot open")
    sys.exit(1)
sys.stdout.write("locked\\n")
sys.stdout.flush()
data = sys.stdin.buffer.read()
while data:
    data = data[os.write(fd, data):]
"""


class _OwnerWriter:
    """As root: the same, done by a child process running as the log's owner. It is given
    START_WAIT seconds to say the log is locked, and APPEND_WAIT more to append, then killed
    and left."""

    def __init__(self, path: str, owner: str) -> None:
        self.path = path
        self.error: str | None = None
        try:
            pw = pwd.getpwnam(owner)
        except KeyError:
            raise OSError(errno.ENOENT, f"no account {owner}") from None
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _child(), path, str(LOCK_WAIT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            user=pw.pw_uid,
            group=pw.pw_gid,
            extra_groups=os.getgrouplist(owner, pw.pw_gid),
            cwd="/",
            env={},
        )
        assert self.proc.stdout is not None
        if _first_line(self.proc.stdout.fileno(), START_WAIT) != b"locked\n":
            self._abandon()
            raise OSError(errno.EACCES, "did not open and lock it in time")

    def finish(self, text: str) -> bool:
        try:
            _, err = self.proc.communicate(text.encode("utf-8", "surrogateescape"),
                                           timeout=APPEND_WAIT)
        except subprocess.TimeoutExpired:
            self._abandon()
            _warn(self.path, errno.ETIME, "as the job owner: did not append in time")
            return False
        self.error = _said(err)
        if self.proc.returncode:
            _warn(self.path, errno.EIO, f"as the job owner: {self.error or 'failed'}")
            return False
        return True


    def _abandon(self) -> None:
        """Kill the child and close this end of its pipes, never reading them to their end
        (she may hold copies of the other end open)."""
        self.proc.kill()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _first_line(fd: int, wait: float) -> bytes:
    """What a child wrote on `fd` up to its first newline, within `wait` seconds (b"" if it
    said nothing whole in time)."""
    got = b""
    deadline = time.monotonic() + wait
    while b"\n" not in got and len(got) < 64:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return b""
        chunk = os.read(fd, 64)
        if not chunk:
            return b""
        got += chunk
    return got


def _said(err: bytes) -> str | None:
    """A child's last line of stderr, as one short line of printable text (it is the job
    owner's process: she may have written it)."""
    lines = err.decode("ascii", "replace").strip().splitlines()
    if not lines:
        return None
    return "".join(c if c.isprintable() else "?" for c in lines[-1])[:200]


def open_log(path: str, *, owner: str | None = None) -> _FileWriter | _OwnerWriter | None:
    """The log at `path`, opened for appending and locked; None (one line logged) if it cannot
    be. Running as root, it is opened by a child process as `owner`, never as root."""
    try:
        if os.geteuid() == 0 and owner and owner != "root":
            return _OwnerWriter(path, owner)
        return _FileWriter(path)
    except OSError as exc:
        _warn(path, exc.errno or 0, exc.strerror or str(exc))
        return None


def _warn(path: str, code: int, message: str) -> None:
    if (path, code) in _warned:
        return
    if len(_warned) >= MAX_WARNED:
        _warned.clear()
    _warned.add((path, code))
    log.warning("jobstore: cannot write job event log %s: %s", path, message)


__all__ = [
    "JobBefore", "LogEvent", "append", "local_address", "log_events", "on_commit", "open_log",
]
