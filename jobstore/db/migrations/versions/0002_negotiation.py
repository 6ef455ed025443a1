"""The negotiator's tables: autoclusters, submitters (fair share), concurrency limits.

Revision ID: 0002
Revises: 0001

Existing jobs get their submitter (the owner) and their autocluster, computed as a submit does.
"""

import json
import time
from types import SimpleNamespace

import sqlalchemy as sa
from alembic import op

from jobstore.core.autoclusters import signature

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
ACTIVE = sa.text("status IN ('fetched', 'accepted', 'running')")


def upgrade() -> None:
    op.create_table(
        "autoclusters",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("signature", sa.String(length=64), nullable=False),
        sa.Column("queue", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("submitter", sa.String(length=255), nullable=False),
        sa.Column("request_cpus", sa.Integer(), nullable=False),
        sa.Column("request_memory", sa.Integer(), nullable=False),
        sa.Column("request_disk", sa.BigInteger(), nullable=False),
        sa.Column("requirements", sa.Text(), nullable=True),
        sa.Column("concurrency_limits", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(precision=53), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_autoclusters")),
        sa.UniqueConstraint("signature", name=op.f("uq_autoclusters_signature")),
    )
    op.create_table(
        "autocluster_limits",
        sa.Column("autocluster_id", BigId, nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("amount", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["autocluster_id"],
            ["autoclusters.id"],
            name=op.f("fk_autocluster_limits_autocluster_id_autoclusters"),
        ),
        sa.PrimaryKeyConstraint("autocluster_id", "name", name=op.f("pk_autocluster_limits")),
    )
    op.create_index("ix_autocluster_limits_name", "autocluster_limits", ["name"])
    op.create_table(
        "concurrency_limits",
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_concurrency_limits")),
    )
    op.create_table(
        "submitters",
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("factor", sa.Float(), server_default=sa.text("1"), nullable=False),
        sa.Column("priority", sa.Float(), server_default=sa.text("0.5"), nullable=False),
        sa.Column("usage", sa.Float(), server_default=sa.text("0"), nullable=False),
        sa.Column("in_use", sa.Float(), server_default=sa.text("0"), nullable=False),
        sa.Column("updated_at", sa.Float(precision=53), nullable=False),
        sa.Column("first_usage", sa.Float(precision=53), nullable=True),
        sa.Column("last_usage", sa.Float(precision=53), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_submitters")),
    )
    op.add_column("jobs", sa.Column("submitter", sa.String(length=255), nullable=True))
    op.add_column("jobs", sa.Column("concurrency_limits", sa.Text(), nullable=True))
    if op.get_bind().dialect.name == "sqlite":  # SQLite adds a reference only with its column
        op.execute(
            "ALTER TABLE jobs ADD COLUMN autocluster_id INTEGER "
            "CONSTRAINT fk_jobs_autocluster_id_autoclusters REFERENCES autoclusters (id)"
        )
    else:
        op.add_column("jobs", sa.Column("autocluster_id", BigId, nullable=True))
        op.create_foreign_key(
            op.f("fk_jobs_autocluster_id_autoclusters"), "jobs", "autoclusters",
            ["autocluster_id"], ["id"],
        )
    op.add_column("jobs", sa.Column("slot_weight", sa.Float(), nullable=True))
    _backfill()
    op.drop_index("ix_jobs_claim", table_name="jobs")
    op.create_index(
        "ix_jobs_claim",
        "jobs",
        ["queue", "autocluster_id", sa.text("priority DESC"), "id"],
        unique=False,
        postgresql_where=sa.text("status = 'idle'"),
        sqlite_where=sa.text("status = 'idle'"),
    )
    op.create_index(
        "ix_jobs_active_submitter",
        "jobs",
        ["submitter", "slot_weight"],
        unique=False,
        postgresql_where=ACTIVE,
        sqlite_where=ACTIVE,
    )
    op.create_index(
        "ix_jobs_active_autocluster",
        "jobs",
        ["autocluster_id"],
        unique=False,
        postgresql_where=ACTIVE,
        sqlite_where=ACTIVE,
    )


def _backfill() -> None:
    """Every existing job: its owner as submitter, its autocluster, its submitter's row."""
    conn = op.get_bind()
    now = time.time()
    conn.execute(sa.text("UPDATE jobs SET submitter = owner"))
    conn.execute(
        sa.text(
            "INSERT INTO submitters (name, factor, priority, usage, in_use, updated_at) "
            "SELECT DISTINCT owner, 1, 0.5, 0, 0, :now FROM jobs"
        ),
        {"now": now},
    )
    # the columns of revision 0002 that make an autocluster (not today's Job: later revisions add
    # columns this one cannot read)
    columns = "id, queue, owner, request_cpus, request_memory, request_disk, requirements, ad"
    known: dict[str, int] = {}
    last = 0
    while True:
        rows = conn.execute(
            sa.text(f"SELECT {columns} FROM jobs WHERE id > :last ORDER BY id LIMIT 1000"),
            {"last": last},
        ).mappings().all()
        if not rows:
            return
        for row in rows:
            values = dict(row, submitter=row["owner"], concurrency_limits=None)
            if isinstance(values["ad"], str):
                values["ad"] = json.loads(values["ad"])
            job = SimpleNamespace(**values)
            sig = signature(job)  # type: ignore[arg-type]
            if sig not in known:
                known[sig] = conn.execute(
                    sa.text(
                        "INSERT INTO autoclusters (signature, queue, owner, submitter, "
                        "request_cpus, request_memory, request_disk, requirements, created_at) "
                        "VALUES (:sig, :queue, :owner, :owner, :cpus, :memory, :disk, "
                        ":requirements, :now) RETURNING id"
                    ),
                    {
                        "sig": sig, "queue": job.queue, "owner": job.owner,
                        "cpus": job.request_cpus, "memory": job.request_memory,
                        "disk": job.request_disk, "requirements": job.requirements, "now": now,
                    },
                ).scalar_one()
            conn.execute(
                sa.text("UPDATE jobs SET autocluster_id = :ac WHERE id = :id"),
                {"ac": known[sig], "id": job.id},
            )
            last = job.id


def downgrade() -> None:
    op.drop_index("ix_jobs_active_autocluster", table_name="jobs")
    op.drop_index("ix_jobs_active_submitter", table_name="jobs")
    op.drop_index("ix_jobs_claim", table_name="jobs")
    op.create_index(
        "ix_jobs_claim",
        "jobs",
        ["queue", sa.text("priority DESC"), "id"],
        unique=False,
        postgresql_where=sa.text("status = 'idle'"),
        sqlite_where=sa.text("status = 'idle'"),
    )
    if op.get_bind().dialect.name != "sqlite":  # SQLite drops it with the column
        op.drop_constraint("fk_jobs_autocluster_id_autoclusters", "jobs", type_="foreignkey")
    for column in ("slot_weight", "autocluster_id", "concurrency_limits", "submitter"):
        op.drop_column("jobs", column)
    op.drop_table("submitters")
    op.drop_table("concurrency_limits")
    op.drop_index("ix_autocluster_limits_name", table_name="autocluster_limits")
    op.drop_table("autocluster_limits")
    op.drop_table("autoclusters")
