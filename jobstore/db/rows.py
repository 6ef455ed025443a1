"""What a transition writes, as values any backend can write: the job row's change
(RowChange) and the event's row (event_row); the events a transaction wrote (note_event)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Update, update

from jobstore.core.jobs import Job
from jobstore.core.states import Event, Status
from jobstore.db.schema import jobs
from jobstore.errors import RowChanged

PENDING = "jobstore_pending_events"  # key in conn.info: events of the open transaction


def note_event(conn: Connection, values: Mapping[str, Any], job: Job | None) -> None:
    """Keep an event written in this transaction for the commit listeners (Transactions)."""
    pending = conn.info.get(PENDING)
    if pending is not None:
        pending.append({**values, "job": job})


@dataclass(frozen=True)
class RowChange:
    """A transition's UPDATE of one job row: `values`, made only if the row is still in
    `status` and attempt `claims` and, with a `version` (a backend's `read_job`), still that
    version."""

    job_id: int
    status: str
    claims: int
    values: Mapping[str, Any]
    version: str | None = None


def update_row(conn: Connection, change: RowChange,
               as_read: Callable[[Update, str | None], Update]) -> None:
    """`change` as the UPDATE of its job's row, made only if the row is still in its status and
    attempt (and version: `as_read`, the backend's); RowChanged if it is not."""
    written = conn.execute(as_read(
        update(jobs).where(jobs.c.id == change.job_id, jobs.c.status == change.status,
                           jobs.c.claims == change.claims).values(**change.values),
        change.version))
    if written.rowcount != 1:
        raise RowChanged(f"job {change.job_id} changed under its transition")


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
