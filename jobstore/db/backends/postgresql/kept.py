"""The connection a store on a pooled PostgreSQL engine keeps between its transactions: taken out
of the pool once (detached: the pool's own capacity is left to the engine's other users) and
lent to one transaction at a time, so that a claim or a report pays for no pool checkout,
checkin and reset, and psycopg stays in the autocommit mode `driver.begin` needs.

It stands for one of the pool's connections: while it is lent, the store's other transactions
take at most the rest of the pool's capacity from the pool (make_engine's pool of one and its
overflow: the overflow, closed right after use), else wait for it, as they would have waited
for the pool. A transaction inside a transaction of its own thread always takes a pooled one.
Engine.dispose() closes the kept connection (or, lent, as it comes back)."""

from __future__ import annotations

import os
import threading
import time

from psycopg import pq
from sqlalchemy import Connection, Engine, event, exc
from sqlalchemy.pool import Pool, QueuePool

from jobstore.db.backends.postgresql import driver

_ATTR = "_jobstore_kept"  # the engine's KeptConnection: one per engine, shared by its stores
_OPENING = object()  # lent while it is being made


class KeptConnection:
    """One engine's kept connection (`for_engine`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # the lock held directly (a Condition's own `with` is Python code, on every loan), and
        # the condition notified only when a transaction waits on it
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._waiting = 0
        self._idle: Connection | None = None
        self._lent: object | None = None  # the lent connection (or _OPENING)
        self._holder: int | None = None  # the thread it is lent to
        self._others = 0  # pooled connections the store's transactions hold meanwhile
        self._generation = 0  # Engine.dispose() starts a new one: older connections are closed
        self._lent_generation = 0
        self._pid = os.getpid()
        event.listen(engine, "engine_disposed", self._disposed)

    @classmethod
    def for_engine(cls, engine: Engine) -> KeptConnection:
        kept = engine.__dict__.get(_ATTR)
        if kept is None:
            kept = engine.__dict__.setdefault(_ATTR, cls(engine))
        return kept

    def lend(self) -> Connection:
        """A connection for one transaction, ended with `end`: the kept one (made on first use),
        or a pooled one when it is lent to this thread, or to another and the pool has room for
        one more of the store's."""
        conn = self._take()
        if conn is not None:
            return conn
        try:
            return self.engine.connect()
        except BaseException:
            self._end_other()
            raise

    def end(self, conn: Connection) -> None:
        """The end of `lend`'s connection."""
        if conn is self._lent:
            self._give_back(conn)
        else:
            self._close_other(conn)

    def _take(self) -> Connection | None:
        with self._lock:
            if self._lent is not None and self._holder == threading.get_ident():
                self._others += 1
                return None
            deadline = None
            while self._lent is not None:
                if self._others < _spare(self.engine.pool):
                    self._others += 1
                    return None
                if deadline is None:
                    deadline = time.monotonic() + float(getattr(self.engine.pool, "_timeout", 30))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise exc.TimeoutError(
                        "the job store's database connection stayed busy: gave up waiting")
                self._waiting += 1
                try:
                    self._cond.wait(left)
                finally:
                    self._waiting -= 1
            conn, self._idle = self._idle, None
            self._lent, self._holder = _OPENING, threading.get_ident()
            self._lent_generation = self._generation
        if conn is None or conn.invalidated or conn.closed:
            try:
                conn = self.engine.connect()
                conn.connection.detach()  # closed for real when closed: never back in the pool
            except BaseException:
                self._end_loan()
                raise
        self._lent = conn
        return conn

    def _give_back(self, conn: Connection) -> None:
        """Kept while it is idle and healthy, closed otherwise."""
        keep = self._lent_generation == self._generation and _reusable(conn)
        if not keep:
            conn.close()
        self._end_loan(conn if keep else None)

    def _close_other(self, conn: Connection) -> None:
        """A pooled connection goes back to the pool or, from a pool of one (make_engine's,
        which the kept connection stands for), is closed."""
        try:
            shape = _shape(self.engine.pool)
            if shape is not None and shape[0] == 1 and not (conn.invalidated or conn.closed):
                conn.connection.detach()
            conn.close()
        finally:
            self._end_other()

    def _end_other(self) -> None:
        with self._lock:
            self._others -= 1
            if self._waiting:
                self._cond.notify()

    def _end_loan(self, idle: Connection | None = None) -> None:
        with self._lock:
            self._idle, self._lent, self._holder = idle, None, None
            if self._waiting:
                self._cond.notify()

    def _disposed(self, engine: Engine) -> None:
        with self._lock:
            self._generation += 1
            conn, self._idle = self._idle, None
        if conn is not None and os.getpid() == self._pid:  # not a forked child's copy
            conn.close()


def _shape(pool: Pool) -> tuple[int, int] | None:
    """A QueuePool's size and overflow (negative: no limit), which SQLAlchemy keeps private;
    None for other kinds of pool."""
    if not isinstance(pool, QueuePool):
        return None
    return pool.size(), int(getattr(pool, "_max_overflow", 0))


def _spare(pool: Pool) -> int:
    """How many of the pool's connections the store's transactions may hold besides the kept
    one: the pool's capacity less one (no limit but the pool's own for other kinds)."""
    shape = _shape(pool)
    if shape is None or shape[1] < 0:
        return 1 << 30
    return shape[0] + shape[1] - 1


def _reusable(conn: Connection) -> bool:
    if conn.invalidated or conn.closed or conn.in_transaction():
        return False
    raw = driver.psycopg_of(conn)
    return raw is not None and raw.pgconn.transaction_status == pq.TransactionStatus.IDLE
