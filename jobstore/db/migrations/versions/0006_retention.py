"""Retention: an index of finished jobs by the time they finished (jobstore prune), and per-table
autovacuum and fillfactor settings on PostgreSQL.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

from jobstore.db.schema import STORAGE_PARAMETERS

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

FINISHED = sa.text("status IN ('completed', 'removed', 'failed')")


def upgrade() -> None:
    op.create_index("ix_jobs_finished", "jobs", ["finished_at"], unique=False,
                    postgresql_where=FINISHED, sqlite_where=FINISHED)
    if op.get_bind().dialect.name == "postgresql":
        for table, params in STORAGE_PARAMETERS.items():
            settings = ", ".join(f"{name} = {value}" for name, value in params.items())
            op.execute(f"ALTER TABLE {table} SET ({settings})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table, params in STORAGE_PARAMETERS.items():
            op.execute(f"ALTER TABLE {table} RESET ({', '.join(params)})")
    op.drop_index("ix_jobs_finished", table_name="jobs")
