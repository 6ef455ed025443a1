"""A durable local spool for hook reports, so that no report is lost while the database is away.

A report is written to the spool *before* it is sent; once the database has it, the file is
removed. What is left (the database was down, the hook was killed) is replayed, oldest first, by
the next hook call of the same account, by the agent, or by `jobstore replay` (as root: every
account's files).

Everything in the directory is untrusted: job users write their own files in it and may rewrite
them, other local users may put anything there they can create. So:

* the shared directory belongs to root with mode 1733 (sticky: nobody removes another account's
  files; not listable by others); root creates it, and moves aside and re-creates one that
  another account made or that has the wrong type, loudly. An ordinary account uses a directory
  only if root made it so, or if it lies in the account's own tree (a private one, 0700), and
  never a directory under a path another account could swap;
* a file is read only if it is a regular file with one link, owned by the reader (root: by
  anyone; the owner's uid goes with the record, so the sender knows who wrote it), at most
  MAX_RECORD bytes, opened with O_NOFOLLOW and O_NONBLOCK (a FIFO or a symlink never blocks or
  redirects the reader);
* a record that cannot be applied for any reason but "later" is quarantined (renamed `.bad`)
  and the replay goes on; what is not a regular file is removed by root.

Replaying twice is harmless: a report of a finished attempt is only recorded as stale.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from jobstore.errors import InvalidInput, SpoolError

SUFFIX = ".report"
DIR_MODE = 0o1733  # the shared directory (owned by root)
PRIVATE_MODE = 0o700  # an ordinary account's own directory
MAX_RECORD = 64 * 1024
# A report taken by a process (a replayer, or the hook that wrote it and is sending it now).
_TAKEN = re.compile(r"^\.(\d+-\d+-[0-9a-f]+\.report)\.(\d+)\.taking$")
# A report being written by `put` (name: time-pid-random), not yet renamed into place.
_WRITING = re.compile(r"^\.(\d+-(\d+)-[0-9a-f]+)\.tmp$")
_REPORT = re.compile(r"^\d+-\d+-[0-9a-f]+\.report$")
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Later:
    """A sender's answer for a report it cannot send now (its database is away): the report
    stays, and so do the reports after it in the same `group`, to keep their order."""

    why: str = ""


@dataclass(frozen=True)
class NotMine:
    """A sender's answer for a report about another job store's job: left, and the replay
    goes on."""


@dataclass(frozen=True)
class Spooled:
    path: Path  # where the report waits while this replayer holds it
    original: Path  # where it goes back if it cannot be sent now
    record: Any  # as decoded from JSON: check it before use
    uid: int  # the file's owner: who wrote it
    error: str | None = None  # why it cannot be read: to be quarantined


class Replayed(NamedTuple):
    sent: int
    left: int
    bad: int = 0  # quarantined (or removed: not a regular file)
    why_left: tuple[tuple[str, int], ...] = ()  # why the left ones were left, and how many
    busy: bool = False  # another replay of the spool was under way: this one sent nothing


# ---- the directory --------------------------------------------------------------------------


# A directory found safe, and its lstat then: (monotonic time until which that holds, identity).
# Only root and the account itself can change what was checked (its ancestors belong to them and
# nobody else may write there), so a check is taken as still true for a moment while the
# directory is the same one with the same owner and mode.
_SAFE: dict[tuple[str, int], tuple[float, tuple[int, int, int, int]]] = {}
SAFE_FOR = 1.0  # seconds


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_uid, st.st_mode


def ensure_dir(directory: Path) -> list[str]:
    """Make sure `directory` is safe to use for this process, creating or (as root) repairing
    it; returns what was repaired, one line each. SpoolError when it cannot be used."""
    directory = Path(directory)
    me = os.geteuid()
    key = (str(directory), me)
    known = _SAFE.get(key)
    if known is not None and time.monotonic() < known[0]:
        try:
            if _identity(os.lstat(directory)) == known[1]:
                return []
        except OSError:
            pass
    notes: list[str] = []
    try:
        if me == 0:  # make missing parents, but only below a path nobody else can swap
            existing = directory.parent
            while not existing.exists() and existing != existing.parent:
                existing = existing.parent
            _check_ancestors(Path(os.path.realpath(existing)), me)
            directory.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        parent = Path(os.path.realpath(directory.parent))
        _check_ancestors(parent, me)
        directory = parent / directory.name
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            _create(directory, me, parent)
            return notes
        if me == 0:
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
                aside = directory.with_name(f"{directory.name}.untrusted-{time.time_ns()}")
                os.rename(directory, aside)
                _create(directory, me, parent)
                notes.append(
                    f"spool {directory} was {_describe(st)}: moved aside to {aside.name}, "
                    "a new one made (its reports are not read)"
                )
            elif stat.S_IMODE(st.st_mode) != DIR_MODE:
                os.chmod(directory, DIR_MODE)
                notes.append(f"spool {directory} had mode {stat.S_IMODE(st.st_mode):o}: now 1733")
        elif not stat.S_ISDIR(st.st_mode):
            raise SpoolError(f"spool {directory} is not a directory; not used")
        elif st.st_uid == 0:
            if stat.S_IMODE(st.st_mode) != DIR_MODE:
                raise SpoolError(f"spool {directory} has mode {stat.S_IMODE(st.st_mode):o}, "
                                 "not 1733; not used")
        elif st.st_uid == me:
            if st.st_mode & 0o077:
                os.chmod(directory, PRIVATE_MODE)
                notes.append(f"spool {directory} was open to others: now 0700")
        else:
            raise SpoolError(f"spool {directory} belongs to uid {st.st_uid}, not root; not used")
    except SpoolError:
        _SAFE.pop(key, None)
        raise
    except OSError as exc:
        _SAFE.pop(key, None)
        raise SpoolError(f"spool {directory}: {exc.strerror or exc}") from None
    for note in notes:
        _log.error("%s", note)
    if not notes:
        _SAFE[key] = (time.monotonic() + SAFE_FOR, _identity(st))
    return notes


def _check_ancestors(path: Path, me: int) -> None:
    """Nobody but root and this account may replace `path` or any directory above it."""
    for p in (path, *path.parents):
        st = os.lstat(p)
        if st.st_uid not in (0, me):
            raise SpoolError(f"spool parent {p} belongs to uid {st.st_uid}; not used")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise SpoolError(f"spool parent {p} is writable by others; not used")


def _create(directory: Path, me: int, parent: Path) -> None:
    if me == 0:
        os.mkdir(directory, 0o700)
        os.chmod(directory, DIR_MODE)
    elif os.lstat(parent).st_uid == me:
        os.mkdir(directory, PRIVATE_MODE)
    else:
        raise SpoolError(f"spool {directory} does not exist (the jobstore agent, as root, "
                         "creates it); not used")


def _describe(st: os.stat_result) -> str:
    kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a directory"
    return f"{kind} of uid {st.st_uid}"


# ---- writing --------------------------------------------------------------------------------


def put(directory: Path, record: dict[str, Any]) -> Path:
    """Write `record` durably (write, fsync, rename); returns the file."""
    path = _report_path(directory)
    _write(record, path, path)
    return path


def hold(directory: Path, record: dict[str, Any]) -> Spooled:
    """Write `record` durably, held by this process while it sends the report itself: replayers
    leave it alone until it is `release`d (sending failed) or its writer dies (killed). It goes
    from its temporary name straight to its held one, so no replayer ever sees it unheld and
    sends it too."""
    path = _report_path(directory)
    taken = _taken(path)
    _write(record, path, taken)
    return Spooled(taken, path, record, os.geteuid())


def _report_path(directory: Path) -> Path:
    return directory / f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(8)}{SUFFIX}"


def _taken(path: Path) -> Path:
    """Where the report `path` waits while this process holds it (_TAKEN)."""
    return path.with_name(f".{path.name}.{os.getpid()}.taking")


def _write(record: dict[str, Any], path: Path, final: Path) -> None:
    """Write the report `path` to its temporary file (_WRITING), fsync it, and rename it to
    `final` (the report itself, or held: `_taken`)."""
    directory = path.parent
    ensure_dir(directory)
    tmp = path.with_name(f".{path.name.removesuffix(SUFFIX)}.tmp")
    data = json.dumps(record, separators=(",", ":")).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, final)
    _fsync_dir(directory)


def release(item: Spooled) -> None:
    """Sending failed: leave the report in the spool for the next replay."""
    _put_back(item)


def done(path: Path) -> None:
    """The database has the report: forget it."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# ---- reading --------------------------------------------------------------------------------


