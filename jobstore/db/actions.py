"""condor_rm, condor_hold and condor_release of many jobs at once: set-based statements in
pages, each page one transaction.

A page locks up to PAGE jobs of the selection (SKIP LOCKED: a job a claim holds is taken in a
later pass, which waits for it). Its waiting jobs (idle or held, no attempt still ending) change
with one UPDATE per kind of change and one multi-row INSERT of their events; a job handed out
to a slot goes through the one-job transition, which stops its attempt and tells its node's
agent. Every job still gets its own event, and the followers (`jobstore watch`) are woken once
per page."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Connection, select, update

from jobstore.core import holds
from jobstore.core.jobs import Job
from jobstore.core.states import FINAL, FINAL_VALUES, STATUS_OF, Event, Status, decide
from jobstore.db.phases import status_not_in
from jobstore.db.rows import RowChanged, event_row, note_event
from jobstore.db.schema import jobs
from jobstore.db.transactions import Transactions
from jobstore.db.transitions import (
    Outcome,
    Transitions,
    event_reason,
    transition_values,
    winding_down,
)
from jobstore.formats import views

PAGE = 1000
SHOWN = 50  # outcomes kept for a caller to print, the failures first
_WAITING = (Status.IDLE, Status.HELD)
_DONE = {Event.HOLD: Status.HELD.value, Event.REMOVE: Status.REMOVED.value}


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


def total_kind(outcome: Outcome, event: Event) -> str:
    """success, already_done or bad_status, as htcondor2's act() counts an outcome."""
    if outcome.changed or outcome.pending:
        return "success"
    if outcome.before == _DONE.get(event) or (
            event == Event.REMOVE and outcome.before in FINAL_VALUES):
        return "already_done"
    return "bad_status"


class PagedActions:
    """Hold, release or remove every job of a selection, PAGE jobs a transaction."""

    def __init__(self, db: Transactions, transitions: Transitions) -> None:
        self.db = db
        self.transitions = transitions

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
        """Apply `event` to the unfinished jobs `where` selects (and `keep` keeps: the part of
        a constraint SQL cannot say) that this session may act on; those it may not are
        counted in `denied`. With `connection`, all in the caller's transaction."""
        totals = ActTotals()

        def act(conn: Connection, locked: list[Job], now: float) -> None:
            self.act_page(conn, locked, event, reason, hold, keep, now, totals)

        self.in_pages(where, keep, act, totals, page=page, connection=connection)
        return totals

    def in_pages(
        self,
        where: ColumnElement[bool],
        keep: Callable[[Job], bool] | None,
        work: Callable[[Connection, list[Job], float], None],
        totals: ActTotals,
        *,
        page: int = PAGE,
        connection: Connection | None = None,
    ) -> None:
        """Call `work` with each page of the unfinished jobs `where` selects that this session
        may change, locked, in a transaction of its own: first the pages of the jobs nobody
        else holds (SKIP LOCKED), then the skipped ones, waiting for them. The jobs the
        policies hide (and `keep` keeps) are counted in `totals.denied`."""
        selected = [where, status_not_in(FINAL)]
        last, skipped = 0, list[int]()
        while True:
            with self.db.transaction(connection) as conn:
                ids = list(conn.execute(select(jobs.c.id).where(*selected, jobs.c.id > last)
                                        .order_by(jobs.c.id).limit(page)).scalars())
                if not ids:
                    break
                last = ids[-1]
                locked = self._lock_page(conn, ids, skip_locked=True)
                skipped.extend(i for i in ids if i not in locked)
                work(conn, _unfinished(locked), time.time())
        for start in range(0, len(skipped), page):  # taken by someone else: wait for them
            chunk = skipped[start:start + page]
            with self.db.transaction(connection) as conn:
                locked = self._lock_page(conn, chunk, skip_locked=False)
                rest = [i for i in chunk if i not in locked]  # hidden by the policies
                hidden = [Job.from_row(r._mapping) for r in conn.execute(
                    select(jobs).where(self.transitions.id_in(rest), *selected)
                    .order_by(jobs.c.id))]
                names = [views.job_id(j) for j in hidden if keep is None or keep(j)]
                totals.denied += len(names)
                totals.denied_names += names[:SHOWN - len(totals.denied_names)]
                work(conn, _unfinished(locked), time.time())

    def _lock_page(self, conn: Connection, ids: Sequence[int], *, skip_locked: bool,
                   ) -> dict[int, Job]:
        """The jobs of `ids` this session may change, locked (those another transaction holds
        are left out with `skip_locked`; the database's policies hide the others)."""
        q = select(jobs).where(self.transitions.id_in(ids)).order_by(jobs.c.id)
        q = q.with_for_update(skip_locked=skip_locked)
        return {r.id: Job.from_row(r._mapping) for r in conn.execute(q)}

    def act_page(self, conn: Connection, page: list[Job], event: Event, reason: str | None,
                  hold: tuple[int, int], keep: Callable[[Job], bool] | None, now: float,
                  totals: ActTotals) -> None:
        groups: dict[tuple[str, tuple[tuple[str, Any], ...]], list[Job]] = {}
        events: list[dict[str, Any]] = []
        every = self.db.listens_to_every_job()
        for job in page:
            if keep is not None and not keep(job):
                continue
            before = STATUS_OF[job.status]
            if before not in _WAITING or winding_down(job, now) or job.release_pending:
                totals.add(self.transitions.apply(conn, job, event, decide_args={}, now=now,
                                       reason=reason, record_ignored=False, hold=hold), event)
                continue
            d = decide(event, before, attempts=job.attempts, max_attempts=job.max_attempts)
            why = event_reason(reason, d)
            if d.to_status is None:
                totals.add(Outcome(job.id, event, before, before, False, reason=why,
                                   name=views.job_id(job)), event)
                continue
            values, attrs = transition_values(job, d, now, why, hold=hold)
            groups.setdefault((before.value, tuple(sorted(values.items()))), []).append(job)
            row = event_row(job.id, event, before, d.to_status, now, attempt=job.claims,
                            reason=why, attrs=attrs)
            events.append(row)
            if job.user_log or every:
                note_event(conn, row, job)
            totals.add(Outcome(job.id, event, before, d.to_status, True, reason=why,
                               name=views.job_id(job)), event)
        for (status, columns), group in groups.items():
            ids = [j.id for j in group]
            change = (update(jobs).where(self.transitions.id_in(ids), jobs.c.status == status)
                      .values(dict(columns)))
            if conn.execute(change).rowcount != len(ids):
                raise RowChanged(f"{len(ids)} jobs changed under their {event}")
        self.transitions.insert_events(conn, events)


def _unfinished(locked: dict[int, Job]) -> list[Job]:
    """The jobs of a page that have not finished since the page was read."""
    return [job for job in locked.values() if job.status not in FINAL_VALUES]
