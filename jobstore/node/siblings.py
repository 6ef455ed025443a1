"""A starter hook that ends the job's life waits for its sibling hooks to end first.

HTCondor's starter does not wait for UPDATE_JOB_INFO (it is fire and forget), so the one it
starts with the job's pid is often still starting when a short job has ended, JOB_EXIT has
answered and the starter exits. The startd then finds a process left in the starter's family,
kills it, and sleeps a second at a time, its whole daemon with it (every slot's fetches and
starters wait), until the kernel has reaped it: up to 2 s (condor_startd.V6/claim.cpp,
Claim::starterExited). So JOB_EXIT lets the starter's UPDATE_JOB_INFO hooks finish first, within
a bound; their report is then also recorded before the exit, in the order things happened.
A sibling is a hook of the same starter: a child of the same parent whose environment names the
same scratch directory (_CONDOR_SCRATCH_DIR), so that where one process starts every slot's
hooks (the emulator) a JOB_EXIT does not wait for other slots'.

Standard library only: the hooks' hot path imports it.
"""

from __future__ import annotations

import os
import sys
import time

WAIT_SECONDS = 2.0
POLL_SECONDS = 0.005


def children(parent: int) -> list[int]:
    """The pids of `parent`'s children (its main thread's, which is where the starter spawns
    its hooks); [] when the kernel does not say."""
    try:
        with open(f"/proc/{parent}/task/{parent}/children", "rb") as fh:
            return [int(p) for p in fh.read().split()]
    except (OSError, ValueError):
        return []


def runs(pid: int, path: bytes, scratch: bytes | None = None) -> bool:
    """Whether process `pid` runs the script `path` (a hook: `python -sS PATH ...`), with
    `scratch` as its _CONDOR_SCRATCH_DIR when that is given (an environment that cannot be read
    counts as the same)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read(4096).split(b"\0")
    except OSError:
        return False
    if path not in argv[:4]:
        return False
    if scratch is None:
        return True
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read().split(b"\0")
    except OSError:
        return True
    return b"_CONDOR_SCRATCH_DIR=" + scratch in env


def wait_for(name: str, seconds: float = WAIT_SECONDS) -> None:
    """Wait, at most `seconds`, until no sibling (of the same starter) runs the hook `name` of
    this hook's directory."""
    me, parent = os.getpid(), os.getppid()
    if parent <= 1:
        return
    path = os.fsencode(os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), name))
    scratch = os.environb.get(b"_CONDOR_SCRATCH_DIR")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not any(pid != me and runs(pid, path, scratch) for pid in children(parent)):
            return
        time.sleep(POLL_SECONDS)
