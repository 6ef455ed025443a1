"""A job's own policy: hold codes, the number of holds, the periodic flag and its index, and the
periodic passes' schedule.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("hold_code", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("hold_subcode", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("num_holds", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("periodic", sa.Boolean(), nullable=True))
    op.execute("UPDATE jobs SET hold_code = 0, hold_subcode = 0 WHERE status = 'held'")
    op.create_index("ix_jobs_periodic", "jobs", ["id"], unique=False,
                    postgresql_where=sa.text("periodic"), sqlite_where=sa.text("periodic"))
    op.create_table(
        "passes",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("last_run_at", sa.Float(precision=53), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_passes")),
    )


def downgrade() -> None:
    op.drop_table("passes")
    op.drop_index("ix_jobs_periodic", table_name="jobs")
    for column in ("periodic", "num_holds", "hold_subcode", "hold_code"):
        op.drop_column("jobs", column)
