"""DAGs: DAGMan's work done by the job store itself. A DAG is a cluster id of its own
(its DAGManJobId) with a `dags` row; each node a row of `dag_nodes` whose jobs are a cluster,
queued in status `waiting` (phase `waiting`: never claimable) until its parents are done;
`dag_edges` are its dependencies, `dag_categories` its MAXJOBS throttles. The transaction that
ends a node's last job releases its children, fails its descendants, or ends the DAG.

Every row names its owner, and the row-level security policies show each owner only hers (a
queue super user: all); the roles that hold the agent's grants read and advance every DAG. A
submitter's job row may now also be `waiting` (0012's policies on jobs, widened).

Revision ID: 0017
Revises: 0016
"""

import hashlib

import sqlalchemy as sa
from alembic import op

from jobstore.db.migrations.shared import AGENT_ROLES, USER_ROLES

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

TABLES = ("dags", "dag_nodes", "dag_edges", "dag_categories")
OWN = "owner = (SELECT jobstore_account())"
ACTS = f"{OWN} OR (SELECT jobstore_super_user())"
SUBMITS = f"{OWN} OR jobstore_may_submit_as(owner)"
SUBMIT_JOBS = f"""({SUBMITS}) AND status IN ({{statuses}}) AND claims = 0 AND token IS NULL
 AND slot IS NULL AND host IS NULL AND keyword IS NULL AND lease_expires_at IS NULL
 AND winding_down_until IS NULL"""
ACT_JOBS = (f"({ACTS}) AND status IN ({{statuses}}) AND token IS NULL"
            " AND lease_expires_at IS NULL")


def upgrade() -> None:
    big = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "dags",
        sa.Column("id", big, nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("batch_name", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("dag_status", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("exit_code", sa.Integer),
        sa.Column("max_jobs", sa.Integer),
        sa.Column("max_idle", sa.Integer),
        sa.Column("attrs", sa.Text),
        sa.Column("created_at", sa.Float(precision=53), nullable=False),
        sa.Column("finished_at", sa.Float(precision=53)),
        sa.ForeignKeyConstraint(["id"], ["clusters.id"], name="fk_dags_id_clusters"),
        sa.PrimaryKeyConstraint("id", name="pk_dags"),
    )
    op.create_table(
        "dag_nodes",
        sa.Column("dag_id", big, nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("cluster_id", big),
        sa.Column("status", sa.String(8), nullable=False),
        sa.Column("pending", sa.Integer, nullable=False),
        sa.Column("priority", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("category", sa.String(255)),
        sa.Column("abort_exit", sa.Integer),
        sa.Column("abort_return", sa.Integer),
        sa.Column("final", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("exit_code", sa.Integer),
        sa.Column("updated_at", sa.Float(precision=53), nullable=False),
        sa.PrimaryKeyConstraint("dag_id", "name", name="pk_dag_nodes"),
    )
    op.create_index("ix_dag_nodes_cluster_id", "dag_nodes", ["cluster_id"])
    op.create_index("ix_dag_nodes_status", "dag_nodes", ["dag_id", "status"])
    op.create_table(
        "dag_edges",
        sa.Column("dag_id", big, nullable=False),
        sa.Column("parent", sa.String(255), nullable=False),
        sa.Column("child", sa.String(255), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("dag_id", "parent", "child", name="pk_dag_edges"),
    )
    op.create_table(
        "dag_categories",
        sa.Column("dag_id", big, nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("maxjobs", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("dag_id", "name", name="pk_dag_categories"),
    )
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    _job_policies("'waiting', 'idle', 'held'", "'waiting', 'idle', 'held', 'removed'")
    for table in TABLES:
        op.execute(f"CREATE POLICY jobstore_read ON {table} FOR SELECT USING ({ACTS})")
        op.execute(f"CREATE POLICY jobstore_submit ON {table} FOR INSERT WITH CHECK ({SUBMITS})")
        op.execute(f"CREATE POLICY jobstore_act ON {table} FOR UPDATE USING ({ACTS})")
        op.execute(f"CREATE POLICY jobstore_prune ON {table} FOR DELETE USING (true)")
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    quote = bind.dialect.identifier_preparer.quote
    for role in bind.execute(sa.text(AGENT_ROLES)).scalars():
        name = "jobstore_agent_" + hashlib.sha1(role.encode()).hexdigest()[:16]
        op.execute(f"GRANT SELECT, UPDATE, DELETE ON {', '.join(TABLES)} TO {quote(role)}")
        for table in TABLES:
            op.execute(f"CREATE POLICY {name} ON {table} TO {quote(role)} USING (true)"
                       " WITH CHECK (true)")
    for role in bind.execute(sa.text(USER_ROLES)).scalars():
        op.execute(f"GRANT SELECT, INSERT, UPDATE ON {', '.join(TABLES)} TO {quote(role)}")


def _job_policies(fresh: str, at_rest: str) -> None:
    """A submitter's job rows: new ones in statuses `fresh`, hers after an action in `at_rest`."""
    op.execute("ALTER POLICY jobstore_submit ON jobs WITH CHECK ("
               + SUBMIT_JOBS.format(statuses=fresh) + ")")
    op.execute("ALTER POLICY jobstore_act ON jobs WITH CHECK ("
               + ACT_JOBS.format(statuses=at_rest) + ")")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _job_policies("'idle', 'held'", "'idle', 'held', 'removed'")
    op.drop_index("ix_dag_nodes_status", table_name="dag_nodes")
    op.drop_index("ix_dag_nodes_cluster_id", table_name="dag_nodes")
    for table in reversed(TABLES):
        op.drop_table(table)
