"""The seam between the job store and its database: what differs from one database to another,
behind one interface (base.Backend), one module per database (postgresql: psycopg on the hot
path, COPY, LISTEN/NOTIFY, roles; sqlite: SQLAlchemy Core, one writer at a time). Nothing above
this package asks which database it has: it asks its backend."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from sqlalchemy import URL, Engine
from sqlalchemy.exc import DBAPIError

from jobstore.db.backends.base import (
    ACTED,
    DAG,
    DENIED,
    MENU,
    MOVED,
    NOOP,
    READ_JOB,
    READ_JOBS,
    SKIPPED,
    VACATES,
    Backend,
    Change,
    Claim,
    DagSettings,
    Door,
    HandOut,
    Identity,
    InputFile,
    MenuRow,
    Opened,
    Params,
    Roles,
    Row,
    UserRights,
    Value,
)
from jobstore.errors import DatabaseError


class Database(Protocol):
    """What a backend package gives besides its Backend: how to connect and to prepare for a
    schema upgrade (jobstore.db.engine)."""

    DRIVER: str  # SQLAlchemy's dialect and driver

    def backend(self, made: Engine) -> Backend: ...

    def engine(self, url: URL, options: Mapping[str, Any], *, connect_timeout: int,
               create: bool) -> Engine: ...

    def before_upgrade(self, url: URL) -> Callable[[], None]: ...


def database(name: str) -> Database:
    """The backend package of the database `name` (a URL's backend name, an engine's dialect):
    the one place that knows which databases there are."""
    if name == "postgresql":
        from jobstore.db.backends.postgresql import connect as pg

        return pg
    if name == "sqlite":
        from jobstore.db.backends.sqlite import connect as lite

        return lite
    raise DatabaseError(f"unsupported database backend {name!r} (use postgresql or sqlite)")


def backend_for(engine: Engine) -> Backend:
    """The backend of `engine`'s database."""
    return database(engine.dialect.name).backend(engine)


def server_warnings(engine: Engine) -> list[str]:
    """What in the server's settings works against a job store (PostgreSQL: autovacuum off)."""
    backend = backend_for(engine)
    try:
        with engine.connect() as conn:
            return backend.server_warnings(conn)
    except DBAPIError:
        return []


def preload_drivers() -> None:
    """Import the database drivers now (a process that forks a child per command)."""
    from sqlalchemy.dialects import registry

    for name in ("postgresql", "sqlite"):
        try:
            registry.load(database(name).DRIVER).import_dbapi()
        except ImportError:
            pass


__all__ = ["ACTED", "DAG", "DENIED", "MENU", "MOVED", "NOOP", "READ_JOB", "READ_JOBS", "SKIPPED",
           "VACATES", "Backend", "Change", "Claim", "DagSettings", "Door", "HandOut", "Identity",
           "InputFile", "MenuRow", "Opened", "Params", "Roles", "Row", "UserRights", "Value",
           "backend_for", "database", "preload_drivers", "server_warnings"]
