"""The job store: a façade that composes its parts (JobStore), and its own paths: submit,
reports, admin events, periodic policy, lease recovery.

Every change of a job's state goes through `Transitions.apply`, which updates the row and appends
its event in the same transaction. Reports carry the attempt's token; a report from a superseded
attempt is recorded as an event and changes nothing (fencing).
"""

from __future__ import annotations

import secrets
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

from classad2 import ClassAd
from sqlalchemy import ColumnElement, Connection, Engine, delete, insert, select, update

from jobstore.core import holds, policy
from jobstore.core.claims import ClaimRequest, Offer, Verdict
from jobstore.core.jobs import (
    CHANGE_COLUMNS,
    JOB_COLUMNS,
    Job,
    JobSpec,
)
from jobstore.core.policy import ExitVerdict
from jobstore.core.states import HANDED_OUT, Event, Status
from jobstore.db.actions import PAGE as ACT_PAGE
from jobstore.db.actions import ActTotals, PagedActions, outcome_of
from jobstore.db.backends import ACTED, DENIED, READ_JOB, READ_JOBS, Door, Identity
from jobstore.db.dags import DagStore
from jobstore.db.engine import make_engine
from jobstore.db.gauges import Gauges
from jobstore.db.localdoor import LocalDoor
from jobstore.db.negotiator import Negotiator
from jobstore.db.phases import status_in
from jobstore.db.reads import AUTOCLUSTER_KEY, JobReads
from jobstore.db.retention import Pruned, Retention
from jobstore.db.rows import event_row
from jobstore.db.sandbox import SandboxFiles
from jobstore.db.schema import job_attr_rules, jobs, passes
from jobstore.db.slots import SlotAds, SlotRow
from jobstore.db.submissions import Submissions
from jobstore.db.transactions import AfterCommit, CommitListener, Transactions
from jobstore.db.transitions import DAG_NODE, Outcome, Transitions
from jobstore.errors import (
    DatabaseError,
    InvalidInput,
    JobstoreError,
    NotOwner,
    RowChanged,
    UnknownJob,
)
from jobstore.formats import userlog, views
from jobstore.formats.edits import edit_target

__all__ = [
    "AttemptReport",
    "ActTotals",
    "SlotRow",
    "AUTOCLUSTER_KEY",
    "AfterCommit",
    "CommitListener",
    "JobStore",
    "Outcome",
    "Pruned",
    "ClaimRequest",
    "Offer",
    "Verdict",
    "UnknownJob",
    "DatabaseError",
]


# Called inside the transaction for EXIT with the job row (and the exit's usage columns): how the
# exit ends (jobstore.core.policy.exit_verdict).
ExitPolicy = Callable[[Job], ExitVerdict]


