"""Statements and transactions straight on the psycopg connection of a SQLAlchemy connection
(PostgreSQL's hot path: the claim and the reports), rows back as tuples, or as `Row`s that find
their columns by the result's own names; SQLAlchemy's listeners see the statements, commits and
rollbacks as they see SQLAlchemy's own."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from operator import itemgetter
from types import TracebackType
from typing import Any, Self

import psycopg
from psycopg.types.json import set_json_loads
from sqlalchemy import Connection

from jobstore.core.jobs import JOB_COLUMNS, Job
from jobstore.db.jsontext import json_value

AUTOCOMMIT_SET = "jobstore_autocommit_set"  # key in conn.info: `begin` turned autocommit on


def execute(conn: Connection, sql: str, params: Mapping[str, Any]) -> psycopg.Cursor[Any]:
    """Run `sql` (psycopg's `%(name)s` parameters) in `conn`'s transaction. A connection the
    server dropped is invalidated (the pool replaces it) and its psycopg error raised."""
    raw = _driver_connection(conn)
    return _run(conn, raw, raw.cursor(), sql, params)


def stream_binary(conn: Connection, sql: str, params: Mapping[str, Any]) -> Iterator[Any]:
    """The rows of `sql`, in binary, each as the server sends it (libpq's single-row mode): a
    row is handed on while the next ones are still on their way."""
    raw = _driver_connection(conn)
    cursor = raw.cursor(binary=True)
    if _listened(conn, "before_cursor_execute"):
        conn.dispatch.before_cursor_execute(conn, cursor, sql, params, None, False)
    try:
        yield from cursor.stream(sql, params)
    except psycopg.Error as exc:
        _invalidate_if_lost(conn, raw, exc)
        raise


def begin(conn: Connection, sql: str, params: Mapping[str, Any]) -> psycopg.Cursor[Any]:
    """Open the transaction of `conn` with `sql`, BEGIN and the statements that go with it (the
    transaction's first may be one), in one round trip: one simple query, its parameters bound
    by psycopg on the client (ClientCursor: quoted as literals); the cursor is left on the last
    statement's result. psycopg, put in autocommit mode, sends no BEGIN of its own, and the
    statements that follow (SQLAlchemy's too) run in the transaction `sql` opened until
    DriverTransaction ends it (psycopg's commit and rollback go by the server's transaction
    status). `end_autocommit` gives the connection back to the pool as SQLAlchemy expects it."""
    raw = _driver_connection(conn)
    if not raw.autocommit:
        try:
            raw.autocommit = True
        except psycopg.Error as exc:
            _invalidate_if_lost(conn, raw, exc)
            raise
        conn.info[AUTOCOMMIT_SET] = True
    cursor = _run(conn, raw, psycopg.ClientCursor(raw), sql, params)
    while cursor.nextset():
        pass
    return cursor


def _run(conn: Connection, raw: psycopg.Connection[Any], cursor: psycopg.Cursor[Any], sql: str,
         params: Mapping[str, Any]) -> psycopg.Cursor[Any]:
    if _listened(conn, "before_cursor_execute"):
        conn.dispatch.before_cursor_execute(conn, cursor, sql, params, None, False)
    try:
        cursor.execute(sql, params)
    except psycopg.Error as exc:
        _invalidate_if_lost(conn, raw, exc)
        raise
    return cursor


def safe_json(raw: Any, record: Any) -> None:
    """A new connection reads JSON as the store does (jsontext.json_value: a value nested too
    deep for Python's decoder is no RecursionError in whoever reads the row)."""
    set_json_loads(json_value, raw)


def end_autocommit(raw: Any, record: Any) -> None:
    """A pool's checkin listener: a connection `begin` put in autocommit mode goes back to the
    pool in the mode it had (a caller's own transaction on it is one again); one that cannot
    change mode any more is discarded."""
    if raw is None or not record.info.pop(AUTOCOMMIT_SET, False):
        return
    try:
        raw.autocommit = False
    except psycopg.Error as exc:
        record.invalidate(exc)


class DriverTransaction:
    """The transaction `begin` opened on a connection, ended as `with conn.begin()` ends one
    (SQLAlchemy's commit and rollback listeners are called as SQLAlchemy calls them); when
    SQLAlchemy statements ran in it, SQLAlchemy began its own on it and ends it."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        conn = self.conn
        if conn.in_transaction():
            if kind is None:
                conn.commit()
            else:
                conn.rollback()
            return
        if conn.invalidated:  # lost with the connection
            return
        raw = psycopg_of(conn)
        if raw is None or raw.closed:
            return
        try:
            if kind is None:
                if _listened(conn, "commit"):
                    conn.dispatch.commit(conn)
                raw.commit()
            elif not raw.broken:
                if _listened(conn, "rollback"):
                    conn.dispatch.rollback(conn)
                raw.rollback()
        except psycopg.Error as exc:
            _invalidate_if_lost(conn, raw, exc)
            if kind is None:
                raise


def psycopg_of(conn: Connection) -> psycopg.Connection[Any] | None:
    """The psycopg connection of `conn` (None: closed). The pool's DBAPI connection, psycopg's
    own on this dialect; there also when detached from the pool (db.kept), where
    `driver_connection` is not."""
    raw: psycopg.Connection[Any] | None = conn.connection.dbapi_connection  # type: ignore[assignment]
    return raw


def _driver_connection(conn: Connection) -> psycopg.Connection[Any]:
    raw = psycopg_of(conn)
    if raw is None:
        raise psycopg.OperationalError("the connection is closed")
    return raw


def _listened(conn: Connection, name: str) -> bool:
    """Whether SQLAlchemy listeners of the connection event `name` may be attached to `conn`
    (or its class) or to its engine: SQLAlchemy's own test before it calls them, narrowed to
    the event on the engine, where other events' listeners are (db.kept's engine_disposed)."""
    if conn._has_events:
        return True
    engine = conn.engine
    return engine._has_events and bool(getattr(engine.dispatch, name))


def _invalidate_if_lost(conn: Connection, raw: psycopg.Connection[Any],
                        exc: psycopg.Error) -> None:
    """Invalidate `conn` when its psycopg connection `raw` is lost: the pool replaces it."""
    if raw.broken or raw.closed:
        conn.invalidate(exc)


@dataclass(frozen=True)
class Layout:
    """The columns of a statement's result: each one's position by name, and (when the result
    has every column of jobs) the values of a Job, in its fields' order."""

    index: dict[str, int]
    job_values: Callable[[Any], tuple[Any, ...]] | None


class Row:
    """One result row: its values and its statement's Layout."""

    __slots__ = ("layout", "values")

    def __init__(self, values: tuple[Any, ...], layout: Layout) -> None:
        self.values = values
        self.layout = layout

    def __getitem__(self, name: str) -> Any:
        return self.values[self.layout.index[name]]

    def job(self, **changes: Any) -> Job:
        """The Job of the row, with `changes` (columns of jobs)."""
        if self.layout.job_values is None:
            raise KeyError("the row does not have every column of jobs")
        values: Any = self.values
        if changes:
            values = list(values)
            for name, value in changes.items():
                values[self.layout.index[name]] = value
        return Job(*self.layout.job_values(values))


# The layouts of the statements' results, by statement text and number of columns.
_LAYOUTS: dict[tuple[str, int], Layout] = {}


def layout(cursor: psycopg.Cursor[Any], sql: str) -> Layout:
    """The Layout of `sql`'s result in `cursor`, read once per statement and number of columns
    (a `SELECT *` gains one when a migration adds it) from the result's field names: not
    psycopg's description, which makes an object per column on every call."""
    result = cursor.pgresult
    count = 0 if result is None else result.nfields
    found = _LAYOUTS.get((sql, count))
    if found is None:
        names = [] if result is None else [(result.fname(i) or b"").decode()
                                           for i in range(count)]
        index = {name: i for i, name in reversed(list(enumerate(names)))}
        complete = all(name in index for name in JOB_COLUMNS)
        getter = itemgetter(*(index[name] for name in JOB_COLUMNS)) if complete else None
        found = _LAYOUTS[(sql, count)] = Layout(index, getter)
    return found


def first(conn: Connection, sql: str, params: Mapping[str, Any]) -> Row | None:
    """The first row of `sql` (None: no row)."""
    return first_of(execute(conn, sql, params), sql)


def first_of(cursor: psycopg.Cursor[Any], sql: str) -> Row | None:
    """The first row of the result `sql` left in `cursor` (None: no row)."""
    values = cursor.fetchone()
    return None if values is None else Row(values, layout(cursor, sql))


def all_of(cursor: psycopg.Cursor[Any], sql: str) -> list[Row]:
    """Every row of the result `sql` left in `cursor`."""
    found = layout(cursor, sql)
    return [Row(values, found) for values in cursor.fetchall()]


def every(conn: Connection, sql: str, params: Mapping[str, Any]) -> list[Row]:
    """Every row of `sql`."""
    cursor = execute(conn, sql, params)
    found = layout(cursor, sql)
    return [Row(values, found) for values in cursor.fetchall()]
