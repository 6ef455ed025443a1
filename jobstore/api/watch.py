"""Follow job transitions as they happen: the public subscriber API behind `jobstore watch`.

    from jobstore.api.watch import subscribe
    with subscribe(url, jobs=["12"], until_done=True) as sub:
        for record in sub:          # JobEvent for each transition, JobFinished once per job
            print(record.to_json())

PostgreSQL: every job_events row sends `NOTIFY jobstore_events` (payload: the job id) when its
transaction commits (store._event). A subscriber LISTENs on a dedicated autocommit connection;
a notification only wakes it up, it then reads job_events by id, and reads anyway every
`catch_up` seconds as a safety net. SQLite, or a pooler that cannot LISTEN (PgBouncer in
transaction mode, found by a probe at start or named with `poll=True`): the same read every
`interval` seconds.

Reading by id misses nothing and repeats nothing (jobstore.api.feed: late commits on
PostgreSQL). After a database restart the subscriber reconnects with backoff and goes on from
the last id it saw.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobstore.api.feed import EventFollower
from jobstore.core.jobs import FeedEvent, Job, JobEvent, JobRecord, parse_job_id
from jobstore.core.states import FINAL, Status
from jobstore.db.channels import CHANNEL, Listener
from jobstore.db.engine import make_engine
from jobstore.db.store import JobStore
from jobstore.errors import DatabaseError, InvalidInput, UnknownJob
from jobstore.formats import views

__all__ = [
    "JobEvent",
    "JobFinished",
    "Record",
    "Subscription",
    "subscribe",
    "watch",
    "parse_since",
    "parse_job_id",
]

WINDOW = 1000  # PostgreSQL: ids below the start that are re-checked for late commits
NOTIFIED = 0.05  # seconds between two reads notifications ask for, at least (anyone may NOTIFY)


@dataclass(frozen=True)
class JobFinished(JobRecord):
    """The last record of a job: it reached a final state (completed, failed, removed).

    `succeeded`: completed, not by a signal, with the job's success_exit_code (default 0).
    `event_id` is the event that finished it (None if it had finished before the watch began).
    """

    job_id: int
    cluster: int
    proc: int
    time: float | None
    status: str
    succeeded: bool
    exit_code: int | None
    exit_signal: int | None
    reason: str | None
    event_id: int | None
    event: str = "finished"

    @classmethod
    def from_job(cls, job: Job) -> JobFinished:
        """Of a job that had finished before the watch began."""
        return cls._of(job.id, job.cluster_id, job.proc_id, job.status, job, job.reason,
                       when=job.finished_at, event_id=None)

    @classmethod
    def from_feed(cls, feed: FeedEvent) -> JobFinished:
        """Of the event that finished the job."""
        e = feed.event
        return cls._of(e.job_id, e.cluster, e.proc, feed.job_status, feed, e.reason,
                       when=e.time, event_id=e.id)

    @classmethod
    def _of(
        cls, job_id: int, cluster: int, proc: int, status: str, outcome: Job | FeedEvent,
        reason: str | None, *, when: float | None, event_id: int | None,
    ) -> JobFinished:
        by_signal = bool(outcome.exit_by_signal)
        return cls(
            job_id=job_id,
            cluster=cluster,
            proc=proc,
            time=when,
            status=status,
            succeeded=status == Status.COMPLETED
            and not by_signal
            and outcome.exit_code == outcome.success_exit_code,
            exit_code=outcome.exit_code,
            exit_signal=outcome.exit_signal if by_signal else None,
            reason=reason,
            event_id=event_id,
        )


Record = JobEvent | JobFinished


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str) -> int | datetime:
    """`--since`: an event id (`0` replays everything), an age (`90s`, `10m`, `2h`, `1d`) or a
    local ISO time (`2025-05-01T12:00`)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    if text[:-1].isdigit() and text[-1:] in _UNITS:
        return datetime.fromtimestamp(time.time() - int(text[:-1]) * _UNITS[text[-1]])
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(
            f"bad --since {text!r} (an event id, an age like 10m or 2h, or an ISO time)"
        ) from None


def _names(value: str | Iterable[str] | None) -> frozenset[str]:
    if value is None:
        return frozenset()
    return frozenset([value] if isinstance(value, str) else value)


