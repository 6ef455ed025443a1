"""An idempotency key per cluster: a submit retried with the same key queues nothing twice.

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


def downgrade() -> None:
    op.drop_index("ix_clusters_idempotency_key", table_name="clusters")
    op.drop_column("clusters", "idempotency_key")
