"""condor_q's order over the unfinished jobs only: (cluster, proc) of the jobs not done.

The jobs table keeps the history too (a busy pool's month: a million finished jobs), so
`jobstore q -limit 10` and `Schedd.query(limit=10)`, which list the unfinished jobs in (cluster,
proc) order, walked the unique (cluster_id, proc_id) index over every finished job first. This
partial index is the schedd's queue: the unfinished jobs in condor_q's order. Its key never
changes and its predicate names the phase, which the claim's index names already: accept and
start stay HOT updates.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

NAME = "ix_jobs_queue_order"
UNFINISHED = "phase <> 'done'"


def upgrade() -> None:
    op.create_index(NAME, "jobs", ["cluster_id", "proc_id"],
                    postgresql_where=sa.text(UNFINISHED), sqlite_where=sa.text(UNFINISHED))


def downgrade() -> None:
    op.drop_index(NAME, table_name="jobs")
