"""The `jobstore` executable's first step: hand a short command to this account's command
server, which has the package loaded, instead of loading it here.

Loading the package (SQLAlchemy, psycopg, click, the submit language) costs a new process most
of a second; `condor_submit` starts in 40 ms. So the first `jobstore submit` (or q, rm, hold,
...) of an account runs in its own process as always and leaves behind a command server
(jobstore.cli.commandserver): a process of the same account that has imported everything and
forks a child per command. The next command passes it its arguments, environment, umask,
working directory and standard streams over a unix socket and waits for the exit status; the
child runs the command exactly as this process would have, once the client has said go (a
client that gave up waiting runs the command itself, and its child never does). The server
ends after IDLE_SECONDS without a command, or when the package it loaded has changed.

Nothing crosses an account: the socket is in a directory of the account's own (mode 0700), the
client talks only to a server of its own uid and the server serves only its own uid. Root never
uses one. JOBSTORE_COMMAND_SERVER=false turns it off.

Standard library only, and little of it: this module is all a served command loads.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # not `typing`'s: this module's import is a served command's cost
if TYPE_CHECKING:
    import socket

# The commands a server runs: short ones that print and end (not agent, watch, demo, ...).
SERVED = frozenset({
    "submit", "submit-dag", "q", "history", "rm", "hold", "release", "qedit", "userprio",
})
# The group's own options that take a value (jobstore.cli.commands.main).
VALUE_OPTIONS = frozenset({"--db", "--keyword", "-k"})
OFF = frozenset({"0", "false", "no", "off"})
IDLE_SECONDS = 600.0
CONNECT_SECONDS = 2.0  # to connect and be accepted; the command itself has no bound
MAX_REQUEST = 4 << 20


def served_command(argv: list[str]) -> str | None:
    """The command `argv` (the executable's arguments) names, when a server may run it."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in VALUE_OPTIONS:
            i += 2
        elif arg.startswith(("--db=", "--keyword=")) or (arg.startswith("-k") and len(arg) > 2):
            i += 1
        elif arg.startswith("-"):
            return None  # --help, --version, or something the group will refuse
        else:
            return arg if arg in SERVED else None
    return None


def socket_dir() -> str | None:
    """This account's directory for its command server: made here when missing, and None when
    it is not a directory (not a link) that only this account can use."""
    uid = os.getuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    base = os.path.join(runtime, "jobstore") if runtime.startswith("/") else f"/tmp/jobstore-{uid}"
    try:
        os.mkdir(base, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        found = os.lstat(base)
    except OSError:
        return None
    if (found.st_mode & 0o170000) != 0o040000 or found.st_uid != uid or found.st_mode & 0o077:
        return None
    return base


def server_key() -> str:
    """What a server must share with its client to run its commands: the interpreter, the
    package and the account's identity (its environment is sent with each command)."""
    import zlib

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    groups = ",".join(str(g) for g in sorted(os.getgroups()))
    text = f"{sys.executable}\0{package}\0{os.getuid()}\0{os.getgid()}\0{groups}"
    return f"{zlib.crc32(text.encode('utf-8', 'surrogateescape')):08x}"


def socket_path() -> str | None:
    base = socket_dir()
    return None if base is None else os.path.join(base, f"cmd-{server_key()}.sock")


def encode_request(argv: list[str]) -> bytes:
    """The command for the server: its arguments, umask and environment, NUL separated."""
    umask = os.umask(0o22)
    os.umask(umask)
    env = [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in os.environ.items()]
    fields = [b"%d" % len(argv), *[os.fsencode(a) for a in argv], b"%o" % umask, *env]
    body = b"\0".join(fields)
    return len(body).to_bytes(4, "big") + body


def decode_request(data: bytes) -> tuple[list[str], int, dict[str, str]]:
    """The inverse of encode_request (without its length); ValueError when malformed."""
    fields = data.split(b"\0")
    count = int(fields[0])
    if not 0 <= count <= len(fields) - 2:
        raise ValueError("bad argument count")
    argv = [os.fsdecode(a) for a in fields[1:1 + count]]
    umask = int(fields[1 + count], 8) & 0o777
    env = {}
    for item in fields[2 + count:]:
        name, sep, value = item.partition(b"=")
        if sep and name:
            env[os.fsdecode(name)] = os.fsdecode(value)
    return argv, umask, env


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of the unix socket `sock` (the kernel's word)."""
    import socket

    cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)  # pid, uid, gid
    return int.from_bytes(cred[4:8], sys.byteorder)


def ask_server(path: str, argv: list[str]) -> int | None:
    """Run `argv` in the server at `path`: its exit status, or None when no server of this
    account took the command (nothing was run)."""
    import socket

    request = encode_request(argv)
    if len(request) > MAX_REQUEST:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_SECONDS)
        try:
            sock.connect(path)
        except OSError:
            return None
        if peer_uid(sock) != os.getuid():
            return None
        here = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            sent = socket.send_fds(sock, [request], [0, 1, 2, here])
            sock.sendall(request[sent:])
        except OSError:
            return None
        finally:
            os.close(here)
        reader = sock.makefile("rb")
        try:
            ready = reader.readline()
            if not ready.startswith(b"P"):
                return None  # stale, or it ended before running anything
            # Only now may the child run the command: a client that gave up before this
            # line never sent it, and its child ends without running anything.
            sock.sendall(b"G")
        except OSError:
            return None
        sock.settimeout(None)
        _forward_signals(int(ready[1:]))
        try:
            ended = reader.readline()
        except OSError:
            ended = b""
        if ended.startswith(b"R"):
            return int(ended[1:])
        sys.stderr.write("jobstore: the command server ended the command without its exit status\n")
        return 1
    finally:
        sock.close()


def _forward_signals(pid: int) -> None:
    """Ctrl-C and friends reach this process: pass them on to the child that runs the command."""
    import signal

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(pid, signum)
        except OSError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, forward)


def start_server(path: str) -> None:
    """Leave a command server behind for the next command (it gives up at once when another
    one holds the place)."""
    import subprocess

    try:
        subprocess.Popen(
            [sys.executable, "-m", "jobstore.cli.commandserver", path],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            cwd="/", start_new_session=True, close_fds=True,
        )
    except OSError:
        pass


def hand_over() -> str | None:
    """Run this process's command in the account's command server and exit with its status,
    when a server takes it; else the socket a server should be started at afterwards (None:
    none, the command is not one a server runs, or the servers are off)."""
    argv = sys.argv[1:]
    if (os.geteuid() == 0 or os.geteuid() != os.getuid() or not served_command(argv)
            or os.environ.get("JOBSTORE_COMMAND_SERVER", "").lower() in OFF):
        return None
    path = socket_path()
    if path is not None:
        code = ask_server(path, argv)
        if code is not None:
            os._exit(code)
    return path
