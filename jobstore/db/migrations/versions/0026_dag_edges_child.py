"""A node's parents found by its name: `dag_edges` gets an index by (DAG, child), which the
access point reads before it starts a node's PRE script (its parents' outputs must be home).

Revision ID: 0026
Revises: 0025
"""

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_dag_edges_child", "dag_edges", ["dag_id", "child"])


def downgrade() -> None:
    op.drop_index("ix_dag_edges_child", table_name="dag_edges")
