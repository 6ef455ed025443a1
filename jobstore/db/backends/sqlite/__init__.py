"""The job store on SQLite: SQLAlchemy Core throughout, one writer at a time (BEGIN IMMEDIATE:
connect), so that a claim takes its job row by row and nothing needs a lock of its
own; no sessions, notifications or server-side rows."""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager

from sqlalchemy import URL, ColumnElement, Connection, Engine, Table, Update, insert, select
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, OperationalError, PendingRollbackError

from jobstore.core.claims import ClaimRequest
from jobstore.core.jobs import Job, ProcTemplate
from jobstore.core.states import Status
from jobstore.db.backends.base import (
    Claim,
    HandOut,
    Identity,
    MenuRow,
    Opened,
    Params,
    Roles,
    Row,
    insert_missing,
    upsert,
)
from jobstore.db.backends.sqlite.fileowner import local_owner
from jobstore.db.backends.statements import load
from jobstore.db.channels import Listener
from jobstore.db.phases import status_in
from jobstore.db.rows import RowChange, update_row
from jobstore.db.schema import job_events, jobs, sandbox_chunks
from jobstore.db.urls import database_message
from jobstore.errors import DatabaseError, InvalidInput

IDLE_AUTOCLUSTERS = load("jobstore.db.backends.sqlite")["idle_autoclusters"].clause


