"""A DAG's home: the door's `jobstore_new_dag` takes the access point a DAG is submitted on and
gives it to the DAG's cluster (checked as `jobstore_new_cluster` checks any home), and
`jobstore_dag_nodes` gives it to each node's cluster, so that the nodes' outputs and job event
logs go home as a plain submit's do. Both are 0019's functions with those lines changed
(CHANGES). The submitters' roles get the new signature. SQLite has no door: nothing to change
there.

Revision ID: 0024
Revises: 0023
"""

from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

OLD = "jobstore_new_dag(text, text, text, text, integer, integer, json, double precision)"
NEW = "jobstore_new_dag(text, text, text, text, integer, integer, json, double precision, text)"
USER_ROLES = "SELECT q.role FROM queue_roles q JOIN pg_roles r ON r.rolname = q.role"
# 0019's text -> this migration's, by function
CHANGES = {
    "jobstore_new_dag(": [
        ("p_attrs json, p_now double precision)",
         "p_attrs json, p_now double precision,\n    p_home text DEFAULT NULL)"),
        ("0, NULL,\n                                                          p_now);",
         "0, NULL,\n                                                          p_now, p_home);"),
    ],
    "jobstore_dag_nodes(": [
        ("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"),
        ("INSERT INTO clusters (owner, queue, submit_file, num_procs, submitted_at)\n"
         "        SELECT d.owner, c.queue, NULL, s.procs, v_now FROM sent s, clusters c",
         "INSERT INTO clusters (owner, queue, submit_file, num_procs, submitted_at, home)\n"
         "        SELECT d.owner, c.queue, NULL, s.procs, v_now, c.home FROM sent s, clusters c"),
    ],
}


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    for name, changes in CHANGES.items():
        text = _function(name)
        for old, new in changes:
            assert old in text, (name, old)
            text = text.replace(old, new, 1)
        _run_sql(text)
    op.execute(f"DROP FUNCTION {OLD}")
    _grant(bind, NEW)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    for name in CHANGES:
        _run_sql(_function(name).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    op.execute(f"DROP FUNCTION {NEW}")
    _grant(bind, OLD)


def _function(name: str) -> str:
    """0019's CREATE FUNCTION of `name`."""
    door = Path(__file__).with_name("0019_one_door.sql").read_text(encoding="utf-8")
    start = door.index(f"CREATE FUNCTION {name}")
    return door[start:door.index("END $$;", start) + len("END $$;")]


def _run_sql(source: str) -> None:
    bind = op.get_bind()
    schema = bind.execute(sa.text("SELECT quote_ident(current_schema())")).scalar_one()
    dbapi = bind.connection.dbapi_connection
    assert dbapi is not None
    cursor = dbapi.cursor()
    cursor.execute(source.replace("@schema@", schema))
    cursor.close()


def _grant(bind: sa.Connection, function: str) -> None:
    """Only the submitters' roles call `function`."""
    op.execute(f"REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC")
    quote = bind.dialect.identifier_preparer.quote
    for role in bind.execute(sa.text(USER_ROLES)).scalars():
        op.execute(f"GRANT EXECUTE ON FUNCTION {function} TO {quote(role)}")
