"""Engines and schema upgrades: one way to connect, tuned per backend (its `connect` module)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from jobstore.db.backends import database
from jobstore.db.jsontext import json_text, json_value
from jobstore.db.urls import parse_url, safe_url
from jobstore.errors import DatabaseError

__all__ = ["DatabaseError", "make_engine", "upgrade", "safe_url"]

MIGRATIONS = Path(__file__).with_name("migrations")


def make_engine(
    url: str,
    *,
    connect_timeout: int = 5,
    pool: bool = False,
    max_overflow: int = 0,
    create: bool = False,
) -> Engine:
    """An engine for `url`. Hooks use no pool (one short connection); a service may pool:
    one connection kept open, plus at most `max_overflow` more under load, closed as soon as
    they are returned. No ping before each use on PostgreSQL: a transaction's first statement
    finds a connection the server dropped, and Transactions replaces it once.
    `create`: the store may be made (`jobstore init`). What else each database needs, its
    backend's `connect` does (jobstore.db.backends.database).
    """
    parsed = parse_url(url)
    options: dict[str, Any] = (
        {"pool_size": 1, "max_overflow": max_overflow, "pool_timeout": 5}
        if pool
        else {"poolclass": NullPool}
    )
    options["json_serializer"] = json_text
    options["json_deserializer"] = json_value
    return database(parsed.get_backend_name()).engine(
        parsed, options, connect_timeout=connect_timeout, create=create)


def alembic_config(url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["database_url"] = url
    return cfg


@lru_cache(maxsize=1)
def head_revision() -> str | None:
    """The newest migration's revision (its scripts read once per process)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("")).get_current_head()


def upgrade(url: str, revision: str = "head") -> None:
    """Create or upgrade the schema (what `jobstore init` does); a store at the newest
    revision already is left as it is, without running alembic (the newest revision is read
    from the migrations once per process: head_revision)."""
    from alembic import command

    parsed = parse_url(url)
    after = database(parsed.get_backend_name()).before_upgrade(parsed)
    try:
        if revision != "head" or _revision(url) != head_revision():
            command.upgrade(alembic_config(url), revision)
    except DBAPIError as exc:  # e.g. the server is unreachable: one line, no traceback
        orig = exc.orig or exc
        first = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
        raise DatabaseError(f"database {safe_url(url)}: {first}") from None
    after()


def _revision(url: str) -> str | None:
    """The store's revision (None: no schema yet)."""
    from alembic.runtime.migration import MigrationContext

    engine = make_engine(url, create=True)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
