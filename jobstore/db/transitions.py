"""The one place a job's state changes: the row and its event, in the caller's transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import psycopg
from sqlalchemy import (
    ARRAY,
    JSON,
    BigInteger,
    ColumnElement,
    Connection,
    Update,
    any_,
    bindparam,
    insert,
    literal_column,
    select,
    update,
)

from jobstore.core import holds
from jobstore.core.jobs import Job
from jobstore.core.states import (
    FINAL,
    FINAL_VALUES,
    HANDED_OUT,
    PHASES,
    STATUS_OF,
    Decision,
    Event,
    Status,
    decide,
)
from jobstore.db import driver
from jobstore.db.engine import json_text
from jobstore.db.notify import CHANNEL, STOPS, notify
from jobstore.db.schema import job_events, jobs
from jobstore.db.sql import (
    INSERT_EVENTS,
    LOCK_JOB,
    READ_JOB,
    RECORD_EVENT,
    RECORD_TRANSITION,
    opening,
)
from jobstore.db.transactions import Transactions, note_event
from jobstore.errors import DatabaseError, InvalidInput
from jobstore.formats import views

# The store's own events that take a job from its slot while its processes may still run there.
STOPS_ATTEMPT = frozenset({Event.HOLD, Event.REMOVE})
DAG_NODE = "DAGNodeName"  # in the ad of a DAG node's job (jobstore.db.dags)


def row_version() -> ColumnElement[str]:
    """The version of a job row as PostgreSQL keeps it (the transaction that wrote it)."""
    return literal_column("jobs.xmin::text")


def as_read(change: Update, version: str | None) -> Update:
    """`change` of a job row, made only to the row as it was read at `version`
    (`_version_read`): it finds nothing if the row changed since. None: the row is locked,
    nothing to check."""
    return change if version is None else change.where(row_version() == version)


class RowChanged(DatabaseError):
    """The job row changed between its read and the write that depended on it."""


@dataclass(frozen=True)
class RowChange:
    """A transition's UPDATE of one job row: `values`, made only if the row is still in
    `status` and attempt `claims` and, with a `version` (`_version_read`), still that
    version."""

    job_id: int
    status: str
    claims: int
    values: Mapping[str, Any]
    version: str | None = None

    def update(self) -> Update:
        """The UPDATE as SQLAlchemy runs it."""
        return as_read(update(jobs).where(jobs.c.id == self.job_id,
                                          jobs.c.status == self.status,
                                          jobs.c.claims == self.claims)
                       .values(**self.values), self.version)

    def params(self) -> dict[str, Any]:
        """record_transition's parameters for the row (the event's are added to them; no
        column a transition sets is JSON: `_transition_sql`)."""
        out = {f"set_{name}": value for name, value in self.values.items()}
        out.update(claims=self.claims, version=self.version)
        return out


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
    pending: bool = False  # a release that waits for the job's stopped attempt to end
    name: str = ""  # the job as condor_q numbers it, CLUSTER.PROC


class Transitions(Transactions):
    """Writes a transition (`_apply`) or a recorded event (`_event`) on a locked job row."""

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
        hold: tuple[int, int] = (holds.UNSPECIFIED, 0),
        attempt_ended: bool = False,
        version: str | None = None,
    ) -> Outcome:
        """Apply `event` to the locked `job`: the row and its event. A job put on hold gets
        `hold` as its HoldReasonCode and HoldReasonSubCode (also in the event's attrs, for the
        user log); a released one loses them.

        A hold or rm of a handed-out job whose attempt has not ended (`attempt_ended`: the
        event comes from the attempt's own end report) leaves the attempt winding down on its
        slot until its end is reported, at the latest until its lease would have run out; a
        release meanwhile is pending (`release_pending`) and takes effect then. With `version`
        (`_version_read`), the row is written only if it is still that version (else RowChanged)."""
        before = STATUS_OF[job.status]
        if event == Event.RELEASE and before == Status.HELD and winding_down(job, now):
            pending = f"release pending: attempt {job.claims} is still ending on {job.slot}"
            if not job.release_pending:
                conn.execute(update(jobs).where(jobs.c.id == job.id)
                             .values(release_pending=True, updated_at=now))
                self._event(conn, job.id, event, before, None, now, attempt=job.claims,
                            slot=job.slot, host=job.host, reason=pending)
            return Outcome(job.id, event, before, before, False, reason=pending, pending=True,
                           name=views.job_id(job))
        d: Decision = decide(
            event,
            before,
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            **decide_args,
        )
        attempt = job.claims if attempt is None else attempt
        why = event_reason(reason, d)
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
            return Outcome(job.id, event, before, before, False, reason=why, name=views.job_id(job))
        values, attrs = transition_values(job, d, now, why, changes=changes, attrs=attrs,
                                          hold=hold)
        stops = event in STOPS_ATTEMPT and not attempt_ended
        if d.ends_attempt and before in HANDED_OUT and stops:
            values["winding_down_until"] = max(job.lease_ends_at or now, now)
            if self._pg:  # the node's agent vacates the slot (jobstore.agent)
                notify(conn, str(job.id), STOPS)
        change = RowChange(job.id, before.value, job.claims, values, version)
        self._record(conn, event_row(job.id, event, before, d.to_status, now, attempt=attempt,
                                     slot=slot, host=host, reason=why, attrs=attrs),
                     job, change)
        if DAG_NODE in job.ad:
            if d.to_status in FINAL:
                self._jobs_ended(conn, [job.id], now, nodes=True)
            elif d.to_status == Status.RUNNING and before != Status.RUNNING:
                self._node_job_started(conn, job, now)
        return Outcome(job.id, event, before, d.to_status, True, reason=why, name=views.job_id(job))

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
        self._record(conn, event_row(job_id, event, before, after, now, attempt=attempt,
                                     slot=slot, host=host, reason=reason, attrs=attrs), job)

    def _record(self, conn: Connection, values: dict[str, Any], job: Job | None,
                change: RowChange | None = None) -> None:
        """Append the event `values` and notify the followers (sent on commit, never for a
        rolled-back transition: jobstore watch), after `change`, the job row's UPDATE, when
        given: it must hit the row (it cannot miss while the row is locked; refuse to guess).
        On PostgreSQL the three are one statement."""
        if not self._pg:
            if change is not None and conn.execute(change.update()).rowcount != 1:
                raise RowChanged(f"job {values['job_id']} changed under its transition")
            conn.execute(insert(job_events).values(**values))
        else:
            params = {**values, "attrs": _json(values["attrs"]), "channel": CHANNEL,
                      "payload": str(values["job_id"])}
            if change is None:
                driver.execute(conn, RECORD_EVENT, params)
            else:
                sql = _transition_sql(tuple(change.values))
                if driver.execute(conn, sql, {**params, **change.params()}).rowcount != 1:
                    raise RowChanged(f"job {values['job_id']} changed under its transition")
        note_event(conn, values, job)

    def _insert_events(self, conn: Connection, rows: list[dict[str, Any]], *,
                       dags_too: bool = True) -> None:
        """Append many events (`event_row`s) in one statement, and notify the followers once
        (on commit): a page of a set-based action. The DAG nodes of the jobs that ended are
        carried forward (`_jobs_ended`), unless `dags_too` is false (the DAGs' own moves)."""
        if not rows:
            return
        if not self._pg:
            conn.execute(insert(job_events), rows)
        else:
            columns = {name: [row[name] for row in rows] for name in rows[0]}
            columns["attrs"] = [_json(value) for value in columns["attrs"]]
            driver.execute(conn, INSERT_EVENTS, columns)
            notify(conn, "page")
        if dags_too:
            ended = [row["job_id"] for row in rows if row["to_status"] in FINAL_VALUES]
            if ended:
                self._jobs_ended(conn, ended, rows[0]["time"])

    def _id_in(self, ids: Sequence[int]) -> ColumnElement[bool]:
        """`jobs.id IN ids`: on PostgreSQL one array parameter (`= ANY`), not one a job."""
        if self._pg:
            return jobs.c.id == any_(bindparam("page_ids", list(ids), type_=ARRAY(BigInteger)))
        return jobs.c.id.in_(list(ids))

    def _jobs_ended(self, conn: Connection, job_ids: list[int], now: float, *,
                    nodes: bool = False) -> None:
        """Jobs `job_ids` ended in this transaction (the store's DAGs carry their nodes on;
        `nodes`: their ads say they are DAG nodes' jobs)."""
        return

    def _node_job_started(self, conn: Connection, job: Job, now: float) -> None:
        """A DAG node's job started in this transaction: no longer idle (the DAG's -maxidle
        may release more nodes)."""
        return

    def _wound_down(self, conn: Connection, job: Job, now: float, why: str) -> Outcome | None:
        """The stopped attempt of the locked `job` ended (its end report came, or its time ran
        out): forget it, and carry out a release that waited for it."""
        conn.execute(update(jobs).where(jobs.c.id == job.id)
                     .values(winding_down_until=None, release_pending=None))
        pending = job.release_pending and job.status == Status.HELD
        job = job.but(winding_down_until=None, release_pending=None)
        if not pending:
            return None
        return self._apply(conn, job, Event.RELEASE, decide_args={}, now=now, reason=why)

    def _lock(self, conn: Connection, job_id: int) -> Job | None:
        if self._pg:
            found = driver.first(conn, LOCK_JOB, {"job_id": job_id})
            return None if found is None else found.job()
        row = conn.execute(select(jobs).where(jobs.c.id == job_id).with_for_update()).first()
        return None if row is None else Job.from_row(row._mapping)

    @staticmethod
    def _version_read(cursor: psycopg.Cursor[Any]) -> tuple[Job | None, str | None]:
        """The job row read_job left in `cursor` (`_opened`, PostgreSQL) and its version, for
        a write that checks nothing changed since (`as_read`), instead of a lock."""
        found = driver.first_of(cursor, opening(READ_JOB))
        return (None, None) if found is None else (found.job(), found["row_version"])


def event_reason(reason: str | None, d: Decision) -> str | None:
    """Why an event did what it did: the caller's reason, then the decision's own."""
    if d.reason is None:
        return reason
    return f"{reason}; {d.reason}" if reason else d.reason


def transition_values(
    job: Job, d: Decision, now: float, why: str | None, *,
    changes: Mapping[str, Any] | None = None, attrs: Mapping[str, Any] | None = None,
    hold: tuple[int, int] = (holds.UNSPECIFIED, 0),
) -> tuple[dict[str, Any], Mapping[str, Any] | None]:
    """The columns a transition of `job` to `d.to_status` sets (`changes` first), and its
    event's attrs, but the stop of a handed-out attempt (Transitions._apply adds that)."""
    assert d.to_status is not None
    before = STATUS_OF[job.status]
    values: dict[str, Any] = {**(changes or {}), "status": d.to_status.value, "updated_at": now}
    renewed = values.get("lease_renewed_until", job.lease_renewed_until)
    if (PHASES[d.to_status] != PHASES[before] and renewed is not None
            and renewed > (job.lease_expires_at or 0)):
        # the row's index entries are new anyway: the reaper's index learns the renewal
        values["lease_expires_at"] = renewed
    if d.counts_attempt:
        values["attempts"] = job.attempts + 1
    if d.ends_attempt:
        values.update(token=None, lease_expires_at=None, lease_renewed_until=None)
    if d.to_status in FINAL:
        values["finished_at"] = now
    if d.to_status in (Status.HELD, Status.FAILED) or (
        why and d.to_status in (Status.IDLE, Status.REMOVED)
    ):
        values["reason"] = why
    if d.to_status == Status.RUNNING and before != Status.RUNNING:
        values.setdefault("started_at", now)
        values["num_starts"] = (job.num_starts or 0) + 1
        if job.first_started_at is None:
            values["first_started_at"] = values["started_at"]
    elif before == Status.RUNNING != d.to_status and job.started_at is not None:
        values["wall_clock"] = (job.wall_clock or 0.0) + max(0.0, now - job.started_at)
    if d.to_status == Status.HELD:
        values.update(hold_code=hold[0], hold_subcode=hold[1],
                      num_holds=(job.num_holds or 0) + 1)
        attrs = {**(attrs or {}), "HoldReasonCode": hold[0], "HoldReasonSubCode": hold[1]}
    elif before == Status.HELD:
        values.update(hold_code=None, hold_subcode=None)
    return values, attrs


def event_row(
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
) -> dict[str, Any]:
    """The `job_events` row of one event (also what the commit listeners get)."""
    return dict(
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


@lru_cache(maxsize=512)
def _transition_sql(columns: tuple[str, ...]) -> str:
    """record_transition with the SET list of `columns` (columns of jobs, nothing else; none
    of them JSON, which psycopg would need wrapped)."""
    unknown = [name for name in columns if name not in jobs.c]
    if unknown:
        raise InvalidInput(f"not columns of jobs: {unknown}")
    json = [name for name in columns if isinstance(jobs.c[name].type, JSON)]
    if json:
        raise InvalidInput(f"a transition does not set JSON columns: {json}")
    return RECORD_TRANSITION.format(
        assignments=", ".join(f"{name} = %(set_{name})s" for name in columns))


def _json(value: Any) -> str | None:
    """A JSON column's value as psycopg binds it: its compact text."""
    return None if value is None else json_text(value)


def winding_down(job: Job, now: float) -> bool:
    """Whether `job`'s attempt, stopped by the store, may still be running on its slot."""
    return job.winding_down_until is not None and job.winding_down_until > now
