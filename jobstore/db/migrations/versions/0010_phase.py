"""The job's phase, computed from its status, and the indexes on it instead of the status.

PostgreSQL updates a row in place (a HOT update: no new entry in any index) only when no column
that an index names, in its keys or its predicate, changes. Every partial index of jobs named
the status, so accept (fetched -> accepted) and start (accepted -> running) each wrote a new
entry in five indexes although none of them needed to tell those statuses apart. `phase` (idle,
out, held, done) is what they need: a column the database computes from the status (stored on
PostgreSQL, virtual on SQLite), which a change within a phase leaves as it is.

Revision ID: 0010
Revises: 0009
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

PHASE = (
    "CASE WHEN status IN ('fetched', 'accepted', 'running') THEN 'out'"
    " WHEN status IN ('completed', 'removed', 'failed') THEN 'done' ELSE status END"
)
CLAIM_KEY: list[str | sa.TextClause] = ["queue", "autocluster_id", sa.text("priority DESC"), "id"]
# (name, keys, predicate before, predicate now)
INDEXES: tuple[tuple[str, Sequence[str | sa.TextClause], str, str], ...] = (
    ("ix_jobs_claim", CLAIM_KEY, "status = 'idle'", "phase = 'idle'"),
    ("ix_jobs_lease", ["lease_expires_at"], "status IN ('fetched', 'accepted', 'running')",
     "phase = 'out'"),
    ("ix_jobs_active", ["submitter", "autocluster_id", "slot_weight"],
     "status IN ('fetched', 'accepted', 'running')", "phase = 'out'"),
    ("ix_jobs_finished", ["finished_at"], "status IN ('completed', 'removed', 'failed')",
     "phase = 'done'"),
)
UNFINISHED_BEFORE = "status NOT IN ('completed', 'removed', 'failed')"
UNFINISHED = "phase <> 'done'"


def upgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    # stored on PostgreSQL (indexed: computed when the row is written); SQLite adds only a
    # virtual one to a table, and indexes it as well
    computed = sa.Computed(PHASE, persisted=True if pg else None)
    op.add_column("jobs", sa.Column("phase", sa.String(8), computed, nullable=False))
    for name, keys, _, now in INDEXES:
        _remake(name, keys, now)
    _remake("ix_jobs_unfinished", ["queue", "phase", "owner"], UNFINISHED)
    if pg:
        op.execute("ANALYZE jobs")


def downgrade() -> None:
    for name, keys, before, _ in INDEXES:
        _remake(name, keys, before)
    _remake("ix_jobs_unfinished", ["queue", "status", "owner"], UNFINISHED_BEFORE)
    op.drop_column("jobs", "phase")


def _remake(name: str, keys: Sequence[str | sa.TextClause], predicate: str) -> None:
    op.drop_index(name, table_name="jobs")
    where = sa.text(predicate)
    op.create_index(name, "jobs", list(keys), unique=False, postgresql_where=where,
                    sqlite_where=where)
