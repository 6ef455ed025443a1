"""The job store: JobStore builds the parts of the job database on one engine.

Every change of a job's state goes through `Transitions.apply`, which updates the row and appends
its event in the same transaction: a hook's report through `reports.Reports`, the periodic
passes through `maintenance.Maintenance`, a submitter's writes through the door.
"""

from __future__ import annotations

from typing import Self

from sqlalchemy import Engine

from jobstore.core.claims import Offer, Verdict
from jobstore.db.actions import ActTotals, PagedActions
from jobstore.db.adminsettings import AdminSettings
from jobstore.db.backends import Door
from jobstore.db.dagfiles import DagFiles
from jobstore.db.dags import DagStore
from jobstore.db.dagscripts import DagScripts
from jobstore.db.deliveries import Deliveries
from jobstore.db.engine import make_engine
from jobstore.db.eventcursors import EventCursors
from jobstore.db.eventlogs import EventLogs
from jobstore.db.gauges import Gauges
from jobstore.db.localdoor import LocalDoor
from jobstore.db.maintenance import Maintenance
from jobstore.db.negotiator import Negotiator
from jobstore.db.reads import AUTOCLUSTER_KEY, JobReads
from jobstore.db.reports import AttemptReport, Reports
from jobstore.db.retention import Retention
from jobstore.db.sandbox import SandboxFiles
from jobstore.db.slots import SlotAds, SlotRow
from jobstore.db.submissions import Submissions
from jobstore.db.transactions import Transactions
from jobstore.db.transitions import Outcome, Transitions
from jobstore.errors import DatabaseError, UnknownJob
from jobstore.formats import userlog

__all__ = [
    "AUTOCLUSTER_KEY",
    "ActTotals",
    "AttemptReport",
    "DatabaseError",
    "JobStore",
    "Offer",
    "Outcome",
    "SlotRow",
    "UnknownJob",
    "Verdict",
]


class JobStore:
    """The job database's parts, each with one job, built on one engine: `db`, transactions on the
    backend; `transitions`, the state machine's writes; `negotiator`, the claim and the
    accountant; `door`, a submitter's writes; `reports`, the hooks' reports; `maintenance`, the
    periodic policy, the reaper, the prune's pass; `actions`, hold, release, rm, qedit of one
    job or of a selection; `submissions`; `reads`; `slots`; `files`, the sandboxes; `retention`;
    `deliveries`, the outputs an access point writes home; `event_cursors`, where the followers
    of job_events stand; `event_logs`, the job event logs an access point writes; `metrics`, the
    gauges; `dags`; `dag_scripts`, the DAG node scripts an access point runs; `admin_settings`,
    condor_userprio's and the attribute rules. Callers use the part they need. Thread-safe as
    far as the engine is; holds no session state but the remembered verdicts of the claim
    (Negotiator.verdicts) and who its sessions are (Transactions.identity)."""

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
        self.dag_scripts = DagScripts(self.db, self.door, self.files)
        self.slots = SlotAds(self.db)
        self.retention = Retention(self.db)
        self.deliveries = Deliveries(self.db)
        self.event_cursors = EventCursors(self.db)
        self.event_logs = EventLogs(self.db)
        self.dag_files = DagFiles(self.db)
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