@dataclass(frozen=True)
class AttemptReport:
    """What a hook reports of one attempt of a job (JobStore.report's arguments, as one value
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


P = ParamSpec("P")
R = TypeVar("R")
# Statuses the periodic pass looks at, and its page size.
POLICED = tuple(s.value for s in (Status.IDLE, Status.HELD, Status.FETCHED, Status.ACCEPTED,
                                  Status.RUNNING))
PAGE = 500
SUBMIT_BATCH = 1000  # jobs per multi-row INSERT at submit
HELD_AT_SUBMIT = "submitted on hold at user's request"  # condor_submit's HoldReason
LEASE_KEPT = 0.9  # a report keeps a lease with more than this share of its length left
EDITABLE = (Status.IDLE.value, Status.HELD.value)
NOT_STARTED = (Status.FETCHED.value, Status.ACCEPTED.value)  # handed out, no start reported
# A report's attrs its event leaves out (_event_attrs): the starter's view of its own state,
# and what the attempt's start reported.
UNREAD_ATTRS = frozenset({"JobState", "NumPids"})
STARTED_ATTRS = frozenset({"JobPid", "JobStartDate"})
# Reports that say an attempt is over (a stopped attempt that was winding down has ended).
ENDS_ATTEMPT = frozenset({Event.EXIT, Event.EVICT, Event.HOOK_HOLD, Event.HOOK_REMOVE,
                          Event.REJECT, Event.CLAIM_EVICTED})


def _job_row(job: Job) -> dict[str, Any]:
    return {name: getattr(job, name) for name in JOB_COLUMNS if name != "id"}


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


def _to(part: str, method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """A method of the store that is `method` of its part `part` (the façade's delegation)."""

    def delegated(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return method(getattr(self, part), *args, **kwargs)

    delegated.__name__ = delegated.__qualname__ = method.__name__
    delegated.__doc__ = method.__doc__
    return delegated


class JobStore:
    """The job database: a façade over its parts, each with one job, composed here
    (`db`: transactions on the backend; `transitions`: the state machine's writes;
    `negotiator`: the claim and the accountant; `actions`: set-based hold, release, rm;
    `reads`; `slots`; `files`: the sandboxes; `retention`; `metrics`: the gauges; `dags`). Its own
    methods are the submit, report, admin and policy paths; the rest are its parts', named
    below. Thread-safe as far as the engine is; holds no session state but the remembered
    verdicts of the claim (Negotiator.verdicts) and who its sessions are (`identity`)."""

    _identity: Identity | None = None
    # How the periodic policy is evaluated (the agent's is bounded: jobstore.node.bounded).
    periodic_policy: Callable[[ClassAd, float], policy.Action | None] = staticmethod(
        policy.periodic_action)
    # Around each read of a job's stored values in this process (the agent marks the job:
    # jobstore.node.inflight)
    reading: Callable[[int], AbstractContextManager[None]] = staticmethod(
        lambda _job_id: nullcontext())

    def __init__(self, engine: Engine, statement_timeout_ms: int | None = 5000, *,
                 user_log: bool = True) -> None:
        """The store on `engine`; with `user_log`, its commits write the jobs' HTCondor event
        logs (formats.userlog)."""
        self.db = Transactions(engine, statement_timeout_ms)
        self.transitions = Transitions(self.db)
        self.negotiator = Negotiator(self.db, self.transitions)
        # the door of a submitter's writes: the database's own, or this package's (SQLite)
        self.door: Door = (self.db.backend.door(self.db.listens_to_every_job)
                           or LocalDoor(self.db, self.transitions, self.negotiator))
        self.transitions.follow_dags(self.door)
        self.actions = PagedActions(self.db, self.door)
        self.files = SandboxFiles(self.db, self.door)
        self.submissions = Submissions(self.db, self.door, self.files)
        self.dags = DagStore(self.db, self.door, self.submissions)
        self.reads = JobReads(self.db)
        self.slots = SlotAds(self.db)
        self.retention = Retention(self.db)
        self.metrics = Gauges(self.db)
        if user_log:
            self.db.listen(userlog.on_commit, jobs_with_a_log_only=True)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        connect_timeout: int = 5,
        statement_timeout_ms: int | None = 5000,
        pool: bool = False,
        max_overflow: int = 0,
        user_log: bool = True,
    ) -> Self:
        """A store on `url`: one short connection per transaction, or (`pool`, for a
        long-running caller) one kept connection plus at most `max_overflow` more."""
        engine = make_engine(
            url, connect_timeout=connect_timeout, pool=pool, max_overflow=max_overflow
        )
        return cls(engine, statement_timeout_ms, user_log=user_log)

    # ---- the parts' methods -------------------------------------------------------------

    def claim(self, req: ClaimRequest, judge: Callable[[Job], Verdict]) -> Job | None:
        """Hand the best matching idle job of `req.queue` to a slot (Negotiator.claim)."""
        return self.negotiator.claim(req, judge)

    @property
    def engine(self) -> Engine:
        return self.db.engine

    @property
    def statement_timeout_ms(self) -> int | None:
        return self.db.statement_timeout_ms

    @property
    def can_listen(self) -> bool:
        return self.db.can_listen

    @property
    def ids_commit_out_of_order(self) -> bool:
        return self.db.ids_commit_out_of_order

    listen = _to("db", Transactions.listen)
    listener = _to("db", Transactions.listener)
    update_priorities = _to("negotiator", Negotiator.update_priorities)
    usage_table = _to("negotiator", Negotiator.usage_table)
    act_where = _to("actions", PagedActions.act_where)
    get_job = _to("reads", JobReads.get_job)
    attempt_states = _to("reads", JobReads.attempt_states)
    attempts_on = _to("reads", JobReads.attempts_on)
    find_jobs = _to("reads", JobReads.find_jobs)
    list_jobs = _to("reads", JobReads.list_jobs)
    iter_jobs = _to("reads", JobReads.iter_jobs)
    has_idle = _to("reads", JobReads.has_idle)
    count_by_status = _to("reads", JobReads.count_by_status)
    autoclusters = _to("reads", JobReads.autoclusters)
    events = _to("reads", JobReads.events)
    last_event_id = _to("reads", JobReads.last_event_id)
    event_feed = _to("reads", JobReads.event_feed)
    snapshot_bounds = _to("reads", JobReads.snapshot_bounds)
    xact_horizon = _to("reads", JobReads.xact_horizon)
    stats = _to("reads", JobReads.stats)
    publish_slots = _to("slots", SlotAds.publish_slots)
    live_slots = _to("slots", SlotAds.live_slots)
    expire_slots = _to("slots", SlotAds.expire_slots)
    input_limits = _to("files", SandboxFiles.input_limits)
    set_input_limits = _to("files", SandboxFiles.set_input_limits)
    job_files_of = _to("files", SandboxFiles.job_files_of)
    sent_names = _to("files", SandboxFiles.sent_names)
    sandbox_start = _to("files", SandboxFiles.sandbox_start)
    file_range = _to("files", SandboxFiles.file_range)
    file_content = _to("files", SandboxFiles.file_content)
    prune = _to("retention", Retention.prune)
    gauges = _to("metrics", Gauges.gauges)
    submit_dag = _to("dags", DagStore.submit_dag)
    dag_of = _to("dags", DagStore.dag_of)
    dag_batches = _to("dags", DagStore.dag_batches)
    dag_node_jobs = _to("dags", DagStore.dag_node_jobs)
    dag_events = _to("dags", DagStore.dag_events)
    dag_nodes_of = _to("dags", DagStore.dag_nodes_of)
    pause_dag = _to("dags", DagStore.pause_dag)
    remove_dag = _to("dags", DagStore.remove_dag)

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
        connection: Connection | None = None,
        idempotency_key: str | None = None,
        check: Callable[[Job], None] | None = None,
    ) -> tuple[int, list[int]]:
        """Insert one cluster of jobs, each with its `submit` event and its autocluster.
        Returns (cluster, job ids). Raises AdError when a spec's attributes cannot be stored (a
        reserved +Attr), ValueError for bad concurrency limits or accounting group names.

        With `connection` (the caller's, inside its own transaction on this database) the jobs
        are queued in that transaction: they commit or roll back with the caller's rows. With
        `idempotency_key`, a submit whose key was used before queues nothing and returns that
        cluster and its jobs. `check` is called on every job before it is inserted; what it
        raises rolls the whole submit back. The specs are read once, in order, SUBMIT_BATCH at
        a time (a lazy sequence, description.SubmitSpecs, is never held whole)."""
        return self.submissions.submit(
            specs, owner=owner, queue=queue, max_attempts=max_attempts,
            submit_file=submit_file, now=now or time.time(), connection=connection,
            idempotency_key=idempotency_key, check=check)

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
            self._police_job(job_id, r.now)
        return outcome

    def report_many(self, reports: Sequence[tuple[int, AttemptReport]]
                    ) -> list[Outcome | JobstoreError]:
        """Apply several reports (job id, report) in one transaction, in their order. A report
        that may not be applied (UnknownJob, NotOwner, InvalidInput) is left out and its error
        is its result; a database error fails them all.

        Where the backend can, the rows are read unlocked in the round trip that opens the
        transaction, and each is written only if it is still the version read (no lock to
        log), all at the end and in the order of their ids; a batch that finds a row changed
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
            self._police_job(job_id, now)
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
        unlocked) at the end."""
        results: list[Outcome | JobstoreError] = []
        left = Counter(job_id for job_id, _ in reports)
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
                keep = left[job_id] or version is not None
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
            self._hold_too_costly(conn, job.autocluster_id, reason or "", now)
        return outcome

    def _hold_too_costly(self, conn: Connection, autocluster: int, reason: str,
                         now: float) -> None:
        """A job's expression took too long to evaluate (jobstore.node.bounded): the other idle
        jobs of its autocluster share it, and are held before they cost a node as much."""
        self.negotiator.hold_idle(conn, autocluster, reason, holds.JOB_POLICY_UNDEFINED, now)

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

    def identity(self) -> Identity:
        """Who this store's sessions are, as the database decides (PostgreSQL: the session's
        role, migration 0012). A database without sessions of its own (SQLite) is one user's
        (the file's owner, or root: engine.make_engine), so its session is the invoking
        account, trusted."""
        if self._identity is None:
            self._identity = self.db.backend.local_identity()
        if self._identity is None:
            with self.db.transaction() as conn:
                self._identity = self.db.backend.session_identity(conn)
        return self._identity

    def _identity_on(self, conn: Connection, callers: bool) -> Identity:
        """`identity`, read on `conn` if it is not known yet; a caller's connection
        (`callers`) may be another role's: read on it every time."""
        local = self.db.backend.local_identity()
        if local is not None:
            return local
        if callers:
            return self.db.backend.session_identity(conn)
        if self._identity is None:
            self._identity = self.db.backend.session_identity(conn)
        return self._identity

    def admin(self, job_id: int, event: Event, reason: str | None = None) -> Outcome:
        """An owner's or a queue super user's hold (HoldReasonCode 1, UserRequest), release or
        rm of one job (NotOwner for anyone else, decided by the database on PostgreSQL)."""
        with self.db.transaction() as conn:
            changes = self.door.act(conn, [job_id], event.value, reason,
                                    (holds.USER_REQUEST, 0), skip_locked=False, now=time.time())
        mine = [c for c in changes if c.job_id == job_id and c.kind in (ACTED, DENIED)]
        if not mine:
            raise UnknownJob(job_id)
        if mine[0].kind == DENIED:
            raise NotOwner(job_id, self.identity().account, str(event))
        return outcome_of(mine[0], self._name(job_id))

    def _name(self, job_id: int) -> str:
        try:
            return views.job_id(self.reads.get_job(job_id))
        except UnknownJob:
            return ""

    def edit(self, job_id: int, attr: str, value: str, *, now: float | None = None) -> bool:
        """condor_qedit of one waiting (idle or held) job: set attribute `attr` to the
        expression `value`; whether the job was edited (False when it is not waiting). Owner,
        the job store's own attributes and those it computes cannot change (ValueError); a
        change of what matching sees moves the job to its new autocluster."""
        totals = self.edit_where(jobs.c.id == job_id, attr, value, now=now)
        if totals.denied:
            raise NotOwner(job_id, self.identity().account, "edit")
        if not totals.success:
            self.reads.get_job(job_id)  # UnknownJob when there is none
        return bool(totals.success)

    def edit_where(self, where: ColumnElement[bool], attr: str, value: str, *,
                   keep: Callable[[Job], bool] | None = None, page: int = ACT_PAGE,
                   now: float | None = None) -> ActTotals:
        """condor_qedit of the jobs `where` selects (and `keep` keeps), in pages of `page`
        jobs, each one transaction: the waiting ones that this session may change are edited
        (`success`), the others counted (`bad_status`: not waiting; `denied`: not this
        session's). ValueError as `edit`."""
        name, text = edit_target(attr, value)
        return self.actions.edit_where(where, name, text, keep=keep, page=page, now=now)

    def set_attr_rules(self, *, immutable: Sequence[str], protected: Sequence[str]) -> None:
        """The admin's rules on job attributes (HTCondor's IMMUTABLE_JOB_ATTRS and
        SECURE_JOB_ATTRS: never submitted nor edited; PROTECTED_JOB_ATTRS: edited by a queue
        super user only), over the job store's own, which stay (as `jobstore init` sets them)."""
        rows = {n.lower(): "protected" for n in protected}
        rows.update({n.lower(): "immutable" for n in immutable})
        with self.db.transaction() as conn:
            conn.execute(delete(job_attr_rules).where(job_attr_rules.c.origin == "config"))
            system = set(conn.execute(select(job_attr_rules.c.name)).scalars())
            new = [{"name": n, "rule": r, "origin": "config"} for n, r in rows.items()
                   if n not in system]
            if new:
                conn.execute(insert(job_attr_rules), new)

    def set_factor(self, name: str, factor: float) -> bool:
        """condor_userprio -setfactor (the admin's); False when the submitter is unknown."""
        if not factor >= 1.0:
            raise InvalidInput("a priority factor must be at least 1")
        with self.db.transaction() as conn:
            return self.door.set_factor(conn, name, factor)

    def reset_usage(self, name: str | None = None, *, now: float | None = None) -> int:
        """condor_userprio -resetusage (one submitter) or -resetall: accumulated usage to 0 and
        real priority to its lowest value (the admin's). Returns the rows reset."""
        with self.db.transaction() as conn:
            return self.door.reset_usage(conn, name, time.time() if now is None else now)

    # ---- the job's own policy: the periodic pass ---------------------------------------

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

    def _police_job(self, job_id: int, now: float) -> None:
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
                continue  # held with the first of them (_hold_too_costly)
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
            self._hold_too_costly(conn, job.autocluster_id, action.reason, now)
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
