"""The seam between the job store and its database: what differs from one database to another,
behind one interface (base.Backend), one module per database (postgresql: psycopg on the hot
path, COPY, LISTEN/NOTIFY, roles; sqlite: SQLAlchemy Core, one writer at a time). Nothing above
this package asks which database it has: it asks its backend."""

from __future__ import annotations

from sqlalchemy import Engine

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
    Backend,
    Change,
    Claim,
    Door,
    HandOut,
    Identity,
    InputFile,
)
from jobstore.errors import InvalidInput


def backend_for(engine: Engine) -> Backend:
    """The backend of `engine`'s database."""
    name = engine.dialect.name
    if name == "postgresql":
        from jobstore.db.backends.postgresql import PostgreSQL

        return PostgreSQL(engine)
    if name == "sqlite":
        from jobstore.db.backends.sqlite import SQLite

        return SQLite(engine)
    raise InvalidInput(f"a job store lives on PostgreSQL or SQLite, not {name}")


__all__ = ["ACTED", "DAG", "DENIED", "MENU", "MOVED", "NOOP", "READ_JOB", "READ_JOBS", "SKIPPED",
           "Backend", "Change", "Claim", "Door", "HandOut", "Identity", "InputFile", "backend_for"]
