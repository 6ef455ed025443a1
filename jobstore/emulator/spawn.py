"""Starting hook processes the way DaemonCore does (protocol section 2)."""

from __future__ import annotations

import os
import pwd
import selectors
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jobstore.node.hooktable import OUTPUT_HOOKS

PIPE_BUFFER_MAX = 10240


@dataclass
class HookCall:
    """One hook invocation as the emulator saw it."""

    hook: str
    argv: list[str]
    slot: str
    stdin: bytes
    env: dict[str, str]
    cwd: str
    user: str
    stdout: bytes = b""
    stderr: bytes = b""
    exit_status: int | None = None  # Popen-style: exit code, or -signal
    started: float = 0.0
    ended: float | None = None
    timed_out: bool = False
    error: str | None = None
    pid: int | None = None
    done: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def lookup_account(name: str) -> Account | None:
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return None
    groups = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
    return Account(pw.pw_name, pw.pw_uid, pw.pw_gid, groups, pw.pw_dir)


def current_account() -> Account:
    pw = pwd.getpwuid(os.geteuid())
    return Account(pw.pw_name, pw.pw_uid, pw.pw_gid, tuple(os.getgroups()), pw.pw_dir)


def check_hook_path(path: str) -> str | None:
    """hook_utils.cpp validation: None if usable, else the reason it is refused."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"stat({path}) failed: {exc.strerror}"
    if st.st_mode & stat.S_IWOTH:
        return f"{path} is world-writable"
    if not st.st_mode & stat.S_IXUSR:
        return f"{path} is not executable by its owner"
    try:
        parent = os.stat(os.path.dirname(os.path.abspath(path)))
    except OSError as exc:
        return f"stat of parent of {path} failed: {exc.strerror}"
    if parent.st_mode & stat.S_IWOTH:
        return f"parent directory of {path} is world-writable"
    return None


class ProcessRegistry:
    """Live hook/job process groups, so a shutdown can SIGKILL what is left."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pgids: set[int] = set()

    def add(self, pgid: int) -> None:
        with self._lock:
            self._pgids.add(pgid)

    def discard(self, pgid: int) -> None:
        with self._lock:
            self._pgids.discard(pgid)

    def kill_all(self) -> None:
        with self._lock:
            pgids = list(self._pgids)
            self._pgids.clear()
        for pgid in pgids:
            kill_group(pgid, signal.SIGKILL)


def kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def hook_preexec(close_std: bool) -> Callable[[], None]:
    """How DaemonCore starts a hook: every signal blocked, SIGPIPE ignored, and for the hooks
    without captured output (REPLY_FETCH, EVICT_CLAIM, UPDATE_JOB_INFO) fds 1 and 2 closed."""

    def prepare() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        if close_std:
            os.close(1)
            os.close(2)

    return prepare