def pending(directory: Path, *, limit: int = 10_000) -> Iterator[Spooled]:
    """The reports this account may replay, oldest first (at most `limit` looked at); each is
    taken (renamed) before it is read, so two replayers never send the same file. Entries that
    cannot be reports are quarantined (root removes those that are not regular files)."""
    try:
        listing = os.listdir(directory)
    except OSError:
        return
    me = os.geteuid()
    # (original name, current name): waiting reports, and reports taken by a process that died
    # (a hook killed while sending or replaying) which would otherwise never be sent.
    entries = []
    for n in listing:
        if _REPORT.match(n):
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
    entries.sort()
    for name, current in entries[:limit]:
        path = directory / name
        try:
            if me != 0 and os.lstat(directory / current).st_uid != me:
                continue
            taken = _taken(path)
            os.rename(directory / current, taken)
        except OSError:
            continue
        try:
            data, uid = read_file(taken, None if me == 0 else me)
            record = json.loads(data)
        except (OSError, ValueError, RecursionError) as exc:
            yield Spooled(taken, path, None, -1, f"{type(exc).__name__}: {exc}")
            continue
        yield Spooled(taken, path, record, uid)


def read_file(path: Path, owner: int | None) -> tuple[bytes, int]:
    """The bytes of spool file `path` and its owner's uid, if it is a regular file with one
    link, owned by `owner` (any owner when None), of at most MAX_RECORD bytes; else OSError
    (ValueError for one that is too large)."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path.name} is not a regular file")
        if st.st_nlink != 1:
            raise OSError(f"{path.name} has {st.st_nlink} links")
        if owner is not None and st.st_uid != owner:
            raise OSError(f"{path.name} belongs to uid {st.st_uid}")
        if st.st_size > MAX_RECORD:
            raise InvalidInput(f"{path.name} is larger than {MAX_RECORD} bytes")
        chunks, total = [], 0
        while total <= MAX_RECORD:
            chunk = os.read(fd, MAX_RECORD + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > MAX_RECORD:
            raise InvalidInput(f"{path.name} is larger than {MAX_RECORD} bytes")
        return b"".join(chunks), st.st_uid
    finally:
        os.close(fd)


# The spool entries one replay may go through, quarantined ones included, and how many of its
# quarantines it logs one by one (the rest in one line).
MAX_LOOKED_AT = 1_000_000
LOGGED_QUARANTINES = 20


REPLAY_LOCK_WAIT = 5.0  # seconds a replay waits for another one of the same spool to end


def replay(
    directory: Path,
    send: Callable[[Any, int], Later | NotMine | None],
    *,
    limit: int = 100,
    deadline: float | None = None,
    group: Callable[[Any], object] = lambda record: None,
) -> Replayed:
    """Send spooled reports with `send(record, writer_uid)`, which returns None (sent), Later
    (keep it, and the rest of its `group`, for the next replay) or NotMine (leave it), or
    raises (the record cannot be applied: quarantined). Returns what was sent, left and
    quarantined.

    One replay of a spool at a time (an flock of the directory, which only the accounts that
    may list it can take), so that two replayers (a hook and the agent) never send one job's
    reports out of order; one that waited REPLAY_LOCK_WAIT for another sends nothing."""
    ensure_dir(directory)
    global _replaying
    with _replaying_lock:
        if not _replaying and _nothing_to_replay(directory):
            return Replayed(0, 0)
        _replaying += 1
    try:
        lock = _lock_replays(directory)
        if lock is None:
            return Replayed(0, 0, busy=True)
        try:
            return _replay(directory, send, limit=limit, deadline=deadline, group=group)
        finally:
            if lock >= 0:
                os.close(lock)
    finally:
        with _replaying_lock:
            _replaying -= 1


# Replays under way in this process (its threads): while one runs, the reports it has taken
# look like this process's own, so another thread waits for it rather than overtake them.
_replaying = 0
_replaying_lock = threading.Lock()


def _nothing_to_replay(directory: Path) -> bool:
    """Does `directory` hold nothing `pending` would take: no waiting report, and nothing
    another process holds or was writing? Read from the names alone."""
    try:
        listing = os.listdir(directory)
    except OSError:
        return False
    me = str(os.getpid())
    for name in listing:
        if _REPORT.match(name):
            return False
        m = _TAKEN.match(name) or _WRITING.match(name)
        if m and m.group(2) != me:
            return False
    return True


def _lock_replays(directory: Path) -> int | None:
    """The directory's descriptor, flocked for this replay; -1 when it cannot be opened (this
    account cannot list it either); None when another replay holds it past the wait."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return -1
    end = time.monotonic() + REPLAY_LOCK_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= end:
                os.close(fd)
                return None
            time.sleep(0.05)


