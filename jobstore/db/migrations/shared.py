"""What the migrations share on PostgreSQL: the roles already granted (the submitters', the
agents'), and SQL run as written (functions whose bodies hold `%` and `;`), with the store's
schema in place of `@schema@`."""

from __future__ import annotations

from alembic import op
from sqlalchemy import Connection, text

# The submitters' roles (jobstore grant-user)
USER_ROLES = "SELECT q.role FROM queue_roles q JOIN pg_roles r ON r.rolname = q.role"
# The agents' roles (jobstore grant): those that may change a job's slot, but its owner
AGENT_ROLES = """
SELECT DISTINCT grantee FROM information_schema.column_privileges
WHERE table_schema = current_schema() AND table_name = 'jobs' AND column_name = 'slot'
  AND privilege_type = 'UPDATE' AND grantee <> 'PUBLIC'
  AND grantee <> (SELECT tableowner FROM pg_tables
                  WHERE schemaname = current_schema() AND tablename = 'jobs')
"""


def run_sql(bind: Connection, source: str) -> None:
    """Run `source` through the driver's own cursor, `@schema@` replaced by the schema."""
    schema = bind.execute(text("SELECT quote_ident(current_schema())")).scalar_one()
    dbapi = bind.connection.dbapi_connection
    assert dbapi is not None
    cursor = dbapi.cursor()
    cursor.execute(source.replace("@schema@", schema))
    cursor.close()


def grant(bind: Connection, roles: str, statement: str) -> None:
    """Run `statement` ("GRANT ... TO {role}") for each role that `roles` selects."""
    quote = bind.dialect.identifier_preparer.quote
    for role in bind.execute(text(roles)).scalars():
        op.execute(statement.format(role=quote(role)))


__all__ = ["AGENT_ROLES", "USER_ROLES", "grant", "run_sql"]
