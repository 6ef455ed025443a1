"""Initial schema: clusters, jobs, job_events.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "clusters",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("queue", sa.String(length=64), nullable=False),
        sa.Column("submit_file", sa.Text(), nullable=True),
        sa.Column("num_procs", sa.Integer(), nullable=False),
        sa.Column("submitted_at", sa.Float(precision=53), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_clusters")),
    )
    op.create_table(
        "jobs",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column(
            "cluster_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("proc_id", sa.Integer(), nullable=False),
        sa.Column("queue", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("priority", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("ad", sa.JSON(), nullable=False),
        sa.Column("cmd", sa.Text(), nullable=False),
        sa.Column("request_cpus", sa.Integer(), nullable=False),
        sa.Column("request_memory", sa.Integer(), nullable=False),
        sa.Column("request_disk", sa.BigInteger(), nullable=False),
        sa.Column("requirements", sa.Text(), nullable=True),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("success_exit_code", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("retry_until", sa.Text(), nullable=True),
        sa.Column("max_retries", sa.Integer(), nullable=True),
        sa.Column("user_log", sa.Text(), nullable=True),
        sa.Column("claims", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("token", sa.String(length=64), nullable=True),
        sa.Column("lease_expires_at", sa.Float(precision=53), nullable=True),
        sa.Column("keyword", sa.String(length=64), nullable=True),
        sa.Column("slot", sa.String(length=255), nullable=True),
        sa.Column("host", sa.String(length=255), nullable=True),
        sa.Column("job_pid", sa.Integer(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("exit_signal", sa.Integer(), nullable=True),
        sa.Column("exit_by_signal", sa.Boolean(), nullable=True),
        sa.Column("remote_user_cpu", sa.Float(), nullable=True),
        sa.Column("remote_sys_cpu", sa.Float(), nullable=True),
        sa.Column("image_size", sa.BigInteger(), nullable=True),
        sa.Column("memory_usage", sa.BigInteger(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("submitted_at", sa.Float(precision=53), nullable=False),
        sa.Column("fetched_at", sa.Float(precision=53), nullable=True),
        sa.Column("started_at", sa.Float(precision=53), nullable=True),
        sa.Column("finished_at", sa.Float(precision=53), nullable=True),
        sa.Column("updated_at", sa.Float(precision=53), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"], ["clusters.id"], name=op.f("fk_jobs_cluster_id_clusters")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("cluster_id", "proc_id", name=op.f("uq_jobs_cluster_id_proc_id")),
    )
    op.create_index(
        "ix_jobs_claim",
        "jobs",
        ["queue", sa.literal_column("priority DESC"), "id"],
        unique=False,
        postgresql_where=sa.text("status = 'idle'"),
        sqlite_where=sa.text("status = 'idle'"),
    )
    op.create_index(
        "ix_jobs_lease",
        "jobs",
        ["lease_expires_at"],
        unique=False,
        postgresql_where=sa.text("status IN ('fetched', 'accepted', 'running')"),
        sqlite_where=sa.text("status IN ('fetched', 'accepted', 'running')"),
    )
    op.create_index("ix_jobs_owner", "jobs", ["owner"], unique=False)
    op.create_index("ix_jobs_status_queue", "jobs", ["status", "queue"], unique=False)
    op.create_table(
        "job_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("time", sa.Float(precision=53), nullable=False),
        sa.Column("event", sa.String(length=32), nullable=False),
        sa.Column("from_status", sa.String(length=16), nullable=True),
        sa.Column("to_status", sa.String(length=16), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("slot", sa.String(length=255), nullable=True),
        sa.Column("host", sa.String(length=255), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("attrs", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_events_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    op.create_index("ix_job_events_job_id", "job_events", ["job_id", "id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_job_events_job_id", table_name="job_events")
    op.drop_table("job_events")
    op.drop_index("ix_jobs_status_queue", table_name="jobs")
    op.drop_index("ix_jobs_owner", table_name="jobs")
    op.drop_index(
        "ix_jobs_lease",
        table_name="jobs",
        postgresql_where=sa.text("status IN ('fetched', 'accepted', 'running')"),
        sqlite_where=sa.text("status IN ('fetched', 'accepted', 'running')"),
    )
    op.drop_index(
        "ix_jobs_claim",
        table_name="jobs",
        postgresql_where=sa.text("status = 'idle'"),
        sqlite_where=sa.text("status = 'idle'"),
    )
    op.drop_table("jobs")
    op.drop_table("clusters")
