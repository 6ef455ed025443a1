"""The checks of a changed job row run after its UPDATE, not before (PostgreSQL).

A BEFORE UPDATE row trigger makes PostgreSQL lock each row it updates first, whether the
trigger fires or not (its columns, its WHEN): a LOCK record in the WAL (54 B) for each report a
job's attempt makes. `jobstore_check_changed_job` (migration 0019) and `jobstore_winding_down`
(migration 0012) only refuse a row (they raise; the row they return is the one they got), so
they run as AFTER UPDATE row triggers on the same columns and conditions: a refused row still
fails its statement, and an UPDATE of other columns queues nothing.

Revision ID: 0020
Revises: 0019
"""

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

CHANGED = ("UPDATE OF ad, cmd, requirements, retry_until, user_log, concurrency_limits ON jobs"
           " FOR EACH ROW EXECUTE FUNCTION jobstore_check_changed_job()")
WINDING = ("UPDATE OF winding_down_until ON jobs FOR EACH ROW"
           " WHEN (NEW.winding_down_until IS NOT NULL"
           " AND NEW.winding_down_until IS DISTINCT FROM OLD.winding_down_until)"
           " EXECUTE FUNCTION jobstore_check_winding_down()")


def _make(when: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, rest in (("jobstore_check_changed_job", CHANGED),
                       ("jobstore_winding_down", WINDING)):
        op.execute(f"DROP TRIGGER {name} ON jobs")
        op.execute(f"CREATE TRIGGER {name} {when} {rest}")


def upgrade() -> None:
    _make("AFTER")


def downgrade() -> None:
    _make("BEFORE")
