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
    with op.batch_alter_table("clusters") as batch:
        batch.add_column(sa.Column("idempotency_key", sa.String(length=255), nullable=True))
        batch.create_unique_constraint("uq_clusters_idempotency_key", ["idempotency_key"])


def downgrade() -> None:
    with op.batch_alter_table("clusters") as batch:
        batch.drop_constraint("uq_clusters_idempotency_key", type_="unique")
        batch.drop_column("idempotency_key")
