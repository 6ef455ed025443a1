"""Which job's stored ad each thread of the agent is reading (parsing its expressions with
libclassad), kept in a file that a crash of the process leaves behind: a job whose values made
the agent die twice is held at the next start, so that no node, and no pool, crashes on it in a
loop. The database's bounds (migration 0019) keep such values out; this is what is left if one
gets past them.

Each thread writes its own fixed-size slot of the file before it reads and blanks it after
(one pwrite each, no fsync: a crashed process's writes are in the page cache all the same).
Standard library only."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

SLOT = 96  # bytes per thread: "<keyword> <job id>", padded, and a newline
CRASHES_BEFORE_HOLD = 2
_BLANK = b" " * (SLOT - 1) + b"\n"


class InFlight:
    """The journal in `directory` (the agent's own, mode 0700)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "reading"
        self.counts = directory / "crashed.json"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                           0o600)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._slots = 0

    @contextlib.contextmanager
    def reading(self, keyword: str, job_id: int) -> Iterator[None]:
        """Mark the calling thread as reading `job_id`'s ad while the block runs."""
        slot = self._slot()
        line = f"{keyword} {job_id}".encode()[:SLOT - 1].ljust(SLOT - 1) + b"\n"
        os.pwrite(self._fd, line, slot * SLOT)
        try:
            yield
        finally:
            os.pwrite(self._fd, _BLANK, slot * SLOT)

    def crashed(self) -> list[tuple[str, int]]:
        """What a run that died left marked, counted across runs: the jobs (keyword, id)
        marked CRASHES_BEFORE_HOLD times, to hold now (forgotten here); the journal emptied.
        Call before any thread reads."""
        try:
            counts = json.loads(self.counts.read_text())
        except (OSError, ValueError):
            counts = {}
        if not isinstance(counts, dict):
            counts = {}
        size = os.fstat(self._fd).st_size
        data = os.pread(self._fd, size, 0) if size else b""
        for raw in data.split(b"\n"):
            words = raw.decode("utf-8", "replace").split()
            if len(words) == 2 and words[1].isdigit():
                key = f"{words[0]} {words[1]}"
                counts[key] = int(counts.get(key, 0)) + 1
        os.ftruncate(self._fd, 0)
        due = [key for key, n in counts.items() if int(n) >= CRASHES_BEFORE_HOLD]
        for key in due:
            del counts[key]
        temp = self.counts.with_name(self.counts.name + ".new")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(counts, out)
        os.replace(temp, self.counts)
        return [(key.split()[0], int(key.split()[1])) for key in due]

    def clear(self) -> None:
        """Empty the journal: the process stops in order, so nothing it was reading crashed
        it."""
        os.ftruncate(self._fd, 0)

    def _slot(self) -> int:
        slot = getattr(self._local, "slot", None)
        if slot is None:
            with self._lock:
                slot = self._local.slot = self._slots
                self._slots += 1
        return int(slot)


__all__ = ["CRASHES_BEFORE_HOLD", "InFlight"]
