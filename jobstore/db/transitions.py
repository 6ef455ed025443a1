"""The one place a job's state changes: the row and its event, in the caller's transaction."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import ColumnElement, Connection

from jobstore.core import holds
from jobstore.core.jobs import JOB_COLUMNS, Job
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
from jobstore.db.backends import Claim
from jobstore.db.channels import STOPS
from jobstore.db.rows import RowChange, event_row, note_event
from jobstore.db.schema import jobs
from jobstore.db.transactions import Transactions
from jobstore.formats import views

# The store's own events that take a job from its slot while its processes may still run there.
STOPS_ATTEMPT = frozenset({Event.HOLD, Event.REMOVE})
DAG_NODE = "DAGNodeName"  # in the ad of a DAG node's job (jobstore.db.dags)
# An idle job whose other columns are not known: fetch_transition reads none
_ANY_IDLE_JOB = Job.from_row({**dict.fromkeys(JOB_COLUMNS), "status": Status.IDLE.value})
# ... and its decision, which depends on nothing the row holds
_FETCH = decide(Event.FETCH, Status.IDLE, attempts=0, max_attempts=1)
assert _FETCH.to_status is not None and not (_FETCH.counts_attempt or _FETCH.ends_attempt)
_IDLE, _FETCHED, _FETCH_EVENT = Status.IDLE.value, _FETCH.to_status.value, str(Event.FETCH)
# conn.info keys: the job whose next transitions keep their row change (`keep_row_of`), and
# the changes kept, by job id
KEEP_FOR = "jobstore_keep_row_of"
KEPT = "jobstore_kept_rows"


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


class DagFollower(Protocol):
    """Told of the jobs that ended or started in a transition's transaction (the DAGs carry
    their nodes forward: the door's DAG engine)."""

    def jobs_ended(self, conn: Connection, job_ids: list[int], now: float, *,
                   nodes: bool = False) -> None:
        """Jobs `job_ids` ended (`nodes`: their ads say they are DAG nodes' jobs)."""

    def node_job_started(self, conn: Connection, job: Job, now: float) -> None:
        """A DAG node's job started: no longer idle."""


