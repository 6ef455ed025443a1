"""What a transition writes, as values any backend can write: the job row's change
(RowChange) and the event's row (event_row)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, Update, literal_column, update

from jobstore.core.jobs import Job
from jobstore.core.states import Event, Status
from jobstore.db.schema import jobs
from jobstore.errors import DatabaseError

PENDING = "jobstore_pending_events"  # key in conn.info: events of the open transaction


def note_event(conn: Connection, values: Mapping[str, Any], job: Job | None) -> None:
    """Keep an event written in this transaction for the commit listeners (Transactions)."""
    pending = conn.info.get(PENDING)
    if pending is not None:
        pending.append({**values, "job": job})


def row_version() -> ColumnElement[str]:
    """The version of a job row as PostgreSQL keeps it (the transaction that wrote it)."""
    return literal_column("jobs.xmin::text")


def as_read(change: Update, version: str | None) -> Update:
    """`change` of a job row, made only to the row as it was read at `version` (a backend's
    `read_job`): it finds nothing if the row changed since. None: the row is locked, nothing
    to check."""
    return change if version is None else change.where(row_version() == version)


class RowChanged(DatabaseError):
    """The job row changed between its read and the write that depended on it."""


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

    def update(self) -> Update:
        """The UPDATE as SQLAlchemy runs it."""
        return as_read(update(jobs).where(jobs.c.id == self.job_id,
                                          jobs.c.status == self.status,
                                          jobs.c.claims == self.claims)
                       .values(**self.values), self.version)


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
