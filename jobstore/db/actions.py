"""condor_rm, condor_hold, condor_release and condor_qedit of many jobs at once, in pages, each
page one transaction and one call of the door (backends.Door: on PostgreSQL the database's own
functions, which decide which of them the session may act on).

A page reads up to PAGE jobs of the selection, keeps those `keep` keeps (the part of a
constraint SQL cannot say), and hands their ids to the door, which locks the ones the session
may act on (SKIP LOCKED: a job a claim holds is taken in a later pass, which waits for it),
changes them and writes an event for each; a job handed out to a slot has its attempt stopped
and its node's agent told."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import ColumnElement, Connection

from jobstore.core import holds
from jobstore.core.jobs import Job
from jobstore.core.states import FINAL, FINAL_VALUES, Event, Status
from jobstore.db.backends import ACTED, DENIED, SKIPPED, Change, Door
from jobstore.db.phases import status_not_in
from jobstore.db.reads import JobReads, public_jobs
from jobstore.db.schema import jobs
from jobstore.db.transactions import Transactions
from jobstore.db.transitions import Outcome
from jobstore.errors import NotOwner, UnknownJob
from jobstore.formats import views
from jobstore.formats.edits import edit_changes, edit_target

PAGE = 1000
SHOWN = 50  # outcomes kept for a caller to print, the failures first
EDITABLE = (Status.IDLE.value, Status.HELD.value)
_DONE = {Event.HOLD: Status.HELD.value, Event.REMOVE: Status.REMOVED.value}

# One page's work: the door's call on these ids (skip_locked), what it did to each
PageWork = Callable[[Connection, list[Job], float, bool], list[Change]]


@dataclass
class ActTotals:
    """What an action on many jobs did, counted as condor_rm and htcondor2's act() count."""

    success: int = 0
    already_done: int = 0
    bad_status: int = 0
    denied: int = 0
    outcomes: list[Outcome] = field(default_factory=list)  # at most SHOWN
    denied_names: list[str] = field(default_factory=list)  # CLUSTER.PROC, at most SHOWN

    @property
    def acted_on(self) -> int:
        return self.success + self.already_done + self.bad_status

    def add(self, outcome: Outcome, event: Event) -> None:
        kind = total_kind(outcome, event)
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.outcomes) < SHOWN:
            self.outcomes.append(outcome)
        elif kind != "success":  # keep the failures in view: drop a success instead
            for i, kept in enumerate(self.outcomes):
                if kept.changed or kept.pending:
                    self.outcomes[i] = outcome
                    break

    def deny(self, name: str) -> None:
        self.denied += 1
        if len(self.denied_names) < SHOWN:
            self.denied_names.append(name)


def total_kind(outcome: Outcome, event: Event) -> str:
    """success, already_done or bad_status, as htcondor2's act() counts an outcome."""
    if outcome.changed or outcome.pending:
        return "success"
    if outcome.before == _DONE.get(event) or (
            event == Event.REMOVE and outcome.before in FINAL_VALUES):
        return "already_done"
    return "bad_status"


def outcome_of(change: Change, name: str = "") -> Outcome:
    """What the door did to a job the caller named, as the one-job transition says it."""
    after = change.to_status if change.changed else change.from_status
    return Outcome(change.job_id, change.event, change.from_status, after, change.changed,
                   reason=change.reason, pending=change.pending, name=name)


