"""A preloaded interpreter that forks `python -m jobstore.cli ...` processes for the tests.

Loading the package costs a new process about half a second of CPU, and the tests start some
two hundred agents and commands. This server imports every module of the package once and forks
a child per command: the child takes the caller's argv, environment, working directory, umask
and standard streams, and runs the command as `python -m jobstore.cli` would, in a process of
its own (signals, exit status and streams are the real process's). The server is the child's
parent; it sends the caller the child's pid and then its wait status.

`python tests/support/zygote.py SOCKET`; it ends when its standard input closes (its test
process ended). Test support only: it serves whoever can reach its socket (mode 0700 directory).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import io
import logging
import os
import pkgutil
import pwd
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

MAX_REQUEST = 8 << 20


def preload() -> None:
    import jobstore
    from jobstore.db.backends import preload_drivers

    gc.disable()
    for module in pkgutil.walk_packages(jobstore.__path__, "jobstore."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    with contextlib.suppress(ImportError):
        importlib.import_module("htcondor2")
    preload_drivers()
    gc.freeze()
    gc.enable()


def encode(argv: list[str], env: dict[str, str], cwd: str, umask: int, flags: str) -> bytes:
    """A command for the server. `flags`, comma separated: `s` a new session, `b` every signal
    blocked and SIGPIPE ignored (as jobstore.emulator.spawn.hook_preexec(False) starts a process),
    `G=1:2` the supplementary groups, `g=GID` and `u=UID` (as subprocess's extra_groups, group
    and user)."""
    fields = [b"%d" % len(argv), *map(os.fsencode, argv), os.fsencode(cwd), b"%o" % umask,
              flags.encode() or b"-",
              *(os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items())]
    body = b"\0".join(fields)
    return len(body).to_bytes(4, "big") + body


def decode(body: bytes) -> tuple[list[str], dict[str, str], str, int, str]:
    fields = body.split(b"\0")
    count = int(fields[0])
    argv = [os.fsdecode(a) for a in fields[1:1 + count]]
    cwd, umask, flags = fields[1 + count:4 + count]
    env = {}
    for item in fields[4 + count:]:
        name, _, value = item.partition(b"=")
        env[os.fsdecode(name)] = os.fsdecode(value)
    return argv, env, os.fsdecode(cwd), int(umask, 8), flags.decode()


def receive(conn: socket.socket) -> tuple[bytes, list[int]]:
    """A caller's command and its three descriptors (closed here if the command is not whole)."""
    head, fds, _flags, _addr = socket.recv_fds(conn, 4, 3)
    try:
        if len(fds) != 3:
            raise ValueError("a command comes with three descriptors")
        while len(head) < 4:
            more = conn.recv(4 - len(head))
            if not more:
                raise EOFError
            head += more
        length = int.from_bytes(head, "big")
        if length > MAX_REQUEST:
            raise ValueError("bad request")
        body = bytearray()
        while len(body) < length:
            more = conn.recv(min(length - len(body), 1 << 20))
            if not more:
                raise EOFError
            body += more
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return bytes(body), fds


def serve(path: str) -> None:
    preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    waiting: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([listener, wake_r, sys.stdin], [], [])
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):
            return
        if wake_r in readable:
            os.read(wake_r, 4096)
        if listener in readable:
            with contextlib.suppress(OSError):
                start(listener, waiting, (wake_r, wake_w))
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(b"R%d\n" % status)
                conn.close()


def start(listener: socket.socket, waiting: dict[int, socket.socket],
          wake: tuple[int, int]) -> None:
    """Accept a command and fork its child, which runs it once its caller says go."""
    conn, _addr = listener.accept()
    try:
        conn.settimeout(10)
        body, fds = receive(conn)
    except (OSError, ValueError, EOFError):
        conn.close()
        return
    try:
        pid = os.fork()
    except OSError:
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    if pid == 0:
        listener.close()
        for other in waiting.values():
            other.close()
        for fd in wake:
            os.close(fd)
        child(conn, body, fds)
    for fd in fds:
        os.close(fd)
    waiting[pid] = conn
    conn.sendall(b"P%d\n" % pid)


