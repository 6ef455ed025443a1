"""The runner of one DAG node script: a process forked from the access point's service into a
session of its own, which outlives the service, runs the script and writes how it ended.

As root the runner stays root (to write the service's directory, root's) and runs the script
in a child that becomes the owner (her groups, her gid and uid, checked) before it enters the
node's directory, with an environment of her own: the script, its directory and its arguments
are hers, and are used only with her rights. The runner keeps none of the service's open
files (its database connections), and writes DIRECTORY/TOKEN.pid (its pid and start time) as
it starts and DIRECTORY/TOKEN.json (the exit, a negative number for a signal, and why the
script could not be started) as the script ends; when this host had no room for the script's
process, the json says `retry` instead, and the script never ran. SIGTERM kills the script's
process group (until the runner has reaped the script).

With SCRIPT DEBUG, the owner's process that runs the script keeps its standard output and
error (MAX_DEBUG bytes of each) and appends them to her debug file as the script ends, after
DAGMan's line `*** Node=... Type=... ExitCode=... Completion=... Cmd='...'`.
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import resource
import select
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path

PATH = "/usr/local/bin:/usr/bin:/bin"
CANNOT_RUN = 127  # the exit of a script that could not be started, as a shell says it
MAX_DEBUG = 1 << 20  # bytes of a script's output and of its error kept for SCRIPT DEBUG
PR_SET_DUMPABLE = 4  # prctl(2)


@dataclass(frozen=True)
class Debug:
    """SCRIPT DEBUG: the file (in the node's directory) the script's output is appended to,
    which of it (STDOUT, STDERR or ALL), and what DAGMan's line says of the run."""

    file: str
    streams: str
    node: str
    kind: str  # PRE or POST


def start(directory: Path, token: str, uid: int, gid: int, cwd: str, argv: list[str],
          debug: Debug | None = None) -> int:
    """Fork the runner of `argv` (run as `uid`:`gid` in `cwd`; -1: as this process): its
    pid, which the caller reaps."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _runner(directory, token, uid, gid, cwd, argv, debug)
            code = 0
        finally:
            os._exit(code)
    return pid


def alive(pidfile: Path) -> bool:
    """Does the runner that wrote `pidfile` still run?"""
    try:
        pid, started = pidfile.read_text().split()
        return _start_time(int(pid)) == started
    except (OSError, ValueError):
        return False


def stop(pidfile: Path) -> bool:
    """SIGTERM the runner that wrote `pidfile`, if it still runs: whether it did."""
    try:
        if alive(pidfile):
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGTERM)
            return True
    except (OSError, ValueError):
        pass
    return False


def _start_time(pid: int) -> str:
    """The start time of `pid` (/proc/PID/stat), which tells it from a later process of the
    same pid."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def _runner(directory: Path, token: str, uid: int, gid: int, cwd: str,
            argv: list[str], debug: Debug | None) -> None:
    os.setsid()
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if null > 2:
        os.close(null)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    pidfile = directory / f"{token}.pid"
    _write(pidfile, f"{os.getpid()} {_start_time(os.getpid())}", exclusive=True)
    try:
        account = pwd.getpwuid(uid if uid >= 0 else os.getuid())
        read_end, write_end = os.pipe()
        child = os.fork()
    except OSError as exc:  # no room for a process (or a file) now: not the script's failure
        _end(directory, token, {"code": CANNOT_RUN, "retry": True,
                                "error": f"starting the script: {exc.strerror or exc}"})
        return
    env = {"PATH": PATH, "HOME": account.pw_dir, "USER": account.pw_name,
           "LOGNAME": account.pw_name, "LANG": "C.UTF-8"}
    if child == 0:
        os.close(read_end)
        _exec(uid, gid, account.pw_name, cwd, argv, env, write_end, debug)
    os.close(write_end)
    signal.signal(signal.SIGTERM, lambda _sig, _frame: _kill(child))
    error = b""
    while chunk := os.read(read_end, 4096):
        error += chunk[:1000]
    os.close(read_end)
    _pid, status = os.waitpid(child, 0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # its pid may be another's from now on
    _end(directory, token, {"code": os.waitstatus_to_exitcode(status),
                            "error": error.decode("utf-8", "replace")[:500]})


def _end(directory: Path, token: str, result: dict[str, object]) -> None:
    """Write the run's result, then say it no longer runs."""
    _write(directory / f"{token}.tmp", json.dumps(result), durable=True)
    os.rename(directory / f"{token}.tmp", directory / f"{token}.json")
    (directory / f"{token}.pid").unlink()


def _exec(uid: int, gid: int, name: str, cwd: str, argv: list[str], env: dict[str, str],
          errors: int, debug: Debug | None) -> None:
    """In the script's process: become the owner, enter her directory, run her script
    (never returns)."""
    step = "becoming the owner"
    try:
        for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}:
            try:
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass  # a real-time signal Python does not let be set
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        os.setpgid(0, 0)
        if uid >= 0:
            os.setgroups(os.getgrouplist(name, gid))
            os.setgid(gid)
            os.setuid(uid)
            if os.getuid() != uid or os.geteuid() != uid:
                raise PermissionError(1, "the account was not taken")
        step = f"entering {cwd}"
        os.chdir(cwd)
        step = f"running {argv[0]}"
        if debug is not None:
            _debugged(argv, env, errors, debug)
        os.execve(argv[0], argv, env)
    except OSError as exc:
        os.write(errors, f"{step}: {exc.strerror or exc}".encode())
    finally:
        os._exit(CANNOT_RUN)


