"""The channels on which a job store that can announce its changes (`can_listen`) announces
them, and what a listener on one of them offers (the backend makes it: `listener`)."""

from __future__ import annotations

from typing import Protocol

CHANNEL = "jobstore_events"  # payload: the job id, or "cluster:N" once for all the submit
# events of cluster N (jobstore watch)
STOPS = "jobstore_stops"  # payload: the id of a handed-out job held or removed (the agents)
# payload: the shapes of new claimable work, `queue cpus memory disk`, comma separated, or `*`
# (migration 0018's triggers; the agents' waiting fetches)
WORK = "jobstore_work"


class Listener(Protocol):
    """A connection of its own that receives one channel's notifications."""

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
