"""A lease renewal that changes no indexed column: `jobs.lease_renewed_until`.

A report that renews a job's lease without changing its status sets only this column, which no
index names, so that PostgreSQL updates the row in place (a HOT update: no new entry in any of
the job's indexes). `lease_expires_at`, which the reaper's index orders, catches up when the
status next changes, or when the reaper finds it run out while the renewal has not.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("lease_renewed_until", sa.Float(precision=53), nullable=True))
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    # whoever was granted UPDATE on lease_expires_at (the hook role: jobstore grant) may write
    # this one too; read from the column's own privileges, as 0008 does (grantee 0 is PUBLIC)
    roles = bind.execute(sa.text(
        "SELECT r.rolname FROM pg_attribute a CROSS JOIN LATERAL aclexplode(a.attacl) x"
        " LEFT JOIN pg_roles r ON r.oid = x.grantee"
        " WHERE a.attrelid = 'jobs'::regclass AND a.attname = 'lease_expires_at'"
        " AND x.privilege_type = 'UPDATE'")).scalars().all()
    for role in roles:
        to = "PUBLIC" if role is None else '"' + role.replace('"', '""') + '"'
        op.execute(f"GRANT UPDATE (lease_renewed_until) ON jobs TO {to}")


def downgrade() -> None:
    op.drop_column("jobs", "lease_renewed_until")
