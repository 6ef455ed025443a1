"""Transactions on the job database: the statement timeout, the commit listeners (the user log
is one), and one clean DatabaseError whatever the driver raised."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, event

from jobstore.db.backends import Backend, Identity, Opened, Params, backend_for
from jobstore.db.channels import Listener
from jobstore.db.rows import PENDING
from jobstore.errors import InvalidInput

# Called just before a transaction that wrote events commits, with those events in order: each a
# dict of the job_events columns plus "job", the job row before the transition (None when not
# known). It may return a callable, called with True once the commit succeeded (False if it
# failed): so a listener can take a lock before the commit and act after it, keeping the
# database's order (jobstore.formats.userlog). Exceptions are logged in one line, never affect the
# transition.
AfterCommit = Callable[[bool], None]
CommitListener = Callable[[list[dict[str, Any]]], AfterCommit | None]
JOINED = "jobstore_joined_events"  # ... of a caller's transaction the store joined
_log = logging.getLogger(__name__)


class Transactions:
    """The job database's engine and backend, and how a unit of work runs on it; holds no
    session state but who its sessions are (`identity`)."""

    def __init__(self, engine: Engine, statement_timeout_ms: int | None = 5000) -> None:
        self.engine = engine
        self.statement_timeout_ms = statement_timeout_ms
        self.backend: Backend = backend_for(engine)
        self._identity: Identity | None = None
        # Commit listeners (see CommitListener), wired where stores are built (JobStore)
        self.listeners: list[CommitListener] = []
        self._log_only: set[CommitListener] = set()  # those that look only at jobs with a log

    @property
    def can_listen(self) -> bool:
        """Does the database announce changes (LISTEN/NOTIFY), or must a watcher poll?"""
        return self.backend.can_listen

    @property
    def ids_commit_out_of_order(self) -> bool:
        """Can a row with a lower id commit after one with a higher id (concurrent writers
        drawing from one sequence), so that a reader must look back for late ones?"""
        return self.backend.ids_commit_out_of_order

    def identity(self) -> Identity:
        """Who this store's sessions are, as the database decides (PostgreSQL: the session's
        role); a database without sessions of its own (SQLite) is one user's (the file's owner,
        or root), so its session is the invoking account, trusted."""
        if self._identity is None:
            self._identity = self.backend.local_identity()
        if self._identity is None:
            with self.transaction() as conn:
                self._identity = self.backend.session_identity(conn)
        return self._identity

    def listener(self, channel: str, connect_timeout: int) -> Listener:
        """A listener on one of the store's channels (jobstore.db.channels; `can_listen`)."""
        return self.backend.listener(channel, connect_timeout, self.transaction)

    def listen(self, listener: CommitListener, *, jobs_with_a_log_only: bool = False) -> None:
        """Call `listener` after each commit (`jobs_with_a_log_only`: it looks only at the
        events of jobs with a user log, so a bulk path may skip the others')."""
        self.listeners.append(listener)
        if jobs_with_a_log_only:
            self._log_only.add(listener)

    def listens_to_every_job(self) -> bool:
        """Does a commit listener want the events of jobs without a user log?"""
        return any(listener not in self._log_only for listener in self.listeners)

    @contextmanager
    def transaction(self, outer: Connection | None = None) -> Iterator[Connection]:
        """One transaction; with `outer`, the caller's own open transaction on that connection
        instead (nothing committed here: the caller commits or rolls back, and the commit
        listeners run as it commits)."""
        if outer is not None:
            with self._joined(outer) as conn:
                yield conn
            return
        with self.opened() as (conn, _):
            yield conn

    @contextmanager
    def opened(self, first: str | None = None, params: Params | None = None,
                ) -> Iterator[tuple[Connection, Opened]]:
        """One transaction, and what the backend read of its `first` read (backends.MENU,
        READ_JOB; `params`) in the round trip that opened it, for the backend's `menu` or
        `read_job` (`_connect`)."""
        pending: list[dict[str, Any]] = []
        after: list[AfterCommit] = []
        try:
            conn, opened = self._connect(first, params)
            try:
                with self.backend.transaction(conn):
                    conn.info[PENDING] = pending  # conn.info outlives the checkout: always reset
                    try:
                        yield conn, opened
                    finally:
                        if not conn.invalidated:  # a lost connection's info cannot be touched
                            conn.info.pop(PENDING, None)
                    if pending:
                        after = self._before_commit(pending)
            finally:
                self.backend.release(conn)
        except self.backend.lost as exc:
            _after_commit(after, False)
            raise self.backend.error(exc, self.engine.url) from None
        except BaseException:
            _after_commit(after, False)
            raise
        _after_commit(after, True)

    def _connect(self, first: str | None = None, params: Params | None = None,
                 ) -> tuple[Connection, Opened]:
        """A connection in a transaction with its statement timeout, and what the backend
        read of `first` as it opened it (`opened`). A connection the server dropped (a
        restart, an idle timeout) is found by the statement that opens the transaction and
        replaced once: no ping precedes every transaction."""
        for retry in (True, False):
            conn = self.backend.connect()
            try:
                opened = self.backend.begin(conn, first, params or {}, self.statement_timeout_ms)
            except self.backend.lost:
                dropped = conn.invalidated  # by the backend's driver
                self.backend.release(conn)
                if retry and dropped:
                    continue
                raise
            return conn, opened
        raise AssertionError("unreachable: the second try returns or raises")

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
        except self.backend.lost as exc:
            raise self.backend.error(exc, self.engine.url) from None
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
