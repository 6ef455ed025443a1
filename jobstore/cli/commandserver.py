"""An account's command server: the package loaded once, a forked child per `jobstore` command
(jobstore.cli.front is the client and says why).

`python -m jobstore.cli.commandserver SOCKET`. One per socket (an flock beside it); it serves
only its own uid, ends after front.IDLE_SECONDS without a command, and tells a client it is
stale (the client then runs the command itself) once a module it loaded has changed on disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import importlib
import io
import os
import signal
import socket
import sys
from pathlib import Path

from jobstore.cli import front

# Modules the served commands import on first use.
PRELOAD = (
    "jobstore.cli.commands", "jobstore.api.schedd", "jobstore.api.dags", "jobstore.api.query",
    "jobstore.submit", "jobstore.db.store", "htcondor2",
)
NO_CONFIG = b"Condor error: can't find config source."
ACCEPT_SECONDS = 5.0  # a client that connects must send its command within this


def preload() -> None:
    """Import what the commands use, kept out of the collector's passes (a forked command
    neither scans nor copies those pages)."""
    from jobstore.db.backends import preload_drivers

    gc.disable()
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    preload_drivers()
    gc.freeze()
    gc.enable()


def loaded_files() -> dict[str, int]:
    """The package's loaded source files and their modification times."""
    package = Path(front.__file__).resolve().parents[1]
    found = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and path.startswith(str(package)):
            with contextlib.suppress(OSError):
                found[path] = os.stat(path).st_mtime_ns
    return found


def stale(files: dict[str, int]) -> bool:
    for path, mtime in files.items():
        try:
            if os.stat(path).st_mtime_ns != mtime:
                return True
        except OSError:
            return True
    return False


def serve(path: str) -> None:
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return  # another server has this place
    preload()
    files = loaded_files()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    listener.bind(tmp)
    os.chmod(tmp, 0o600)
    listener.listen(64)
    os.rename(tmp, path)
    mine = os.stat(path).st_ino
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    listener.settimeout(front.IDLE_SECONDS)
    try:
        while True:
            try:
                conn, _addr = listener.accept()
            except TimeoutError:
                return
            with conn:
                if front.peer_uid(conn) != os.getuid():
                    continue
                if stale(files):
                    with contextlib.suppress(OSError):
                        conn.sendall(b"S\n")
                    return
                if os.fork() == 0:
                    listener.close()
                    os.close(lock)
                    child(conn)
    finally:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == mine:
                os.unlink(path)


def child(conn: socket.socket) -> None:
    """Run the command `conn` brings, as the client would have; never returns."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    code = 1
    try:
        conn.settimeout(ACCEPT_SECONDS)
        argv, umask, env = receive(conn)
        os.umask(umask)
        os.environ.clear()
        os.environ.update(env)
        reload_condor_config()
        sys.argv = ["jobstore", *argv]
        conn.sendall(b"P%d\n" % os.getpid())
        if conn.recv(1) != b"G":  # the client gave up waiting and runs the command itself
            os._exit(1)
        conn.settimeout(None)
    except BaseException:  # noqa: BLE001 - the client runs the command itself
        os._exit(1)
    try:
        from jobstore.cli.commands import main

        main(args=argv, prog_name="jobstore")
        code = 0
    except SystemExit as exc:
        code = exit_status(exc.code)
    except BaseException:  # noqa: BLE001 - what the client's own process would print
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError):
        conn.sendall(b"R%d\n" % code)
    os._exit(code)


def reload_condor_config() -> None:
    """Read the HTCondor configuration again, with the client's environment, as the client's
    own process would read it (which says nothing when there is none)."""
    htcondor2 = sys.modules.get("htcondor2")
    if htcondor2 is None:
        return
    import tempfile

    saved = os.dup(2)
    with tempfile.TemporaryFile() as said:
        os.dup2(said.fileno(), 2)
        try:
            htcondor2.reload_config()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        said.seek(0)
        lines = said.read(1 << 16).splitlines(keepends=True)
    kept = [line for line in lines if line.strip() != NO_CONFIG]
    if kept:
        os.write(2, b"".join(kept))


def exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def receive(conn: socket.socket) -> tuple[list[str], int, dict[str, str]]:
    """The client's command; its standard streams and working directory become this process's."""
    head, fds, _flags, _addr = socket.recv_fds(conn, 4, 4)
    if len(fds) != 4:
        for fd in fds:
            os.close(fd)
        raise ValueError("a command comes with four descriptors")
    while len(head) < 4:
        more = conn.recv(4 - len(head))
        if not more:
            raise ValueError("no command")
        head += more
    length = int.from_bytes(head, "big")
    if length > front.MAX_REQUEST:
        raise ValueError("command too large")
    body = bytearray()
    while len(body) < length:
        more = conn.recv(min(length - len(body), 1 << 20))
        if not more:
            raise ValueError("command cut short")
        body += more
    argv, umask, env = front.decode_request(bytes(body))
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    os.fchdir(fds[3])
    for fd in fds:
        os.close(fd)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), errors="surrogateescape")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), errors="surrogateescape",
                                  line_buffering=os.isatty(1))
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), errors="backslashreplace",
                                  line_buffering=True)
    return argv, umask, env


def main() -> None:
    if len(sys.argv) != 2 or os.geteuid() == 0:
        raise SystemExit("usage: python -m jobstore.cli.commandserver SOCKET (not as root)")
    os.umask(0o077)
    serve(sys.argv[1])


if __name__ == "__main__":
    main()
