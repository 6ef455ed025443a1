"""`python -m jobstore.cli ...` for the tests, started by a preloaded server (support/zygote.py).

`popen` and `run` take subprocess's arguments. A command that is `JOBSTORE_CLI` plus arguments,
without options the server cannot honour (preexec_fn, pass_fds, a shell), runs in a child the
server forks: a process of its own with the caller's environment, directory, umask, streams and
user, whose pid, signals and exit status are the real ones. Anything else is an ordinary
subprocess. `signals_blocked=True` starts it as jobstore.emulator.spawn.hook_preexec(False)
would (every signal blocked, SIGPIPE ignored). `JOBSTORE_TEST_ZYGOTE=0` turns the server off.
"""

# mypy: disable-error-code="misc, attr-defined"
# (subprocess.Popen's POSIX internals, which ForkedPopen overrides, are not in typeshed)

from __future__ import annotations

import atexit
import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import zygote

from jobstore.emulator.spawn import hook_preexec

JOBSTORE_CLI = [sys.executable, "-m", "jobstore.cli"]
_SERVER = Path(zygote.__file__)
_UNSUPPORTED = ("preexec_fn", "pass_fds", "process_group", "executable", "startupinfo",
                "creationflags")


class _Server:
    lock = threading.Lock()
    pid: int | None = None
    path: str | None = None
    python_env: dict[str, str] = {}

    @classmethod
    def failed(cls) -> None:
        """The server broke: say so on stderr (with its own words) and use none from now on."""
        with cls.lock:
            log = Path(cls.path).with_name("zygote.log") if cls.path else None
            said = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            sys.stderr.write(f"clirun: the test zygote failed; ordinary processes from now on\n"
                             f"{said}")
            cls.path = None

    @classmethod
    def socket(cls) -> str | None:
        """The socket of this process's server, started on first use (None: off or broken)."""
        if os.environ.get("JOBSTORE_TEST_ZYGOTE", "1") == "0":
            return None
        with cls.lock:
            if cls.pid != os.getpid():
                cls.pid, cls.path = os.getpid(), None
                home = tempfile.mkdtemp(prefix="jobstore-zygote-")
                path = os.path.join(home, "z.sock")
                env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
                cls.python_env = _python_env(env)
                with open(os.path.join(home, "zygote.log"), "wb") as log:
                    proc = subprocess.Popen([sys.executable, str(_SERVER), path],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=log, cwd="/", env=env,
                                            start_new_session=True)
                atexit.register(shutil.rmtree, home, ignore_errors=True)
                atexit.register(proc.kill)
                assert proc.stdout is not None
                if (_readable(proc.stdout.fileno(), READY_SECONDS)
                        and proc.stdout.readline() == b"ready\n"):
                    cls.path = path
                else:
                    proc.kill()
            return cls.path


READY_SECONDS = 120.0


def _python_env(env: Mapping[str, str]) -> dict[str, str]:
    """What of `env` a new interpreter reads at its start, before any code of the command, and
    the zygote's child cannot do as it (PYTHONUNBUFFERED it does; bytecode files do not matter)."""
    return {k: v for k, v in env.items()
            if k.startswith("PYTHON") and k not in ("PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE")}


def _readable(fd: int, timeout: float | None) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else int(timeout * 1000)))


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _umask() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    raise OSError("no Umask in /proc/self/status")


