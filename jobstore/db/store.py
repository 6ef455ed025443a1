"""The only module that talks SQL: submit, claim, transitions, queries, lease recovery.

Every change of a job's state goes through `_apply`, which updates the row and appends its event
in the same transaction. Reports carry the attempt's token; a report from a superseded attempt is
recorded as an event and changes nothing (fencing).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    and_,
    case,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.exc import DBAPIError, OperationalError

from jobstore.core.claims import ClaimRequest, Offer, Verdict
from jobstore.core.jobs import CHANGE_COLUMNS, FeedEvent, Job, JobEvent, JobSpec
from jobstore.core.states import FINAL, Decision, Event, Status, decide
from jobstore.db.engine import make_engine, safe_url
from jobstore.db.schema import clusters, job_events, jobs
from jobstore.errors import DatabaseError, NotOwner, UnknownJob
from jobstore.formats import userlog
from jobstore.formats.jobads import submitted_ad

# PostgreSQL channel notified (payload: the job id) for every event row; see jobstore/watch.py.
NOTIFY_CHANNEL = "jobstore_events"
__all__ = [
    "JobStore",
    "Outcome",
    "ClaimRequest",
    "Offer",
    "Verdict",
    "UnknownJob",
    "DatabaseError",
]


@dataclass(frozen=True)
class Outcome:
    """The result of an event: the job's status before and after, and whether it changed."""

    job_id: int
    event: str
    before: str | None
    after: str | None
    changed: bool
    stale: bool = False
    reason: str | None = None


# Called inside the transaction for EXIT: (job row) -> (exit succeeded, retry wanted).
ExitPolicy = Callable[[Job], tuple[bool, bool]]
# Called just before a transaction that wrote events commits, with those events in order: each a
# dict of the job_events columns plus "job", the job row before the transition (None when not
# known). It may return a callable, called with True once the commit succeeded (False if it
# failed): so a listener can take a lock before the commit and act after it, keeping the
# database's order (jobstore.formats.userlog). Exceptions are logged in one line, never affect the
# transition.
AfterCommit = Callable[[bool], None]
CommitListener = Callable[[list[dict[str, Any]]], AfterCommit | None]
# The columns a submit writes; the others start as their server defaults or NULL.
_INSERTED = frozenset(
    ("cluster_id", "proc_id", "queue", "status", "priority", "owner", "ad", "cmd", "request_cpus",
     "request_memory", "request_disk", "requirements", "max_attempts", "success_exit_code",
     "retry_until", "max_retries", "user_log", "submitted_at", "updated_at")
)
_PENDING = "jobstore_pending_events"  # key in conn.info: events of the open transaction
_log = logging.getLogger(__name__)

# The claim's fast path on PostgreSQL, one statement: lock the best idle candidate of the queue
# that fits the slot (the partial index ix_jobs_claim gives the order), hand it out, append its
# `fetch` event and notify `jobstore watch`; returns the row as it was before (or nothing).
_FETCHED = str(decide(Event.FETCH, Status.IDLE, attempts=0, max_attempts=1).to_status)
CLAIM_FIRST_SQL = f"""\
WITH cand AS (
    SELECT * FROM jobs
    WHERE status = '{Status.IDLE.value}' AND queue = %(queue)s AND request_cpus <= %(cpus)s
      AND request_memory <= %(memory)s AND request_disk <= %(disk)s
    ORDER BY priority DESC, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE jobs SET status = '{_FETCHED}', token = %(token)s, claims = jobs.claims + 1,
        lease_expires_at = %(lease_expires_at)s, slot = %(slot)s, host = %(host)s,
        keyword = %(keyword)s, fetched_at = %(fetched_at)s, job_pid = %(job_pid)s,
        reason = %(reason)s, updated_at = %(now)s
    FROM cand WHERE jobs.id = cand.id AND jobs.status = '{Status.IDLE.value}'
    RETURNING jobs.id, jobs.claims
), ev AS (
    INSERT INTO job_events (job_id, time, event, from_status, to_status, attempt, slot, host)
    SELECT id, %(now)s, '{Event.FETCH}', '{Status.IDLE.value}', '{_FETCHED}', claims,
        %(slot)s, %(host)s
    FROM upd
)
SELECT cand.*, pg_notify(%(channel)s, cand.id::text) AS notified FROM cand CROSS JOIN upd"""


