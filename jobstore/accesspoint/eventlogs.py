"""Job event logs on the access point: every transition of a job submitted here (not spooled)
appended to its log (`log = FILE`) by this service alone, in the order the store committed
them, as the job's owner, as a schedd writes it: the execute node's events land on the machine
the user reads them on."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from jobstore.accesspoint.service import LogWriter, SaidOnce, refusal, serving_account
from jobstore.api.feed import EventFollower
from jobstore.core.jobs import FeedEvent, JobEvent
from jobstore.core.states import FINAL
from jobstore.db.eventcursors import EventCursor
from jobstore.db.eventlogs import HomeLog
from jobstore.db.store import JobStore
from jobstore.formats import userlog
from jobstore.node import config

MAX_KNOWN = 100_000  # jobs whose log (or its absence) is remembered between passes


class _Before(NamedTuple):
    """An event's job as the log's entries need it (userlog.JobBefore)."""

    cluster_id: int
    proc_id: int
    host: str | None
    slot: str | None
    image_size: int | None


@dataclass
class EventLogs:
    """Appends the events of the jobs whose home is `name` to their logs; as root, every
    owner's (each as herself), else only this account's. Where it stands is kept in the store
    after each batch, so a restarted service goes on from there."""

    store: JobStore
    name: str
    settings: config.Settings
    clock: Callable[[], float] = time.time
    written: int = 0  # entries appended
    _owner: str | None = field(default=None, init=False)
    _follower: EventFollower | None = field(default=None, init=False)
    _known: dict[int, HomeLog | None] = field(default_factory=dict, init=False)
    _sizes: dict[int, int] = field(default_factory=dict, init=False)
    _through: dict[int, int] = field(default_factory=dict, init=False)
    _said: SaidOnce = field(default_factory=SaidOnce, init=False)

    def __post_init__(self) -> None:
        self._owner = serving_account()

    @property
    def cursor_name(self) -> str:
        """The name this service's place in the events is kept under."""
        return f"userlog:{self.name}" + (f":{self._owner}" if self._owner else "")

    def pass_once(self) -> int:
        """Append every event committed since the last pass; returns how many entries."""
        follower = self._follower or self._resume()
        done, more = 0, True
        writer = LogWriter()
        while more:
            seen = (follower.high, dict(follower.gaps))
            try:
                rows, more = follower.read()
                done += self._append(rows, writer)
            except BaseException:  # the batch is read again by the next pass
                follower.high, follower.gaps = seen
                raise
            if (follower.high, follower.gaps) != seen:
                self.store.event_cursors.save(
                    self.cursor_name, EventCursor(follower.high, follower.gaps), self.clock())
        self.written += done
        return done

    def _resume(self) -> EventFollower:
        kept = self.store.event_cursors.get(self.cursor_name) or EventCursor(0)
        self._follower = EventFollower(self.store, kept.high, gaps=kept.gaps)
        return self._follower

    def _append(self, rows: list[FeedEvent], writer: LogWriter) -> int:
        """Append the entries of `rows` that are this service's, one write per log (by the
        pass's `writer`), those of each job past the last one its log got; record how far
        each job's log got."""
        rows = [r for r in rows if self._owner is None or r.owner == self._owner]
        logs = self._logs_of({r.event.job_id for r in rows})
        texts: dict[tuple[str, str], list[str]] = {}
        through: dict[int, int] = {}
        for r in rows:
            event, log = r.event, logs.get(r.event.job_id)
            if (log is not None and log.path is not None
                    and event.id > self._through.get(event.job_id, 0)):
                through[event.job_id] = self._through[event.job_id] = event.id
                entries = self._entries(event)
                if entries:
                    texts.setdefault((log.path, log.owner), []).extend(entries)
            if event.to_status in FINAL:
                self._forget(event.job_id)
        done = 0
        for (path, owner), entries in texts.items():
            why = refusal(owner, self._owner, self.settings) or writer.over(owner)
            if why is not None:
                self._once(f"job event log {path}: not written: {why}")
            elif writer.append(path, "".join(entries), owner):
                done += len(entries)
        self.store.event_logs.logged(through)
        return done

    def _forget(self, job_id: int) -> None:
        for known in (self._known, self._sizes, self._through):
            known.pop(job_id, None)

    def _entries(self, event: JobEvent) -> list[str]:
        """The log entries of `event`; none (said once) for one whose row holds what no
        entry can be made of (a SQLite file's owner may write anything in it)."""
        try:
            return [e.text() for e in userlog.log_events(_record(event), self._before(event))]
        except Exception as exc:  # noqa: BLE001 - one event's row, never the others' logs
            self._once(f"job {event.cluster}.{event.proc}: event {event.id} not logged: "
                       f"{type(exc).__name__}")
            return []

    def _once(self, line: str) -> None:
        """Log `line` the first time it comes."""
        self._said.warn(line, line)

    def _logs_of(self, job_ids: set[int]) -> dict[int, HomeLog | None]:
        """Each job's log: remembered, or read (None: not a job whose log this service
        writes)."""
        unknown = [i for i in job_ids if i not in self._known]
        if unknown:
            if len(self._known) + len(unknown) > MAX_KNOWN:
                self._known.clear()
                self._through.clear()
            found = self.store.event_logs.logs_of(unknown, self.name)
            for job_id in unknown:
                log = self._known[job_id] = found.get(job_id)
                if log is not None:
                    self._through[job_id] = max(self._through.get(job_id, 0), log.through)
        return {i: self._known[i] for i in job_ids}

    def _before(self, event: JobEvent) -> _Before:
        """The job as `event` found it: the attempt's place, the image size logged last."""
        size = self._sizes.get(event.job_id)
        reported = (event.attrs or {}).get("ImageSize")
        if isinstance(reported, int) and not isinstance(reported, bool) and reported > 0:
            if len(self._sizes) > MAX_KNOWN:
                self._sizes.clear()
            self._sizes[event.job_id] = reported
        return _Before(event.cluster, event.proc, event.host, event.slot, size)


def _record(event: JobEvent) -> dict[str, object]:
    """The event as a commit listener gets it (jobstore.db.rows.event_row)."""
    return {"event": event.event, "from_status": event.from_status,
            "to_status": event.to_status, "time": event.time, "reason": event.reason,
            "attrs": event.attrs}


__all__ = ["EventLogs"]
