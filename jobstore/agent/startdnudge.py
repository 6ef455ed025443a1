"""A freshly started startd runs its slots' first FETCH_WORK only at its first periodic update
(UPDATE_INTERVAL, 300 s by default): entering Unclaimed does not try a fetch, only the periodic
evaluation of a slot's state does (startd/ResState.cpp), and that runs on the update timer. An
UPDATE_MACHINE_AD command makes the startd update at once (command.cpp caUpdateMachineAd ->
ResMgr::update_all -> every slot's eval_state -> Unclaimed: tryFetchWork). So the agent, started
with the startd by the condor_master, sends one (`condor_update_machine_ad`, with
`JobstoreAgentStartTime`) every NUDGE_EVERY seconds until it has served the startd's first fetch,
for at most NUDGE_FOR seconds. Each costs the startd one update of its ads to the collector.
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
NUDGE_EVERY = 5.0  # seconds between two tries, until the startd's first fetch
NUDGE_AGAIN = 60.0  # seconds after one the startd took, if no fetch came of it
NUDGE_FOR = 300.0  # seconds after the agent's start: then the startd's own timer has run


def nudge_startd(command: str, started: float, fetched: threading.Event,
                 stopping: Callable[[], bool]) -> int:
    """Send the startd UPDATE_MACHINE_AD with `command` until `fetched` is set (or NUDGE_FOR
    passed, or `stopping()`); the number of commands the startd took."""
    took, warned = 0, False
    fd, path = tempfile.mkstemp(prefix="jobstore-nudge-", suffix=".ad")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(f"JobstoreAgentStartTime = {int(started)}\n")
        while not fetched.is_set() and not stopping() and time.time() - started < NUDGE_FOR:
            try:
                done = subprocess.run([command, path], capture_output=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("startd not nudged to fetch (%s): %s", command, exc)
                return took
            if done.returncode == 0:
                took += 1
                log.info("startd nudged to fetch now (UPDATE_MACHINE_AD)")
                fetched.wait(NUDGE_AGAIN - NUDGE_EVERY)  # its fetches should come now
            elif not warned:
                warned = True  # the startd may not be up yet: say so once
                log.info("startd not nudged yet: %s", done.stderr.decode(
                    "utf-8", "replace").strip().splitlines()[-1:] or done.returncode)
            fetched.wait(NUDGE_EVERY)
        if fetched.is_set():
            log.info("the startd fetches: no more nudges")
    finally:
        os.unlink(path)
    return took
