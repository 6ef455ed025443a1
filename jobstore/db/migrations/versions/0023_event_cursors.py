"""Event logs on the access point: `event_cursors` keeps where a follower of job_events stands
(the access point's `jobstore schedd` writing its jobs' event logs), so that a restarted one
goes on where it stopped; `logged_events`, the last event of each job it appended to the job's
log; `dagman_logs`, what it wrote of each DAG's own log. The agents' roles
(which a `jobstore schedd` connects as) read and write them; no submitter does.

Revision ID: 0023
Revises: 0022
"""

import sqlalchemy as sa
from alembic import op

from jobstore.db.migrations.shared import AGENT_ROLES

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None



def upgrade() -> None:
    op.create_table(
        "event_cursors",
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("high", sa.BigInteger(), nullable=False),
        sa.Column("gaps", sa.Text()),
        sa.Column("updated_at", sa.Float(precision=53), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_event_cursors"),
    )
    op.create_table(
        "logged_events",
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  autoincrement=False, nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_logged_events"),
    )
    op.create_table(
        "dagman_logs",
        sa.Column("dag_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  autoincrement=False, nullable=False),
        sa.Column("written", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.Float(precision=53), nullable=False),
        sa.PrimaryKeyConstraint("dag_id", name="pk_dagman_logs"),
    )
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    quote = bind.dialect.identifier_preparer.quote
    for role in bind.execute(sa.text(AGENT_ROLES)).scalars():
        op.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON event_cursors, logged_events, "
                   f"dagman_logs TO {quote(role)}")


def downgrade() -> None:
    op.drop_table("dagman_logs")
    op.drop_table("logged_events")
    op.drop_table("event_cursors")
