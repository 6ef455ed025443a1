"""The sandbox root of a node: the directory under which fetched jobs with file
transfer get their sandboxes, made by the agent (as root: root's, mode 1777 like /tmp, so that
each job's user can make her sandbox there and nobody can rename another's), checked by the
hooks (jobstore.node.sandbox.check_root); and what a crash left there, swept."""

from __future__ import annotations

import os
import re
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path

ROOT_MODE = 0o1777  # as root: every job's user makes her sandbox here, sticky
OWN_MODE = 0o755  # an ordinary account's node (everything runs as that account)
OUTBOX = ".jobstore-outbox"  # the agent's own: sandboxes whose outputs it sends (agent.outbox)
CACHE = ".jobstore-cache"  # the agent's own: the node's copies of inputs (node.inputcache)
UPLOADS = ".jobstore-uploads"  # the agent's own: outputs on their way into the store
INFLIGHT = ".jobstore-inflight"  # the agent's own: the jobs it reads (node.inflight)


def ensure_root(directory: str) -> list[str]:
    """Make `directory` a sandbox root this process's hooks accept, creating or (as root)
    repairing it; what was repaired, one line each. OSError when it cannot be made."""
    path = Path(directory)
    me = os.geteuid()
    mode = ROOT_MODE if me == 0 else OWN_MODE
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    notes: list[str] = []
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        os.mkdir(path, 0o700)
        os.chmod(path, mode)
        return notes
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != me:
        if me != 0:
            raise OSError(f"the sandbox root {path} is not a directory of uid {me}")
        aside = path.with_name(f"{path.name}.untrusted-{time.time_ns()}")
        os.rename(path, aside)
        os.mkdir(path, 0o700)
        os.chmod(path, mode)
        notes.append(f"sandbox root {path} was not root's directory: moved aside to "
                     f"{aside.name}, a new one made")
    elif stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
        notes.append(f"sandbox root {path} had mode {stat.S_IMODE(st.st_mode):o}: now {mode:o}")
    return notes


def ensure_outbox(directory: str) -> Path:
    """The agent's outbox under the sandbox root `directory` (ensure_private)."""
    return ensure_private(directory, OUTBOX)


def ensure_private(directory: str, name: str) -> Path:
    """The agent's own directory `name` under the sandbox root `directory`: mode 0700, so that
    no job's user can reach what is there; one made by another account is moved aside."""
    path = Path(directory) / name
    try:
        os.mkdir(path, 0o700)
        return path
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.chmod(path, 0o700)
        return path
    os.rename(path, path.with_name(f"{name}.untrusted-{time.time_ns()}"))
    os.mkdir(path, 0o700)
    return path


_ATTEMPT_DIR = re.compile(r"(\d+)\.(\d+)\.(\d+)-[0-9a-f]{16}")


def sweep(directory: str, current: Callable[[int, int], int | None], older_than: float,
          now: float | None = None) -> list[str]:
    """Remove the sandboxes a crash left under the root `directory`: those of attempts that
    are not their job's current one (`current(cluster, proc)`: the attempt handed out, else
    None) and untouched for `older_than` seconds (by then no slot can still run them); and the
    uploads untouched as long. The names of those removed."""
    now = time.time() if now is None else now
    removed = []
    with os.scandir(directory) as entries:
        for entry in entries:
            found = _ATTEMPT_DIR.fullmatch(entry.name)
            if not found or not entry.is_dir(follow_symlinks=False):
                continue
            if now - entry.stat(follow_symlinks=False).st_mtime < older_than:
                continue
            cluster, proc, attempt = (int(g) for g in found.groups())
            if current(cluster, proc) == attempt:
                continue
            shutil.rmtree(entry.path, ignore_errors=True)  # never through a link (fd-based)
            removed.append(entry.name)
    uploads = os.path.join(directory, UPLOADS)
    if os.path.isdir(uploads):  # the pieces of outputs whose sending stopped half-way
        with os.scandir(uploads) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and now - st.st_mtime >= older_than:
                    os.unlink(entry.path)
                    removed.append(f"{UPLOADS}/{entry.name}")
    return removed
