"""The job store on PostgreSQL: the hot path (claim, reports) straight on psycopg in one round
trip each (driver), one kept connection per pooled engine (kept), COPY for bulk inserts (copy,
bulk), LISTEN/NOTIFY (notify), and the session's identity from its role."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from functools import lru_cache
from typing import Any

import psycopg
from sqlalchemy import (
    ARRAY,
    JSON,
    URL,
    BigInteger,
    ColumnElement,
    Connection,
    Engine,
    Table,
    any_,
    bindparam,
    event,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError, OperationalError, PendingRollbackError
from sqlalchemy.pool import NullPool

from jobstore.core.claims import ClaimRequest
from jobstore.core.jobs import Job, ProcTemplate
from jobstore.db.backends.base import (
    MENU,
    READ_JOB,
    READ_JOBS,
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
from jobstore.db.backends.postgresql import driver
from jobstore.db.backends.postgresql.bulk import insert_procs
from jobstore.db.backends.postgresql.copy import copy_rows
from jobstore.db.backends.postgresql.door import PgDoor
from jobstore.db.backends.postgresql.grants import PgRoles
from jobstore.db.backends.postgresql.kept import KeptConnection
from jobstore.db.backends.postgresql.notify import PgListener, notify
from jobstore.db.backends.postgresql.queries import (
    AUTOVACUUM_SETTING,
    CLAIM_IN_AUTOCLUSTERS,
    FILE_CHUNKS,
    IDLE_AUTOCLUSTERS,
    INSERT_EVENTS,
    JOB_HEADS,
    LOCK_JOB,
    LOCK_LIMITS,
    NEXT_IDS,
    READS_TOKENS,
    RECORD_EVENT,
    RECORD_TRANSITION,
    SESSION_IDENTITY,
    SNAPSHOT_BOUNDS,
    TABLE_ROWS_ESTIMATE,
    UPDATE_JOB_ROW,
    XACT_HORIZON,
    opening,
)
from jobstore.db.backends.postgresql.queries import READ_JOB as READ_JOB_SQL
from jobstore.db.backends.postgresql.queries import READ_JOBS as READ_JOBS_SQL
from jobstore.db.channels import CHANNEL, Listener
from jobstore.db.jsontext import json_text
from jobstore.db.rows import RowChange, event_row, note_event
from jobstore.db.schema import jobs
from jobstore.db.urls import database_message
from jobstore.errors import (
    DatabaseError,
    InvalidInput,
    JobstoreError,
    Refused,
    RowChanged,
    UnknownCluster,
)

CLAIM_CHUNK = 64  # autoclusters per claim statement
# The SQLSTATEs the door's functions raise (migration 0019), and what each is here
# Refusals whose message is the one line to show: the door's own, and a value one of the
# database's checks refused (check_violation: a constraint, or a trigger's limit)
REFUSALS: dict[str, Callable[[str], JobstoreError]] = {
    "JS001": InvalidInput, "JS002": Refused, "JS004": UnknownCluster, "23514": InvalidInput}
_FIRST = {MENU: IDLE_AUTOCLUSTERS, READ_JOB: READ_JOB_SQL, READ_JOBS: READ_JOBS_SQL}


class PostgreSQL:
    """jobstore.db.backends.Backend on PostgreSQL (psycopg 3)."""

    can_listen = True
    ids_commit_out_of_order = True
    makes_rows_on_server = True
    # a report reads its row unlocked in the round trip that opens the transaction and writes it
    # only if it is still that version (no lock to log); one that changed is read again locked
    report_reads: tuple[bool, ...] = (False, True)
    lost: tuple[type[BaseException], ...] = (
        OperationalError, DBAPIError, PendingRollbackError, psycopg.Error)

    def __init__(self, engine: Engine) -> None:
        if engine.dialect.driver != "psycopg":  # the hot path is psycopg's (driver)
            raise InvalidInput(f"a job store on PostgreSQL needs psycopg (postgresql+psycopg://),"
                               f" not {engine.dialect.driver}")
        if not event.contains(engine, "checkin", driver.end_autocommit):
            event.listen(engine, "checkin", driver.end_autocommit)  # after driver.begin
        if not event.contains(engine, "connect", driver.safe_json):
            event.listen(engine, "connect", driver.safe_json)
        self.engine = engine
        self._reads_tokens: bool | None = None
        # a pooled engine's store keeps one connection between its transactions (kept)
        self._kept = (None if isinstance(engine.pool, NullPool)
                      else KeptConnection.for_engine(engine))

    # ---- transactions --------------------------------------------------------------------

    def connect(self) -> Connection:
        return self.engine.connect() if self._kept is None else self._kept.lend()

    def release(self, conn: Connection) -> None:
        if self._kept is None:
            conn.close()
        else:
            self._kept.end(conn)

    def begin(self, conn: Connection, first: str | None, params: Params,
              timeout_ms: int | None) -> Opened:
        """BEGIN, set_config local to the transaction (begin_transaction; '0' for no timeout)
        and `first`, in one round trip; the cursor of `first`'s result."""
        cursor = driver.begin(conn, opening(None if first is None else _FIRST[first]), {
            "milliseconds": str(int(timeout_ms or 0)), **params})
        return None if first is None else cursor

    def transaction(self, conn: Connection) -> AbstractContextManager[object]:
        return driver.DriverTransaction(conn)  # no SQLAlchemy Transaction on the hot path

    def error(self, exc: BaseException, url: str | URL) -> JobstoreError:
        orig = getattr(exc, "orig", None) or exc
        state = getattr(orig, "sqlstate", None)
        if state in REFUSALS:
            diag = getattr(orig, "diag", None)
            message = (diag.message_primary if diag is not None else None) or str(orig)
            return REFUSALS[state](message.strip().splitlines()[0])
        if isinstance(orig, psycopg.errors.InsufficientPrivilege):
            first = str(orig).strip().splitlines()[0] if str(orig).strip() else "permission denied"
            return Refused(f"the job store's database refused it: {first}")
        return DatabaseError(database_message(exc, url))

    # ---- reading and locking -------------------------------------------------------------

    def read_job(self, conn: Connection, opened: Opened, job_id: int,
                 ) -> tuple[Job | None, str | None]:
        found = driver.first_of(_cursor(opened), opening(READ_JOB_SQL))
        return (None, None) if found is None else (found.job(), found["row_version"])

    def read_jobs(self, conn: Connection, opened: Opened, job_ids: Sequence[int],
                  ) -> dict[int, tuple[Job, str | None]]:
        read = [(row.job(), row["row_version"])
                for row in driver.all_of(_cursor(opened), opening(READ_JOBS_SQL))]
        return {job.id: (job, version) for job, version in read}

    def lock_job(self, conn: Connection, job_id: int) -> Job | None:
        found = driver.first(conn, LOCK_JOB, {"job_id": job_id})
        return None if found is None else found.job()

    def jobs_of(self, conn: Connection, ids: Sequence[int]) -> list[Job]:
        return [r.job() for r in driver.every(conn, JOB_HEADS, {"ids": list(ids)})]

    def id_in(self, column: ColumnElement[int], ids: Sequence[int]) -> ColumnElement[bool]:
        """One array parameter (`= ANY`), not one a job."""
        return column == any_(bindparam("ids", list(ids), type_=ARRAY(BigInteger), unique=True))

    # ---- the negotiator ------------------------------------------------------------------

    def menu(self, conn: Connection, opened: Opened, params: Params) -> list[MenuRow]:
        # read in the round trip that opened the transaction
        return list(_cursor(opened).fetchall())

    def lock_limits(self, conn: Connection, names: Sequence[str]) -> None:
        driver.execute(conn, LOCK_LIMITS, {"names": list(names)}).fetchall()

    def take(self, conn: Connection, req: ClaimRequest, autoclusters: Sequence[int],
             claim: Claim, now: float, hand_out: HandOut) -> Job | None:
        """claim_in_autoclusters, CLAIM_CHUNK autoclusters at a time: lock, hand out, event,
        notify; one round trip each."""
        sql = _claim_sql(tuple(claim.values), claim.event, claim.from_status, claim.to_status)
        # the SET list's parameters are the columns' own names (the event's slot and host are
        # the row's)
        params = {
            "queue": req.queue,
            "slot": req.slot,
            "host": req.host,
            "partitionable": req.partitionable,
            "weight": req.weight,
            "now": now,
            "channel": CHANNEL,
            **claim.values,
        }
        for start in range(0, len(autoclusters), CLAIM_CHUNK):
            params["autoclusters"] = list(autoclusters[start : start + CLAIM_CHUNK])
            found = driver.first(conn, sql, params)
            if found is not None:
                attempt = found["claims"] + 1
                note_event(conn, event_row(found["id"], claim.event, claim.from_status,
                                           claim.to_status, now, attempt=attempt, slot=req.slot,
                                           host=req.host), found.job())
                return found.job(**claim.values, claims=attempt,
                                 slot_weight=found["claimed_weight"])
        return None

    # ---- writing -------------------------------------------------------------------------

    def record(self, conn: Connection, values: Row, change: RowChange | None,
               ) -> None:
        """The row's UPDATE, the event and the notification: one statement."""
        params = {**values, "attrs": _json(values["attrs"]), "channel": CHANNEL,
                  "payload": str(values["job_id"])}
        if change is None:
            driver.execute(conn, RECORD_EVENT, params)
            return
        params.update({f"set_{name}": value for name, value in change.values.items()},
                      claims=change.claims, version=change.version, row_status=change.status)
        if driver.execute(conn, _transition_sql(tuple(change.values)), params).rowcount != 1:
            raise RowChanged(f"job {values['job_id']!r} changed under its transition")

    def update_row(self, conn: Connection, change: RowChange) -> None:
        """The version is the transaction that wrote the row, as read_job reads it (xmin)."""
        params = {f"set_{name}": value for name, value in change.values.items()}
        params.update(job_id=change.job_id, row_status=change.status, claims=change.claims,
                      version=change.version)
        if driver.execute(conn, _update_sql(tuple(change.values)), params).rowcount != 1:
            raise RowChanged(f"job {change.job_id!r} changed under its transition")

    def insert_events(self, conn: Connection, rows: Sequence[Row]) -> None:
        columns = {name: [row[name] for row in rows] for name in rows[0]}
        columns["attrs"] = [_json(value) for value in columns["attrs"]]
        driver.execute(conn, INSERT_EVENTS, columns)
        notify(conn, "page")

    def notify(self, conn: Connection, payload: str, channel: str) -> None:
        notify(conn, payload, channel)

    def insert_missing(self, conn: Connection, table: Table, values: Params,
                       keys: Sequence[str] | None = None) -> bool:
        return insert_missing(conn, pg_insert(table), values, keys)

    def upsert(self, conn: Connection, table: Table, rows: Sequence[Row],
               key: str, columns: Sequence[str]) -> None:
        upsert(conn, pg_insert(table), rows, key, columns)

    def insert_rows(self, conn: Connection, table: Table, rows: Sequence[Row], *,
                    staged: bool) -> None:
        """COPY, through a staging table under row-level security."""
        copy_rows(conn, table, rows, staged=staged)

    def insert_numbered(self, conn: Connection, table: Table, rows: Sequence[Row], *,
                        staged: bool) -> list[int]:
        """COPY, the ids reserved from the table's sequence first."""
        if table.name not in NEXT_IDS:
            raise InvalidInput(f"{table.name}: rows numbered here are clusters or jobs")
        reserved = driver.execute(conn, NEXT_IDS[table.name], {"n": len(rows)}).fetchall()
        ids = [int(row[0]) for row in reserved]
        copy_rows(conn, table, [{"id": i, **row} for i, row in zip(ids, rows, strict=True)],
                  staged=staged)
        return ids

    def insert_procs(self, conn: Connection, job: Job, template: ProcTemplate, now: float, *,
                     events_after: bool, clusters: list[int] | None) -> list[int]:
        return insert_procs(conn, job, template, now, events_after=events_after,
                            clusters=clusters)

    def file_stream(self, conn: Connection, owner: str, sha256: str, first: int, last: int,
                    ) -> Iterator[bytes]:
        """In binary (bytea as stored, no hex text to decode), each chunk as it arrives (a
        third less time than fetching them whole)."""
        for (data,) in driver.stream_binary(conn, FILE_CHUNKS, {
                "owner": owner, "sha256": sha256, "first": first, "last": last}):
            yield data

    # ---- the session and the server ------------------------------------------------------

    def reads_tokens(self, conn: Connection) -> bool:
        """Asked once per store: a role's column privileges do not change under it."""
        if self._reads_tokens is None:
            self._reads_tokens = bool(conn.execute(READS_TOKENS).scalar())
        return self._reads_tokens

    def local_owner(self) -> None:
        return None  # every row's owner is the door's, from the session

    def local_identity(self) -> None:
        return None  # the session's role decides: session_identity

    def session_identity(self, conn: Connection) -> Identity:
        """Migration 0012's functions: the session's role decides."""
        row = conn.execute(SESSION_IDENTITY).one()
        return Identity(str(row.account), bool(row.trusted), bool(row.super_user))

    def snapshot_bounds(self, conn: Connection) -> tuple[int, int]:
        xmin, xmax = conn.execute(SNAPSHOT_BOUNDS).one()
        return int(xmin), int(xmax)

    def xact_horizon(self, conn: Connection) -> int:
        return int(conn.execute(XACT_HORIZON).scalar_one())

    def rows_estimate(self, conn: Connection) -> int:
        return max(int(conn.execute(TABLE_ROWS_ESTIMATE).scalar_one()), 0)

    def listener(self, channel: str, connect_timeout: int,
                 transaction: Callable[[], AbstractContextManager[Connection]]) -> Listener:
        return PgListener(self.engine, transaction, connect_timeout, channel)

    def server_warnings(self, conn: Connection) -> list[str]:
        """autovacuum off."""
        if conn.execute(AUTOVACUUM_SETTING).scalar_one() == "on":
            return []
        return ["autovacuum is off on this server: the job store's tables keep every dead row"
                " (jobstore prune removes history, only VACUUM reuses its space); turn it on"]

    def roles(self) -> Roles:
        return PgRoles(self.engine)

    def door(self, every: Callable[[], bool]) -> PgDoor:
        return PgDoor(every)


