"""A durable local spool for hook reports, so that no report is lost while the database is away.

A report is written to the spool *before* it is sent; once the database has it, the file is
removed. What is left (the database was down, the hook was killed) is replayed, oldest first, by
the next hook call of the same account or by `jobstore replay` (as root: every account's files).
Replaying twice is harmless: a report of a finished attempt is only recorded as stale.

The directory is shared by the job users of a node: mode 1733 (sticky, so nobody removes
another account's files, and not listable by others); each file is 0600 and only its owner or
root replays it. The files hold attempt tokens, so they are never world-readable.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUFFIX = ".report"
DIR_MODE = 0o1733
# A report taken by a process (a replayer, or the hook that wrote it and is sending it now).
_TAKEN = re.compile(r"^\.(.+\.report)\.(\d+)\.taking$")
# A report being written by `put` (name: time-pid-random), not yet renamed into place.
_WRITING = re.compile(r"^\.(\d+-(\d+)-[0-9a-f]+)\.tmp$")


class SpoolError(OSError):
    """The spool directory cannot be used safely."""


class NotMine(Exception):
    """Raised by a sender for a report that belongs to another job store: leave it, go on."""


@dataclass(frozen=True)
class Spooled:
    path: Path  # where the report waits while this replayer holds it
    original: Path  # where it goes back if it cannot be sent now
    record: dict[str, Any]


def ensure_dir(directory: Path) -> Path:
    """Create the spool directory (1733) or check an existing one is not a trap."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = directory.lstat()
        if not stat.S_ISDIR(st.st_mode):
            raise SpoolError(f"{directory} is not a directory")
        if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != DIR_MODE:
            os.chmod(directory, DIR_MODE)
        elif st.st_uid not in (0, os.geteuid()) and not st.st_mode & stat.S_ISVTX:
            raise SpoolError(f"{directory} belongs to another account and is not sticky")
    except SpoolError:
        raise
    except OSError as exc:
        raise SpoolError(f"spool {directory}: {exc.strerror}") from None
    return directory


def put(directory: Path, record: dict[str, Any]) -> Path:
    """Write `record` durably (write, fsync, rename); returns the file."""
    ensure_dir(directory)
    name = f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(8)}"
    tmp = directory / f".{name}.tmp"
    final = directory / f"{name}{SUFFIX}"
    data = json.dumps(record, separators=(",", ":")).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, final)
    _fsync_dir(directory)
    return final


def hold(directory: Path, record: dict[str, Any]) -> Spooled:
    """Write `record` durably, held by this process while it sends the report itself: replayers
    leave it alone until it is `release`d (sending failed) or its writer dies (killed)."""
    path = put(directory, record)
    taken = path.with_name(f".{path.name}.{os.getpid()}.taking")
    os.rename(path, taken)
    return Spooled(taken, path, record)


def release(item: Spooled) -> None:
    """Sending failed: leave the report in the spool for the next replay."""
    _put_back(item)


def done(path: Path) -> None:
    """The database has the report: forget it."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def pending(directory: Path) -> Iterator[Spooled]:
    """The reports this account may replay, oldest first; each is taken (renamed) before use,
    so two replayers never send the same file."""
    try:
        listing = os.listdir(directory)
    except OSError:
        return
    # (original name, current name): waiting reports, and reports taken by a process that died
    # (a hook killed while sending or replaying) which would otherwise never be sent.
    entries = []
    for n in listing:
        if n.endswith(SUFFIX) and not n.startswith("."):
            entries.append((n, n))
            continue
        m = _TAKEN.match(n)
        if m and int(m.group(2)) != os.getpid() and not _alive(int(m.group(2))):
            entries.append((m.group(1), n))
            continue
        m = _WRITING.match(n)
        if m and int(m.group(2)) != os.getpid() and not _alive(int(m.group(2))):
            recovered = _finish_write(directory, n, m.group(1) + SUFFIX)
            if recovered:
                entries.append((recovered, recovered))
    me = os.geteuid()
    for name, current in sorted(entries):
        path = directory / name
        try:
            if me != 0 and (directory / current).lstat().st_uid != me:
                continue
            taken = path.with_name(f".{name}.{os.getpid()}.taking")
            os.rename(directory / current, taken)
        except OSError:
            continue
        try:
            record = json.loads(taken.read_bytes())
        except (OSError, ValueError):
            _quarantine(taken)
            continue
        yield Spooled(taken, path, record)


def replay(
    directory: Path,
    send: Callable[[dict[str, Any]], None],
    *,
    limit: int = 100,
    deadline: float | None = None,
) -> tuple[int, int]:
    """Send spooled reports with `send` (which raises on failure). Returns (sent, left)."""
    sent = left = 0
    for item in pending(directory):
        if sent >= limit or (deadline is not None and time.monotonic() > deadline):
            _put_back(item)
            left += 1
            break
        try:
            send(item.record)
        except NotMine:
            _put_back(item)
            left += 1
            continue
        except Exception:
            _put_back(item)
            left += 1
            break  # the database is still away: keep the order, try again later
        done(item.path)
        sent += 1
    return sent, left


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another account's process
    return True


def _finish_write(directory: Path, tmp_name: str, final_name: str) -> str | None:
    """A writer killed before its rename: keep a complete report, drop a half-written one
    (its hook died before it could send anything)."""
    tmp = directory / tmp_name
    try:
        if os.geteuid() != 0 and tmp.lstat().st_uid != os.geteuid():
            return None
        json.loads(tmp.read_bytes())
    except (OSError, ValueError):
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return None
    try:
        os.rename(tmp, directory / final_name)
    except OSError:
        return None
    return final_name


def _put_back(item: Spooled) -> None:
    try:
        os.rename(item.path, item.original)
    except OSError:
        pass


def _quarantine(path: Path) -> None:
    try:
        os.rename(path, path.with_name(path.name.replace(".taking", ".bad")))
    except OSError:
        pass


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