def _note_event(conn: Connection, values: Mapping[str, Any], job: Job | None) -> None:
    """Keep an event written in this transaction for the commit listeners (JobStore._tx)."""
    pending = conn.info.get(_PENDING)
    if pending is not None:
        pending.append({**values, "job": job})


class _NotTaken(Exception):
    """The fast path's candidate was not taken by the judge: roll its claim back."""


class JobStore:
    """The job database. Thread-safe as far as the engine is; holds no session state."""

    def __init__(self, engine: Engine, statement_timeout_ms: int | None = 5000) -> None:
        self.engine = engine
        self.statement_timeout_ms = statement_timeout_ms
        self._pg = engine.dialect.name == "postgresql"
        # (queue, slot)s whose best candidate was not taken last time: claim scans directly
        self._scan_first: set[tuple[str, str]] = set()
        # Commit listeners (see CommitListener); the job event log writer is always one.
        self.listeners: list[CommitListener] = [userlog.on_commit]

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        connect_timeout: int = 5,
        statement_timeout_ms: int | None = 5000,
        pool: bool = False,
        max_overflow: int = 0,
    ) -> JobStore:
        """A store on `url`: one short connection per transaction, or (`pool`, for a
        long-running caller) one kept connection plus at most `max_overflow` more."""
        engine = make_engine(
            url, connect_timeout=connect_timeout, pool=pool, max_overflow=max_overflow
        )
        return cls(engine, statement_timeout_ms)

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        pending: list[dict[str, Any]] = []
        after: list[AfterCommit] = []
        try:
            with self.engine.begin() as conn:
                if self._pg and self.statement_timeout_ms:
                    # SET LOCAL, not a startup option: PgBouncer in transaction mode allows it.
                    conn.execute(
                        text(f"SET LOCAL statement_timeout = {int(self.statement_timeout_ms)}")
                    )
                conn.info[_PENDING] = pending  # conn.info outlives the checkout: always reset
                try:
                    yield conn
                finally:
                    conn.info.pop(_PENDING, None)
                if pending:
                    after = self._before_commit(pending)
        except (OperationalError, DBAPIError) as exc:
            _after_commit(after, False)
            raise DatabaseError(_db_message(exc, self.engine.url)) from None
        except BaseException:
            _after_commit(after, False)
            raise
        _after_commit(after, True)

    def _before_commit(self, events: list[dict[str, Any]]) -> list[AfterCommit]:
        after = []
        for listener in self.listeners:
            try:
                then = listener(events)
            except Exception as exc:  # a listener never breaks a transition
                _log.warning("jobstore: commit listener failed: %s: %s", type(exc).__name__, exc)
            else:
                if then is not None:
                    after.append(then)
        return after

    # ---- submit -------------------------------------------------------------------------

    def submit(
        self,
        specs: Sequence[JobSpec],
        *,
        owner: str,
        queue: str,
        max_attempts: int,
        submit_file: str | None = None,
        now: float | None = None,
    ) -> tuple[int, list[int]]:
        """Insert one cluster of jobs, each with its `submit` event. Returns (cluster, job ids).
        Raises AdError when a spec's attributes cannot be stored (a reserved +Attr)."""
        now = now or time.time()
        ads = [submitted_ad(spec) for spec in specs]
        with self._tx() as conn:
            cluster_id = conn.execute(
                insert(clusters)
                .values(
                    owner=owner,
                    queue=queue,
                    submit_file=submit_file,
                    num_procs=len(specs),
                    submitted_at=now,
                )
                .returning(clusters.c.id)
            ).scalar_one()
            ids = []
            for spec, ad in zip(specs, ads, strict=True):
                job = Job.queued(
                    spec, id=0, cluster_id=cluster_id, owner=owner, queue=queue, ad=ad,
                    max_attempts=max_attempts, now=now,
                )
                values = {name: getattr(job, name) for name in _INSERTED}
                job = job.but(
                    id=conn.execute(insert(jobs).values(values).returning(jobs.c.id)).scalar_one()
                )
                self._event(
                    conn, job.id, Event.SUBMIT, None, Status.IDLE, now, attempt=0, job=job
                )
                ids.append(job.id)
        return cluster_id, ids

    # ---- claim --------------------------------------------------------------------------

    def claim(self, req: ClaimRequest, judge: Callable[[Job], Verdict]) -> Job | None:
        """Hand the best fitting idle job of `req.queue` to a slot, atomically.

        Candidates come in claim order (priority, then age) from the partial claim index,
        prefiltered by the slot's resources and locked with SKIP LOCKED on PostgreSQL; `judge`
        evaluates what SQL cannot (Requirements, owner rules). At most `scan_limit` are judged.

        PostgreSQL first tries the best candidate in one statement (lock, update, event); when
        `judge` does not take that job, the attempt is rolled back and the general scan below
        runs (reusing that verdict), and this slot scans directly until its first candidate is
        taken again.
        """
        now = time.time()
        known: dict[tuple[int, int], Verdict] = {}
        if self._pg and (req.queue, req.slot) not in self._scan_first:
            try:
                with self._tx() as conn:
                    return self._claim_first(conn, req, judge, now, known)
            except _NotTaken:
                self._scan_first.add((req.queue, req.slot))
        return self._claim_scan(req, judge, now, known)

    def _claim_first(
        self,
        conn: Connection,
        req: ClaimRequest,
        judge: Callable[[Job], Verdict],
        now: float,
        known: dict[tuple[int, int], Verdict],
    ) -> Job | None:
        """One round trip: lock the best candidate, hand it out, write its `fetch` event (and
        the watch notification); raises _NotTaken, rolling it all back, if `judge` says no."""
        o = req.offer
        changes = {
            "token": secrets.token_hex(16),
            "lease_expires_at": now + req.claim_lease,
            "slot": req.slot,
            "host": req.host,
            "keyword": req.keyword,
            "fetched_at": now,
            "job_pid": None,
            "reason": None,
        }
        params = {
            **changes,
            "queue": req.queue,
            "cpus": o.cpus,
            "memory": o.memory,
            "disk": o.disk,
            "now": now,
            "channel": NOTIFY_CHANNEL,
        }
        found = conn.exec_driver_sql(CLAIM_FIRST_SQL, params).mappings().first()
        if found is None:
            return None
        job = Job.from_row(found)
        verdict = judge(job)
        known[(job.id, job.claims)] = verdict
        if verdict.hold_reason or not verdict.take:
            raise _NotTaken
        attempt = job.claims + 1
        # CLAIM_FIRST_SQL wrote the event row; the commit listeners see it as _event's
        _note_event(
            conn,
            {
                "job_id": job.id,
                "time": now,
                "event": str(Event.FETCH),
                "from_status": Status.IDLE.value,
                "to_status": _FETCHED,
                "attempt": attempt,
                "slot": req.slot,
                "host": req.host,
                "reason": None,
                "attrs": None,
            },
            job,
        )
        return job.but(**changes, claims=attempt, status=_FETCHED)

    def _claim_scan(
        self,
        req: ClaimRequest,
        judge: Callable[[Job], Verdict],
        now: float,
        known: dict[tuple[int, int], Verdict],
    ) -> Job | None:
        """The general claim: candidates in pages of `req.batch`, each judged (or its verdict
        taken from `known`), refused owners held, the first taken job handed out."""
        o = req.offer
        base = select(jobs).where(
            jobs.c.status == Status.IDLE.value,
            jobs.c.queue == req.queue,
            jobs.c.request_cpus <= o.cpus,
            jobs.c.request_memory <= o.memory,
            jobs.c.request_disk <= o.disk,
        )
        with self._tx() as conn:
            scanned = 0
            after: Job | None = None
            while scanned < req.scan_limit:
                q = base
                if after is not None:
                    p = after.priority
                    q = q.where(
                        or_(jobs.c.priority < p, and_(jobs.c.priority == p, jobs.c.id > after.id))
                    )
                # never judge more than scan_limit candidates, whatever the batch size
                size = min(req.batch, req.scan_limit - scanned)
                q = q.order_by(jobs.c.priority.desc(), jobs.c.id).limit(size)
                rows = [
                    Job.from_row(r._mapping)
                    for r in conn.execute(q.with_for_update(skip_locked=True))
                ]
                for row in rows:
                    scanned += 1
                    verdict = known.get((row.id, row.claims)) or judge(row)
                    if verdict.hold_reason:
                        self._apply(
                            conn,
                            row,
                            Event.HOLD,
                            decide_args={},
                            now=now,
                            reason=verdict.hold_reason,
                            slot=req.slot,
                            host=req.host,
                        )
                    elif verdict.take:
                        token = secrets.token_hex(16)
                        changes = {
                            "token": token,
                            "claims": row.claims + 1,
                            "lease_expires_at": now + req.claim_lease,
                            "slot": req.slot,
                            "host": req.host,
                            "keyword": req.keyword,
                            "fetched_at": now,
                            "job_pid": None,
                            "reason": None,
                        }
                        self._apply(
                            conn,
                            row,
                            Event.FETCH,
                            decide_args={},
                            now=now,
                            changes=changes,
                            slot=req.slot,
                            host=req.host,
                            attempt=row.claims + 1,
                        )
                        if scanned == 1:  # the best candidate fits again: try it first next time
                            self._scan_first.discard((req.queue, req.slot))
                        return row.but(**changes, status=Status.FETCHED.value)
                if len(rows) < size:
                    return None
                after = rows[-1]
        return None

    # ---- reports and admin events -------------------------------------------------------

    def report(
        self,
        job_id: int,
        event: Event,
        *,
        token: str | None,
        attempt: int | None,
        changes: Mapping[str, Any] | None = None,
        attrs: Mapping[str, Any] | None = None,
        lease: int | None = None,
        slot: str | None = None,
        host: str | None = None,
        exit_policy: ExitPolicy | None = None,
        now: float | None = None,
        reason: str | None = None,
        owner: str | None = None,
    ) -> Outcome:
        """Apply a hook's report about one attempt; a superseded attempt is only recorded.

        A report sets only the usage and exit columns (`reports.CHANGE_COLUMNS`); with `owner`
        (an ordinary account reports) it is refused (NotOwner) unless that account owns the job.
        """
        wrong = set(changes or {}) - CHANGE_COLUMNS.keys()
        if wrong:
            raise ValueError(f"a report may not change {sorted(wrong)}")
        now = now or time.time()
        with self._tx() as conn:
            job = self._lock(conn, job_id)
            if job is None:
                raise UnknownJob(job_id)
            if owner is not None and job.owner != owner:
                raise NotOwner(job_id, owner)
            current = (
                job.token is not None
                and secrets.compare_digest(str(token or ""), job.token)
                and attempt == job.claims
            )
            if not current:
                reason = f"report from attempt {attempt}, current attempt is {job.claims}"
                if job.token is None:
                    reason = f"report from attempt {attempt}; the job is {job.status}"
                self._event(
                    conn,
                    job_id,
                    event,
                    job.status,
                    None,
                    now,
                    attempt=attempt,
                    slot=slot,
                    host=host,
                    reason="stale: " + reason,
                    attrs=attrs,
                )
                return Outcome(job_id, event, job.status, job.status, False, True, reason)
            decide_args: dict[str, Any] = {}
            if event == Event.EXIT and exit_policy is not None:
                succeeded, retry = exit_policy(job)
                decide_args = {"exit_succeeded": succeeded, "retry_wanted": retry}
            all_changes = dict(changes or {})
            if lease is not None:
                all_changes["lease_expires_at"] = now + lease
            return self._apply(
                conn,
                job,
                event,
                decide_args=decide_args,
                now=now,
                changes=all_changes,
                attrs=attrs,
                reason=reason,
                slot=slot,
                host=host,
                attempt=attempt,
            )

    def admin(self, job_id: int, event: Event, reason: str | None = None) -> Outcome:
        """An administrator's hold, release or rm of one job."""
        now = time.time()
        with self._tx() as conn:
            job = self._lock(conn, job_id)
            if job is None:
                raise UnknownJob(job_id)
            return self._apply(
                conn, job, event, decide_args={}, now=now, reason=reason, record_ignored=False
            )

    def reap(self, *, now: float | None = None, limit: int = 500) -> list[Outcome]:
        """Send jobs whose lease ran out back to idle (or to failed, out of attempts)."""
        now = now or time.time()
        q = (
            select(jobs)
            .where(
                jobs.c.status.in_(
                    [s.value for s in (Status.FETCHED, Status.ACCEPTED, Status.RUNNING)]
                ),
                jobs.c.lease_expires_at < now,
            )
            .order_by(jobs.c.lease_expires_at)
            .limit(limit)
        )
        with self._tx() as conn:
            rows = [
                Job.from_row(r._mapping) for r in conn.execute(q.with_for_update(skip_locked=True))
            ]
            return [
                self._apply(
                    conn,
                    row,
                    Event.LEASE_EXPIRED,
                    decide_args={},
                    now=now,
                    reason=f"lease of attempt {row.claims} expired",
                    attempt=row.claims,
                    slot=row.slot,
                    host=row.host,
                )
                for row in rows
            ]

    # ---- the one place a transition is written ------------------------------------------

    def _apply(
        self,
        conn: Connection,
        job: Job,
        event: Event,
        *,
        decide_args: Mapping[str, Any],
        now: float,
        changes: Mapping[str, Any] | None = None,
        attrs: Mapping[str, Any] | None = None,
        reason: str | None = None,
        slot: str | None = None,
        host: str | None = None,
        attempt: int | None = None,
        record_ignored: bool = True,
    ) -> Outcome:
        before = Status(job.status)
        d: Decision = decide(
            event,
            before,
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            **decide_args,
        )
        attempt = job.claims if attempt is None else attempt
        why = reason if d.reason is None else (f"{reason}; {d.reason}" if reason else d.reason)
        if d.to_status is None:
            if record_ignored:
                self._event(
                    conn,
                    job.id,
                    event,
                    before,
                    None,
                    now,
                    attempt=attempt,
                    slot=slot,
                    host=host,
                    reason=why,
                    attrs=attrs,
                )
            return Outcome(job.id, event, before, before, False, reason=why)
        values: dict[str, Any] = {**(changes or {}), "status": d.to_status.value, "updated_at": now}
        if d.counts_attempt:
            values["attempts"] = job.attempts + 1
        if d.ends_attempt:
            values.update(token=None, lease_expires_at=None)
        if d.to_status in FINAL:
            values["finished_at"] = now
        if d.to_status in (Status.HELD, Status.FAILED) or (why and d.to_status == Status.IDLE):
            values["reason"] = why
        if d.to_status == Status.RUNNING and before != Status.RUNNING:
            values.setdefault("started_at", now)
        result = conn.execute(
            update(jobs)
            .where(
                jobs.c.id == job.id,
                jobs.c.status == before.value,
                jobs.c.claims == job.claims,
            )
            .values(**values)
        )
        if result.rowcount != 1:  # cannot happen while the row is locked; refuse to guess
            raise DatabaseError(f"job {job.id} changed under a locked transition")
        self._event(
            conn,
            job.id,
            event,
            before,
            d.to_status,
            now,
            attempt=attempt,
            slot=slot,
            host=host,
            reason=why,
            attrs=attrs,
            job=job,
        )
        return Outcome(job.id, event, before, d.to_status, True, reason=why)

    def _event(
        self,
        conn: Connection,
        job_id: int,
        event: Event | str,
        before: Status | str | None,
        after: Status | str | None,
        now: float,
        *,
        attempt: int | None = None,
        slot: str | None = None,
        host: str | None = None,
        reason: str | None = None,
        attrs: Mapping[str, Any] | None = None,
        job: Job | None = None,
    ) -> None:
        values = dict(
            job_id=job_id,
            time=now,
            event=str(event),
            from_status=None if before is None else str(before),
            to_status=None if after is None else str(after),
            attempt=attempt,
            slot=slot,
            host=host,
            reason=reason,
            attrs=dict(attrs) if attrs else None,
        )
        conn.execute(insert(job_events).values(**values))
        _note_event(conn, values, job)
        if self._pg:  # sent on commit, never for a rolled-back transition (jobstore watch)
            conn.execute(text("SELECT pg_notify(:c, :p)"), {"c": NOTIFY_CHANNEL, "p": str(job_id)})

    def _lock(self, conn: Connection, job_id: int) -> Job | None:
        row = conn.execute(select(jobs).where(jobs.c.id == job_id).with_for_update()).first()
        return None if row is None else Job.from_row(row._mapping)

    # ---- queries ------------------------------------------------------------------------

    def get_job(self, job_id: int) -> Job:
        with self._tx() as conn:
            row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
        if row is None:
            raise UnknownJob(job_id)
        return Job.from_row(row._mapping)

    def find_jobs(self, cluster_id: int, proc_id: int | None = None) -> list[Job]:
        q = select(jobs).where(jobs.c.cluster_id == cluster_id)
        if proc_id is not None:
            q = q.where(jobs.c.proc_id == proc_id)
        with self._tx() as conn:
            return [Job.from_row(r._mapping) for r in conn.execute(q.order_by(jobs.c.id))]

    def list_jobs(
        self,
        *,
        statuses: Sequence[str] | None = None,
        owners: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        include_final: bool = False,
        final_only: bool = False,
        limit: int | None = None,
        where: ColumnElement[bool] | None = None,
    ) -> list[Job]:
        """Jobs in (cluster, proc) order; `where` is an extra filter (jobstore.db.constraint)."""
        q = select(jobs).where(
            *_job_filter(statuses, owners, queues, include_final, final_only, where)
        )
        q = q.order_by(jobs.c.cluster_id, jobs.c.proc_id)
        if limit:
            q = q.limit(limit)
        with self._tx() as conn:
            return [Job.from_row(r._mapping) for r in conn.execute(q)]

    def autoclusters(
        self,
        *,
        statuses: Sequence[str] | None = None,
        owners: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        include_final: bool = False,
        final_only: bool = False,
        where: ColumnElement[bool] | None = None,
    ) -> list[dict[str, Any]]:
        """Jobs grouped like HTCondor's autoclusters (same owner, queue, requests and
        Requirements), counted by status with one GROUP BY in the database."""
        key = AUTOCLUSTER_KEY
        counts = [
            func.sum(case((jobs.c.status == s.value, 1), else_=0)).label(s.value) for s in Status
        ]
        q = (
            select(*(jobs.c[k] for k in key), func.count().label("jobs"), *counts)
            .where(*_job_filter(statuses, owners, queues, include_final, final_only, where))
            .group_by(*(jobs.c[k] for k in key))
            .order_by(*(jobs.c[k] for k in key))
        )
        with self._tx() as conn:
            rows = [r._mapping for r in conn.execute(q)]
        return [
            {
                "id": n,
                **{k: r[k] for k in key},
                "jobs": int(r["jobs"]),
                "status": {s.value: int(r[s.value] or 0) for s in Status if r[s.value]},
            }
            for n, r in enumerate(rows, 1)
        ]

    def events(self, job_id: int | None = None, *, after_id: int = 0) -> list[JobEvent]:
        """Events in id order: of one job, or of all jobs; those after `after_id`."""
        q = (
            select(job_events, jobs.c.cluster_id, jobs.c.proc_id)
            .join(jobs, jobs.c.id == job_events.c.job_id)
            .where(job_events.c.id > after_id)
        )
        if job_id is not None:
            q = q.where(job_events.c.job_id == job_id)
        with self._tx() as conn:
            rows = conn.execute(q.order_by(job_events.c.id))
            return [JobEvent.from_row(r._mapping) for r in rows]

    # ---- following job_events (jobstore watch) -------------------------------------------

    def last_event_id(self, before: float | None = None) -> int:
        """The highest event id (0 if none); with `before`, of the events before that time."""
        q = select(func.max(job_events.c.id))
        if before is not None:
            q = q.where(job_events.c.time < before)
        with self._tx() as conn:
            return int(conn.execute(q).scalar() or 0)

    def event_feed(
        self, after_id: int, *, gaps: Sequence[tuple[int, int]] = (), limit: int = 1000
    ) -> list[FeedEvent]:
        """Events with id > `after_id` or in one of the `gaps` (lo, hi) id ranges, in id order,
        each with its job's cluster_id, proc_id, owner, queue and outcome columns (job_status,
        exit_code, exit_signal, exit_by_signal, success_exit_code); all events, the caller
        filters (it must see every id)."""
        wanted = or_(
            job_events.c.id > after_id, *(job_events.c.id.between(lo, hi) for lo, hi in gaps)
        )
        q = (
            select(
                job_events,
                jobs.c.cluster_id,
                jobs.c.proc_id,
                jobs.c.owner,
                jobs.c.queue,
                jobs.c.status.label("job_status"),
                jobs.c.exit_code,
                jobs.c.exit_signal,
                jobs.c.exit_by_signal,
                jobs.c.success_exit_code,
            )
            .join(jobs, jobs.c.id == job_events.c.job_id)
            .where(wanted)
            .order_by(job_events.c.id)
            .limit(limit)
        )
        with self._tx() as conn:
            return [FeedEvent.from_row(r._mapping) for r in conn.execute(q)]

    def snapshot_bounds(self) -> tuple[int, int] | None:
        """PostgreSQL: (xmin, xmax) of a snapshot taken now, so that a follower of job_events
        knows when every transaction that could still add a lower event id has ended. SQLite:
        None (one writer at a time, so event ids become visible in order)."""
        if not self._pg:
            return None
        q = text(
            "SELECT pg_snapshot_xmin(s)::text, pg_snapshot_xmax(s)::text"
            " FROM pg_current_snapshot() AS s"
        )
        with self._tx() as conn:
            xmin, xmax = conn.execute(q).one()
        return int(xmin), int(xmax)

    def xact_horizon(self) -> int | None:
        """PostgreSQL: a transaction id assigned now (its transaction commits at once). Every
        transaction that had an id before this call has a smaller one, so once a snapshot's
        xmin is at or past it they have all ended. (A snapshot's xmax is no such bound: it is
        one past the highest *completed* id, and a transaction still running may have a larger
        one.) SQLite: None."""
        if not self._pg:
            return None
        with self._tx() as conn:
            return int(conn.execute(text("SELECT pg_current_xact_id()::text")).scalar_one())

    def stats(self) -> list[tuple[str, str, int]]:
        q = (
            select(jobs.c.queue, jobs.c.status, func.count())
            .group_by(jobs.c.queue, jobs.c.status)
            .order_by(jobs.c.queue, jobs.c.status)
        )
        with self._tx() as conn:
            return [(r[0], r[1], int(r[2])) for r in conn.execute(q)]