def _debugged(argv: list[str], env: dict[str, str], errors: int, debug: Debug) -> None:
    """As the owner, in the node's directory: run the script with its output kept, append
    it to the debug file, and end as the script ended (never returns; OSError when the
    script could not be started)."""
    _undumpable()  # this process is a copy of the service's (its memory): never hers to read
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    script = os.fork()
    if script == 0:
        try:
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.execve(argv[0], argv, env)
        except OSError as exc:
            os.write(errors, f"running {argv[0]}: {exc.strerror or exc}".encode())
        finally:
            os._exit(CANNOT_RUN)
    os.close(out_w)
    os.close(err_w)
    os.close(errors)
    kept = {out_r: bytearray(), err_r: bytearray()}
    open_fds = [out_r, err_r]
    for fd in open_fds:
        os.set_blocking(fd, False)
    status = None
    while open_fds and status is None:  # until the script ends (not its pipes: a child it
        # left in the background may hold them), then what it wrote before
        ready = select.select(open_fds, [], [], 0.2)[0]
        pid, ended = os.waitpid(script, os.WNOHANG)
        if pid:
            status, ready = ended, list(open_fds)
        for fd in ready:
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if not chunk:
                    open_fds.remove(fd)
                    break
                if len(kept[fd]) < MAX_DEBUG:
                    kept[fd] += chunk[:MAX_DEBUG - len(kept[fd])]
                if status is None or len(kept[fd]) >= MAX_DEBUG:
                    break
    if status is None:
        status = os.waitpid(script, 0)[1]
    signalled = os.WIFSIGNALED(status)
    line = (f"*** Node={debug.node} Type={debug.kind} "
            f"{'Signal' if signalled else 'ExitCode'}="
            f"{status if signalled else os.WEXITSTATUS(status)} "
            f"Completion={int(time.time())} Cmd='{' '.join(argv)}'\n").encode()
    text = line + (bytes(kept[out_r]) if debug.streams in ("STDOUT", "ALL") else b"") + (
        bytes(kept[err_r]) if debug.streams in ("STDERR", "ALL") else b"")
    try:
        _append(debug.file, text)
    except (OSError, ValueError):
        pass  # as DAGMan: the script's end is what counts (a name the system cannot take)
    if signalled:  # ended by the same signal (no core: _undumpable)
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status) if not signalled else 128 + os.WTERMSIG(status))


def _undumpable() -> None:
    """No core of this process, and nobody but root may trace it or read its memory."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def _append(path: str, data: bytes) -> None:
    """Append `data` to the regular file `path` (made if missing; never through a link, never
    a FIFO's reader awaited)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK,
                 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _kill(child: int) -> None:
    try:
        os.killpg(child, signal.SIGKILL)
    except OSError:
        pass


def _write(path: Path, text: str, *, exclusive: bool = False, durable: bool = False) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    try:
        os.write(fd, text.encode())
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