def wait_pid_exit(pid: int, pidfd: int | None, timeout: float | None) -> bool:
    """Wait until `pid` has exited (without reaping it); False on timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    if pidfd is not None:
        sel = selectors.DefaultSelector()
        sel.register(pidfd, selectors.EVENT_READ)
        try:
            return bool(sel.select(timeout))
        finally:
            sel.close()
    while True:
        try:
            res = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        if res is not None:
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def run_hook(
    call: HookCall,
    *,
    account: Account | None,
    kill_family: bool,
    timeout: float | None,
    registry: ProcessRegistry,
) -> HookCall:
    """Run one hook to completion (or timeout) and fill in `call`. Never raises."""
    capture = call.hook in OUTPUT_HOOKS
    creds: dict[str, Any] = {}
    if account is not None:
        creds = {"user": account.uid, "group": account.gid, "extra_groups": list(account.groups)}
    call.started = time.time()
    try:
        proc = subprocess.Popen(
            call.argv,
            executable=call.argv[0],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
            cwd=call.cwd,
            env=call.env,
            start_new_session=True,
            restore_signals=False,  # keeps SIGPIPE and SIGXFSZ ignored, as Python has them
            preexec_fn=hook_preexec(close_std=not capture),
            close_fds=True,
            **creds,  # type: ignore[arg-type]
        )
    except Exception as exc:
        call.error = f"spawn failed: {exc}"
        call.ended = time.time()
        call.done.set()
        return call
    call.pid = proc.pid
    registry.add(proc.pid)
    pidfd = open_pidfd(proc.pid)
    try:
        exited = _pump(proc, call, pidfd, timeout)
        if not exited:
            call.timed_out = True
            threading.Thread(
                target=_reap_later, args=(proc, call, pidfd, registry), daemon=True
            ).start()
            pidfd = None
            return call
        _finish(proc, call, kill_family, registry)
    except Exception as exc:  # an emulator bug must not escape into the caller's thread
        call.error = f"emulator error: {exc!r}"
        _finish(proc, call, kill_family, registry)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return call


def _finish(
    proc: subprocess.Popen, call: HookCall, kill_family: bool, reg: ProcessRegistry
) -> None:
    if kill_family:
        kill_group(proc.pid, signal.SIGKILL)
    call.exit_status = proc.wait()
    reg.discard(proc.pid)
    call.ended = time.time()
    call.done.set()


def _reap_later(
    proc: subprocess.Popen, call: HookCall, pidfd: int | None, reg: ProcessRegistry
) -> None:
    try:
        call.exit_status = proc.wait()
        call.ended = time.time()
    finally:
        reg.discard(proc.pid)
        if pidfd is not None:
            os.close(pidfd)
        call.done.set()


def _pump(proc: subprocess.Popen, call: HookCall, pidfd: int | None, timeout: float | None) -> bool:
    """Feed stdin, collect capped stdout/stderr until the hook exits; False on timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    sel = selectors.DefaultSelector()
    bufs: dict[int, bytearray] = {}
    names: dict[int, str] = {}
    pending = memoryview(call.stdin)
    assert proc.stdin is not None
    stdin_fd = proc.stdin.fileno()
    os.set_blocking(stdin_fd, False)
    if pending:
        sel.register(stdin_fd, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    for name, stream in (("stdout", proc.stdout), ("stderr", proc.stderr)):
        if stream is not None:
            fd = stream.fileno()
            os.set_blocking(fd, False)
            bufs[fd] = bytearray()
            names[fd] = name
            sel.register(fd, selectors.EVENT_READ)
    streams = {s.fileno(): s for s in (proc.stdout, proc.stderr) if s is not None}
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ)

    def close_out(fd: int) -> None:
        try:
            sel.unregister(fd)
        except (KeyError, ValueError):
            pass
        streams[fd].close()
        setattr(call, names[fd], bytes(bufs[fd]))

    def read_some(fd: int) -> bool:
        try:
            chunk = os.read(fd, PIPE_BUFFER_MAX - len(bufs[fd]))
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            close_out(fd)
            return False
        bufs[fd] += chunk
        if len(bufs[fd]) >= PIPE_BUFFER_MAX:
            close_out(fd)  # the daemon closes its end at the cap: later writes get EPIPE
            return False
        return True

    exited = False
    try:
        while True:
            if pidfd is None and proc.poll() is not None:
                exited = True
                break
            wait = 0.05 if pidfd is None else None
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                wait = left if wait is None else min(wait, left)
            for key, _ in sel.select(wait):
                fd = key.fd
                if fd == pidfd:
                    exited = True
                elif fd == stdin_fd:
                    try:
                        n = os.write(fd, pending)
                        pending = pending[n:]
                    except BlockingIOError:
                        continue
                    except OSError:
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(fd)
                        proc.stdin.close()
                elif fd in bufs:
                    read_some(fd)
            if exited:
                break
    finally:
        # the reaper's last read of each pipe still open, then close everything
        for fd in list(streams):
            if not streams[fd].closed:
                while exited and not streams[fd].closed and read_some(fd):
                    pass
                if not streams[fd].closed:
                    close_out(fd)
        if not proc.stdin.closed:
            try:
                proc.stdin.close()
            except OSError:
                pass
        sel.close()
    return exited
