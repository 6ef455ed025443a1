"""Where a follower of job_events stands (`event_cursors`), kept so that a restarted one goes
on where it stopped: the last id it handled, and the lower ids it has not seen yet that a
transaction still running may commit (jobstore.api.feed)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import select

from jobstore.db.schema import event_cursors
from jobstore.db.transactions import Transactions

MAX_GAPS = 10_000  # kept of a cursor's gaps; past them the cursor is kept lower


@dataclass(frozen=True)
class EventCursor:
    """Every event id up to `high` was handled, but `gaps` (id -> the horizon after which no
    transaction can commit it, None if not known yet)."""

    high: int
    gaps: Mapping[int, int | None] = field(default_factory=dict)


class EventCursors:
    """The followers' cursors, by name."""

    def __init__(self, db: Transactions) -> None:
        self.db = db

    def get(self, name: str) -> EventCursor | None:
        """The cursor called `name`; None if there is none (or what is kept is not one)."""
        with self.db.transaction() as conn:
            row = conn.execute(select(event_cursors.c.high, event_cursors.c.gaps)
                               .where(event_cursors.c.name == name)).first()
        if row is None:
            return None
        return EventCursor(int(row.high), _gaps(row.gaps))

    def save(self, name: str, cursor: EventCursor, now: float) -> None:
        """Keep `cursor` as `name`'s."""
        gaps = sorted(cursor.gaps.items())
        high = cursor.high
        if len(gaps) > MAX_GAPS:  # kept lower: what lies past it is read again, not lost
            high = min(high, gaps[MAX_GAPS][0] - 1)
            gaps = gaps[:MAX_GAPS]
        values = {"high": high, "updated_at": now, "gaps": json.dumps(gaps) if gaps else None}
        with self.db.transaction() as conn:
            self.db.backend.upsert(conn, event_cursors, [{"name": name, **values}], "name",
                                   list(values))


def _gaps(text: str | None) -> dict[int, int | None]:
    """The gaps as kept; a value that is not a list of [id, horizon] pairs keeps none."""
    try:
        pairs = json.loads(text) if text else []
        return {int(i): None if h is None else int(h) for i, h in pairs}
    except (TypeError, ValueError):
        return {}


__all__ = ["EventCursor", "EventCursors"]
