"""The write side of the job store: submit, claim, reports, admin events, lease recovery.

Every change of a job's state goes through `_apply`, which updates the row and appends its event
in the same transaction. Reports carry the attempt's token; a report from a superseded attempt is
recorded as an event and changes nothing (fencing).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    insert,
    or_,
    select,
    update,
)

from jobstore.core.claims import ClaimRequest, Offer, Verdict
from jobstore.core.jobs import CHANGE_COLUMNS, JOB_COLUMNS, Job, JobSpec
from jobstore.core.states import FINAL, Decision, Event, Status, decide
from jobstore.db.notify import CHANNEL, notify
from jobstore.db.reads import AUTOCLUSTER_KEY, JobReads
from jobstore.db.schema import clusters, job_events, jobs
from jobstore.db.sql import CLAIM_FIRST
from jobstore.db.transactions import AfterCommit, CommitListener, note_event
from jobstore.errors import DatabaseError, NotOwner, UnknownJob
from jobstore.formats.jobads import submitted_ad

__all__ = [
    "AUTOCLUSTER_KEY",
    "AfterCommit",
    "CommitListener",
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

# The status the claim's fast path (claim_first in queries.sql) hands a job out in.
_FETCHED = str(decide(Event.FETCH, Status.IDLE, attempts=0, max_attempts=1).to_status)


def _claim_changes(req: ClaimRequest, now: float) -> dict[str, Any]:
    """The columns a claim sets on the job it hands out (besides status and claims)."""
    return {
        "token": secrets.token_hex(16),
        "lease_expires_at": now + req.claim_lease,
        "slot": req.slot,
        "host": req.host,
        "keyword": req.keyword,
        "fetched_at": now,
        "job_pid": None,
        "reason": None,
    }


class _NotTaken(Exception):
    """The fast path's candidate was not taken by the judge: roll its claim back."""


class JobStore(JobReads):
    """The job database. Thread-safe as far as the engine is; holds no session state."""

    def __init__(self, engine: Engine, statement_timeout_ms: int | None = 5000) -> None:
        super().__init__(engine, statement_timeout_ms)
        # (queue, slot)s whose best candidate was not taken last time: claim scans directly
        self._scan_first: set[tuple[str, str]] = set()

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
                values = {name: getattr(job, name) for name in JOB_COLUMNS if name != "id"}
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
        changes = _claim_changes(req, now)
        params = {
            **changes,
            "queue": req.queue,
            "cpus": o.cpus,
            "memory": o.memory,
            "disk": o.disk,
            "now": now,
            "channel": CHANNEL,
        }
        found = conn.exec_driver_sql(CLAIM_FIRST, params).mappings().first()
        if found is None:
            return None
        job = Job.from_row(found)
        verdict = judge(job)
        known[(job.id, job.claims)] = verdict
        if verdict.hold_reason or not verdict.take:
            raise _NotTaken
        attempt = job.claims + 1
        # claim_first wrote the event row; the commit listeners see it as _event's
        note_event(
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
                        changes = {**_claim_changes(req, now), "claims": row.claims + 1}
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
        note_event(conn, values, job)
        if self._pg:  # sent on commit, never for a rolled-back transition (jobstore watch)
            notify(conn, str(job_id))

    def _lock(self, conn: Connection, job_id: int) -> Job | None:
        row = conn.execute(select(jobs).where(jobs.c.id == job_id).with_for_update()).first()
        return None if row is None else Job.from_row(row._mapping)

