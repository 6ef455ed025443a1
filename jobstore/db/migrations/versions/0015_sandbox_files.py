"""A job's files: its inputs, stored at submit, and the outputs it brings back.

Files are content-addressed per owner (`sandbox_files`, their bytes `sandbox_chunks` in
order), so that the jobs of one owner that share an input store it once; `job_files` says
which files a job takes into its sandbox (`in`: the cluster's, or one proc's) and which it sent
back (`out`). The owner is part of every key, and the row-level security policies show each
owner only her own rows (or every row to a queue super user): a hash seen in another's job ad
names nothing a submitter can read. A submitter inserts only as an owner she may submit as; the
roles that hold the agent's grants read and store every owner's files.

Revision ID: 0015
Revises: 0014
"""

import hashlib

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

TABLES = ("sandbox_files", "sandbox_chunks", "job_files")
OWN = "owner = (SELECT jobstore_account())"
ACTS = f"{OWN} OR (SELECT jobstore_super_user())"
SUBMITS = f"{OWN} OR jobstore_may_submit_as(owner)"
AGENT_ROLES = """
SELECT DISTINCT grantee FROM information_schema.column_privileges
WHERE table_schema = current_schema() AND table_name = 'jobs' AND column_name = 'status'
  AND privilege_type = 'UPDATE' AND grantee <> 'PUBLIC'
  AND grantee <> (SELECT tableowner FROM pg_tables
                  WHERE schemaname = current_schema() AND tablename = 'jobs')
"""
USER_ROLES = "SELECT q.role FROM queue_roles q JOIN pg_roles r ON r.rolname = q.role"


def upgrade() -> None:
    op.create_table(
        "sandbox_files",
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Float(precision=53), nullable=False),
        sa.PrimaryKeyConstraint("owner", "sha256", name="pk_sandbox_files"),
    )
    op.create_table(
        "sandbox_chunks",
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False, autoincrement=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
        sa.PrimaryKeyConstraint("owner", "sha256", "seq", name="pk_sandbox_chunks"),
    )
    op.create_table(
        "job_files",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False,
                  autoincrement=True),
        sa.Column("cluster_id", sa.BigInteger, nullable=False),
        sa.Column("proc_id", sa.Integer),
        sa.Column("direction", sa.String(4), nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("mode", sa.Integer, nullable=False),
        sa.Column("attempt", sa.Integer),
        sa.Column("created_at", sa.Float(precision=53), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_job_files"),
    )
    op.create_index("ix_job_files_cluster_id", "job_files", ["cluster_id", "proc_id"])
    op.create_index("ix_job_files_owner", "job_files", ["owner", "sha256"])
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    for table in TABLES:
        op.execute(f"CREATE POLICY jobstore_read ON {table} FOR SELECT USING ({ACTS})")
        op.execute(f"CREATE POLICY jobstore_submit ON {table} FOR INSERT WITH CHECK ({SUBMITS})")
        op.execute(f"CREATE POLICY jobstore_prune ON {table} FOR DELETE USING (true)")
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    quote = bind.dialect.identifier_preparer.quote
    sequence = bind.execute(sa.text("SELECT pg_get_serial_sequence('job_files', 'id')")).scalar()
    for role in bind.execute(sa.text(AGENT_ROLES)).scalars():
        name = "jobstore_agent_" + hashlib.sha1(role.encode()).hexdigest()[:16]
        op.execute(f"GRANT SELECT, INSERT, DELETE ON {', '.join(TABLES)} TO {quote(role)}")
        op.execute(f"GRANT USAGE ON SEQUENCE {sequence} TO {quote(role)}")
        for table in TABLES:
            op.execute(f"CREATE POLICY {name} ON {table} TO {quote(role)} USING (true)"
                       " WITH CHECK (true)")
    for role in bind.execute(sa.text(USER_ROLES)).scalars():
        op.execute(f"GRANT SELECT, INSERT ON {', '.join(TABLES)} TO {quote(role)}")
        op.execute(f"GRANT USAGE ON SEQUENCE {sequence} TO {quote(role)}")


def downgrade() -> None:
    op.drop_index("ix_job_files_owner", table_name="job_files")
    op.drop_index("ix_job_files_cluster_id", table_name="job_files")
    for table in reversed(TABLES):
        op.drop_table(table)
