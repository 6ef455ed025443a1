"""A hook's report of one attempt of a job, applied: the state machine's transition (or only
its event, for a superseded attempt: fencing), the lease renewed, the exit's own policy.

Reports carry the attempt's token; a report from a superseded attempt is recorded as an event
and changes nothing. Every change of a job's state goes through `Transitions.apply`, which
updates the row and appends its event in the same transaction.
"""

from __future__ import annotations

import secrets
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, select

from jobstore.core import holds
from jobstore.core.jobs import CHANGE_COLUMNS, Job
from jobstore.core.policy import ExitVerdict
from jobstore.core.states import HANDED_OUT, Event, Status
from jobstore.db.backends import READ_JOB, READ_JOBS
from jobstore.db.negotiator import Negotiator
from jobstore.db.rows import event_row
from jobstore.db.schema import jobs
from jobstore.db.transactions import Transactions
from jobstore.db.transitions import DAG_NODE, Outcome, Transitions
from jobstore.errors import InvalidInput, JobstoreError, NotOwner, RowChanged, UnknownJob
from jobstore.formats import views

# Called inside the transaction for EXIT with the job row (and the exit's usage columns): how the
# exit ends (jobstore.core.policy.exit_verdict).
ExitPolicy = Callable[[Job], ExitVerdict]
LEASE_KEPT = 0.9  # a report keeps a lease with more than this share of its length left
NOT_STARTED = (Status.FETCHED.value, Status.ACCEPTED.value)  # handed out, no start reported
# A report's attrs its event leaves out (_event_attrs): the starter's view of its own state,
# and what the attempt's start reported.
UNREAD_ATTRS = frozenset({"JobState", "NumPids"})
STARTED_ATTRS = frozenset({"JobPid", "JobStartDate"})
# Reports that say an attempt is over (a stopped attempt that was winding down has ended).
ENDS_ATTEMPT = frozenset({Event.EXIT, Event.EVICT, Event.HOOK_HOLD, Event.HOOK_REMOVE,
                          Event.REJECT, Event.CLAIM_EVICTED})


@dataclass(frozen=True)
class AttemptReport:
    """What a hook reports of one attempt of a job (Reports.report's arguments, as one value
    on their way to the transition)."""

    event: Event
    token: str | None = field(repr=False)
    attempt: int | None
    changes: Mapping[str, Any] | None = None
    attrs: Mapping[str, Any] | None = None
    lease: int | None = None
    slot: str | None = None
    host: str | None = None
    exit_policy: ExitPolicy | None = None
    now: float = 0.0
    reason: str | None = None
    owner: str | None = None
    keyword: str | None = None  # of the hook that reports (the claim's keyword must be it)


def _hook_hold(attrs: Mapping[str, Any]) -> tuple[int, int]:
    """The HoldReasonCode and SubCode a JOB_EXIT hold or PREPARE_JOB carried (HTCondor's code
    range), else StartdHeldJob."""
    code, sub = attrs.get("HoldReasonCode"), attrs.get("HoldReasonSubCode")
    if not isinstance(code, int) or isinstance(code, bool) or not 0 < code < 1000:
        return holds.STARTD_HELD_JOB, 0
    if isinstance(sub, int) and not isinstance(sub, bool) and abs(sub) < 2**31:
        return code, sub
    return code, 0


