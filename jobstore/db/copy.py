"""COPY ... FROM STDIN on PostgreSQL: rows of a table written in one stream, inside the caller's
transaction (a bulk submit)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import JSON, Connection, Table

from jobstore.db.engine import json_text
from jobstore.db.sql import QUERIES


def copy_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """COPY `rows` (column -> value, all with the same columns) into `table`."""
    if not rows:
        return
    from psycopg import sql
    from psycopg.types.json import Json

    names = list(rows[0])
    json_columns = {c.name for c in table.columns if isinstance(c.type, JSON)}
    statement = sql.SQL(QUERIES["copy_rows"].sql).format(
        table=sql.Identifier(table.name),
        columns=sql.SQL(", ").join(map(sql.Identifier, names)))
    dbapi: Any = conn.connection.dbapi_connection  # psycopg's, in the open transaction
    with dbapi.cursor() as cursor, cursor.copy(statement) as copy:
        for row in rows:
            copy.write_row([Json(row[n], dumps=json_text)
                            if n in json_columns and row[n] is not None else row[n]
                            for n in names])
