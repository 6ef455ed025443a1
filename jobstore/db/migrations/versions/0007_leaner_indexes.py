"""Fewer index entries per status change of a job: one index of the unfinished jobs (queue,
status, owner) instead of two whole-table ones (status and queue; owner), and one index of the
handed-out jobs by submitter and autocluster instead of one by each.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

UNFINISHED = sa.text("status NOT IN ('completed', 'removed', 'failed')")
ACTIVE = sa.text("status IN ('fetched', 'accepted', 'running')")


def upgrade() -> None:
    op.create_index("ix_jobs_unfinished", "jobs", ["queue", "status", "owner"], unique=False,
                    postgresql_where=UNFINISHED, sqlite_where=UNFINISHED)
    op.drop_index("ix_jobs_status_queue", table_name="jobs")
    op.drop_index("ix_jobs_owner", table_name="jobs")
    op.create_index("ix_jobs_active", "jobs", ["submitter", "autocluster_id", "slot_weight"],
                    unique=False, postgresql_where=ACTIVE, sqlite_where=ACTIVE)
    op.drop_index("ix_jobs_active_submitter", table_name="jobs")
    op.drop_index("ix_jobs_active_autocluster", table_name="jobs")


def downgrade() -> None:
    op.create_index("ix_jobs_active_autocluster", "jobs", ["autocluster_id"], unique=False,
                    postgresql_where=ACTIVE, sqlite_where=ACTIVE)
    op.create_index("ix_jobs_active_submitter", "jobs", ["submitter", "slot_weight"],
                    unique=False, postgresql_where=ACTIVE, sqlite_where=ACTIVE)
    op.drop_index("ix_jobs_active", table_name="jobs")
    op.create_index("ix_jobs_owner", "jobs", ["owner"], unique=False)
    op.create_index("ix_jobs_status_queue", "jobs", ["status", "queue"], unique=False)
    op.drop_index("ix_jobs_unfinished", table_name="jobs")