class ForkedPopen(subprocess.Popen):  # type: ignore[type-arg]
    """subprocess.Popen whose child the zygote forks when it can."""

    _zconn: socket.socket | None = None
    _zfile: Any = None
    _pidfd: int | None = None

    def __init__(self, args: Any, *, signals_blocked: bool = False, **kwargs: Any) -> None:
        self._zflags = "b" if signals_blocked else ""
        self._zwant = (isinstance(args, (list, tuple)) and list(args[:3]) == JOBSTORE_CLI
                       and not kwargs.get("shell") and kwargs.get("close_fds", True)
                       and kwargs.get("process_group") is None
                       and not any(kwargs.get(name) for name in _UNSUPPORTED))
        super().__init__(args, **kwargs)

    def _execute_child(self, args: Any, executable: Any, preexec_fn: Any, close_fds: Any,
                       pass_fds: Any, cwd: Any, env: Any, *rest: Any) -> None:
        if self._zflags and preexec_fn is None:
            preexec_fn = hook_preexec(False)  # for the ordinary way
        path = _Server.socket() if self._zwant else None
        environ = dict(os.environ if env is None else env)
        if path is None or _python_env(environ) != _Server.python_env:
            return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds,
                                          cwd, env, *rest)
        (_startupinfo, _flags, _shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
         _restore, gid, gids, uid, umask, new_session, _group) = rest
        request = zygote.encode(
            [os.fsdecode(a) for a in args[3:]], environ,
            os.path.abspath(os.fsdecode(cwd) if cwd is not None else os.getcwd()),
            _umask() if umask < 0 else umask,
            ",".join(flag for flag in (
                self._zflags, "s" if new_session else "",
                "" if gids is None else "G=" + ":".join(map(str, gids)),
                "" if gid is None else f"g={gid}",
                "" if uid is None else f"u={uid}") if flag))
        fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
               errwrite if errwrite != -1 else 2]
        if not all(_open(fd) for fd in fds):  # a closed stream is passed on the ordinary way
            return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds,
                                          cwd, env, *rest)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        pidfd = None
        try:
            conn.connect(path)
            sent = socket.send_fds(conn, [request], fds)
            conn.sendall(request[sent:])
            self._zfile = conn.makefile("rb")
            line = self._zfile.readline()
            if not line.startswith(b"P"):
                raise ConnectionError("no child")
            pidfd = os.pidfd_open(int(line[1:]))
            conn.sendall(b"G")
        except OSError:  # nothing ran: the ordinary way, and no server from now on
            conn.close()
            if pidfd is not None:
                os.close(pidfd)
            _Server.failed()
            return super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds,
                                          cwd, env, *rest)
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
        self._zconn, self._pidfd = conn, pidfd
        self.pid = int(line[1:])
        self._child_created = True

    def _zstatus(self, block: bool) -> int | None:
        """The child's wait status from the zygote, or None while it runs. Should the zygote
        end first, the child is waited for through its pidfd and its status is unknown (255)."""
        assert self._zconn is not None and self._pidfd is not None
        if not _readable(self._zconn.fileno(), None if block else 0):
            return None
        line = self._zfile.readline()
        if not line.startswith(b"R") and not _readable(self._pidfd, None if block else 0):
            return None  # the zygote is gone, the child is not
        self._zconn.close()
        os.close(self._pidfd)
        self._pidfd = None
        return int(line[1:]) if line.startswith(b"R") else 255 << 8

    def send_signal(self, sig: int) -> None:
        if self._pidfd is None:
            return super().send_signal(sig)
        self.poll()
        if self.returncode is None and self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, sig)
        return None

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        if self._zconn is None:
            return super()._try_wait(wait_flags)
        status = self._zstatus(block=not wait_flags & os.WNOHANG)
        return (0, 0) if status is None else (self.pid, status)

    def _internal_poll(self, _deadstate: Any = None, **kwargs: Any) -> int | None:
        if self._zconn is None:
            return super()._internal_poll(_deadstate, **kwargs)
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                if self.returncode is None:
                    status = self._zstatus(block=False)
                    if status is not None:
                        self._handle_exitstatus(status)
            except OSError:
                if _deadstate is not None:
                    self.returncode = _deadstate
            finally:
                self._waitpid_lock.release()
        return self.returncode


def popen(args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
    return ForkedPopen(args, **kwargs)


def run(args: Any, *, input: Any = None, capture_output: bool = False,  # noqa: A002
        timeout: float | None = None, check: bool = False,
        **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    """subprocess.run, through popen."""
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with popen(args, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()  # as subprocess.run: what the command left running keeps the pipes
            raise
        except BaseException:
            process.kill()
            raise
    code = process.poll()
    assert code is not None
    if check and code:
        raise subprocess.CalledProcessError(code, process.args, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(process.args, code, stdout, stderr)