def _replay(
    directory: Path,
    send: Callable[[Any, int], Later | NotMine | None],
    *,
    limit: int,
    deadline: float | None,
    group: Callable[[Any], object],
) -> Replayed:
    sent = left = bad = 0
    away: set[object] = set()
    why: dict[str, int] = {}

    def leave(item: Spooled, reason: str) -> None:
        nonlocal left
        _put_back(item)
        left += 1
        why[reason] = why.get(reason, 0) + 1

    # at most `most` records sent or left; quarantined ones are not counted: a flood of
    # unusable or foreign ones is cleared in one replay, and never keeps the genuine ones
    # behind it from being looked at
    most = max(limit, 1) * 4
    for item in pending(directory, limit=MAX_LOOKED_AT):
        if item.error is not None:
            quarantine(item.path, item.error, logged=bad < LOGGED_QUARANTINES)
            bad += 1
            continue
        if sent + left >= most or sent >= limit or (
                deadline is not None and time.monotonic() > deadline):
            leave(item, "this replay's limit reached (the next replay sends them)")
            break
        try:
            key = group(item.record)
        except Exception:
            key = None
        if key in away:
            leave(item, "an earlier report of the same job could not be sent (kept in order)")
            continue
        try:
            unsent = send(item.record, item.uid)
        except Exception as exc:
            quarantine(item.path, f"{type(exc).__name__}: {exc}",
                       logged=bad < LOGGED_QUARANTINES)
            bad += 1
            continue
        if isinstance(unsent, NotMine):
            leave(item, "about a job of another job store (its keyword's replay sends it)")
            continue
        if isinstance(unsent, Later):
            leave(item, f"its database is away: {unsent.why}" if unsent.why
                  else "its database is away")
            away.add(key)
            continue
        done(item.path)
        sent += 1
    if bad > LOGGED_QUARANTINES:
        _log.warning("spool: %d more reports quarantined", bad - LOGGED_QUARANTINES)
    return Replayed(sent, left, bad, tuple(sorted(why.items(), key=lambda kv: -kv[1])))


