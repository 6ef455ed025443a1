"""Files written on an owner's behalf: as root, by one child process per call that takes her
groups and her effective uid and gid (its real uid stays root's, so she can neither signal nor
trace it), each file by the rename of a whole one, the whole exchange under a deadline; as
anyone else, by this process itself."""

from __future__ import annotations

import json
import os
import pwd
import select
import signal
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

from jobstore.errors import NotWritten

IDLE = 30.0  # seconds the child may go without taking bytes, or ending once it has them all
HEADER_LIMIT = 16 * 1024  # bytes of one file's header line


class Wanted(NamedTuple):
    """One file to write: where, its mode, its size, and its bytes (read when it is written)."""

    dest: str
    mode: int
    size: int
    content: Callable[[], Iterable[bytes]]


def write_as(owner: str, files: Sequence[Wanted], budget: float | None = None) -> None:
    """Write `files` with `owner`'s rights (OSError: the first that could not be written, and
    why; those before it are written), as root within `budget` seconds in all."""
    if os.geteuid() != 0 or owner == "root":
        for f in files:
            write_whole(f.dest, f.content(), f.mode, f.size)
        return
    user = pwd.getpwnam(owner)
    data_r, data_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, measured by the tests through its effects
        _child(owner, user, data_r, err_w)
    os.close(data_r)
    os.close(err_w)
    stalled = False
    deadline = time.monotonic() + (budget if budget is not None else float("inf"))
    try:
        _feed(data_w, files, deadline)
    except BrokenPipeError:
        pass  # the child gave up: its reason follows
    except TimeoutError:
        stalled = True
        os.kill(pid, signal.SIGKILL)
    finally:
        os.close(data_w)
        why = _reason(err_r, pid)
    if stalled:
        why = (f"it took no bytes for {IDLE:g} s" if time.monotonic() < deadline
               else f"it took more than its {budget:g} s")
    if why is not None:
        raise NotWritten(f"not written as {owner}: {why}")


def write_whole(dest: str, chunks: Iterable[bytes], mode: int, size: int) -> None:
    """Write `size` bytes to `dest` by a rename of a whole file: fewer (a writer stopped
    midway) leave `dest` as it was."""
    directory = os.path.dirname(dest) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".jobstore-")
    try:
        got = 0
        with os.fdopen(fd, "wb") as f:
            for data in chunks:
                got += f.write(data)
        if got != size:
            raise OSError(f"{dest}: {got} of its {size} bytes came")
        os.chmod(tmp, mode & 0o755 | 0o600)
        os.replace(tmp, dest)
    except BaseException:
        os.unlink(tmp)
        raise


def _feed(fd: int, files: Sequence[Wanted], deadline: float) -> None:
    """Each file's header line, then its bytes, into the child's pipe; TimeoutError when the
    child takes nothing for IDLE seconds, or `deadline` passes."""
    os.set_blocking(fd, False)
    for f in files:
        header = json.dumps({"dest": f.dest, "mode": f.mode, "size": f.size}).encode() + b"\n"
        _send(fd, header, deadline)
        for data in f.content():
            _send(fd, data, deadline)


def _send(fd: int, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        wait = min(IDLE, deadline - time.monotonic())
        _, ready, _ = select.select([], [fd], [], max(wait, 0.0))
        if not ready:
            raise TimeoutError
        view = view[os.write(fd, view):]


def _reason(err_r: int, pid: int) -> str | None:
    """Why the child failed (None: it wrote everything), once it has ended; killed when it
    has not within IDLE seconds."""
    got = b""
    ended = False
    deadline = time.monotonic() + IDLE
    while not ended and (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([err_r], [], [], left)
        if not ready:
            break
        data = os.read(err_r, 1000)
        got = (got + data)[:1000]
        ended = not data  # its end of the pipe closes as it exits
    os.close(err_r)
    status = reap(pid, 1.0 if ended else 0.0)
    if not ended or status is None:
        return got.decode("utf-8", "replace") or f"it did not end within {IDLE:g} s"
    if status == 0:
        return None
    return got.decode("utf-8", "replace") or "failed"


LEFT: set[int] = set()  # children killed that had not ended yet: reaped once they have


def reap(pid: int, wait: float) -> int | None:
    """`pid`'s wait status once it ended within `wait` seconds; else it is killed, waited
    for a second more, and left to be reaped on a later call (None): a child stuck in the
    kernel on a file system that never answers cannot be waited for, and must not hold the
    caller."""
    for old in list(LEFT):
        try:
            if os.waitpid(old, os.WNOHANG)[0]:
                LEFT.discard(old)
        except ChildProcessError:
            LEFT.discard(old)
    deadline = time.monotonic() + wait
    killed = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return None if killed else status
        if time.monotonic() >= deadline:
            if killed:
                LEFT.add(pid)
                return None
            os.kill(pid, signal.SIGKILL)
            killed, deadline = True, time.monotonic() + 1.0
        time.sleep(0.01)


def _child(owner: str, user: pwd.struct_passwd, data_r: int, err_w: int) -> None:
    try:
        _close_others((data_r, err_w))
        os.initgroups(owner, user.pw_gid)
        os.setegid(user.pw_gid)
        os.seteuid(user.pw_uid)
        with os.fdopen(data_r, "rb") as source:
            for dest, mode, size in _headers(source):
                write_whole(dest, _body(source, size), mode, size)
        os._exit(0)
    except BaseException as exc:  # noqa: BLE001 - said to the parent, then gone
        os.write(err_w, str(exc).encode("utf-8", "replace")[:1000])
        os._exit(1)


def _headers(source: object) -> Iterator[tuple[str, int, int]]:
    read = source.readline  # type: ignore[attr-defined]
    while line := read(HEADER_LIMIT):
        header = json.loads(line)
        yield str(header["dest"]), int(header["mode"]), int(header["size"])


def _body(source: object, size: int) -> Iterator[bytes]:
    left = size
    while left > 0:
        data = source.read(min(left, 1 << 20))  # type: ignore[attr-defined]
        if not data:
            return
        left -= len(data)
        yield data


def _close_others(keep: tuple[int, ...]) -> None:
    """Close every descriptor above stderr but `keep` (the parent's database connections)."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