@lru_cache(maxsize=512)
def _transition_sql(columns: tuple[str, ...]) -> str:
    """record_transition with the SET list of `columns`."""
    return RECORD_TRANSITION.format(assignments=_assignments(columns))


@lru_cache(maxsize=512)
def _update_sql(columns: tuple[str, ...]) -> str:
    """update_job_row with the SET list of `columns`."""
    return UPDATE_JOB_ROW.format(assignments=_assignments(columns))


@lru_cache(maxsize=16)
def _claim_sql(columns: tuple[str, ...], event: str, from_status: str, to_status: str) -> str:
    """claim_in_autoclusters with the claim's transition (Transitions.fetch_transition): its
    SET list (`columns`, the status a literal as the event and the statuses are: the same for
    every claim, no parameters to bind)."""
    if "status" not in columns:
        raise InvalidInput("a claim sets the job's status")
    return CLAIM_IN_AUTOCLUSTERS.format(
        assignments=_assignments(tuple(c for c in columns if c != "status"), prefix=""),
        event=_literal(event), from_status=_literal(from_status), to_status=_literal(to_status))


def _literal(name: str) -> str:
    """A status's or an event's name as an SQL literal (the state machine's names only)."""
    if not re.fullmatch(r"[a-z_]+", name):
        raise InvalidInput(f"not a status or event name: {name!r}")
    return f"'{name}'"


def _assignments(columns: tuple[str, ...], prefix: str = "set_") -> str:
    """`column = %(<prefix>column)s` per column: columns of jobs, none of them JSON (which
    psycopg would need wrapped)."""
    unknown = [name for name in columns if name not in jobs.c]
    if unknown:
        raise InvalidInput(f"not columns of jobs: {unknown}")
    json = [name for name in columns if isinstance(jobs.c[name].type, JSON)]
    if json:
        raise InvalidInput(f"a transition does not set JSON columns: {json}")
    return ", ".join(f"{name} = %({prefix}{name})s" for name in columns)


def _json(value: Any) -> str | None:
    """A JSON column's value as psycopg binds it: its compact text."""
    return None if value is None else json_text(value)


__all__ = ["PostgreSQL"]


def _cursor(opened: Opened) -> psycopg.Cursor[Any]:
    """The cursor `begin` left on the result of the transaction's first read."""
    assert isinstance(opened, psycopg.Cursor)
    return opened