# The attributes that put two jobs in the same autocluster (`jobstore q -autocluster`).
AUTOCLUSTER_KEY = (
    "owner",
    "queue",
    "request_cpus",
    "request_memory",
    "request_disk",
    "requirements",
)


def _job_filter(
    statuses: Sequence[str] | None,
    owners: Sequence[str] | None,
    queues: Sequence[str] | None,
    include_final: bool,
    final_only: bool,
    where: ColumnElement[bool] | None,
) -> list[ColumnElement[bool]]:
    """The WHERE terms of the job queries (`jobstore q`, `history`, autoclusters)."""
    terms: list[ColumnElement[bool]] = []
    if statuses:
        terms.append(jobs.c.status.in_(list(statuses)))
    elif final_only:
        terms.append(jobs.c.status.in_([s.value for s in FINAL]))
    elif not include_final:
        terms.append(jobs.c.status.not_in([s.value for s in FINAL]))
    if owners:
        terms.append(jobs.c.owner.in_(list(owners)))
    if queues:
        terms.append(jobs.c.queue.in_(list(queues)))
    if where is not None:
        terms.append(where)
    return terms


def _after_commit(after: list[AfterCommit], committed: bool) -> None:
    for then in after:
        try:
            then(committed)
        except Exception as exc:  # a listener never breaks a transition
            _log.warning("jobstore: commit listener failed: %s: %s", type(exc).__name__, exc)


def _db_message(exc: Exception, url: Any) -> str:
    orig = getattr(exc, "orig", None) or exc
    first = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    return f"database {safe_url(str(url))}: {first}"
