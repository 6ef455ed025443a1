"""Outputs home: a cluster names the access point whose `jobstore schedd` writes its jobs'
outputs into their Iwd (`clusters.home`, NULL for a spooled submit), and `deliveries` records
each job's outputs written there, under a lease, once.

On PostgreSQL the door's `jobstore_new_cluster` takes the home and checks it
(0022_outputs_home.sql); the submitters' roles get the new signature, and the agents' roles
(which a `jobstore schedd` connects as) read and write `deliveries`.

Revision ID: 0022
Revises: 0021
"""

from pathlib import Path

import sqlalchemy as sa
from alembic import op

from jobstore.db.migrations.shared import AGENT_ROLES, USER_ROLES

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

OLD = "jobstore_new_cluster(text, text, text, integer, text, double precision)"
NEW = "jobstore_new_cluster(text, text, text, integer, text, double precision, text)"


def upgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("home", sa.String(255)))
    op.create_table(
        "deliveries",
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  autoincrement=False, nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("home", sa.String(255), nullable=False),
        sa.Column("leased_until", sa.Float(precision=53), nullable=False),
        sa.Column("delivered_at", sa.Float(precision=53)),
        sa.Column("files", sa.Integer()),
        sa.Column("error", sa.Text()),
        sa.Column("failures", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_deliveries"),
    )
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    schema = bind.execute(sa.text("SELECT quote_ident(current_schema())")).scalar_one()
    _run_sql(Path(__file__).with_suffix(".sql").read_text(encoding="utf-8"), schema)
    op.execute(f"DROP FUNCTION {OLD}")
    op.execute(f"REVOKE EXECUTE ON FUNCTION {NEW} FROM PUBLIC")
    _grant(bind, NEW)


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        schema = bind.execute(sa.text("SELECT quote_ident(current_schema())")).scalar_one()
        door = Path(__file__).with_name("0019_one_door.sql").read_text(encoding="utf-8")
        start = door.index("CREATE FUNCTION jobstore_new_cluster(")
        _run_sql(door[start:door.index("END $$;", start) + len("END $$;")], schema)
        op.execute(f"DROP FUNCTION {NEW}")
        op.execute(f"REVOKE EXECUTE ON FUNCTION {OLD} FROM PUBLIC")
        _grant(bind, OLD, deliveries=False)
    op.drop_table("deliveries")
    with op.batch_alter_table("clusters") as batch:
        batch.drop_column("home")


def _run_sql(source: str, schema: str) -> None:
    dbapi = op.get_bind().connection.dbapi_connection
    assert dbapi is not None
    cursor = dbapi.cursor()
    cursor.execute(source.replace("@schema@", schema))
    cursor.close()


def _grant(bind: sa.Connection, function: str, *, deliveries: bool = True) -> None:
    """The submitters' roles call `function`; the agents' roles keep the deliveries (whose
    errors name the owners' paths: no submitter reads them)."""
    quote = bind.dialect.identifier_preparer.quote
    for role in bind.execute(sa.text(USER_ROLES)).scalars():
        op.execute(f"GRANT EXECUTE ON FUNCTION {function} TO {quote(role)}")
    if deliveries:
        for role in bind.execute(sa.text(AGENT_ROLES)).scalars():
            op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON deliveries TO {quote(role)}")