class SQLite:
    """jobstore.db.backends.Backend on SQLite."""

    can_listen = False
    ids_commit_out_of_order = False  # one writer at a time: ids become visible in order
    makes_rows_on_server = False
    # the transaction holds the write lock from its start: a report reads its row locked at once
    report_reads: tuple[bool, ...] = (True,)
    lost: tuple[type[BaseException], ...] = (OperationalError, DBAPIError, PendingRollbackError)

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._identity: Identity | None = None

    # ---- transactions --------------------------------------------------------------------

    def connect(self) -> Connection:
        return self.engine.connect()

    def release(self, conn: Connection) -> None:
        conn.close()

    def begin(self, conn: Connection, first: str | None, params: Params,
              timeout_ms: int | None) -> None:
        """Nothing yet: SQLAlchemy's transaction (`transaction`) begins it."""
        return None

    def transaction(self, conn: Connection) -> AbstractContextManager[object]:
        return conn.begin()  # BEGIN IMMEDIATE (connect)

    def reads_tokens(self, conn: Connection) -> bool:
        return True  # one user's store

    def door(self, every: Callable[[], bool]) -> None:
        return None  # one user's store: the package writes (jobstore.db.localdoor)

    def error(self, exc: BaseException, url: str | URL) -> DatabaseError:
        return DatabaseError(database_message(exc, url))

    # ---- reading and locking -------------------------------------------------------------

    def read_job(self, conn: Connection, opened: Opened, job_id: int,
                 ) -> tuple[Job | None, str | None]:
        return self.lock_job(conn, job_id), None

    def read_jobs(self, conn: Connection, opened: Opened, job_ids: Sequence[int],
                  ) -> dict[int, tuple[Job, str | None]]:
        found = {job_id: self.lock_job(conn, job_id) for job_id in sorted(job_ids)}
        return {job_id: (job, None) for job_id, job in found.items() if job is not None}

    @staticmethod
    def _as_read(change: Update, version: str | None) -> Update:
        if version is not None:  # read_job reads none: the transaction holds the write lock
            raise InvalidInput("a SQLite job row has no version")
        return change

    def lock_job(self, conn: Connection, job_id: int) -> Job | None:
        row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
        return None if row is None else Job.from_row(row._mapping)

    def jobs_of(self, conn: Connection, ids: Sequence[int]) -> list[Job]:
        rows = conn.execute(select(jobs).where(jobs.c.id.in_(list(ids))))
        return [Job.from_row(r._mapping) for r in rows]

    def id_in(self, column: ColumnElement[int], ids: Sequence[int]) -> ColumnElement[bool]:
        return column.in_(list(ids))  # type: ignore[no-any-return]

    # ---- the negotiator ------------------------------------------------------------------

    def menu(self, conn: Connection, opened: Opened, params: Params) -> list[MenuRow]:
        return list(conn.execute(IDLE_AUTOCLUSTERS, dict(params)).all())

    def lock_limits(self, conn: Connection, names: Sequence[str]) -> None:
        return  # the write transaction is serialised already

    def take(self, conn: Connection, req: ClaimRequest, autoclusters: Sequence[int],
             claim: Claim, now: float, hand_out: HandOut) -> Job | None:
        """Row by row: the first idle job of each autocluster in turn, handed out by
        `hand_out` (the state machine's own transition)."""
        for autocluster in autoclusters:
            row = conn.execute(
                select(jobs)
                .where(status_in([Status.IDLE]), jobs.c.queue == req.queue,
                       jobs.c.autocluster_id == autocluster)
                .order_by(jobs.c.priority.desc(), jobs.c.id)
                .limit(1)
            ).first()
            if row is None:
                continue
            job = Job.from_row(row._mapping)
            weight = float(job.request_cpus) if req.partitionable else req.weight
            extra = {"claims": job.claims + 1, "slot_weight": weight}
            hand_out(conn, job, extra)
            return job.but(**claim.values, **extra)
        return None

    # ---- writing -------------------------------------------------------------------------

    def record(self, conn: Connection, values: Row, change: RowChange | None,
               ) -> None:
        if change is not None:
            self.update_row(conn, change)
        conn.execute(insert(job_events).values(**values))

    def update_row(self, conn: Connection, change: RowChange) -> None:
        update_row(conn, change, self._as_read)

    def insert_events(self, conn: Connection, rows: Sequence[Row]) -> None:
        conn.execute(insert(job_events), rows)

    def notify(self, conn: Connection, payload: str, channel: str) -> None:
        return  # no one can listen: watchers poll

    def insert_missing(self, conn: Connection, table: Table, values: Params,
                       keys: Sequence[str] | None = None) -> bool:
        return insert_missing(conn, sqlite_insert(table), values, keys)

    def upsert(self, conn: Connection, table: Table, rows: Sequence[Row],
               key: str, columns: Sequence[str]) -> None:
        upsert(conn, sqlite_insert(table), rows, key, columns)

    def insert_rows(self, conn: Connection, table: Table, rows: Sequence[Row], *,
                    staged: bool) -> None:
        conn.execute(insert(table), rows)

    def insert_numbered(self, conn: Connection, table: Table, rows: Sequence[Row], *,
                        staged: bool) -> list[int]:
        made = conn.execute(insert(table).returning(table.c.id, sort_by_parameter_order=True),
                            rows)
        return [int(i) for i in made.scalars()]

    def insert_procs(self, conn: Connection, job: Job, template: ProcTemplate, now: float, *,
                     events_after: bool, clusters: list[int] | None) -> list[int]:
        raise InvalidInput("SQLite does not make a cluster's rows itself (makes_rows_on_server)")

    def file_stream(self, conn: Connection, owner: str, sha256: str, first: int, last: int,
                    ) -> Iterator[bytes]:
        for (data,) in conn.execute(
                select(sandbox_chunks.c.data)
                .where(sandbox_chunks.c.owner == owner, sandbox_chunks.c.sha256 == sha256,
                       sandbox_chunks.c.seq.between(first, last))
                .order_by(sandbox_chunks.c.seq)):
            yield bytes(data)

    # ---- the session and the server ------------------------------------------------------

    def local_owner(self) -> str | None:
        return local_owner(self.engine.url.database or "")

    def local_identity(self) -> Identity:
        """A SQLite job store is one account's (the file's owner, or root:
        connect.engine): its session is the invoking account, trusted (looked
        up once)."""
        if self._identity is None:
            self._identity = Identity(pwd.getpwuid(os.getuid()).pw_name, trusted=True,
                                      super_user=True)
        return self._identity

    def session_identity(self, conn: Connection) -> Identity:
        return self.local_identity()

    def snapshot_bounds(self, conn: Connection) -> None:
        return None

    def xact_horizon(self, conn: Connection) -> None:
        return None

    def rows_estimate(self, conn: Connection) -> None:
        return None

    def listener(self, channel: str, connect_timeout: int,
                 transaction: Callable[[], AbstractContextManager[Connection]]) -> Listener:
        raise InvalidInput("a SQLite job store announces nothing: watch it by polling")

    def server_warnings(self, conn: Connection) -> list[str]:
        return []

    def roles(self) -> Roles:
        raise InvalidInput("database roles exist on PostgreSQL only")


__all__ = ["SQLite"]
