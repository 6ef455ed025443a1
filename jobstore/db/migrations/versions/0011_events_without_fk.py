"""The events without a foreign key to their job.

Every event is written while its transaction holds the job's row: the claim and a transition
write the row in the statement that appends the event, and a report about an attempt that is
over reads the row under a lock first. The retention pruner, the only one to delete jobs,
takes them with SKIP LOCKED and deletes their events with them. The foreign key added nothing
but its check, which locks the job row again for every event (FOR KEY SHARE: a record of its
own in the WAL of PostgreSQL, about a twentieth of a job's life).

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

FK = "fk_job_events_job_id_jobs"


def upgrade() -> None:
    with op.batch_alter_table("job_events") as batch:  # SQLite: the table is made again
        batch.drop_constraint(FK, type_="foreignkey")


def downgrade() -> None:
    with op.batch_alter_table("job_events") as batch:
        batch.create_foreign_key(FK, "jobs", ["job_id"], ["id"], ondelete="CASCADE")
