"""The slots of the pool, as their nodes' agents publish them (`jobstore status`, `q
-better-analyze`): one row per slot with its ad, upserted every UPDATE_INTERVAL, out of view
after its lifetime (CLASSAD_LIFETIME), as the collector expires an ad. The roles that hold the
agent's grants publish; the submitters' roles read.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# The roles that hold the agent's grants (UPDATE of jobs.status), and the submitters' roles.
AGENT_ROLES = """
SELECT DISTINCT grantee FROM information_schema.column_privileges
WHERE table_schema = current_schema() AND table_name = 'jobs' AND column_name = 'status'
  AND privilege_type = 'UPDATE' AND grantee <> 'PUBLIC'
  AND grantee <> (SELECT tableowner FROM pg_tables
                  WHERE schemaname = current_schema() AND tablename = 'jobs')
"""
USER_ROLES = "SELECT q.role FROM queue_roles q JOIN pg_roles r ON r.rolname = q.role"


def upgrade() -> None:
    op.create_table(
        "slots",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("machine", sa.String(255), nullable=False),
        sa.Column("ad", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Float(precision=53), nullable=False),
        sa.Column("expires_at", sa.Float(precision=53), nullable=False),
    )
    op.create_index("ix_slots_expires_at", "slots", ["expires_at"])
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    quote = bind.dialect.identifier_preparer.quote
    for role in bind.execute(sa.text(AGENT_ROLES)).scalars():
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON slots TO {quote(role)}")
    for role in bind.execute(sa.text(USER_ROLES)).scalars():
        op.execute(f"GRANT SELECT ON slots TO {quote(role)}")


def downgrade() -> None:
    op.drop_index("ix_slots_expires_at", table_name="slots")
    op.drop_table("slots")
