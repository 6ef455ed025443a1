"""Which job's stored ad each thread of the agent is reading (parsing its expressions with
libclassad), kept in a file that a crash of the process leaves behind: a job whose values made
the agent die twice is held at the next start, so that no node, and no pool, crashes on it in a
loop. The database's bounds (migration 0019) keep such values out; this is what is left if one
gets past them.

Each thread writes its own fixed-size slot of the file before it reads and blanks it after
(one pwrite each, no fsync: a crashed process's writes are in the page cache all the same).
Only a death by a fault of the process itself counts (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL:
what a crash in libclassad is), which Python's faulthandler writes down in `fault` as it
happens: a SIGKILL from outside (an admin, the OOM killer, condor_master) says nothing about the
jobs being read at that moment. Each reading thread gets a signal stack of its own, so that
the handler also runs for a stack overflow in it. A job counts once per death, however many
threads read it.
Standard library only."""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import json
import os
import shutil
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

SLOT = 96  # bytes per thread: "<keyword> <job id>", padded, and a newline
CRASHES_BEFORE_HOLD = 2
ALTERNATE_STACK = 64 * 1024  # bytes: where a reading thread's fault handler runs
_BLANK = b" " * (SLOT - 1) + b"\n"


class _Stack(ctypes.Structure):
    """sigaltstack(2)'s stack_t."""

    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int),
                ("ss_size", ctypes.c_size_t)]


class InFlight:
    """The journal in `directory` (the agent's own, mode 0700)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "reading"
        self.counts = directory / "crashed.json"
        self.fault = directory / "fault"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                           0o600)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._slots = 0
        self._fault_file: TextIO | None = None

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
        """What a run that died of a fault left marked, counted across runs: the jobs
        (keyword, id) marked in CRASHES_BEFORE_HOLD such runs, to hold now (forgotten here);
        the journal emptied, and this process's faults written down from now on. Call before
        any thread reads."""
        faulted = self._faulted()
        self._watch_faults()
        try:
            counts = json.loads(self.counts.read_text())
        except (OSError, ValueError):
            counts = {}
        if not isinstance(counts, dict):
            counts = {}
        size = os.fstat(self._fd).st_size
        data = os.pread(self._fd, size, 0) if size else b""
        marked = set()
        for raw in data.split(b"\n"):
            words = raw.decode("utf-8", "replace").split()
            if len(words) == 2 and words[1].isdigit():
                marked.add(f"{words[0]} {words[1]}")
        if faulted:
            for key in marked:
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

    def _faulted(self) -> bool:
        """Whether the run before this one died of a fault (faulthandler wrote in `fault`);
        anything but a file there is removed and says no."""
        try:
            fd = os.open(self.fault, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        except OSError:  # a symlink, or what cannot be opened
            self._remove_fault()
            return False
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return bool(os.read(fd, 1))
        finally:
            os.close(fd)
        self._remove_fault()
        return False

    def _remove_fault(self) -> None:
        if self.fault.is_dir() and not self.fault.is_symlink():
            shutil.rmtree(self.fault, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                self.fault.unlink()

    def _watch_faults(self) -> None:
        """From now on, a fault of this process writes its threads' stacks in `fault`."""
        fd = os.open(self.fault, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
        self._fault_file = os.fdopen(fd, "w")  # faulthandler needs it open while enabled
        faulthandler.enable(file=self._fault_file, all_threads=True)

    def clear(self) -> None:
        """Empty the journal: the process stops in order, so nothing it was reading crashed
        it."""
        os.ftruncate(self._fd, 0)
        if self._fault_file is not None:
            faulthandler.disable()
            self._fault_file.close()
            self._fault_file = None

    def _slot(self) -> int:
        slot = getattr(self._local, "slot", None)
        if slot is None:
            with self._lock:
                slot = self._local.slot = self._slots
                self._slots += 1
            self._local.stack = _alternate_stack()
        return int(slot)


def _alternate_stack() -> ctypes.Array[ctypes.c_char] | None:
    """A stack of the calling thread's own for the fault handler, so that a C stack overflow
    in this thread is written down too (faulthandler gives one to the thread that enables it
    only); the caller keeps it as long as the thread lives. None where it cannot be had."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        stack = ctypes.create_string_buffer(ALTERNATE_STACK)
        if libc.sigaltstack(ctypes.byref(_Stack(ctypes.addressof(stack), 0, ALTERNATE_STACK)),
                            None) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return stack


__all__ = ["CRASHES_BEFORE_HOLD", "InFlight"]
