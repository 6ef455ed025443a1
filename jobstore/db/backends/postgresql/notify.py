"""PostgreSQL notifications, sent inside the transaction that writes what they announce
(delivered at its commit), received on a dedicated LISTEN connection: new job events (for
`jobstore watch`), attempts the store stopped and new claimable work (for the node agents)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine

from jobstore.db.backends.postgresql import driver
from jobstore.db.backends.postgresql.queries import (
    LISTEN_EVENTS,
    LISTEN_STOPS,
    LISTEN_WORK,
    NOTIFY_EVENT,
    NOTIFY_KEY,
    NOTIFY_SIGNED,
)
from jobstore.db.channels import CHANNEL, FRESH_MS, SIGNED, STOPS, WORK, verified
from jobstore.db.urls import database_message
from jobstore.errors import DatabaseError

_LISTEN = {CHANNEL: LISTEN_EVENTS, STOPS: LISTEN_STOPS, WORK: LISTEN_WORK}


def notify(conn: Connection, payload: str, channel: str = CHANNEL) -> None:
    """Notify the followers when `conn`'s transaction commits (never if it rolls back); what
    the agents act on signed by the database."""
    sql = NOTIFY_SIGNED if channel in SIGNED and not payload.startswith("probe:") else NOTIFY_EVENT
    driver.execute(conn, sql, {"channel": channel, "payload": payload})


class PgListener:
    """A dedicated autocommit psycopg connection that LISTENs on one of the store's channels
    (jobstore.db.channels.Listener); `transaction` opens one of the store's transactions."""

    def __init__(self, engine: Engine,
                 transaction: Callable[[], AbstractContextManager[Connection]],
                 connect_timeout: int, channel: str = CHANNEL) -> None:
        self.engine = engine
        self.transaction = transaction
        self.connect_timeout = connect_timeout
        self.channel = channel
        self.conn: Any = None
        self._key: str | None = None  # a signed channel's
        # the signed notifications taken, against replays, in the order taken
        self._seen: dict[str, float] = {}
        self.forged = 0  # notifications of a signed channel that were not signed, or replayed

    def open(self) -> None:
        engine = self.engine
        _, params = engine.dialect.create_connect_args(engine.url)
        params = {k: v for k, v in params.items() if k != "context"}
        params.setdefault("connect_timeout", self.connect_timeout)
        with self._errors():
            self.conn = psycopg.connect(**params, autocommit=True)
            if self.channel in SIGNED:
                row = self.conn.execute(NOTIFY_KEY).fetchone()
                if row is None:
                    raise psycopg.OperationalError("the job store has no notification key")
                self._key = str(row[0])
            self.conn.execute(_LISTEN[self.channel])

    def probe(self, timeout: float = 3.0) -> bool:
        """Does a notification sent from another connection arrive? (Not behind a pooler in
        transaction mode: the LISTEN stays on a server connection we no longer hold.) Sent in
        the store's own transaction, which replaces a pooled connection the server dropped (a
        restart) instead of failing the probe."""
        token = "probe:" + secrets.token_hex(8)
        with self.transaction() as conn:
            notify(conn, token, self.channel)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if token in self.wait(left):
                return True
        return False

    def wait(self, timeout: float) -> list[str]:
        """Payloads of the notifications that arrive within `timeout` (all that are queued)."""
        with self._errors():
            got = [n.payload
                   for n in self.conn.notifies(timeout=max(timeout, 0.001), stop_after=1)]
            if got:
                got += [n.payload for n in self.conn.notifies(timeout=0.001)]
        return got if self._key is None else self._believed(got, self._key)

    def _believed(self, payloads: list[str], key: str) -> list[str]:
        """The signed payloads not seen before (and the probes, which nobody acts on)."""
        now = time.time()
        stale = now - 3 * FRESH_MS / 1000  # a replay of an older one is refused as stale
        while self._seen:  # the oldest first: the work is the forgotten ones'
            oldest = next(iter(self._seen))
            if self._seen[oldest] > stale:
                break
            del self._seen[oldest]
        out = []
        for text in payloads:
            if text.startswith("probe:"):
                out.append(text)
                continue
            found = verified(key, text, int(now * 1000))
            if found is None or found[1] in self._seen:
                self.forged += 1
                continue
            self._seen[found[1]] = now
            out.append(found[0])
        return out

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """psycopg's errors as the store's: one DatabaseError line."""
        try:
            yield
        except psycopg.Error as exc:
            raise DatabaseError(database_message(exc, self.engine.url)) from None

    def fileno(self) -> int | None:
        return None if self.conn is None else int(self.conn.fileno())

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            finally:
                self.conn = None
