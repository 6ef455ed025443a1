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
import logging
import os
import pwd
import socket
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
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _address(host: str | None) -> str:
    return f"<{host or socket.getfqdn()}>"


def local_address() -> str:
    """This host, as an event's host (`<name>`)."""
    return _address(None)


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

    cpu = (float(attrs.get("RemoteUserCpu") or 0), float(attrs.get("RemoteSysCpu") or 0))
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


class _FileWriter:
    """The log opened O_APPEND and locked (fcntl, as HTCondor locks it) until `finish`."""

    def __init__(self, path: str) -> None:
        self.path = path
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        self.fd = os.open(path, flags, 0o644)
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX)
        except OSError:
            os.close(self.fd)
            raise

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


# Root never writes into a directory the user controls: a short child (stdlib only, no site)
# opens and locks the log as the job's owner, says so, then appends what it is sent.
_CHILD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX)
sys.stdout.write("locked\\n")
sys.stdout.flush()
data = sys.stdin.buffer.read()
while data:
    data = data[os.write(fd, data):]
"""


class _OwnerWriter:
    """As root: the same, done by a child process running as the log's owner."""

    def __init__(self, path: str, owner: str) -> None:
        self.path = path
        try:
            pw = pwd.getpwnam(owner)
        except KeyError:
            raise OSError(errno.ENOENT, f"no account {owner}") from None
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _CHILD, path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            user=pw.pw_uid,
            group=pw.pw_gid,
            extra_groups=os.getgrouplist(owner, pw.pw_gid),
            cwd="/",
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline() != b"locked\n":
            self.finish("")
            raise OSError(errno.EACCES, self.error or "failed")

    def finish(self, text: str) -> bool:
        try:
            _, err = self.proc.communicate(text.encode("utf-8", "surrogateescape"), timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        lines = err.decode(errors="replace").strip().splitlines()
        self.error = lines[-1] if lines else None
        if self.proc.returncode:
            _warn(self.path, errno.EIO, f"as the job owner: {self.error or 'failed'}")
            return False
        return True


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
    _warned.add((path, code))
    log.warning("jobstore: cannot write job event log %s: %s", path, message)


__all__ = [
    "JobBefore", "LogEvent", "append", "local_address", "log_events", "on_commit", "open_log",
]
