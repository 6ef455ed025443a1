"""Engines and schema upgrades: one way to connect, tuned per backend."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from jobstore.db.sql import AUTOVACUUM_SETTING
from jobstore.errors import DatabaseError

__all__ = ["DatabaseError", "make_engine", "upgrade", "safe_url", "is_sqlite",
           "server_warnings"]

MIGRATIONS = Path(__file__).with_name("migrations")


def json_text(value: Any) -> str:
    """A JSON column's text as the job store writes it: without the spaces after `,` and `:`
    (a job's ad and every event's attrs are in the WAL and on disk once per row)."""
    return json.dumps(value, separators=(",", ":"))


# What a reader gets for a JSON value nested deeper than Python's decoder goes: an object whose
# one name is no attribute name, so that a job's ad that holds it cannot be read (its job held;
# formats.jobads.stored_attrs) and nothing else fails on it
TOO_DEEP = {"!": "nested too deeply to read"}


def json_value(text: str | bytes) -> Any:
    """A JSON column's value as the store reads it: never a RecursionError."""
    try:
        return json.loads(text)
    except RecursionError:
        return dict(TOO_DEEP)


def is_sqlite(url: str) -> bool:
    try:
        return make_url(url).get_backend_name() == "sqlite"
    except Exception:
        raise DatabaseError("the database URL cannot be parsed") from None


def safe_url(url: str) -> str:
    """The URL with its password masked, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database URL>"


def database_message(exc: BaseException, url: Any) -> str:
    """A failed statement in one line, naming the database (never its password)."""
    orig = getattr(exc, "orig", None) or exc
    first = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    if "no such table" in first or ("relation" in first and "does not exist" in first):
        first += " (not a job store yet? create it with `jobstore init`)"
    return f"database {safe_url(str(url))}: {first}"


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

    PostgreSQL: no server-side prepared statements and no startup parameters, so that the same
    code works behind PgBouncer in transaction pooling mode; statement timeouts are set per
    transaction with SET LOCAL. SQLite: every transaction is BEGIN IMMEDIATE, so that claims from
    several processes serialise instead of failing on lock upgrades; the file must exist unless
    `create` (`jobstore init`): nothing else creates a job store, not even by reading.
    """
    try:
        parsed = make_url(url)
    except Exception:
        raise DatabaseError(url_error(url)) from None
    backend = parsed.get_backend_name()
    kwargs: dict = (
        {"pool_size": 1, "max_overflow": max_overflow, "pool_timeout": 5}
        if pool
        else {"poolclass": NullPool}
    )
    kwargs["json_serializer"] = json_text
    kwargs["json_deserializer"] = json_value
    if backend == "sqlite":
        database = parsed.database or ""
        if database and database != ":memory:" and not create and not os.path.exists(database):
            raise DatabaseError(f"no job store at {database} (create it with `jobstore init`)")
        if database and database != ":memory:":
            _check_sqlite_owner(database)
            _make_parent(database)
        engine = create_engine(url, connect_args={"timeout": max(connect_timeout, 30)}, **kwargs)
        _sqlite_immediate(engine)
        return engine
    if backend == "postgresql":
        if parsed.get_driver_name() != "psycopg":
            parsed = parsed.set(drivername="postgresql+psycopg")
        connect_args = {"connect_timeout": connect_timeout, "prepare_threshold": None}
        return create_engine(parsed, connect_args=connect_args, **kwargs)
    raise DatabaseError(f"unsupported database backend {backend!r} (use postgresql or sqlite)")


def preload_drivers() -> None:
    """Import the database drivers now (a process that forks a child per command)."""
    from sqlalchemy.dialects import registry

    for name in ("postgresql.psycopg", "sqlite.pysqlite"):
        try:
            registry.load(name).import_dbapi()
        except ImportError:
            pass


def url_error(url: str) -> str:
    """Why `url` is not a database URL, with the URL a path would have been meant as."""
    text = url.strip()
    if text.startswith("/") or text.endswith((".db", ".sqlite", ".sqlite3")):
        path = os.path.abspath(text)
        return (f"{text!r} is a path, not a database URL: for SQLite say sqlite:///{path}")
    return "the database URL cannot be parsed (postgresql://USER@HOST/DB or sqlite:////PATH)"


def _check_sqlite_owner(database: str) -> None:
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


def _sqlite_immediate(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record):  # type: ignore[no-untyped-def]
        dbapi_conn.isolation_level = None  # let SQLAlchemy's "begin" below issue BEGIN
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys = ON")
        cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn):  # type: ignore[no-untyped-def]
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def server_warnings(url: str) -> list[str]:
    """What in the server's settings works against a job store (PostgreSQL: autovacuum off)."""
    if is_sqlite(url):
        return []
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            autovacuum = conn.execute(AUTOVACUUM_SETTING).scalar_one()
    except DBAPIError:
        return []
    finally:
        engine.dispose()
    if autovacuum != "on":
        return ["autovacuum is off on this server: the job store's tables keep every dead row"
                " (jobstore prune removes history, only VACUUM reuses its space); turn it on"]
    return []


def alembic_config(url: str):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["database_url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Create or upgrade the schema (what `jobstore init` does)."""
    from alembic import command

    if is_sqlite(url):
        database = make_url(url).database or ""
        if database and database != ":memory:":
            _make_parent(database)
            existed = os.path.exists(database)
    try:
        command.upgrade(alembic_config(url), revision)
    except DBAPIError as exc:  # e.g. the server is unreachable: one line, no traceback
        orig = exc.orig or exc
        first = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
        raise DatabaseError(f"database {safe_url(url)}: {first}") from None
    if is_sqlite(url) and database and database != ":memory:" and not existed:
        os.chmod(database, 0o660)