def _event_attrs(job: Job, attrs: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A report's attrs as its event keeps them: without the starter's own state (no reader),
    and without the pid and start date of an attempt whose start reported them already."""
    if not attrs:
        return attrs
    known = job.job_pid is not None and attrs.get("JobPid") == job.job_pid
    return {name: value for name, value in attrs.items()
            if name not in UNREAD_ATTRS and not (known and name in STARTED_ATTRS)}


def _no_transition(job: Job, event: Event, changes: Mapping[str, Any]) -> bool:
    """An UPDATE_JOB_INFO (or a PREPARE_JOB of an accepted job) that leaves the job where it
    is and reports only values already stored, about a job with no periodic policy for a
    report to evaluate: it may renew the lease, nothing else (no event: nothing happened to
    the job)."""
    staying = (event in (Event.UPDATE, Event.START) and job.status == Status.RUNNING) or (
        event in (Event.UPDATE, Event.PREPARE) and job.status == Status.ACCEPTED)
    if not staying or job.periodic:
        return False
    return all(getattr(job, name) == value for name, value in changes.items())


def _needs_lock(job: Job, r: AttemptReport) -> bool:
    """Whether `r` is applied to `job` under a lock: more than one write (a periodically
    policed or winding-down job; a DAG node's, which its DAG reads at each transition), or an
    event of an attempt that is over (its job may be finished and pruned meanwhile)."""
    return (job.periodic or job.winding_down_until is not None or DAG_NODE in job.ad
            or not _current(job, r.token, r.attempt, r.keyword))


def _current(job: Job, token: str | None, attempt: int | None,
             keyword: str | None = None) -> bool:
    """Whether a report with `token` and `attempt` (from a hook of `keyword`, when known) is
    about the job's current attempt."""
    return (job.token is not None and secrets.compare_digest(str(token or ""), job.token)
            and attempt == job.claims
            and (keyword is None or job.keyword is None or job.keyword == keyword))


def _lease_holds(job: Job, lease: int, now: float) -> bool:
    """Whether `job`'s lease was renewed within the last tenth of `lease` (the reports of a
    job's start come seconds apart): a report then keeps it and changes no indexed column,
    so PostgreSQL updates the row in place (a HOT update, no new index entries). Any later
    report renews it, so that one lost periodic report never lets it run out (with the lease
    above 2.5 times the starter's update interval)."""
    return (job.lease_ends_at or 0.0) - now > lease * LEASE_KEPT


def _text(attrs: Mapping[str, Any], name: str) -> str | None:
    value = attrs.get(name)
    return value if isinstance(value, str) and value else None


class Reports:
    """Applies the hooks' reports (`report`, `apply_report`, `report_many`); `after` is called
    with a job's id and the report's time when a report left a job with a periodic policy
    handed out (the store polices it then)."""

    def __init__(self, db: Transactions, transitions: Transitions, negotiator: Negotiator,
                 after: Callable[[int, float], None]) -> None:
        self.db, self.transitions, self.negotiator = db, transitions, negotiator
        self._after = after

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
        keyword: str | None = None,
    ) -> Outcome:
        """Apply a hook's report about one attempt; a superseded attempt is only recorded.

        A report sets only the usage and exit columns (`reports.CHANGE_COLUMNS`); with `owner`
        (an ordinary account reports) it is refused (NotOwner) unless that account owns the job;
        with `keyword`, one about an attempt another keyword's slot claimed is only recorded.
        """
        return self.apply_report(job_id, AttemptReport(
            event, token, attempt, changes, attrs, lease, slot, host, exit_policy,
            now or time.time(), reason, owner, keyword))

    def apply_report(self, job_id: int, r: AttemptReport) -> Outcome:
        """`report`, its arguments as one value."""
        wrong = set(r.changes or {}) - CHANGE_COLUMNS.keys()
        if wrong:
            raise InvalidInput(f"a report may not change {sorted(wrong)}")
        # where the backend can, the row is read unlocked in the round trip that opens the
        # transaction, and written only if it is still the version read (no lock to log); one
        # that changed meanwhile is read again under a lock
        with self.db.opened(READ_JOB, {"job_id": job_id}) as (conn, opened):
            for locked in self.db.backend.report_reads:
                if locked:
                    job, version = self.transitions.lock(conn, job_id), None
                else:
                    job, version = self.db.backend.read_job(conn, opened, job_id)
                if job is None:
                    raise UnknownJob(job_id)
                if r.owner is not None and job.owner != r.owner:
                    raise NotOwner(job_id, r.owner)
                if not locked and _needs_lock(job, r):
                    continue
                try:
                    outcome = self._report(conn, job, r, version)
                    break
                except RowChanged:
                    if locked:
                        raise
            else:
                raise AssertionError("unreachable: the locked read is the last")
        if job.periodic and outcome.changed and outcome.after in HANDED_OUT:
            self._after(job_id, r.now)
        return outcome

    def report_many(self, reports: Sequence[tuple[int, AttemptReport]]
                    ) -> list[Outcome | JobstoreError]:
        """Apply several reports (job id, report) in one transaction, in their order. A report
        that may not be applied (UnknownJob, NotOwner, InvalidInput) is left out and its error
        is its result; a database error fails them all.

        Where the backend can, the rows are read unlocked in the round trip that opens the
        transaction, and each is written only if it is still the version read (no lock to
        log), all at the end and in the order of their ids (the row of a batch about one job
        with its last transition); a batch that finds a row changed
        meanwhile is rolled back and made again on locked rows. A batch with a report that
        `report` would make under a lock (`_needs_lock`) locks its rows at once. Rows are
        locked in the order of their ids (two batches never wait on each other in a cycle),
        only those of the reports that may be applied."""
        ids = sorted({job_id for job_id, _ in reports})
        locked = self.db.backend.report_reads[0]
        try:
            results, police = self._report_batch(reports, ids, locked)
        except RowChanged:
            if locked:
                raise
            results, police = self._report_batch(reports, ids, True)
        for job_id, now in police:
            self._after(job_id, now)
        return results

    def _report_batch(self, reports: Sequence[tuple[int, AttemptReport]], ids: list[int],
                      locked: bool,
                      ) -> tuple[list[Outcome | JobstoreError], list[tuple[int, float]]]:
        """report_many's transaction: its results, and the jobs to police after it."""
        police: list[tuple[int, float]] = []
        with self.db.opened(None if locked else READ_JOBS,
                            {} if locked else {"job_ids": ids}) as (conn, opened):
            rows, versions, owners = self._batch_rows(conn, opened, reports, ids, locked)
            with self.transitions.one_update_each(conn):
                results = self._report_each(conn, reports, owners, rows, versions, police)
        return results, police

    def _batch_rows(self, conn: Connection, opened: Any,
                    reports: Sequence[tuple[int, AttemptReport]], ids: list[int], locked: bool,
                    ) -> tuple[dict[int, Job | None], dict[int, str | None], dict[int, str]]:
        """report_many's rows: (the rows, their versions (None: locked), their owners)."""
        if not locked:
            read = self.db.backend.read_jobs(conn, opened, ids)
            owners = {job_id: job.owner for job_id, (job, _) in read.items()}
            if all(job_id not in read or not _needs_lock(read[job_id][0], r)
                   for job_id, r in reports):
                return ({job_id: job for job_id, (job, _) in read.items()},
                        {job_id: version for job_id, (_, version) in read.items()}, owners)
        else:
            owners = {row.id: row.owner for row in conn.execute(
                select(jobs.c.id, jobs.c.owner).where(self.transitions.id_in(ids)))}
        mine = {job_id for job_id, r in reports
                if job_id in owners and r.owner in (None, owners[job_id])}
        return {job_id: self.transitions.lock(conn, job_id) for job_id in sorted(mine)}, {}, owners

    def _report_each(self, conn: Connection, reports: Sequence[tuple[int, AttemptReport]],
                     owners: dict[int, str], rows: dict[int, Job | None],
                     versions: dict[int, str | None], police: list[tuple[int, float]],
                     ) -> list[Outcome | JobstoreError]:
        """report_many's reports in order, on the rows it read (at `versions`) or locked: a
        job's several reports make one UPDATE of its row, with the last, or (rows read
        unlocked, of several jobs) at the end."""
        results: list[Outcome | JobstoreError] = []
        left = Counter(job_id for job_id, _ in reports)
        # rows read at a version are written at the end, in the order of their ids, unless
        # there is one (no order to keep): its change then goes with its last transition
        in_order = len(left) > 1
        for job_id, r in reports:
            left[job_id] -= 1
            wrong = set(r.changes or {}) - CHANGE_COLUMNS.keys()
            job = rows.get(job_id)
            if wrong:
                results.append(InvalidInput(f"a report may not change {sorted(wrong)}"))
            elif job_id not in owners:
                results.append(UnknownJob(job_id))
            elif r.owner is not None and owners[job_id] != r.owner:
                results.append(NotOwner(job_id, r.owner))
            elif job is None:  # gone since (pruned)
                results.append(UnknownJob(job_id))
            else:
                version = versions.get(job_id)
                keep = left[job_id] or (version is not None and in_order)
                self.transitions.keep_row_of(conn, job_id if keep else None)
                outcome = self._report(conn, job, r, version)
                results.append(outcome)
                if job.periodic and outcome.changed and outcome.after in HANDED_OUT:
                    police.append((job_id, r.now))
                if left[job_id]:  # the row as this report left it, for the next one
                    # (read at a version, every change of it is kept: nothing written yet)
                    rows[job_id] = self.transitions.left_by(conn, job,
                                                            written=version is None)
        return results

    def _report(self, conn: Connection, job: Job, r: AttemptReport,
                version: str | None) -> Outcome:
        """`report` on the row `job` as read (RowChanged: it is no longer `version`)."""
        job_id, event, attempt, attrs, now, reason = (
            job.id, r.event, r.attempt, _event_attrs(job, r.attrs), r.now, r.reason)
        slot, host, changes, lease = r.slot, r.host, r.changes, r.lease
        if slot and "@" not in slot and job.slot and job.slot.split("@")[0] == slot:
            slot = job.slot  # a starter hook's _CONDOR_SLOT: one name form in the history
        if not _current(job, r.token, attempt, r.keyword):
            reason = f"report from attempt {attempt}, current attempt is {job.claims}"
            if job.token is None:
                reason = f"report from attempt {attempt}; the job is {job.status}"
            self.transitions.record(conn, event_row(
                job_id, event, job.status, None, now, attempt=attempt, slot=slot, host=host,
                reason="stale: " + reason, attrs=attrs))
            if (job.winding_down_until is not None and attempt == job.claims
                    and event in ENDS_ATTEMPT):
                released = self.transitions.wound_down(
                    conn, job, now, f"released: attempt {attempt} ended ({event})")
                if released is not None:
                    return released
            return Outcome(job_id, event, job.status, job.status, False, True, reason,
                           name=views.job_id(job))
        if _no_transition(job, event, changes or {}):
            return self._renew(conn, job, event, lease, now, version)
        decide_args: dict[str, Any] = {}
        hold = (holds.UNSPECIFIED, 0)
        if event == Event.HOOK_HOLD:  # the starter's reason, or "the startd held it"
            hold = _hook_hold(attrs or {})
            reason = reason or _text(attrs or {}, "HoldReason")
        all_changes = dict(changes or {})
        if event == Event.EXIT and job.status in NOT_STARTED:
            # the attempt ran (it exited) although its start report has not come (it comes
            # late, or never): NumJobStarts counts it, as the starter's own count would
            all_changes.setdefault("num_starts", (job.num_starts or 0) + 1)
            if job.first_started_at is None:
                all_changes.setdefault("first_started_at", job.fetched_at or now)
        if event == Event.EXIT and r.exit_policy is not None:
            verdict = r.exit_policy(job.but(**all_changes))
            if verdict.hold is not None:  # on_exit_hold: the exit puts the job on hold
                event, reason = Event.HOLD, verdict.hold.reason
                hold = (verdict.hold.code, verdict.hold.subcode)
            decide_args = {"exit_succeeded": verdict.succeeded, "retry_wanted": verdict.retry}
        if lease is not None and not _lease_holds(job, lease, now):
            all_changes["lease_renewed_until"] = now + lease
        outcome = self.transitions.apply(
            conn,
            job,
            event,
            decide_args={} if event == Event.HOLD else decide_args,
            now=now,
            changes=all_changes,
            attrs=attrs,
            reason=reason,
            slot=slot,
            host=host,
            attempt=attempt,
            hold=hold,
            attempt_ended=True,
            version=version,
        )
        if hold[0] == holds.JOB_POLICY_UNDEFINED and job.autocluster_id is not None:
            self.negotiator.hold_idle(conn, job.autocluster_id, reason or "",
                                     holds.JOB_POLICY_UNDEFINED, now)
        return outcome

    def _renew(self, conn: Connection, job: Job, event: Event, lease: int | None,
               now: float, version: str | None) -> Outcome:
        """A report with nothing new (`_no_transition`): the lease renewed unless it still holds
        (`_lease_holds`), in place (no indexed column changes); no event."""
        if lease is None or _lease_holds(job, lease, now):
            return Outcome(job.id, event, job.status, job.status, False,
                           reason="nothing new", name=views.job_id(job))
        self.transitions.change_row(conn, job, {
            "lease_renewed_until": now + lease, "updated_at": max(now, job.updated_at)}, version)
        return Outcome(job.id, event, job.status, job.status, False,
                       reason="lease renewed", name=views.job_id(job))
