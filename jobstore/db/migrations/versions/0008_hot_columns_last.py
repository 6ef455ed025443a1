"""The columns a job's transitions and reports change, at the end of its row (PostgreSQL), the
most often changed last, so that an UPDATE logs only the changed end of the row and not the
submitted ad before it.

PostgreSQL logs a same-page UPDATE as the bytes between the prefix and the suffix that the old
and the new row have in common. `status` was the fifth column: every status change logged the
ad, the command and the requirements that follow it, although they never change. A column
cannot be moved in place: each is copied into a new column at the end (one UPDATE of every
row), the old one dropped, with the indexes that name it (made again here), and the new one
renamed, with its default and NOT NULL. Column privileges on the moved columns (the hook
role's UPDATE) are granted again.

SQLite logs whole pages, and keeps its order.

Revision ID: 0008
Revises: 0007
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# In their new order, after the columns set at submit: a hold's, a claim's, a start's, an
# exit's and every report's.
MOVED = (
    "reason", "hold_code", "hold_subcode", "num_holds", "release_pending",
    "winding_down_until", "claims", "attempts", "keyword", "slot", "host", "fetched_at",
    "slot_weight", "token", "finished_at", "first_started_at", "num_starts", "started_at",
    "wall_clock", "exit_code", "exit_signal", "exit_by_signal", "job_pid", "remote_user_cpu",
    "remote_sys_cpu", "image_size", "memory_usage", "lease_expires_at", "updated_at", "status",
)
HANDED_OUT = sa.text("status IN ('fetched', 'accepted', 'running')")
FINISHED = sa.text("status IN ('completed', 'removed', 'failed')")
UNFINISHED = sa.text("status NOT IN ('completed', 'removed', 'failed')")
WINDING_DOWN = sa.text("winding_down_until IS NOT NULL")
# The indexes that name a moved column, made again as they were made (the same predicate text,
# so that the planner matches the queries' conditions to them as before).
INDEXES: tuple[tuple[str, Sequence[str | sa.TextClause], sa.TextClause], ...] = (
    ("ix_jobs_claim", ["queue", "autocluster_id", sa.text("priority DESC"), "id"],
     sa.text("status = 'idle'")),
    ("ix_jobs_lease", ["lease_expires_at"], HANDED_OUT),
    ("ix_jobs_active", ["submitter", "autocluster_id", "slot_weight"], HANDED_OUT),
    ("ix_jobs_winding_down", ["host"], WINDING_DOWN),
    ("ix_jobs_finished", ["finished_at"], FINISHED),
    ("ix_jobs_unfinished", ["queue", "status", "owner"], UNFINISHED),
)


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    columns = {r.name: r for r in bind.execute(sa.text(
        "SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type,"
        " a.attnotnull AS not_null, pg_get_expr(d.adbin, d.adrelid) AS default"
        " FROM pg_attribute a LEFT JOIN pg_attrdef d"
        " ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
        " WHERE a.attrelid = 'jobs'::regclass AND a.attnum > 0 AND NOT a.attisdropped"))}
    indexes = sa.text("SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                      " WHERE i.indrelid = 'jobs'::regclass")
    before = set(bind.execute(indexes).scalars())
    privileges = bind.execute(sa.text(  # granted on columns (not the table's); 0 is PUBLIC
        "SELECT a.attname, r.rolname, x.privilege_type"
        " FROM pg_attribute a CROSS JOIN LATERAL aclexplode(a.attacl) x"
        " LEFT JOIN pg_roles r ON r.oid = x.grantee"
        " WHERE a.attrelid = 'jobs'::regclass AND a.attnum > 0 AND NOT a.attisdropped")).all()
    op.execute("ALTER TABLE jobs " + ", ".join(
        f"ADD COLUMN {name}_moved {columns[name].type}" for name in MOVED))
    op.execute("UPDATE jobs SET " + ", ".join(f"{name}_moved = {name}" for name in MOVED))
    op.execute("ALTER TABLE jobs " + ", ".join(f"DROP COLUMN {name}" for name in MOVED))
    for name in MOVED:
        op.execute(f"ALTER TABLE jobs RENAME COLUMN {name}_moved TO {name}")
    op.execute("ALTER TABLE jobs " + ", ".join(
        [f"ALTER COLUMN {name} SET DEFAULT {columns[name].default}"
         for name in MOVED if columns[name].default is not None]
        + [f"ALTER COLUMN {name} SET NOT NULL" for name in MOVED if columns[name].not_null]))
    for name, keys, where in INDEXES:
        op.create_index(name, "jobs", keys, unique=False, postgresql_where=where)
    lost = before - set(bind.execute(indexes).scalars())
    if lost:
        raise RuntimeError(f"migration 0008 would lose the indexes {sorted(lost)} of jobs")
    for column, role, privilege in privileges:
        if column in MOVED and privilege in ("SELECT", "INSERT", "UPDATE", "REFERENCES"):
            to = "PUBLIC" if role is None else '"' + role.replace('"', '""') + '"'
            op.execute(f"GRANT {privilege} ({column}) ON jobs TO {to}")
    op.execute("ANALYZE jobs")


def downgrade() -> None:
    """Nothing to undo: the order of the columns is not part of the schema."""
