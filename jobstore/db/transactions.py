"""Transactions on the job database: the statement timeout, the commit listeners (the user log
is one), and one clean DatabaseError whatever the driver raised."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Self

import psycopg
from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import DBAPIError, OperationalError, PendingRollbackError
from sqlalchemy.pool import NullPool

from jobstore.core.jobs import Job
from jobstore.db import driver
from jobstore.db.engine import make_engine, safe_url
from jobstore.db.kept import KeptConnection
from jobstore.db.sql import opening
from jobstore.errors import DatabaseError, InvalidInput, Refused

# Called just before a transaction that wrote events commits, with those events in order: each a
# dict of the job_events columns plus "job", the job row before the transition (None when not
# known). It may return a callable, called with True once the commit succeeded (False if it
# failed): so a listener can take a lock before the commit and act after it, keeping the
# database's order (jobstore.formats.userlog). Exceptions are logged in one line, never affect the
# transition.
AfterCommit = Callable[[bool], None]
CommitListener = Callable[[list[dict[str, Any]]], AfterCommit | None]
PENDING = "jobstore_pending_events"  # key in conn.info: events of the open transaction
JOINED = "jobstore_joined_events"  # ... of a caller's transaction the store joined
_log = logging.getLogger(__name__)
# What a lost or refused connection raises inside a transaction (PendingRollbackError: a
# connection lost mid-transaction, as SQLAlchemy reports it once; psycopg's own errors: the
# statements of the hot path, jobstore.db.driver).
LOST = (OperationalError, DBAPIError, PendingRollbackError, psycopg.Error)


def note_event(conn: Connection, values: Mapping[str, Any], job: Job | None) -> None:
    """Keep an event written in this transaction for the commit listeners."""
    pending = conn.info.get(PENDING)
    if pending is not None:
        pending.append({**values, "job": job})


class Transactions:
    """The job database's engine and how a unit of work runs on it; holds no session state."""

    def __init__(self, engine: Engine, statement_timeout_ms: int | None = 5000) -> None:
        self.engine = engine
        self.statement_timeout_ms = statement_timeout_ms
        self._pg = engine.dialect.name == "postgresql"
        if self._pg and engine.dialect.driver != "psycopg":  # the hot path is psycopg's (driver)
            raise InvalidInput(f"a job store on PostgreSQL needs psycopg (postgresql+psycopg://),"
                               f" not {engine.dialect.driver}")
        if self._pg and not event.contains(engine, "checkin", driver.end_autocommit):
            event.listen(engine, "checkin", driver.end_autocommit)  # after driver.begin
        # a pooled engine's store keeps one connection between its transactions (db.kept)
        self._kept = (KeptConnection.for_engine(engine)
                      if self._pg and not isinstance(engine.pool, NullPool) else None)
        # Commit listeners (see CommitListener), wired where stores are built (JobStore)
        self.listeners: list[CommitListener] = []
        self._log_only: set[CommitListener] = set()  # those that look only at jobs with a log

    @property
    def can_listen(self) -> bool:
        """Does the database announce changes (LISTEN/NOTIFY), or must a watcher poll?"""
        return self._pg

    @property
    def ids_commit_out_of_order(self) -> bool:
        """Can a row with a lower id commit after one with a higher id (concurrent writers
        drawing from one sequence), so that a reader must look back for late ones?"""
        return self._pg

    def listen(self, listener: CommitListener, *, jobs_with_a_log_only: bool = False) -> None:
        """Call `listener` after each commit (`jobs_with_a_log_only`: it looks only at the
        events of jobs with a user log, so a bulk path may skip the others')."""
        self.listeners.append(listener)
        if jobs_with_a_log_only:
            self._log_only.add(listener)

    def listens_to_every_job(self) -> bool:
        """Does a commit listener want the events of jobs without a user log?"""
        return any(listener not in self._log_only for listener in self.listeners)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        connect_timeout: int = 5,
        statement_timeout_ms: int | None = 5000,
        pool: bool = False,
        max_overflow: int = 0,
    ) -> Self:
        """A store on `url`: one short connection per transaction, or (`pool`, for a
        long-running caller) one kept connection plus at most `max_overflow` more."""
        engine = make_engine(
            url, connect_timeout=connect_timeout, pool=pool, max_overflow=max_overflow
        )
        return cls(engine, statement_timeout_ms)

    @contextmanager
    def _tx(self, outer: Connection | None = None) -> Iterator[Connection]:
        """One transaction; with `outer`, the caller's own open transaction on that connection
        instead (nothing committed here: the caller commits or rolls back, and the commit
        listeners run as it commits)."""
        if outer is not None:
            with self._joined(outer) as conn:
                yield conn
            return
        with self._opened() as (conn, _):
            yield conn

    @contextmanager
    def _opened(self, first: str | None = None, params: Mapping[str, Any] | None = None,
                ) -> Iterator[tuple[Connection, psycopg.Cursor[Any] | None]]:
        """One transaction, and on PostgreSQL the cursor of its `first` statement (psycopg's
        `%(name)s` parameters `params`), run in the round trip that opens the transaction
        (`_connect`); None on SQLite or without `first`."""
        pending: list[dict[str, Any]] = []
        after: list[AfterCommit] = []
        try:
            conn, opened = self._connect(first, params)
            try:
                with self._transaction(conn):
                    conn.info[PENDING] = pending  # conn.info outlives the checkout: always reset
                    try:
                        yield conn, opened
                    finally:
                        if not conn.invalidated:  # a lost connection's info cannot be touched
                            conn.info.pop(PENDING, None)
                    if pending:
                        after = self._before_commit(pending)
            finally:
                self._release(conn)
        except LOST as exc:
            _after_commit(after, False)
            raise _database_error(exc, self.engine.url) from None
        except BaseException:
            _after_commit(after, False)
            raise
        _after_commit(after, True)

    def _transaction(self, conn: Connection) -> AbstractContextManager[Any]:
        """The transaction of `conn` (`_connect`), committed at the end of its block or rolled
        back: on PostgreSQL the one `_connect` opened (no SQLAlchemy Transaction on the hot
        path), on SQLite SQLAlchemy's (BEGIN IMMEDIATE)."""
        return driver.DriverTransaction(conn) if self._pg else conn.begin()

    def _connect(self, first: str | None = None, params: Mapping[str, Any] | None = None,
                 ) -> tuple[Connection, psycopg.Cursor[Any] | None]:
        """A connection in a transaction with its statement timeout, and the cursor of the
        transaction's `first` statement (`_opened`). PostgreSQL: BEGIN, set_config local to
        the transaction (begin_transaction; '0' for no timeout) and `first`, in one round trip.
        The connection is the store's kept one where it has one (db.kept). That round trip
        finds a kept or pooled connection the server dropped (a restart, an idle timeout): it
        is replaced once, and no ping precedes every transaction."""
        for retry in (True, False):
            conn = self.engine.connect() if self._kept is None else self._kept.lend()
            if not self._pg:
                return conn, None
            try:
                cursor = driver.begin(conn, opening(first), {
                    "milliseconds": str(int(self.statement_timeout_ms or 0)), **(params or {})})
            except (DBAPIError, psycopg.Error):
                dropped = conn.invalidated  # by the driver module
                self._release(conn)
                if retry and dropped:
                    continue
                raise
            return conn, None if first is None else cursor
        raise AssertionError("unreachable: the second try returns or raises")

    def _release(self, conn: Connection) -> None:
        """The end of `_connect`'s connection."""
        if self._kept is None:
            conn.close()
        else:
            self._kept.end(conn)

    @contextmanager
    def _joined(self, outer: Connection) -> Iterator[Connection]:
        if not outer.in_transaction():
            raise InvalidInput("connection= needs a connection inside a transaction (begin())")
        joined = outer.info.get(JOINED)
        if joined is None:
            joined = outer.info[JOINED] = []
            self._on_end(outer, joined)
        before = outer.info.get(PENDING)
        outer.info[PENDING] = joined
        try:
            yield outer
        except LOST as exc:
            raise _database_error(exc, self.engine.url) from None
        finally:
            if not outer.invalidated:
                if before is None:
                    outer.info.pop(PENDING, None)
                else:
                    outer.info[PENDING] = before

    def _on_end(self, outer: Connection, joined: list[dict[str, Any]]) -> None:
        """Run the commit listeners for the events written in the caller's transaction as it
        commits (just before the database's commit); forget them if it rolls back."""
        ended: list[bool] = []

        def end() -> bool:
            if ended:
                return False
            ended.append(True)
            if not outer.invalidated and outer.info.get(JOINED) is joined:
                outer.info.pop(JOINED, None)
            return True

        def committed(conn: Connection) -> None:
            if end() and joined:
                _after_commit(self._before_commit(list(joined)), True)

        def rolled_back(conn: Connection) -> None:
            end()

        event.listen(outer, "commit", committed, once=True)
        event.listen(outer, "rollback", rolled_back, once=True)

    def _before_commit(self, events: list[dict[str, Any]]) -> list[AfterCommit]:
        after = []
        for listener in self.listeners:
            try:
                then = listener(events)
            except Exception as exc:  # a listener never breaks a transition
                _log.warning("jobstore: commit listener failed: %s: %s", type(exc).__name__, exc)
            else:
                if then is not None:
                    after.append(then)
        return after


def _after_commit(after: list[AfterCommit], committed: bool) -> None:
    for then in after:
        try:
            then(committed)
        except Exception as exc:  # a listener never breaks a transition
            _log.warning("jobstore: commit listener failed: %s: %s", type(exc).__name__, exc)


def _database_error(exc: Exception, url: Any) -> DatabaseError:
    """What a failed transaction raises: Refused when the database refused a statement for this
    session's rights (SQLSTATE 42501: a privilege or a row-level security policy), else
    DatabaseError; one line either way."""
    orig = getattr(exc, "orig", None) or exc
    if isinstance(orig, psycopg.errors.InsufficientPrivilege):
        first = str(orig).strip().splitlines()[0] if str(orig).strip() else "permission denied"
        return Refused(f"the job store's database refused it: {first}")
    return DatabaseError(_db_message(exc, url))


def _db_message(exc: Exception, url: Any) -> str:
    orig = getattr(exc, "orig", None) or exc
    first = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    if "no such table" in first or ("relation" in first and "does not exist" in first):
        first += " (not a job store yet? create it with `jobstore init`)"
    return f"database {safe_url(str(url))}: {first}"
