"""Engines on a SQLite file: one writer at a time (BEGIN IMMEDIATE), the file one user's."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import URL, Engine, create_engine, event

from jobstore.db.backends.base import Backend
from jobstore.db.backends.sqlite import SQLite
from jobstore.errors import DatabaseError

DRIVER = "sqlite.pysqlite"  # SQLAlchemy's dialect and driver


def backend(made: Engine) -> Backend:
    """The backend of an engine on this database."""
    return SQLite(made)


def engine(url: URL, options: Mapping[str, Any], *, connect_timeout: int,
           create: bool) -> Engine:
    """Every transaction is BEGIN IMMEDIATE, so that claims from several processes serialise
    instead of failing on lock upgrades; the file must exist unless `create` (`jobstore init`):
    nothing else creates a job store, not even by reading."""
    database = url.database or ""
    if _on_disk(database):
        if not create and not os.path.exists(database):
            raise DatabaseError(f"no job store at {database} (create it with `jobstore init`)")
        _check_owner(database)
        if create:
            _make_parent(database)
    made = create_engine(url, connect_args={"timeout": max(connect_timeout, 30)}, **options)
    _immediate(made)
    return made


def before_upgrade(url: URL) -> Callable[[], None]:
    """Make the file's directory; what to do once the schema is made: a new file is 0660."""
    database = url.database or ""
    if not _on_disk(database):
        return lambda: None
    _make_parent(database)
    if os.path.exists(database):
        return lambda: None
    return lambda: os.chmod(database, 0o660)


def _on_disk(database: str) -> bool:
    return bool(database) and database != ":memory:"


def _check_owner(database: str) -> None:
    """A SQLite job store is one user's: its file's owner and root use it, nobody else (the
    file holds no identity: whoever can write it could queue jobs as anyone)."""
    try:
        owner = os.stat(database).st_uid
    except OSError:
        return  # not there yet (`jobstore init` makes it, owned by the caller)
    me = os.getuid()
    if me not in (0, owner):
        import pwd

        try:
            name = pwd.getpwuid(owner).pw_name
        except KeyError:
            name = f"uid {owner}"
        raise DatabaseError(f"the SQLite job store {database} belongs to {name}: a SQLite job "
                            "store is one user's (its owner's and root's); use PostgreSQL, "
                            "where each submitter has her own role, for a shared queue")


def _make_parent(database: str) -> None:
    try:
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatabaseError(f"cannot create the directory of {database}: "
                            f"{exc.strerror or exc}") from None


def _immediate(made: Engine) -> None:
    @event.listens_for(made, "connect")
    def _connect(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        dbapi_conn.isolation_level = None  # let SQLAlchemy's "begin" below issue BEGIN
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys = ON")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(made, "begin")
    def _begin(conn):  # type: ignore[no-untyped-def]
        conn.exec_driver_sql("BEGIN IMMEDIATE")
