"""Files read on an owner's behalf: a child process that takes her groups and her effective uid
and gid (as root; its real uid stays root's, so she can neither signal nor trace it) opens and
reads each file as she may, and sends its bytes to this process, which copies them into a
directory of its own. This process never opens nor reads a file of hers: what a file shows
depends on who reads it (/proc, for one), and she may change it while it is read. What the
child sends is checked as if she wrote it: names inside the sandbox, each file's size (taken
when it was opened) within the limits before its bytes are taken, at most MAX_FILES, the
whole exchange under a deadline."""

from __future__ import annotations

import json
import os
import pwd
import select
import signal
import stat
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from jobstore.api.ownerwrite import reap
from jobstore.errors import NotRead, SandboxError
from jobstore.node.sandbox import check_name

IDLE = 5.0  # seconds the child may go without sending a byte
BASE = 10.0  # seconds a read may take, and one more per RATE bytes it sends
RATE = 50 * (1 << 20)
HEADER_LIMIT = 16 * 1024  # bytes of one file's header line
MAX_FILES = 10_000  # files of one read (a directory's, at any depth)
CHUNK = 1 << 20


class Copied(NamedTuple):
    """One file read: its name in the sandbox, its mode, and this process's copy."""

    name: str
    mode: int
    path: str
    size: int


def read_as(owner: str | None, entries: Sequence[tuple[str, str]], into: Path,
            max_file: int, max_total: int) -> list[Copied]:
    """The files of `entries` ((path, name): a file under its name, a directory's files
    under it; name "" for a directory's contents), read with `owner`'s rights (None: this
    process's) and copied into the directory `into` (this process's own); at most
    `max_file` bytes each and `max_total` in all. NotRead (one line) for the first that
    cannot be read, or a child that says what no reader would."""
    user = pwd.getpwnam(owner) if owner is not None and os.geteuid() == 0 else None
    data_r, data_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, measured by the tests through its effects
        os.close(data_r)
        _child(owner, user, data_w, entries)
    os.close(data_w)
    try:
        with os.fdopen(data_r, "rb", buffering=0) as source:
            return _received(_Reader(source.fileno()), into, max_file, max_total)
    finally:
        reap(pid, 1.0)  # killed if it has not ended: the parent reads no further


class _Reader:
    """The child's bytes, each read waited for at most IDLE seconds and all of them by a
    deadline that grows with what was announced."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""
        self.deadline = time.monotonic() + BASE

    def _more(self) -> bytes:
        left = min(IDLE, self.deadline - time.monotonic())
        ready, _, _ = select.select([self.fd], [], [], max(left, 0.0))
        if not ready:
            raise NotRead("reading them took too long")
        return os.read(self.fd, CHUNK)

    def line(self) -> bytes:
        while b"\n" not in self.buffer:
            data = self._more()
            if not data:
                raise NotRead("the reader ended before it said why")
            self.buffer += data
            if len(self.buffer) > HEADER_LIMIT and b"\n" not in self.buffer[:HEADER_LIMIT]:
                raise NotRead("the reader said what no reader says")
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def chunks(self, size: int) -> Iterator[bytes]:
        left = size
        if self.buffer:
            head, self.buffer = self.buffer[:left], self.buffer[left:]
            left -= len(head)
            yield head
        while left > 0:
            data = self._more()
            if not data:
                raise NotRead("a file changed while it was read")
            if len(data) > left:
                data, self.buffer = data[:left], data[left:]
            left -= len(data)
            yield data


def _received(reader: _Reader, into: Path, max_file: int, max_total: int) -> list[Copied]:
    seen: dict[str, Copied] = {}
    total = 0
    while True:
        try:
            header = json.loads(reader.line())
            if not isinstance(header, dict):
                raise ValueError
        except ValueError:
            raise NotRead("the reader said what no reader says") from None
        if header.get("end") is True:
            return list(seen.values())
        if "error" in header:
            raise NotRead(" ".join(str(header["error"]).split())[:300])
        name, mode, size = header.get("name"), header.get("mode"), header.get("size")
        if not (isinstance(name, str) and isinstance(mode, int) and isinstance(size, int)
                and size >= 0):
            raise NotRead("the reader said what no reader says")
        _check_name(name)
        if name in seen:
            raise NotRead(f"{name} would be in the sandbox twice")
        if len(seen) >= MAX_FILES:
            raise NotRead(f"more than {MAX_FILES} files")
        if size > max_file:
            raise NotRead(f"{name} is {size / (1 << 20):.1f} MB, more than the "
                          f"{max_file >> 20} MB an input file may be (JOBSTORE_MAX_INPUT_FILE_MB)")
        total += size
        if total > max_total:
            raise NotRead(f"the node's inputs are more than the {max_total >> 20} MB a job "
                          "may store (JOBSTORE_MAX_INPUT_MB)")
        reader.deadline += size / RATE
        path = into / f"{len(seen)}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            for data in reader.chunks(size):
                out.write(data)
        seen[name] = Copied(name, mode & 0o755, str(path), size)


def _check_name(name: str) -> None:
    """NotRead for a name that is not UTF-8 or not inside the sandbox (sandbox.check_name)."""
    try:
        name.encode("utf-8")
        check_name(name)
    except UnicodeEncodeError:
        raise NotRead(f"{name!r} is not a name in the sandbox (not UTF-8)") from None
    except SandboxError as exc:
        raise NotRead(str(exc)) from None


def _child(owner: str | None, user: pwd.struct_passwd | None, data_w: int,
           entries: Sequence[tuple[str, str]]) -> None:
    try:
        os.closerange(3, data_w)
        os.closerange(data_w + 1, os.sysconf("SC_OPEN_MAX"))
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        if user is not None and owner is not None:
            os.initgroups(owner, user.pw_gid)
            os.setegid(user.pw_gid)
            os.seteuid(user.pw_uid)
        with os.fdopen(data_w, "wb") as out:
            try:
                for path, name in entries:
                    _send_entry(out, path, name)
                out.write(b'{"end": true}\n')
            except OSError as exc:
                where = f"{exc.filename}: " if exc.filename else ""
                out.write(json.dumps({"error": f"{where}{exc.strerror or exc}"}).encode()
                          + b"\n")
        os._exit(0)
    except BaseException:  # noqa: BLE001 - the parent sees the pipe end without a word
        os._exit(1)


def _send_entry(out: object, path: str, name: str) -> None:
    """A file under `name`, or each file of a directory under it."""
    fd = _open(path)
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        _send(out, fd, name or os.path.basename(path), path)
        return
    os.close(fd)

    def fail(exc: OSError) -> None:
        raise exc

    for top, dirs, files in os.walk(path, onerror=fail):
        dirs.sort()
        for leaf in sorted(files):
            full = os.path.join(top, leaf)
            rel = os.path.relpath(full, path)
            _send(out, _open(full), os.path.join(name, rel) if name else rel, full)


def _open(path: str) -> int:
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)


def _send(out: object, fd: int, name: str, path: str) -> None:
    """One file's header (its size as it is now) and as many bytes, read by this process."""
    write = out.write  # type: ignore[attr-defined]
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(0, "not a regular file", path)
        write(json.dumps({"name": name, "mode": st.st_mode, "size": st.st_size},
                         ensure_ascii=True).encode() + b"\n")
        left = st.st_size
        while left > 0:
            data = os.read(fd, min(CHUNK, left))
            if not data:
                raise OSError(0, "it changed while it was read", path)
            write(data)
            left -= len(data)
    finally:
        os.close(fd)


__all__ = ["Copied", "read_as"]