def child(conn: socket.socket, body: bytes, fds: list[int]) -> None:
    """Run the command as `python -m jobstore.cli` would in its own process; never returns.
    The order is _posixsubprocess's: streams, directory, umask, session, then the account."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        conn.settimeout(60)
        if conn.recv(1) != b"G":  # the caller gave up (and may run the command itself)
            os._exit(121)
        conn.close()
        argv, env, cwd, umask, text = decode(body)
        flags = dict(flag.partition("=")[::2] for flag in text.split(","))
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.closerange(3, 1 << 16)
        os.chdir(cwd)
        os.umask(umask)
        if "b" in flags:
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        if "s" in flags:
            os.setsid()
        if "G" in flags:
            os.setgroups([int(g) for g in flags["G"].split(":") if g])
        if "g" in flags:
            os.setregid(int(flags["g"]), int(flags["g"]))
        if "u" in flags:
            os.setreuid(int(flags["u"]), int(flags["u"]))
        os.environ.clear()
        os.environ.update(env)
        time.tzset()
        unbuffered = bool(env.get("PYTHONUNBUFFERED"))
        sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                     errors="surrogateescape")
        sys.stdout = io.TextIOWrapper(output(1, unbuffered), errors="surrogateescape",
                                      line_buffering=os.isatty(1), write_through=unbuffered)
        sys.stderr = io.TextIOWrapper(output(2, unbuffered), errors="backslashreplace",
                                      line_buffering=True, write_through=unbuffered)
        sys.path[0] = cwd
        from jobstore.cli import commands, commandserver

        reload_condor_config(commandserver.reload_condor_config)
        sys.argv = [str(commands.__file__).replace("commands.py", "__main__.py"), *argv]
    except BaseException:  # noqa: BLE001 - nothing ran; say why where the caller reads
        with contextlib.suppress(Exception):
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
        os._exit(120)
    os._exit(run(commands.main, argv, commandserver.exit_status))


def output(fd: int, unbuffered: bool) -> io.RawIOBase | io.BufferedWriter:
    """A standard output stream's binary layer, as the interpreter makes it (`-u`: raw)."""
    raw = io.FileIO(fd, "w", closefd=False)
    return raw if unbuffered else io.BufferedWriter(raw)


def reload_condor_config(quietly: Callable[[], None]) -> None:
    """Read the HTCondor configuration with the command's environment, as a new process's import
    of htcondor2 does: where a configuration is named or found, what HTCondor says of it (and an
    exit on an error in it) reaches the command's stderr; else it says nothing (`quietly`,
    the command server's, which filters what no process would print)."""
    htcondor2 = sys.modules.get("htcondor2")
    if htcondor2 is None:
        return
    found = ["/etc/condor/condor_config", "/usr/local/etc/condor_config"]
    with contextlib.suppress(KeyError):
        found.append(os.path.join(pwd.getpwnam("condor").pw_dir, "condor_config"))
    if "CONDOR_CONFIG" in os.environ or any(os.path.exists(path) for path in found):
        htcondor2.reload_config()
    else:
        quietly()


def run(main: Callable[..., object], argv: list[str], exit_status: Callable[[object], int]) -> int:
    """The command, then what the interpreter does at its end: its exit status."""
    code, interrupted = 1, False
    try:
        main(args=argv, prog_name="python -m jobstore.cli")
        code = 0
    except SystemExit as exc:
        code = exit_status(exc.code)
    except BaseException as exc:  # noqa: BLE001 - what the interpreter would print
        import traceback

        traceback.print_exc()
        interrupted = isinstance(exc, KeyboardInterrupt)
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - the interpreter's exit status for this
            code = 120
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


if __name__ == "__main__":
    os.umask(0o077)
    serve(sys.argv[1])
