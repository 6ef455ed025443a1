"""Engines on PostgreSQL: psycopg, nothing that PgBouncer's transaction pooling would break."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import URL, Engine, create_engine

from jobstore.db.backends.base import Backend
from jobstore.db.backends.postgresql import PostgreSQL

DRIVER = "postgresql.psycopg"  # SQLAlchemy's dialect and driver


def backend(made: Engine) -> Backend:
    """The backend of an engine on this database."""
    return PostgreSQL(made)


def engine(url: URL, options: Mapping[str, Any], *, connect_timeout: int,
           create: bool) -> Engine:
    """No server-side prepared statements and no startup parameters, so that the same code works
    behind PgBouncer in transaction pooling mode (statement timeouts are set per transaction:
    begin_transaction); the driver is psycopg, whatever the URL names."""
    if url.get_driver_name() != "psycopg":
        url = url.set(drivername="postgresql+psycopg")
    connect_args = {"connect_timeout": connect_timeout, "prepare_threshold": None}
    return create_engine(url, connect_args=connect_args, **options)


def before_upgrade(url: URL) -> Callable[[], None]:
    """Nothing to prepare: the server has the database."""
    return lambda: None
