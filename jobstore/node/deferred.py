"""Reports the agent applies together with the attempt's next one.

The startd and the starter do not wait for REPLY_FETCH and UPDATE_JOB_INFO, so their reports
need not reach the database before their hook is answered. The agent keeps them, written
durably in the spool as every report is (spool.hold), and applies them in the transaction of
the attempt's next report that is waited for (PREPARE_JOB, JOB_EXIT), or after `delay` seconds
on their own, in one transaction with whatever else is due. A job's life then costs three
commits (the claim, PREPARE_JOB with REPLY_FETCH and the starter's first update, JOB_EXIT with
the update that saw the job start) instead of six, and every transition is still recorded, in
the order the hooks reported it, with the time they did.

Kept back: REPLY_FETCH's accept, an update before the job runs, and the first update with the
job's pid after a PREPARE_JOB this agent served (its start). Any other update with the pid is
applied at once: it is how a job whose attempt was stopped meanwhile is ended by its own user's
hook (hookproc.stop_job). An agent that
dies holding reports leaves them in the spool, where the next replay finds them.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from jobstore.core.states import Event
from jobstore.node import spool

MAX_PREPARED = 100_000  # attempts prepared here whose start this agent waits to see
MAX_PER_UID = 64  # reports kept back for one account at most (more are applied as they come)


@dataclass
class Pending:
    """A report kept back: what it is, where it waits in the spool, and its settings."""

    key: tuple[str, int, int]  # (keyword, job id, attempt)
    report: Any  # node.sending.Prepared: as the store applies it, its author checked
    spooled: spool.Spooled
    settings: Any  # node.config.Settings
    uid: int  # who sent it
    since: float = field(default_factory=time.monotonic)


class Deferred:
    """The reports kept back, by attempt, in the order they came."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self._lock = threading.Lock()
        self._pending: OrderedDict[tuple[str, int, int], list[Pending]] = OrderedDict()
        self._prepared: OrderedDict[Hashable, None] = OrderedDict()
        self._by_uid: dict[int, int] = {}

    def may_keep(self, key: tuple[str, int, int], event: Event, has_pid: bool,
                 uid: int) -> bool:
        """Whether a report of `event` about attempt `key` from account `uid` may wait: the
        first start after a PREPARE_JOB this agent served does (this remembers the
        PREPARE_JOBs), and none of an account that has MAX_PER_UID waiting."""
        with self._lock:
            if self._by_uid.get(uid, 0) >= MAX_PER_UID:
                return False
            if event in (Event.ACCEPT, Event.UPDATE) and not has_pid:
                return True
            if event == Event.PREPARE:
                self._prepared[key] = None
                while len(self._prepared) > MAX_PREPARED:
                    self._prepared.popitem(last=False)
            elif event == Event.START and key in self._prepared:
                del self._prepared[key]
                return True
        return False

    def keep(self, item: Pending) -> None:
        with self._lock:
            self._pending.setdefault(item.key, []).append(item)
            self._by_uid[item.uid] = self._by_uid.get(item.uid, 0) + 1

    def take(self, key: tuple[str, int, int]) -> list[Pending]:
        """The reports kept back about attempt `key`, for its next report's transaction."""
        with self._lock:
            return self._forget(self._pending.pop(key, []))

    def _forget(self, items: list[Pending]) -> list[Pending]:
        for item in items:
            left = self._by_uid.get(item.uid, 0) - 1
            if left > 0:
                self._by_uid[item.uid] = left
            else:
                self._by_uid.pop(item.uid, None)
        return items

    def due(self, now: float | None = None) -> list[Pending]:
        """The reports kept back for `delay` seconds or longer, with the rest of their
        attempt's."""
        now = time.monotonic() if now is None else now
        out: list[Pending] = []
        with self._lock:
            for key in [k for k, items in self._pending.items()
                        if now - items[0].since >= self.delay]:
                out.extend(self._forget(self._pending.pop(key)))
        return out

    def drain(self) -> list[Pending]:
        """Every report kept back (the agent stops)."""
        with self._lock:
            out = [item for items in self._pending.values() for item in items]
            self._pending.clear()
            self._by_uid.clear()
        return out

    def __len__(self) -> int:
        with self._lock:
            return sum(len(items) for items in self._pending.values())
