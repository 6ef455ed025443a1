"""Following job_events by id: every committed event once, in id order, however late it
commits (what `jobstore watch` and the access point's event logs read).

On PostgreSQL event ids come from a sequence before commit, so a lower id can become visible
after a higher one. Such missing ids ("gaps") are read again until every transaction that could
still commit them has ended (a snapshot's xmin has reached a transaction id assigned after the
gap was seen, `store.reads.xact_horizon`); this relies on every transaction that writes an event
having written or locked a row first (so it had its id before it took the event's id), which
the store's writes always do. On SQLite writers take turns, so ids become visible in order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jobstore.core.jobs import FeedEvent
from jobstore.db.store import JobStore

BATCH = 1000
MAX_GAP_RANGES = 100


class EventFollower:
    """Reads job_events after `high`: every committed event once. Its position (`high`,
    `gaps`) may be kept and given to a new follower to go on where this one stopped."""

    def __init__(self, store: JobStore, high: int, silent_upto: int = 0,
                 gaps: Mapping[int, int | None] | None = None) -> None:
        self.store = store
        self.high = high  # every id <= high was delivered, is a gap, or is gone for good
        # id -> a transaction id newer than any that could still commit it (None: not yet known)
        self.gaps: dict[int, int | None] = dict(gaps or {})
        self.silent_upto = silent_upto  # ids read that are at most this are not delivered
        self.late_ids = store.db.ids_commit_out_of_order

    def read(self) -> tuple[list[FeedEvent], bool]:
        """New events in id order (late ones first), and whether more are waiting."""
        xmin = self.store.reads.snapshot_bounds()[0] if self.gaps else None  # type: ignore[index]
        ranges = _ranges(sorted(self.gaps))[:MAX_GAP_RANGES]
        rows = self.store.reads.event_feed(self.high, gaps=ranges, limit=BATCH)
        found = {r.event.id for r in rows}
        top = max((i for i in found if i > self.high), default=self.high)
        if xmin is not None:  # asked gaps whose writers had all ended before the read: gone
            for lo, hi in ranges:
                for i in range(lo, hi + 1):
                    h = self.gaps.get(i)
                    if i not in found and h is not None and h <= xmin:
                        del self.gaps[i]
        for i in found:
            self.gaps.pop(i, None)
        if self.late_ids:
            for i in range(self.high + 1, top):
                if i not in found:
                    self.gaps[i] = None
            if any(h is None for h in self.gaps.values()):
                horizon = self.store.reads.xact_horizon()
                for i, h in self.gaps.items():
                    if h is None:
                        self.gaps[i] = horizon
        self.high = top
        fresh = [r for r in rows if r.event.id > self.silent_upto]
        return fresh, len(rows) == BATCH


def _ranges(ids: Sequence[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for i in ids:
        if out and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


__all__ = ["BATCH", "EventFollower"]