class Subscription:
    """Events of a set of jobs or of a filter, as an iterator (see `subscribe`). Use it once;
    `close()` (from any thread) ends the iteration within about half a second."""

    error: Exception | None = None  # what stopped a `watch` callback thread
    thread: threading.Thread | None = None

    def __init__(
        self,
        db: str | JobStore,
        *,
        jobs: Iterable[str | int] | None = None,
        owner: str | Iterable[str] | None = None,
        queue: str | Iterable[str] | None = None,
        statuses: Iterable[str] | None = None,
        since: int | datetime | None = None,
        until_done: bool = False,
        poll: bool | None = None,
        interval: float = 0.25,
        catch_up: float = 5.0,
        on_retry: Callable[[str], None] | None = None,
        repeats: bool = False,
    ) -> None:
        url = db.db.engine.url if isinstance(db, JobStore) else db
        # A private engine with a pool: one connection kept open between reads.
        self.store = JobStore(make_engine(url, pool=True))  # type: ignore[arg-type]
        self.owners, self.queues = _names(owner), _names(queue)
        self.statuses = frozenset(Status(s).value for s in (statuses or ()))
        self.repeats = repeats
        self.until_done = until_done
        self.interval, self.catch_up, self.on_retry = interval, catch_up, on_retry
        self.poll = poll
        self.job_ids: frozenset[int] | None = None
        self.tracked: set[int] = set()  # jobs whose end ends the iteration (until_done)
        self.outcomes: dict[int, JobFinished] = {}
        self._closed = threading.Event()
        self._listener: Listener | None = None
        self._read_at = 0.0  # when a notification last led to a read
        try:
            self._start(jobs, since)
        except BaseException:
            self.store.db.engine.dispose()
            raise

    # ---- start ----------------------------------------------------------------------------

    def _start(self, jobs: Iterable[str | int] | None, since: int | datetime | None) -> None:
        store = self.store
        named: list[Job] = []
        if jobs is not None:
            for text in jobs:
                cluster, proc = parse_job_id(text)
                found = store.reads.find_jobs(cluster, proc)
                if not found:
                    raise UnknownJob(str(text))
                named.extend(found)
            self.job_ids = frozenset(j.id for j in named)
        if isinstance(since, datetime):
            high, silent = store.reads.last_event_id(before=since.timestamp()), 0
        elif since is not None:
            high, silent = int(since), 0
        else:  # from now on; on PostgreSQL re-check a window below for late commits
            silent = store.reads.last_event_id()
            high = max(0, silent - WINDOW) if store.db.ids_commit_out_of_order else silent
        self.follower = EventFollower(store, high, silent)
        if named:
            candidates = [j for j in named if self._matches(j.id, j.owner, j.queue)]
        elif self.until_done:
            candidates = store.reads.list_jobs(owners=list(self.owners), queues=list(self.queues))
        else:
            candidates = []
        self.tracked = {j.id for j in candidates}
        # finished before the watch: told after the first read, unless that read tells it
        self._done_at_start = [j for j in candidates if j.status in FINAL]
        if store.db.can_listen and self.poll is not True:
            listener = store.db.listener(CHANNEL, connect_timeout=5)
            try:
                listener.open()
                ok = listener.probe()
            except Exception as exc:  # noqa: BLE001 - any failure to LISTEN means: poll
                listener.close()
                ok = False
                self._tell(f"cannot LISTEN ({_first_line(exc)}); following job_events by polling")
            else:
                if not ok:
                    listener.close()
                    self._tell(
                        "notifications do not arrive (a pooler in transaction mode?); "
                        "following job_events by polling"
                    )
            if ok:
                self._listener = listener
        self.mode = "listen" if self._listener else "poll"

    def _matches(self, job_id: int, owner: str, queue: str) -> bool:
        return (
            (self.job_ids is None or job_id in self.job_ids)
            and (not self.owners or owner in self.owners)
            and (not self.queues or queue in self.queues)
        )

    def _tell(self, message: str) -> None:
        if self.on_retry is not None:
            self.on_retry(message)

    # ---- the public surface -----------------------------------------------------------------

    @property
    def done(self) -> bool:
        """until_done: every tracked job has finished."""
        return self.until_done and self.tracked.issubset(self.outcomes)

    @property
    def all_succeeded(self) -> bool:
        """Every tracked job finished, and completed successfully."""
        return self.tracked.issubset(self.outcomes) and all(
            self.outcomes[j].succeeded for j in self.tracked
        )

    def close(self) -> None:
        self._closed.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for a `watch` thread to end; True if it has."""
        if self.thread is not None:
            self.thread.join(timeout)
            return not self.thread.is_alive()
        return True

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Record]:
        try:
            yield from self._records()
        finally:
            self._closed.set()
            if self._listener is not None:
                self._listener.close()
            self.store.db.engine.dispose()

    # ---- the loop ---------------------------------------------------------------------------

    def _records(self) -> Iterator[Record]:
        backoff = 0.0
        first = True
        while not self._closed.is_set() and not (self.done and not first):
            try:
                if self._listener is not None and self._listener.fileno() is None:
                    self._listener.open()
                rows, more = self.follower.read()
            except Exception as exc:  # noqa: BLE001 - database away: retry, resume from high
                if not _is_db_error(exc):
                    raise
                if self._listener is not None:
                    self._listener.close()
                if backoff == 0.0:
                    self._tell(f"{_first_line(exc)}; retrying")
                backoff = min(max(backoff * 2, 0.2), 5.0)
                self._closed.wait(backoff)
                continue
            if backoff:
                self._tell("database back; watching again")
                backoff = 0.0
            for row in rows:
                yield from self._from_feed(row)
            if first and not more:
                first = False
                for j in self._done_at_start:
                    if j.id not in self.outcomes:
                        rec = JobFinished.from_job(j)
                        self.outcomes[j.id] = rec
                        yield rec
            if not more and not (self.done and not first):
                self._wait()

    def _from_feed(self, feed: FeedEvent) -> Iterator[Record]:
        e = feed.event
        if not self._matches(e.job_id, feed.owner, feed.queue):
            return
        wanted = self.repeats or not views.is_repeat(e.to_status, e.reason)
        if wanted and (not self.statuses or e.to_status in self.statuses):
            yield e
        if e.to_status in FINAL and e.job_id not in self.outcomes:
            rec = JobFinished.from_feed(feed)
            self.outcomes[e.job_id] = rec
            yield rec

    def _wait(self) -> None:
        """Until something may have happened: a notification, or the next poll or catch-up."""
        if self._listener is None:
            self._closed.wait(self.interval)
            return
        deadline = time.monotonic() + self.catch_up
        while not self._closed.is_set() and (left := deadline - time.monotonic()) > 0:
            try:
                payloads = self._listener.wait(min(left, 0.5))
            except Exception as exc:  # noqa: BLE001 - lost the connection: read (and retry)
                if not _is_db_error(exc):
                    raise
                self._listener.close()
                return
            if payloads and not self._irrelevant(payloads):
                early = self._read_at + NOTIFIED - time.monotonic()
                if early > 0:  # what arrives meanwhile is read with it
                    self._closed.wait(early)
                self._read_at = time.monotonic()
                return

    def _irrelevant(self, payloads: list[str]) -> bool:
        """Only notifications about jobs we do not follow (and no late ids to look for)."""
        if self.job_ids is None or self.follower.gaps:
            return False
        return all(p.isdigit() and int(p) not in self.job_ids for p in payloads)


def _is_db_error(exc: Exception) -> bool:
    return isinstance(exc, DatabaseError | OSError)  # a listener's are DatabaseErrors too


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def subscribe(db: str | JobStore, **options: Any) -> Subscription:
    """Follow job events: iterate the result for `JobEvent`s and one `JobFinished` per job.

    db: a database URL (or a JobStore). jobs: ids like "12" or "12.3" (default: all jobs);
    owner, queue: a name or names; statuses: only events into these statuses (JobFinished
    records come regardless); since: an event id, or a datetime, to replay from (default: now);
    until_done: stop when the named jobs (or those matching owner/queue at start that are not
    finished) have all finished; poll: True to poll, False to insist on LISTEN, None to choose;
    interval: seconds between polls; catch_up: seconds between safety reads while listening;
    on_retry: called with a one-line message when the database goes away or comes back;
    repeats: True to also get the harmless repeats (a late or second report of an attempt that
    had ended, which changed nothing: `jobstore events --all` shows them).
    Raises UnknownJob, ValueError or DatabaseError at once when it cannot start.
    """
    return Subscription(db, **options)


def watch(db: str | JobStore, callback: Callable[[Record], None], **options: Any) -> Subscription:
    """Call `callback(record)` from a background thread for each record of `subscribe(db,
    **options)`. Stop it with `close()`; `join()` waits for the end (with until_done: until the
    last job finished). An exception in the callback ends it and is kept in `error`."""
    sub = subscribe(db, **options)

    def run() -> None:
        try:
            for record in sub:
                callback(record)
        except Exception as exc:  # noqa: BLE001 - kept for the caller
            sub.error = exc

    sub.thread = threading.Thread(target=run, name="jobstore-watch", daemon=True)
    sub.thread.start()
    return sub