def quarantine(path: Path, why: str, *, logged: bool = True) -> None:
    """Keep a report that cannot be applied out of every later replay (root removes what is
    not a regular file: it cannot be a report)."""
    if logged:
        _log.warning("spool: %s not applied, quarantined: %s", path.name,
                     why[:300].replace("\n", " "))
    try:
        st = os.lstat(path)
        if os.geteuid() == 0 and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
            os.unlink(path)
            return
        name = path.name.removesuffix(".taking").lstrip(".")
        os.rename(path, path.with_name(f".{name}.bad"))
    except OSError:
        pass


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
    me = os.geteuid()
    try:
        if me != 0 and os.lstat(tmp).st_uid != me:
            return None
        data, _ = read_file(tmp, None if me == 0 else me)
    except (OSError, ValueError) as exc:
        quarantine(tmp, f"unfinished write: {exc}")
        return None
    try:
        json.loads(data)
    except (ValueError, RecursionError):
        done(tmp)  # half-written: its hook died before it could send anything
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


class Depth(NamedTuple):
    """The reports waiting in a spool directory, and when the oldest was written."""

    reports: int
    oldest: float | None  # epoch seconds


def depth(directory: Path) -> Depth:
    """How many reports wait in `directory` (also those being sent) and the time of the oldest,
    read from the names alone: no file is opened or followed."""
    try:
        listing = os.listdir(directory)
    except OSError:
        return Depth(0, None)
    stamps = []
    for name in listing:
        taken = _TAKEN.match(name)
        if taken or _REPORT.match(name):
            stamps.append(int((taken.group(1) if taken else name).split("-", 1)[0]))
    return Depth(len(stamps), min(stamps) / 1e9 if stamps else None)
