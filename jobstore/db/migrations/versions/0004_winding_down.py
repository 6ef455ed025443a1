"""Attempts stopped by the store that may still run on their slot (winding down), and releases
waiting for them.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("winding_down_until", sa.Float(precision=53), nullable=True))
    op.add_column("jobs", sa.Column("release_pending", sa.Boolean(), nullable=True))
    where = sa.text("winding_down_until IS NOT NULL")
    op.create_index("ix_jobs_winding_down", "jobs", ["host"], unique=False,
                    postgresql_where=where, sqlite_where=where)


def downgrade() -> None:
    op.drop_index("ix_jobs_winding_down", table_name="jobs")
    op.drop_column("jobs", "release_pending")
    op.drop_column("jobs", "winding_down_until")
