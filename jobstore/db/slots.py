"""The slots of the pool as their nodes' agents last published them (`jobstore status`, `q
-better-analyze`): one row per slot, upserted every UPDATE_INTERVAL, expired after its
lifetime as the collector expires an ad."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy import delete, select

from jobstore.db.schema import slots
from jobstore.db.transactions import Transactions


class SlotRow(NamedTuple):
    """One published slot: its Name, Machine, ad (old ClassAd syntax, as the startd wrote it)
    and when it was published and expires."""

    name: str
    machine: str
    ad: str
    updated_at: float
    expires_at: float


class SlotAds:
    """Writes and reads of the `slots` table."""

    def __init__(self, db: Transactions) -> None:
        self.db = db

    def publish_slots(self, rows: Sequence[SlotRow]) -> None:
        """Upsert `rows` in one transaction (one statement per row on SQLite)."""
        if not rows:
            return
        values = [row._asdict() for row in rows]
        with self.db.transaction() as conn:
            self.db.backend.upsert(conn, slots, values, "name",
                                ("machine", "ad", "updated_at", "expires_at"))

    def live_slots(self, *, now: float | None = None) -> list[SlotRow]:
        """The slots whose ads have not expired, by name."""
        now = time.time() if now is None else now
        q = select(slots).where(slots.c.expires_at > now).order_by(slots.c.name)
        with self.db.transaction() as conn:
            return [SlotRow(**r._mapping) for r in conn.execute(q)]

    def expire_slots(self, *, now: float | None = None) -> int:
        """Delete the slots whose ads expired; how many."""
        now = time.time() if now is None else now
        with self.db.transaction() as conn:
            return int(conn.execute(delete(slots).where(slots.c.expires_at <= now)).rowcount)


__all__ = ["SlotAds", "SlotRow"]
