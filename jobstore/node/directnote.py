"""A hook that did its work itself (direct mode) although the configuration names an agent says
so: a line in the hook log at most once every NOTE_SECONDS, and a note beside the log (its name
plus `.direct`) that the agent's metrics and `jobstore agent --check` read.

Standard library only: the hooks' hot path imports it.
"""

from __future__ import annotations

import os
import time

from jobstore.node.hookproc import append_hook_log, log_entry, one_line, write_all

SUFFIX = ".direct"
NOTE_SECONDS = 600.0
MAX_NOTE = 4096


def note(hook_log: str | None, hook: str, socket_path: str, why: str) -> None:
    """Say that `hook` found no agent at `socket_path` (`why`), unless said in the last
    NOTE_SECONDS or this account may not write beside the hook log (a job user's starter hook)."""
    if not hook_log:
        return
    marker = hook_log + SUFFIX
    now = time.time()
    try:
        if now - os.lstat(marker).st_mtime < NOTE_SECONDS:
            return
    except OSError:
        pass
    text = one_line(f"no jobstore agent at {socket_path} ({why}): each hook imports the package "
                    "and connects to the database itself (direct mode)")
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
    except OSError:
        return
    try:
        write_all(fd, f"{int(now)} {hook}: {text}\n".encode("utf-8", "replace"))
    finally:
        os.close(fd)
    append_hook_log(hook_log, log_entry(hook, os.getpid(), text))


def last(hook_log: str | None) -> tuple[float, str] | None:
    """When hooks last said so, and what (None: never, or no hook log)."""
    if not hook_log:
        return None
    try:
        fd = os.open(hook_log + SUFFIX, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        raw = os.read(fd, MAX_NOTE)
    except OSError:  # not a file (a FIFO, a directory)
        return None
    finally:
        os.close(fd)
    stamp, _, said = raw.decode("utf-8", "replace").partition(" ")
    try:
        when = float(stamp)
    except ValueError:
        return None
    if not 0 <= when < 1e11:  # NaN, or not a time
        return None
    return when, "".join(c if c.isprintable() else "?" for c in one_line(said.strip()))