class Transitions:
    """Writes a transition (`apply`) or a recorded event (`record`) on a locked job row."""

    def __init__(self, db: Transactions) -> None:
        self.db = db
        self._dags: DagFollower | None = None

    def follow_dags(self, dags: DagFollower) -> None:
        """Tell `dags` of the jobs that end or start in each transition."""
        self._dags = dags

    # ---- the one place a transition is written ------------------------------------------

    def apply(
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
        (a backend's `read_job`), the row is written only if it is still that version (else
        RowChanged).

        A transition is never dated before the one it follows: a report carries its hook's
        clock, and a slow one may commit after a report made later."""
        now = max(now, job.updated_at)
        before = STATUS_OF[job.status]
        if event == Event.RELEASE and before == Status.HELD and winding_down(job, now):
            pending = f"release pending: attempt {job.claims} is still ending on {job.slot}"
            if not job.release_pending:
                self.change_row(conn, job, {"release_pending": True, "updated_at": now})
                self.record(conn, event_row(job.id, event, before, None, now, attempt=job.claims,
                                            slot=job.slot, host=job.host, reason=pending))
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
                self.record(conn, event_row(job.id, event, before, None, now, attempt=attempt,
                                            slot=slot, host=host, reason=why, attrs=attrs))
            return Outcome(job.id, event, before, before, False, reason=why, name=views.job_id(job))
        values, attrs = transition_values(job, d, now, why, changes=changes, attrs=attrs,
                                          hold=hold)
        stops = event in STOPS_ATTEMPT and not attempt_ended
        if d.ends_attempt and before in HANDED_OUT and stops:
            values["winding_down_until"] = max(job.lease_ends_at or now, now)
            self.db.backend.notify(conn, str(job.id), STOPS)  # the node's agent vacates the slot
        change = RowChange(job.id, before.value, job.claims, values, version)
        slot, host = own_place(job, before, attempt, slot, host)
        self.record(conn, event_row(job.id, event, before, d.to_status, now, attempt=attempt,
                                     slot=slot, host=host, reason=why, attrs=attrs),
                     job, change)
        if DAG_NODE in job.ad:
            if d.to_status in FINAL:
                self._jobs_ended(conn, [job.id], now, nodes=True)
            elif d.to_status == Status.RUNNING and before != Status.RUNNING:
                self._node_job_started(conn, job, now)
        return Outcome(job.id, event, before, d.to_status, True, reason=why, name=views.job_id(job))

    def record(self, conn: Connection, values: dict[str, Any], job: Job | None = None,
               change: RowChange | None = None) -> None:
        """Append the event `values` and notify the followers (sent on commit, never for a
        rolled-back transition: jobstore watch), after `change`, the job row's UPDATE, when
        given: it must hit the row (it cannot miss while the row is locked; refuse to guess).
        (On PostgreSQL the three are one statement.)

        The change of the job `keep_row_of` names is kept, to be written with its next one
        (one UPDATE of the row for the transaction's several transitions of it)."""
        if change is not None:
            change = self._keep(conn, change, job)
        self.db.backend.record(conn, values, change)
        note_event(conn, values, job)

    @contextmanager
    def one_update_each(self, conn: Connection) -> Iterator[None]:
        """Within: the row changes of the job `keep_row_of` names are kept, to be written with
        its next transition's (one UPDATE of the row for the several); at the end, any still
        kept, in the order of their ids. Their events are written at once and name a row that
        does not show them yet: for rows locked, or read at a version that the UPDATE checks
        (RowChanged fails the transaction, events and all)."""
        conn.info[KEPT] = {}
        try:
            yield
            self.write_kept(conn)
        finally:
            if not conn.invalidated:  # a lost connection's info cannot be touched
                conn.info.pop(KEPT, None)
                conn.info.pop(KEEP_FOR, None)

    @staticmethod
    def keep_row_of(conn: Connection, job_id: int | None) -> None:
        """Keep the row change of `job_id`'s next transitions (None: no job's), within
        `one_update_each`."""
        conn.info[KEEP_FOR] = job_id

    def left_by(self, conn: Connection, job: Job, *, written: bool = True) -> Job | None:
        """`job` as the transitions since it was read left it: the kept change applied, or,
        if none is kept and they may have `written` the row, read again under a lock (None:
        gone)."""
        change = (conn.info.get(KEPT) or {}).get(job.id)
        if change is not None:
            return job.but(**change.values)
        return self.lock(conn, job.id) if written else job

    def write_kept(self, conn: Connection) -> None:
        """Write every kept row change (before the commit), in the order of their ids (two
        transactions that write the same rows never wait on each other in a cycle)."""
        kept: dict[int, RowChange] = conn.info.get(KEPT) or {}
        for change in sorted(kept.values(), key=lambda c: c.job_id):
            self.db.backend.update_row(conn, change)
            del kept[change.job_id]

    def change_row(self, conn: Connection, job: Job, values: Mapping[str, Any],
                   version: str | None = None) -> None:
        """A change of the locked (or, with `version`, read) `job`'s row that is not a
        transition (a lease renewed, a stopped attempt forgotten): kept as `record` keeps a
        transition's, or written now."""
        change = self._keep(conn, RowChange(job.id, job.status, job.claims, dict(values),
                                            version), job)
        if change is not None:
            self.db.backend.update_row(conn, change)

    @staticmethod
    def _keep(conn: Connection, change: RowChange, job: Job | None) -> RowChange | None:
        """`change` with the job's kept one before it (`one_update_each`); None if it is kept
        in turn (the job `keep_row_of` names, unless a DAG node's, whose DAG reads the row)."""
        kept: dict[int, RowChange] | None = conn.info.get(KEPT)
        if kept is None:
            return change
        earlier = kept.pop(change.job_id, None)
        if earlier is not None:
            change = RowChange(change.job_id, earlier.status, earlier.claims,
                               {**earlier.values, **change.values}, earlier.version)
        if conn.info.get(KEEP_FOR) == change.job_id and not (job and DAG_NODE in job.ad):
            kept[change.job_id] = change
            return None
        return change

    def insert_events(self, conn: Connection, rows: list[dict[str, Any]], *,
                       dags_too: bool = True) -> None:
        """Append many events (`event_row`s) in one statement, and notify the followers once
        (on commit): a page of a set-based action. The DAG nodes of the jobs that ended are
        carried forward (`_jobs_ended`), unless `dags_too` is false (the DAGs' own moves)."""
        if not rows:
            return
        self.db.backend.insert_events(conn, rows)
        if dags_too:
            ended = [row["job_id"] for row in rows if row["to_status"] in FINAL_VALUES]
            if ended:
                self._jobs_ended(conn, ended, rows[0]["time"])

    def id_in(self, ids: Sequence[int]) -> ColumnElement[bool]:
        """`jobs.id IN ids`, as the backend takes a long list best."""
        return self.db.backend.id_in(jobs.c.id, ids)

    def _jobs_ended(self, conn: Connection, job_ids: list[int], now: float, *,
                    nodes: bool = False) -> None:
        if self._dags is not None:
            self._dags.jobs_ended(conn, job_ids, now, nodes=nodes)

    def _node_job_started(self, conn: Connection, job: Job, now: float) -> None:
        if self._dags is not None:
            self._dags.node_job_started(conn, job, now)

    def wound_down(self, conn: Connection, job: Job, now: float, why: str) -> Outcome | None:
        """The stopped attempt of the locked `job` ended (its end report came, or its time ran
        out): forget it, and carry out a release that waited for it."""
        self.change_row(conn, job, {"winding_down_until": None, "release_pending": None})
        pending = job.release_pending and job.status == Status.HELD
        job = job.but(winding_down_until=None, release_pending=None)
        if not pending:
            return None
        return self.apply(conn, job, Event.RELEASE, decide_args={}, now=now, reason=why)

    def lock(self, conn: Connection, job_id: int) -> Job | None:
        return self.db.backend.lock_job(conn, job_id)

    @staticmethod
    def fetch_transition(changes: Mapping[str, Any], now: float) -> Claim:
        """A claim's idle -> fetched for a backend that hands out a job in one statement: the
        columns `transition_values` sets (`changes` first) and the event, the same for every
        idle job (what depends on the row, `claims` and the slot's weight, the backend adds)."""
        values, _ = transition_values(_ANY_IDLE_JOB, _FETCH, now, None, changes=changes)
        return Claim(values, _FETCH_EVENT, _IDLE, _FETCHED)


def own_place(job: Job, before: Status, attempt: int, slot: str | None,
              host: str | None) -> tuple[str | None, str | None]:
    """The slot and host that the event of a transition of `job` stores: not those of its
    attempt when it leaves a handed-out status on the attempt's slot, which the attempt's fetch
    event holds (and the row, while it is the latest attempt); the readers fill them in
    (jobstore.db.reads.where_ran). An event from another slot keeps both as they came."""
    if before not in HANDED_OUT or attempt != job.claims or slot not in (None, job.slot):
        return slot, host
    return None, (None if host == job.host else host)


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
    event's attrs, but the stop of a handed-out attempt (Transitions.apply adds that)."""
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


def winding_down(job: Job, now: float) -> bool:
    """Whether `job`'s attempt, stopped by the store, may still be running on its slot."""
    return job.winding_down_until is not None and job.winding_down_until > now
