"""Files read on an owner's behalf: as root, a child process that takes her groups and her
effective uid and gid (its real uid stays root's, so she can neither signal nor trace it) opens
each file as she may, and hands the open file to this process over a socket pair; as anyone
else, this process opens them itself. What the child says is checked as if she wrote it: names
inside the sandbox, regular files only, at most MAX_FILES, the whole exchange under a
deadline."""

from __future__ import annotations

import json
import os
import pwd
import select
import signal
import socket
import stat
import time
from collections.abc import Generator, Iterator, Sequence
from typing import NamedTuple

from jobstore.errors import NotRead

IDLE = 30.0  # seconds the child may take to open its next file
HEADER_LIMIT = 16 * 1024  # bytes of one file's header
MAX_FILES = 10_000  # files of one read (a directory's, at any depth)
MAX_NAME = 4096


class Opened(NamedTuple):
    """One file read: its name in the sandbox, its mode, and a descriptor open on it (closed
    when the next one is read)."""

    name: str
    mode: int
    fd: int


def read_as(owner: str | None, entries: Sequence[tuple[str, str]],
            budget: float) -> Generator[Opened, None, None]:
    """The files of `entries` ((path, name): a file under its name, a directory's files
    under it; name "" for a directory's contents), each opened with `owner`'s rights (None:
    this process's), within `budget` seconds in all. NotRead (one line) for the first
    that cannot be read, or a child that says what no reader would."""
    if owner is None or os.geteuid() != 0 or owner == "root":
        yield from _checked(_opened(entries), time.monotonic() + budget)
        return
    user = pwd.getpwnam(owner)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, measured by the tests through its effects
        mine.close()
        _child(owner, user, theirs, entries)
    theirs.close()
    try:
        yield from _checked(_received(mine, time.monotonic() + budget, owner),
                            time.monotonic() + budget)
    finally:
        mine.close()
        _reap(pid)


def _checked(found: Iterator[Opened], deadline: float) -> Iterator[Opened]:
    """The files as they come, each checked (a regular file, a name inside the sandbox, none
    twice), each closed when the next is read."""
    seen: set[str] = set()
    for opened in found:
        try:
            _check_name(opened.name)
            if opened.name in seen:
                raise NotRead(f"{opened.name} would be in the sandbox twice")
            if len(seen) >= MAX_FILES:
                raise NotRead(f"more than {MAX_FILES} files")
            if time.monotonic() > deadline:
                raise NotRead("reading them took too long")
            if not stat.S_ISREG(os.fstat(opened.fd).st_mode):
                raise NotRead(f"{opened.name}: not a regular file")
            seen.add(opened.name)
            yield Opened(opened.name, opened.mode & 0o755, opened.fd)
        finally:
            os.close(opened.fd)


def _check_name(name: str) -> None:
    parts = name.split("/")
    if (not name or len(name) > MAX_NAME or name.startswith("/") or ".." in parts
            or "" in parts or "." in parts or any(ord(c) < 32 or c == "\x7f" for c in name)):
        raise NotRead(f"{name!r} is not a name in the sandbox")


def _opened(entries: Sequence[tuple[str, str]]) -> Iterator[Opened]:
    """Each file of `entries`, opened by this process (what the child does as her)."""
    for path, name in entries:
        try:
            fd = _open(path)
        except OSError as exc:
            raise NotRead(f"{path}: {exc.strerror or exc}") from None
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            yield Opened(name or os.path.basename(path), os.fstat(fd).st_mode, fd)
            continue
        os.close(fd)
        for top, dirs, files in os.walk(path, onerror=_raise):
            dirs.sort()
            for leaf in sorted(files):
                full = os.path.join(top, leaf)
                rel = os.path.relpath(full, path)
                try:
                    fd = _open(full)
                except OSError as exc:
                    raise NotRead(f"{full}: {exc.strerror or exc}") from None
                yield Opened(os.path.join(name, rel) if name else rel, os.fstat(fd).st_mode, fd)


def _open(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)


def _raise(exc: OSError) -> None:
    raise NotRead(f"{exc.filename}: {exc.strerror or exc}")


def _received(sock: socket.socket, deadline: float, owner: str) -> Iterator[Opened]:
    """The files the child hands over, until it says it is done; NotRead when it says
    why it cannot, stalls, or hands over what is not one file with its header."""
    while True:
        left = min(IDLE, deadline - time.monotonic())
        ready, _, _ = select.select([sock], [], [], max(left, 0.0))
        if not ready:
            raise NotRead(f"not read as {owner}: it took too long")
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, HEADER_LIMIT, 1)
        except OSError as exc:
            raise NotRead(f"not read as {owner}: {exc.strerror or exc}") from None
        try:
            header = json.loads(data) if data else {"error": "it ended without a word"}
            if not isinstance(header, dict):
                raise ValueError("not a header")
        except ValueError:
            header = {"error": "it said what no reader says"}
        if header.get("end") is True and not fds:
            return
        if "error" in header or len(fds) != 1 or not isinstance(header.get("name"), str) \
                or not isinstance(header.get("mode"), int):
            for fd in fds:
                os.close(fd)
            why = header.get("error") or "it said what no reader says"
            raise NotRead(" ".join(str(why).split())[:300])
        yield Opened(str(header["name"]), int(header["mode"]), fds[0])


def _child(owner: str, user: pwd.struct_passwd, sock: socket.socket,
           entries: Sequence[tuple[str, str]]) -> None:
    try:
        keep = sock.fileno()
        os.closerange(3, keep)
        os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
        os.initgroups(owner, user.pw_gid)
        os.setegid(user.pw_gid)
        os.seteuid(user.pw_uid)
        for opened in _opened(entries):
            socket.send_fds(sock, [json.dumps({"name": opened.name,
                                               "mode": opened.mode}).encode()], [opened.fd])
            os.close(opened.fd)
        sock.send(json.dumps({"end": True}).encode())
        os._exit(0)
    except BaseException as exc:  # noqa: BLE001 - said to the parent, then gone
        try:
            sock.send(json.dumps({"error": str(exc)[:1000]}).encode())
        finally:
            os._exit(1)


def _reap(pid: int) -> None:
    """Wait for the child, killed if it has not ended (the parent read no further)."""
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


__all__ = ["Opened", "read_as"]
