"""The store's upkeep, run by whoever asks when it is due pool-wide: the jobs' periodic policy
(`police`), the lease reaper (`reap`), the history's prune (`prune_due`), and holding a job no
reader can take."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from classad2 import ClassAd
from sqlalchemy import Connection, select, update

from jobstore.core import holds, policy
from jobstore.core.jobs import Job
from jobstore.core.states import HANDED_OUT, Event, Status
from jobstore.db.negotiator import Negotiator
from jobstore.db.phases import status_in
from jobstore.db.reads import JobReads
from jobstore.db.retention import Pruned, Retention
from jobstore.db.schema import jobs, passes
from jobstore.db.transactions import Transactions
from jobstore.db.transitions import Outcome, Transitions
from jobstore.formats import views

# Statuses the periodic pass looks at, and its page size.
POLICED = tuple(s.value for s in (Status.IDLE, Status.HELD, Status.FETCHED, Status.ACCEPTED,
                                  Status.RUNNING))
PAGE = 500


class Maintenance:
    """The periodic passes of one store (see the module's docstring)."""

    def __init__(self, db: Transactions, transitions: Transitions, negotiator: Negotiator,
                 reads: JobReads, retention: Retention) -> None:
        self.db, self.transitions, self.negotiator = db, transitions, negotiator
        self.reads, self.retention = reads, retention
        # How the periodic policy is evaluated (the agent's is bounded: jobstore.node.bounded).
        self.periodic_policy: Callable[[ClassAd, float], policy.Action | None] = (
            policy.periodic_action)
        # Around each read of a job's stored values in this process (the agent marks the job:
        # jobstore.node.inflight)
        self.reading: Callable[[int], AbstractContextManager[None]] = (
            lambda _job_id: nullcontext())

    def police(self, *, now: float | None = None, limit: int | None = None) -> list[Outcome]:
        """Evaluate the periodic policy (periodic_hold, _release, _remove, allowed_*_duration)
        of the jobs that have one, in pages, and act on what fires; returns what changed.
        `limit` bounds the jobs looked at (None: all). A page is read, its expressions are
        evaluated in no transaction (a job's user wrote them: they may be slow), and what fired
        is applied to the jobs still as they were read, in a transaction of its own."""
        now = time.time() if now is None else now
        out: list[Outcome] = []
        after, seen = 0, 0
        while limit is None or seen < limit:
            size = PAGE if limit is None else min(PAGE, limit - seen)
            with self.db.transaction() as conn:
                rows = [Job.from_row(r._mapping) for r in conn.execute(
                    select(jobs)
                    .where(jobs.c.periodic.is_(True), jobs.c.id > after,
                           status_in(POLICED))
                    .order_by(jobs.c.id)
                    .limit(size)
                ).all()]
            out.extend(self._act_on(rows, now))
            if len(rows) < size:
                break
            after = rows[-1].id
            seen += len(rows)
        return out

    def police_job(self, job_id: int, now: float) -> None:
        """`police` one job (after a report that left it handed out)."""
        with self.db.transaction() as conn:
            row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
        if row is not None:
            self._act_on([Job.from_row(row._mapping)], now)

    def _act_on(self, read: list[Job], now: float) -> list[Outcome]:
        """The periodic policy of the jobs `read`, evaluated here, applied to those that are
        still as they were read (the others are looked at by the next pass)."""
        fired: list[tuple[Job, policy.Action]] = []
        costly: set[int | None] = set()  # autoclusters whose expressions ran into the bound
        for job in read:
            if job.autocluster_id in costly:
                continue  # held with the first of them (Negotiator.hold_idle)
            with self.reading(job.id):
                action = self.periodic_policy(views.policy_ad(job), now)
            if action is not None:
                fired.append((job, action))
                if action.code == holds.JOB_POLICY_UNDEFINED:
                    costly.add(job.autocluster_id)
        out: list[Outcome] = []
        if not fired:
            return out
        with self.db.transaction() as conn:
            for job, action in fired:
                locked = self.transitions.lock(conn, job.id)
                if locked is None or (locked.status, locked.claims, locked.updated_at) != (
                        job.status, job.claims, job.updated_at):
                    continue
                out.append(self._police_one(conn, locked, action, now))
        return out

    def police_due(self, interval: float, *, now: float | None = None) -> list[Outcome] | None:
        """`police` every job, unless a pass started less than `interval` seconds ago anywhere
        in the pool (None then): one runner per interval, whoever asks first; none when no job
        has a periodic expression."""
        now = time.time() if now is None else now
        if not self.reads.police_pending(POLICED) or not self._take_pass("police", interval, now):
            return None
        return self.police(now=now)

    def reap_due(self, interval: float, *, now: float | None = None) -> list[Outcome] | None:
        """`reap`, unless a reap pass started less than `interval` seconds ago anywhere in the
        pool (None then), or there is nothing to reap."""
        now = time.time() if now is None else now
        if not self.reads.reap_pending(now) or not self._take_pass("reap", interval, now):
            return None
        return self.reap(now=now)

    def prune_due(self, retention: float, interval: float, *, now: float | None = None,
                  budget: float = 30.0) -> Pruned | None:
        """`prune` what finished more than `retention` seconds ago, for at most `budget`
        seconds, unless a prune started less than `interval` seconds ago anywhere in the pool
        (None then)."""
        now = time.time() if now is None else now
        if not self._take_pass("prune", interval, now):
            return None
        return self.retention.prune(now - retention, budget=budget)

    def _take_pass(self, name: str, interval: float, now: float) -> bool:
        with self.db.transaction() as conn:
            self.db.backend.insert_missing(conn, passes, {"name": name, "last_run_at": 0.0})
            done = conn.execute(
                update(passes)
                .where(passes.c.name == name, passes.c.last_run_at <= now - interval)
                .values(last_run_at=now)
            )
            return bool(done.rowcount)

    def _police_one(self, conn: Connection, job: Job, action: policy.Action,
                    now: float) -> Outcome:
        """Act on `action`, what the periodic policy of `job` (locked) asked for."""
        event = {policy.HOLD: Event.HOLD, policy.RELEASE: Event.RELEASE,
                 policy.REMOVE: Event.REMOVE}[action.kind]
        outcome = self.transitions.apply(
            conn, job, event, decide_args={}, now=now, reason=action.reason,
            hold=(action.code, action.subcode), attrs={"PolicyAction": action.kind},
        )
        if action.code == holds.JOB_POLICY_UNDEFINED and job.autocluster_id is not None:
            self.negotiator.hold_idle(conn, job.autocluster_id, action.reason,
                                     holds.JOB_POLICY_UNDEFINED, now)
        return outcome

    def hold_unreadable(self, job_id: int, reason: str) -> Outcome | None:
        """Hold a job whose stored values a reader cannot take (the agent died reading them:
        jobstore.node.inflight), whatever its status allows; None when it is not there or
        cannot be held."""
        with self.db.transaction() as conn:
            job = self.transitions.lock(conn, job_id)
            if job is None or job.status not in (Status.IDLE, *HANDED_OUT):
                return None
            return self.transitions.apply(conn, job, Event.HOLD, decide_args={},
                                          now=time.time(), reason=reason,
                                          hold=(holds.JOB_POLICY_UNDEFINED, 0))

    def reap(self, *, now: float | None = None, limit: int = 500) -> list[Outcome]:
        """Send jobs whose lease ran out back to idle (or to failed, out of attempts); give up
        waiting for stopped attempts that never reported their end (a pending release then
        takes effect)."""
        now = now or time.time()
        out = self._reap_leases(now, limit)
        with self.db.transaction() as conn:
            gone = conn.execute(
                select(jobs)
                .where(jobs.c.winding_down_until < now)
                .limit(limit)
                .with_for_update(skip_locked=True)
            ).all()
            for row in gone:
                job = Job.from_row(row._mapping)
                why = f"released: attempt {job.claims} did not report its end in time"
                released = self.transitions.wound_down(conn, job, now, why)
                if released is not None:
                    out.append(released)
        return out

    def _reap_leases(self, now: float, limit: int) -> list[Outcome]:
        """Expire the leases that ran out; a lease that a report renewed since its expiry was
        last indexed (Job.lease_renewed_until) is indexed again instead (no event: nothing
        happened to the job)."""
        q = (
            select(jobs)
            .where(
                status_in(HANDED_OUT),
                jobs.c.lease_expires_at < now,
            )
            .order_by(jobs.c.lease_expires_at)
            .limit(limit)
        )
        with self.db.transaction() as conn:
            rows = []
            for r in conn.execute(q.with_for_update(skip_locked=True)).all():
                job = Job.from_row(r._mapping)
                renewed = job.lease_renewed_until
                if renewed is not None and renewed >= now:
                    conn.execute(update(jobs).where(jobs.c.id == job.id)
                                 .values(lease_expires_at=renewed))
                else:
                    rows.append(job)
            return [
                self.transitions.apply(
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