class PagedActions:
    """Hold, release, remove or edit one job, or every job of a selection, PAGE jobs a
    transaction."""

    def __init__(self, db: Transactions, door: Door, reads: JobReads) -> None:
        self.db = db
        self.door = door
        self.reads = reads

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
            raise NotOwner(job_id, self.db.identity().account, str(event))
        return outcome_of(mine[0], self._name(job_id))

    def edit(self, job_id: int, attr: str, value: str, *, now: float | None = None) -> bool:
        """condor_qedit of one waiting (idle or held) job: set attribute `attr` to the
        expression `value`; whether the job was edited (False when it is not waiting). Owner,
        the job store's own attributes and those it computes cannot change (ValueError); a
        change of what matching sees moves the job to its new autocluster."""
        totals = self.edit_where(jobs.c.id == job_id, attr, value, now=now)
        if totals.denied:
            raise NotOwner(job_id, self.db.identity().account, "edit")
        if not totals.success:
            self.reads.get_job(job_id)  # UnknownJob when there is none
        return bool(totals.success)

    def _name(self, job_id: int) -> str:
        try:
            return views.job_id(self.reads.get_job(job_id))
        except UnknownJob:
            return ""

    def act_where(
        self,
        where: ColumnElement[bool],
        event: Event,
        reason: str | None,
        *,
        keep: Callable[[Job], bool] | None = None,
        hold: tuple[int, int] = (holds.USER_REQUEST, 0),
        page: int = PAGE,
        connection: Connection | None = None,
    ) -> ActTotals:
        """Apply `event` to the unfinished jobs `where` selects (and `keep` keeps) that this
        session may act on; those it may not are counted in `denied`. With `connection`, all
        in the caller's transaction."""
        totals = ActTotals()

        def act(conn: Connection, chosen: list[Job], now: float, skip: bool) -> list[Change]:
            return self.door.act(conn, [j.id for j in chosen], event.value, reason, hold,
                                 skip_locked=skip, now=now)

        self.in_pages(where, keep, act, totals, event, page=page, connection=connection)
        return totals

    def edit_where(self, where: ColumnElement[bool], attr: str, value: str, *,
                   keep: Callable[[Job], bool] | None = None, page: int = PAGE,
                   now: float | None = None) -> ActTotals:
        """condor_qedit of the jobs `where` selects (and `keep` keeps), in pages of `page`
        jobs, each one transaction: the waiting ones that this session may change are edited
        (`success`), the others counted (`bad_status`: not waiting; `denied`: not this
        session's). ValueError as `edit` (formats.edits.edit_target)."""
        name, text = edit_target(attr, value)
        totals = ActTotals()

        def edit(conn: Connection, chosen: list[Job], at: float, skip: bool) -> list[Change]:
            edited = [job.but(**edit_changes(job, name, text)) for job in chosen
                      if job.status in EDITABLE]
            return self.door.edit(conn, [j.id for j in chosen], name, text, edited,
                                  skip_locked=skip, now=now or at)

        self.in_pages(where, keep, edit, totals, None, page=page)
        return totals

    def in_pages(self, where: ColumnElement[bool], keep: Callable[[Job], bool] | None,
                 work: PageWork, totals: ActTotals, event: Event | None, *, page: int = PAGE,
                 connection: Connection | None = None) -> None:
        """Call `work` with each page of the unfinished jobs `where` selects (and `keep`
        keeps), in a transaction of its own: first every page, the jobs another transaction
        holds skipped; then those, waiting for them. `totals` counts what the door did."""
        selected = [where, status_not_in(FINAL)]
        last, skipped = 0, list[int]()
        while True:
            with self.db.transaction(connection) as conn:
                rows = self._page(conn, [*selected, jobs.c.id > last], page)
                if not rows:
                    break
                last = rows[-1].id
                chosen = [job for job in rows if keep is None or keep(job)]
                if chosen:
                    changes = work(conn, chosen, time.time(), True)
                    skipped += _count(changes, chosen, totals, event)
        for start in range(0, len(skipped), page):  # taken by someone else: wait for them
            chunk = skipped[start:start + page]
            with self.db.transaction(connection) as conn:
                rows = self._page(conn, [*selected, jobs.c.id.in_(chunk)], page)
                chosen = [job for job in rows if keep is None or keep(job)]
                if chosen:
                    _count(work(conn, chosen, time.time(), False), chosen, totals, event)

    @staticmethod
    def _page(conn: Connection, where: Sequence[ColumnElement[bool]], page: int) -> list[Job]:
        return [Job.from_row(r._mapping) for r in conn.execute(
            public_jobs().where(*where).order_by(jobs.c.id).limit(page))]


def _count(changes: list[Change], chosen: list[Job], totals: ActTotals,
           event: Event | None) -> list[int]:
    """Count what the door did to the jobs of a page; the ids it skipped."""
    names = {job.id: views.job_id(job) for job in chosen}
    skipped = []
    for change in changes:
        if change.kind == SKIPPED:
            skipped.append(change.job_id)
        elif change.kind == DENIED:
            totals.deny(names.get(change.job_id, str(change.job_id)))
        elif change.kind == ACTED:
            outcome = outcome_of(change, names.get(change.job_id, ""))
            if event is None:  # an edit: success, or not waiting
                if change.pending:
                    totals.success += 1
                else:
                    totals.bad_status += 1
            else:
                totals.add(outcome, event)
    return skipped


__all__ = ["PAGE", "SHOWN", "ActTotals", "PagedActions", "outcome_of", "total_kind"]
