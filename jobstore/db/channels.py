"""The channels on which a job store that can announce its changes (`can_listen`) announces
them, and what a listener on one of them offers (the backend makes it: `listener`)."""

from __future__ import annotations

import hashlib
import hmac
from typing import Protocol

CHANNEL = "jobstore_events"  # payload: the job id, or "cluster:N" once for all the submit
# events of cluster N (jobstore watch)
STOPS = "jobstore_stops"  # payload: the id of a handed-out job held or removed (the agents)
# payload: the shapes of new claimable work, `queue cpus memory disk`, comma separated, or `*`
# (migration 0018's triggers; the agents' waiting fetches)
WORK = "jobstore_work"
# What the agents act on, signed by the database (migration 0019: jobstore_sign): anyone who may
# connect may NOTIFY, and a listener takes only what carries the key's mac
SIGNED = frozenset({STOPS, WORK})
FRESH_MS = 60_000  # a signed notification older (or newer) than this by the listener's clock
MAC_DIGITS = 32


def mac(key: str, ms: str, xid: str, payload: str) -> str:
    """The mac of a signed notification (jobstore_sign's)."""
    inner = hashlib.sha256(f"{key}{ms} {xid} {payload}".encode()).hexdigest()
    return hashlib.sha256(f"{key}{inner}".encode()).hexdigest()[:MAC_DIGITS]


def verified(key: str, text: str, now_ms: int) -> tuple[str, str] | None:
    """The payload of a signed notification, and what tells it from a replay (its time,
    transaction and mac); None when it is not signed with `key`, or is stale."""
    parts = text.split(" ", 3)
    if len(parts) != 4 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    ms, xid, got, payload = parts
    if abs(now_ms - int(ms)) > FRESH_MS:
        return None
    if not hmac.compare_digest(got, mac(key, ms, xid, payload)):
        return None
    return payload, f"{ms} {xid} {got}"


class Listener(Protocol):
    """A connection of its own that receives one channel's notifications (of a SIGNED
    channel, only those the database signed, each once)."""

    forged: int  # notifications of a signed channel dropped (not signed, or replayed)

    def open(self) -> None:
        """Connect and listen."""

    def probe(self, timeout: float = 3.0) -> bool:
        """Does a notification sent from another connection arrive? (Not behind a pooler in
        transaction mode.)"""

    def wait(self, timeout: float) -> list[str]:
        """The payloads that arrive within `timeout` (all that are queued)."""

    def fileno(self) -> int | None:
        """The connection's socket, to select on; None when closed."""

    def close(self) -> None:
        """Disconnect (again is harmless)."""
