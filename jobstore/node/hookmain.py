"""The process side of a hook: make the process sane, read stdin, call the handler, print once.

HTCondor starts hooks with every signal blocked and, for REPLY_FETCH, EVICT_CLAIM and
UPDATE_JOB_INFO, with fds 1 and 2 closed (protocol document, 2.4 and 2.7). A hung FETCH_WORK
stops its slot from ever fetching again, so every hook runs under a hard deadline.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import NoReturn

from jobstore.node.hookproc import (
    MAX_STDIN,
    STOP_JOB,
    append_hook_log,
    log_entry,
    one_line,
    read_stdin,
    stop_job,
    write_all,
)
from jobstore.node.hookproc import prologue as _reopen_fds
from jobstore.node.hooktable import DEADLINES, DEFAULT_DEADLINE


def _prologue() -> bool:
    """The hooks' prologue (unblock signals, reopen fds 1 and 2), and Python's own stdout/stderr
    objects for code that prints; returns whether stderr reaches HTCondor."""
    stderr_open = _reopen_fds()
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115
    return stderr_open


class _Deadline:
    """Exit silently (stdout untouched) once the deadline passes, whatever the main thread does.

    A thread, because a signal handler would wait for a C call (a TCP connect) to return; SIGALRM
    with its default action is the backstop should the interpreter itself be stuck.
    """

    def __init__(self, hook: str, started: float | None = None) -> None:
        self.hook = hook
        self.started = time.monotonic() if started is None else started
        self.timer: threading.Timer | None = None

    def set(self, seconds: float) -> None:
        """(Re)arm: the hook ends `seconds` after it started."""
        if self.timer is not None:
            self.timer.cancel()
        left = max(0.1, seconds - (time.monotonic() - self.started))
        self.timer = threading.Timer(left, self._expire, args=(seconds,))
        self.timer.daemon = True
        self.timer.start()
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(int(left) + 2)

    def _expire(self, seconds: float) -> None:
        _log_line(self.hook, f"{self.hook}: gave up after {seconds:g} s (deadline)", to_stderr=True)
        os._exit(0)


_stderr_open = True


def _log_line(hook: str, message: str, *, to_stderr: bool = False) -> None:
    """Write one line to stderr (where HTCondor keeps it) and to the hook log; an account that
    may not write the hook log (a job's user: condor made it 0644) sends it to syslog instead."""
    line = one_line(message)
    if to_stderr and _stderr_open:
        try:
            os.write(2, (line + "\n").encode("utf-8", "replace"))
        except OSError:
            pass
    path = os.environ.get("JOBSTORE_HOOK_LOG") or _configured_log()
    if not path:
        return
    if not append_hook_log(path, log_entry(hook, os.getpid(), line)):
        import syslog

        syslog.openlog("jobstore-hook", syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(syslog.LOG_NOTICE, f"{hook}: {line}")


def _configured_log() -> str | None:
    if "htcondor2" not in sys.modules:  # never import HTCondor just to log
        return None
    from jobstore.node.config import _param

    try:
        return _param("JOBSTORE_HOOK_LOG")
    except Exception:
        return None


def main(hook: str, *, stdin: bytes | None = None, started: float | None = None) -> NoReturn:
    """Entry point of the direct (in-process) hooks. The thin client passes the `stdin` it read
    already and the time the hook `started`, so that the deadline counts from the real start."""
    global _stderr_open
    _stderr_open = _prologue()
    deadline = _Deadline(hook, started)
    deadline.set(DEADLINES.get(hook, DEFAULT_DEADLINE))
    code = 0
    try:
        if stdin is None:
            stdin = read_stdin()
        if len(stdin) > MAX_STDIN:
            _log_line(hook, f"{hook}: stdin larger than {MAX_STDIN} bytes, ignored", to_stderr=True)
        else:
            from jobstore.node.handlers import handle
            from jobstore.node.hookcall import HookRequest
            from jobstore.node.services import direct

            response = handle(
                HookRequest(
                    hook=hook,
                    argv=sys.argv[1:],
                    stdin=stdin,
                    env=dict(os.environ),
                    set_deadline=deadline.set,
                    node=direct(),
                )
            )
            for note in response.log:
                _log_line(hook, f"{hook}: {note}")
            if response.error:
                _log_line(hook, response.error, to_stderr=True)
            if response.stdout:
                write_all(1, response.stdout)
            code = response.exit_code
            if hook == "update_job_info" and code == STOP_JOB:
                _log_line(hook, f"{hook}: {stop_job(stdin)}")
                code = 0
    except BaseException as exc:  # noqa: BLE001 - a hook must never show a traceback
        _log_line(hook, f"{hook}: internal error: {type(exc).__name__}: {exc}", to_stderr=True)
        code = 0
    os._exit(code)
