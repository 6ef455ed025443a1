"""Events are found by their job through an index of the job id alone.

A job's events are few and read together (its history, its log, the pruner's delete), sorted
by id after they are found; the id as the index's second column made each event's entry 8 B
larger in the WAL and kept PostgreSQL from deduplicating a job's entries.

Revision ID: 0021
Revises: 0020
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def _index(*columns: str) -> None:
    op.drop_index("ix_job_events_job_id", table_name="job_events")
    op.create_index("ix_job_events_job_id", "job_events", list(columns), unique=False)


def upgrade() -> None:
    _index("job_id")


def downgrade() -> None:
    _index("job_id", "id")
