"""Migrated PostgreSQL databases for the tests, used again: a test gets one that holds what a
fresh copy of the template holds, and gives it back emptied. One the test changed beyond its
rows (grants, policies, owners, functions, columns, settings: a role's objects would keep that
role from being dropped) is dropped instead, as every database was before.

Creating a database from the template writes the whole template into the WAL; emptying one
writes a few pages. Only what the catalog and the rows hold is compared and reset (not the
planner's statistics: a test about plans runs ANALYZE); a test that needs an empty database of
its own is marked `empty_database`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from jobstore.testing.support import libpq_url

# What a test may change besides rows, as names and definitions (no oids): a copy of the
# template has the same.
FINGERPRINT = """
SELECT md5(string_agg(x, E'\\n' ORDER BY x)) FROM (
    SELECT 'rel ' || c.oid::regclass::text || ' ' || c.relkind::text
        || ' ' || c.relowner::regrole::text || ' ' || coalesce(c.relacl::text, '')
        || ' ' || c.relrowsecurity::text || ' ' || c.relforcerowsecurity::text
        || ' ' || coalesce(c.reloptions::text, '')
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
        AND n.nspname NOT LIKE 'pg\\_%'
    UNION ALL
    SELECT 'col ' || a.attrelid::regclass::text || ' ' || a.attname || ' '
        || a.atttypid::regtype::text || ' ' || a.attnotnull::text
        || ' ' || coalesce(a.attacl::text, '')
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND a.attnum > 0 AND NOT a.attisdropped
    UNION ALL
    SELECT 'con ' || conrelid::regclass::text || ' ' || conname || ' ' || convalidated::text
        || ' ' || pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace = 'public'::regnamespace
    UNION ALL
    SELECT 'idx ' || pg_get_indexdef(i.indexrelid) FROM pg_index i
        JOIN pg_class c ON c.oid = i.indexrelid
    WHERE c.relnamespace = 'public'::regnamespace
    UNION ALL
    SELECT 'def ' || adrelid::regclass::text || ' ' || adnum::text || ' '
        || pg_get_expr(adbin, adrelid)
    FROM pg_attrdef
    UNION ALL
    SELECT 'seq ' || seqrelid::regclass::text || ' ' || seqincrement::text || ' '
        || seqmin::text || ' ' || seqmax::text || ' ' || seqcycle::text
    FROM pg_sequence
    UNION ALL
    SELECT 'rule ' || ev_class::regclass::text || ' ' || rulename FROM pg_rewrite
    WHERE ev_class IN (SELECT oid FROM pg_class WHERE relnamespace = 'public'::regnamespace)
    UNION ALL
    SELECT 'evt ' || evtname FROM pg_event_trigger
    UNION ALL
    SELECT 'pol ' || polrelid::regclass::text || ' ' || polname || ' ' || polcmd::text || ' '
        || polroles::text || ' ' || coalesce(pg_get_expr(polqual, polrelid), '')
        || ' ' || coalesce(pg_get_expr(polwithcheck, polrelid), '')
    FROM pg_policy
    UNION ALL
    SELECT 'trg ' || tgrelid::regclass::text || ' ' || tgname || ' ' || tgenabled::text
    FROM pg_trigger WHERE NOT tgisinternal
    UNION ALL
    SELECT 'fn ' || p.oid::regprocedure::text || ' ' || p.proowner::regrole::text || ' '
        || coalesce(p.proacl::text, '') || ' ' || md5(coalesce(p.prosrc, ''))
        || ' ' || p.prosecdef::text || ' ' || coalesce(p.proconfig::text, '')
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
    UNION ALL
    SELECT 'ns ' || nspname || ' ' || nspowner::regrole::text || ' ' || coalesce(nspacl::text, '')
    FROM pg_namespace
    WHERE nspname NOT LIKE 'pg\\_temp\\_%' AND nspname NOT LIKE 'pg\\_toast\\_temp\\_%'
    UNION ALL
    SELECT 'type ' || t.oid::regtype::text FROM pg_type t
    WHERE t.typnamespace = 'public'::regnamespace
    UNION ALL
    SELECT 'acl ' || defaclrole::regrole::text || ' ' || defaclacl::text FROM pg_default_acl
    UNION ALL
    SELECT 'ext ' || extname || ' ' || extversion FROM pg_extension
    UNION ALL
    SELECT 'set ' || setrole::text || ' ' || array_to_string(setconfig, ',') FROM pg_db_role_setting
    WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
    UNION ALL
    SELECT 'db ' || datdba::regrole::text || ' ' || coalesce(datacl::text, '') FROM pg_database
    WHERE datname = current_database()
) AS found(x)
"""
TABLES = """
SELECT c.relname FROM pg_class c
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
ORDER BY 1
"""
SEQUENCES = """
SELECT quote_ident(schemaname) || '.' || quote_ident(sequencename), last_value
FROM pg_sequences ORDER BY 1
"""
WRITABLE_COLUMNS = """
SELECT column_name FROM information_schema.columns
WHERE table_schema = 'public' AND table_name = %s AND is_generated = 'NEVER'
ORDER BY ordinal_position
"""
KEPT = frozenset({"alembic_version"})  # the schema's own: never a test's to change


class DatabasePool:
    """This test process's databases copied from `template`, the free ones kept."""

    def __init__(self, admin_url: str, template: str) -> None:
        self.admin_url = admin_url
        self.admin = libpq_url(admin_url)
        self.template = template
        self.free: list[str] = []
        self._kept: psycopg.Connection | None = None
        with self._connect(template) as conn:
            self.fingerprint = _fingerprint(conn)
            tables = [r[0] for r in conn.execute(TABLES)]
            self.emptied = [t for t in tables if t not in KEPT]
            self.seeds: dict[str, tuple[list[str], str]] = {}
            for table in self.emptied:  # the rows the migrations wrote, as JSON
                found = conn.execute(sql.SQL("SELECT json_agg(t)::text FROM {} AS t").format(
                    sql.Identifier(table))).fetchone()
                if found is not None and found[0] is not None:
                    columns = [r[0] for r in conn.execute(WRITABLE_COLUMNS, (table,))]
                    self.seeds[table] = (columns, found[0])
            self.sequences = list(conn.execute(SEQUENCES))

    def url(self, name: str) -> str:
        return make_url(self.admin_url).set(database=name).render_as_string(hide_password=False)

    def take(self) -> str:
        """A database as a fresh copy of the template is."""
        if self.free:
            return self.free.pop()
        name = f"jobstore_test_{uuid.uuid4().hex}"
        self._admin().execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(self.template)))
        return name

    def give_back(self, name: str) -> None:
        """Empty `name` for the next test, under a new name (what the test left running cannot
        reach it), or drop it if the test changed more than rows or still holds a session."""
        renamed = f"jobstore_test_{uuid.uuid4().hex}"
        try:
            self._end_sessions(name)
            self._admin().execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                sql.Identifier(name), sql.Identifier(renamed)))  # fails while one connects
            name = renamed
            with self._connect(name) as conn:
                if _fingerprint(conn) != self.fingerprint:
                    raise LookupError("changed beyond its rows")
                with conn.transaction():
                    self._reset(conn)
        except (psycopg.Error, LookupError):
            self.drop(name)
            return
        self.free.append(name)

    def close(self) -> None:
        try:
            while self.free:
                self.drop(self.free.pop())
        finally:
            if self._kept is not None:
                self._kept.close()
                self._kept = None

    def drop(self, name: str) -> None:
        self._admin().execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))

    def _admin(self) -> psycopg.Connection:
        """The pool's own session on the server's admin database (one, kept: a session costs
        the server a process)."""
        if self._kept is None or self._kept.closed or self._kept.broken:
            self._kept = psycopg.connect(self.admin, connect_timeout=5, autocommit=True)
        return self._kept

    def _reset(self, conn: psycopg.Connection) -> None:
        conn.execute("SET LOCAL lock_timeout = '2s'")
        # a few rows each: DELETE writes less than TRUNCATE's new files; no foreign key or
        # trigger fires (replica), so any order does
        conn.execute("SET LOCAL session_replication_role = replica")
        for table in self.emptied:
            conn.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier(table)))
        for table, (columns, rows) in self.seeds.items():
            names = sql.SQL(", ").join(map(sql.Identifier, columns))
            conn.execute(sql.SQL(
                "INSERT INTO {table} ({names}) OVERRIDING SYSTEM VALUE SELECT {names} "
                "FROM json_populate_recordset(NULL::{table}, %s)").format(
                    table=sql.Identifier(table), names=names), (rows,))
        for sequence, last in self.sequences:
            if last is None:
                conn.execute(sql.SQL("ALTER SEQUENCE {} RESTART").format(sql.SQL(sequence)))
            else:
                conn.execute("SELECT setval(%s, %s)", (sequence, last))

    def _end_sessions(self, name: str) -> None:
        self._admin().execute("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                              "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))

    @contextmanager
    def _connect(self, name: str) -> Iterator[psycopg.Connection]:
        url = make_url(self.admin_url).set(database=name).render_as_string(hide_password=False)
        with psycopg.connect(libpq_url(url), connect_timeout=5, autocommit=True) as conn:
            yield conn


def _fingerprint(conn: psycopg.Connection) -> str:
    found = conn.execute(FINGERPRINT).fetchone()
    assert found is not None
    return str(found[0])
