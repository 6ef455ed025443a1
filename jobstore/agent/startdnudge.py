"""A startd runs its slots' first FETCH_WORK only at its first periodic update (UPDATE_INTERVAL,
300 s by default): entering Unclaimed does not try a fetch, only the periodic evaluation of a
slot's state does (startd/ResState.cpp), and that runs on the update timer. An UPDATE_MACHINE_AD
command makes the startd update at once (command.cpp caUpdateMachineAd -> ResMgr::update_all ->
every slot's eval_state -> Unclaimed: tryFetchWork). So the agent sends one
(`condor_update_machine_ad`, with `JobstoreAgentStartTime`) whenever the startd has gone quiet:
no fetch for QUIET seconds and none waiting in the agent, as at the agent's start, and after
the condor_master restarted a startd that died (seen on a real startd: the new one would not
fetch for 300 s). It tries every NUDGE_EVERY seconds until one is taken, then waits NUDGE_AGAIN
for the fetches it should bring. Each costs the startd one update of its ads to the collector;
a startd that fetches (FetchWorkDelay of 50-jobstore.conf: a slot fetches every second, or
waits in the agent) is never nudged.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable

log = logging.getLogger("jobstore.agent")
NUDGE_EVERY = 5.0  # seconds between two tries while the startd is quiet
STARVED_EVERY = 0.5  # seconds between two nudges for work no waiting fetch could take
FREED_FOR = 2.0  # seconds a slot whose job ended may wait for the startd's timer to fetch
NUDGE_AGAIN = 60.0  # seconds after one the startd took, if no fetch came of it
QUIET = 20.0  # seconds without a fetch, and none waiting, after which the startd is not fetching


class FetchActivity:
    """When the startd's last FETCH_WORK came, and how many wait in the agent now."""

    def __init__(self, waiting: Callable[[], int]) -> None:
        self._waiting = waiting
        self._last = float("-inf")
        self._came = threading.Condition()
        self._starved = False
        self._freed: dict[str, float] = {}  # slot -> when its job ended, until it fetches

    def seen(self, slot: str = "") -> None:
        """A FETCH_WORK call from the startd arrived (for `slot`)."""
        with self._came:
            self._last = time.monotonic()
            self._freed.pop(slot, None)
            self._came.notify_all()

    def freed(self, slot: str) -> None:
        """The job of `slot` ended: until its next fetch, it could take work it is not asking
        for (the startd fetches for it when its timer says)."""
        with self._came:
            self._freed[slot] = time.monotonic()

    def quiet(self) -> bool:
        return time.monotonic() - self._last > QUIET and self._waiting() == 0

    def starved(self) -> None:
        """Work came that no waiting fetch could take: if a slot's job has just ended (the slot
        Claimed/Idle, its next fetch up to a second away), it should fetch now. A node whose
        slots are all busy or waiting is never nudged for it."""
        with self._came:
            now = time.monotonic()
            self._freed = {s: t for s, t in self._freed.items() if now - t < FREED_FOR}
            if self._freed:
                self._starved = True
                self._came.notify_all()

    def take_starved(self, timeout: float) -> bool:
        """Whether work starved (since the last call), waiting up to `timeout` for it."""
        with self._came:
            self._came.wait_for(lambda: self._starved, timeout)
            starved, self._starved = self._starved, False
            return starved

    def came_since(self, since: float, timeout: float) -> bool:
        """Whether a fetch came after `since` (time.monotonic()), waiting up to `timeout`."""
        with self._came:
            return self._came.wait_for(lambda: self._last >= since, timeout)


def nudge_startd(command: str, started: float, fetches: FetchActivity,
                 stopping: Callable[[], bool]) -> int:
    """Send the startd UPDATE_MACHINE_AD with `command` whenever `fetches` is quiet, until
    `stopping()`; the number of commands the startd took."""
    took = 0
    fd, path = tempfile.mkstemp(prefix="jobstore-nudge-", suffix=".ad")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(f"JobstoreAgentStartTime = {int(started)}\n")
        spell = warned = False  # within one quiet spell: nudged, said why not
        last = float("-inf")  # the last nudge for starved work
        while not stopping():
            if not fetches.quiet():
                if spell:
                    log.info("the startd fetches: no more nudges")
                spell = warned = False
                if fetches.take_starved(NUDGE_EVERY):
                    time.sleep(max(0.0, last + STARVED_EVERY - time.monotonic()))
                    last = time.monotonic()
                    _send(command, path)
                continue
            asked = time.monotonic()
            try:
                done = subprocess.run([command, path], capture_output=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("startd not nudged to fetch (%s): %s", command, exc)
                return took
            if done.returncode == 0:
                took += 1
                spell = True
                log.info("startd nudged to fetch now (UPDATE_MACHINE_AD)")
                if fetches.came_since(asked, NUDGE_AGAIN - NUDGE_EVERY):
                    continue  # its fetches came
            elif not warned:
                warned = True  # the startd may not be up yet: say so once
                log.info("startd not nudged yet: %s", done.stderr.decode(
                    "utf-8", "replace").strip().splitlines()[-1:] or done.returncode)
            time.sleep(NUDGE_EVERY)
    finally:
        os.unlink(path)
    return took


def _send(command: str, path: str) -> None:
    """One UPDATE_MACHINE_AD for work that no waiting fetch could take (failures: debug only,
    the quiet spell's nudges say why the startd cannot be nudged)."""
    try:
        done = subprocess.run([command, path], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.debug("startd not nudged for waiting work: %s", exc)
        return
    if done.returncode != 0:
        log.debug("startd not nudged for waiting work: exit %d", done.returncode)
