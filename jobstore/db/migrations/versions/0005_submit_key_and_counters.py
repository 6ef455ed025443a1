"""An idempotency key per cluster (a submit retried with the same key queues nothing twice), and
HTCondor's counters per job: NumJobStarts, JobStartDate (the first start), RemoteWallClockTime.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a unique index, not a constraint: SQLite would have to copy the table (and its rows'
    # foreign keys) to add one
    op.add_column("clusters", sa.Column("idempotency_key", sa.String(length=255), nullable=True))
    op.create_index("ix_clusters_idempotency_key", "clusters", ["idempotency_key"], unique=True)
    op.add_column("jobs", sa.Column("num_starts", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("first_started_at", sa.Float(precision=53), nullable=True))
    op.add_column("jobs", sa.Column("wall_clock", sa.Float(), nullable=True))
    # what the history says: the times each job went to running, the first of them
    op.execute(
        "UPDATE jobs SET num_starts = (SELECT count(*) FROM job_events e WHERE e.job_id = jobs.id"
        " AND e.to_status = 'running' AND e.from_status <> 'running'),"
        " first_started_at = (SELECT min(e.time) FROM job_events e WHERE e.job_id = jobs.id"
        " AND e.to_status = 'running')"
    )


def downgrade() -> None:
    for column in ("wall_clock", "first_started_at", "num_starts"):
        op.drop_column("jobs", column)
    op.drop_index("ix_clusters_idempotency_key", table_name="clusters")
    op.drop_column("clusters", "idempotency_key")
