"""The job store: a façade that composes its parts (JobStore) and names their methods.

Every change of a job's state goes through `Transitions.apply`, which updates the row and appends
its event in the same transaction: a hook's report through `reports.Reports`, the periodic
passes through `maintenance.Maintenance`, a submitter's writes through the door.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

from classad2 import ClassAd
from sqlalchemy import Connection, Engine

from jobstore.core import policy
from jobstore.core.claims import ClaimRequest, Offer, Verdict
from jobstore.core.jobs import (
    Job,
    JobSpec,
)
from jobstore.db.actions import ActTotals, PagedActions
from jobstore.db.adminsettings import AdminSettings
from jobstore.db.backends import Door
from jobstore.db.dags import DagStore
from jobstore.db.engine import make_engine
from jobstore.db.gauges import Gauges
from jobstore.db.localdoor import LocalDoor
from jobstore.db.maintenance import Maintenance
from jobstore.db.negotiator import Negotiator
from jobstore.db.reads import AUTOCLUSTER_KEY, JobReads
from jobstore.db.reports import AttemptReport, Reports
from jobstore.db.retention import Pruned, Retention
from jobstore.db.sandbox import SandboxFiles
from jobstore.db.slots import SlotAds, SlotRow
from jobstore.db.submissions import Submissions
from jobstore.db.transactions import AfterCommit, CommitListener, Transactions
from jobstore.db.transitions import Outcome, Transitions
from jobstore.errors import (
    DatabaseError,
    UnknownJob,
)
from jobstore.formats import userlog

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


P = ParamSpec("P")
R = TypeVar("R")


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
    `negotiator`: the claim and the accountant; `reports`: the hooks' reports; `maintenance`:
    the periodic policy, the reaper, the prune's pass; `actions`: hold, release, rm, qedit of
    one job or of a selection; `submissions`; `reads`; `slots`; `files`: the sandboxes;
    `retention`; `metrics`: the gauges; `dags`; `admin_settings`: condor_userprio's and the
    attribute rules). Its methods are its parts', named below. Thread-safe as far as the engine
    is; holds no session state but the remembered verdicts of the claim (Negotiator.verdicts)
    and who its sessions are (Transactions.identity)."""

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
        self.reads = JobReads(self.db)
        self.actions = PagedActions(self.db, self.door, self.reads)
        self.admin_settings = AdminSettings(self.db, self.door)
        self.files = SandboxFiles(self.db, self.door)
        self.submissions = Submissions(self.db, self.door, self.files)
        self.dags = DagStore(self.db, self.door, self.submissions)
        self.slots = SlotAds(self.db)
        self.retention = Retention(self.db)
        self.metrics = Gauges(self.db)
        self.maintenance = Maintenance(self.db, self.transitions, self.negotiator, self.reads,
                                       self.retention)
        self.reports = Reports(self.db, self.transitions, self.negotiator,
                               self.maintenance.police_job)
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
    identity = _to("db", Transactions.identity)
    admin = _to("actions", PagedActions.admin)
    edit = _to("actions", PagedActions.edit)
    act_where = _to("actions", PagedActions.act_where)
    edit_where = _to("actions", PagedActions.edit_where)
    set_factor = _to("admin_settings", AdminSettings.set_factor)
    reset_usage = _to("admin_settings", AdminSettings.reset_usage)
    set_attr_rules = _to("admin_settings", AdminSettings.set_attr_rules)
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
    report = _to("reports", Reports.report)
    apply_report = _to("reports", Reports.apply_report)
    report_many = _to("reports", Reports.report_many)
    police = _to("maintenance", Maintenance.police)
    police_due = _to("maintenance", Maintenance.police_due)
    reap = _to("maintenance", Maintenance.reap)
    reap_due = _to("maintenance", Maintenance.reap_due)
    prune_due = _to("maintenance", Maintenance.prune_due)
    hold_unreadable = _to("maintenance", Maintenance.hold_unreadable)

    @property
    def periodic_policy(self) -> Callable[[ClassAd, float], policy.Action | None]:
        """How the periodic policy is evaluated (the agent's is bounded: node.bounded)."""
        return self.maintenance.periodic_policy

    @periodic_policy.setter
    def periodic_policy(self, evaluate: Callable[[ClassAd, float], policy.Action | None]
                        ) -> None:
        self.maintenance.periodic_policy = evaluate

    @property
    def reading(self) -> Callable[[int], AbstractContextManager[None]]:
        """Around each read of a job's stored values in this process (the agent marks the
        job: node.inflight)."""
        return self.maintenance.reading

    @reading.setter
    def reading(self, around: Callable[[int], AbstractContextManager[None]]) -> None:
        self.maintenance.reading = around

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
        a time (a lazy sequence, submit.expansion.SubmitSpecs, is never held whole)."""
        return self.submissions.submit(
            specs, owner=owner, queue=queue, max_attempts=max_attempts,
            submit_file=submit_file, now=now or time.time(), connection=connection,
            idempotency_key=idempotency_key, check=check)
