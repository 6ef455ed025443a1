"""COPY ... FROM STDIN on PostgreSQL: rows of a table written in one stream, inside the caller's
transaction (a bulk submit)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import JSON, Connection, Table

from jobstore.db.backends.postgresql.queries import QUERIES
from jobstore.db.jsontext import json_text


def copy_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]], *,
              staged: bool = False) -> None:
    """COPY `rows` (column -> value, all with the same columns) into `table`. `staged`: the
    session is subject to row-level security (a submitter's own role), which COPY does not
    check: the rows go through a temporary table and an INSERT that the policies check."""
    if not rows:
        return
    from psycopg import sql
    from psycopg.types.json import Json

    names = list(rows[0])
    json_columns = {c.name for c in table.columns if isinstance(c.type, JSON)}
    parts = {"table": sql.Identifier(table.name),
             "staging": sql.Identifier(f"jobstore_staged_{table.name}"),
             "columns": sql.SQL(", ").join(map(sql.Identifier, names))}
    dbapi: Any = conn.connection.dbapi_connection  # psycopg's, in the open transaction
    with dbapi.cursor() as cursor:
        if staged:
            cursor.execute(sql.SQL(QUERIES["copy_staging_table"].sql).format(**parts))
        target = {**parts, "table": parts["staging"]} if staged else parts
        with cursor.copy(sql.SQL(QUERIES["copy_rows"].sql).format(**target)) as copy:
            for row in rows:
                copy.write_row([Json(row[n], dumps=json_text)
                                if n in json_columns and row[n] is not None else row[n]
                                for n in names])
        if staged:
            cursor.execute(sql.SQL(QUERIES["copy_from_staging"].sql).format(**parts))
            cursor.execute(sql.SQL(QUERIES["copy_staging_clear"].sql).format(**parts))
