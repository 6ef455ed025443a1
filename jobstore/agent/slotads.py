"""The slots this node's startd offered work to, published into the job store (`jobstore
status`): the newest ad of each slot the FETCH_WORK hook was given, upserted every
UPDATE_INTERVAL (the startd's own cadence for its collector), each visible for CLASSAD_LIFETIME
(a node that stops publishing drops out of view, as the collector expires an ad)."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from jobstore.agent.fetchwait import slot_name
from jobstore.db.slots import SlotRow
from jobstore.errors import AdError
from jobstore.formats.classads import get_str, parse_ad, sprint_ad

if TYPE_CHECKING:
    from jobstore.db.store import JobStore

# Never published: what could claim the slot.
_SECRET = frozenset({"claimid", "capability", "claimidlist", "childclaimids"})
_NAME_LINE = re.compile(rb"^\s*name\s*=", re.M | re.I)  # every line that sets a Name
log = logging.getLogger(__name__)


class SlotBoard:
    """The newest ad of each slot seen (thread-safe), and when they were last published."""

    def __init__(self, update_interval: float, lifetime: float) -> None:
        self.update_interval = update_interval
        self.lifetime = lifetime
        self._ads: dict[str, tuple[str, str]] = {}  # Name -> (Machine, ad text)
        self._unread: dict[str, bytes] = {}  # the newest stdin of each slot since the last read
        self._lock = threading.Lock()
        self._next = 0.0

    def seen(self, stdin: bytes) -> None:
        """A FETCH_WORK's stdin, the slot ad the startd wrote. The newest of each slot is kept
        as it came and read when the slots are published (ignored then unless it parses and
        has a Name), so that a fetch pays for no parse; an ad whose Name line is not the plain
        `Name = "..."` the startd writes is read at once."""
        key = slot_name(stdin)
        if not key or len(_NAME_LINE.findall(stdin)) != 1:
            self._take(stdin)
            return
        with self._lock:
            self._unread[key] = stdin

    def _read(self) -> None:
        """The ads seen since the last read: each slot's newest one, if it parses."""
        with self._lock:
            unread, self._unread = self._unread, {}
        for stdin in unread.values():
            try:
                self._take(stdin)
            except Exception as exc:  # one bad ad never keeps the others from being published
                log.warning("slot ad not kept: %s: %s", type(exc).__name__, exc)

    def _take(self, stdin: bytes) -> None:
        try:
            ad = parse_ad(stdin.decode("utf-8", "replace"))
        except AdError:
            return
        name = get_str(ad, "Name")
        if not name:
            return
        for key in [k for k in ad if k.lower() in _SECRET]:
            del ad[key]
        with self._lock:
            self._ads[name] = (get_str(ad, "Machine") or name.partition("@")[2], sprint_ad(ad))

    def due(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) >= self._next

    def publish(self, stores: Iterable[JobStore], now: float | None = None) -> int:
        """Upsert every slot seen into each store, expire the stale slots there; how many
        slots were published."""
        self._next = time.monotonic() + self.update_interval
        self._read()
        wall = time.time() if now is None else now
        with self._lock:
            rows = [SlotRow(name, machine, text, wall, wall + self.lifetime)
                    for name, (machine, text) in self._ads.items()]
        for store in stores:
            store.slots.publish_slots(rows)
            store.slots.expire_slots(now=wall)
        return len(rows)
