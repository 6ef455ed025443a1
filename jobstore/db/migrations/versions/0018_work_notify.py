"""Waiting fetches: on PostgreSQL the jobs table says when work becomes claimable, in
the transaction that makes it so: a NOTIFY on channel `jobstore_work` whose payload is the new
idle jobs' shapes, `queue cpus memory disk` (comma separated; `*` when too many to list), sent by
a statement trigger on INSERT (a submit, however many rows) and a row trigger on an UPDATE that
makes a job idle (a release, a requeue after an eviction or an expired lease, a DAG node
released), or `*` when a job that held concurrency limits stops holding them (what waited for
the limits may be claimable now). PostgreSQL delivers one of each distinct payload per
transaction, at its commit.

Revision ID: 0018
Revises: 0017
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

SHAPES = """
CREATE FUNCTION jobstore_work_shapes(shapes text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF shapes IS NOT NULL THEN
        PERFORM pg_notify('jobstore_work', CASE WHEN length(shapes) > 7900 THEN '*'
                                                ELSE shapes END);
    END IF;
END $$
"""
INSERTED = """
CREATE FUNCTION jobstore_work_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM jobstore_work_shapes((
        SELECT string_agg(shape, ',') FROM (
            SELECT DISTINCT queue || ' ' || request_cpus || ' ' || request_memory || ' '
                   || request_disk AS shape
            FROM new_jobs WHERE status = 'idle' LIMIT 200) AS s));
    RETURN NULL;
END $$
"""
UPDATED = """
CREATE FUNCTION jobstore_work_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'idle' THEN
        PERFORM jobstore_work_shapes(NEW.queue || ' ' || NEW.request_cpus || ' '
                                     || NEW.request_memory || ' ' || NEW.request_disk);
    ELSE
        PERFORM jobstore_work_shapes('*');
    END IF;
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(SHAPES)
    op.execute(INSERTED)
    op.execute(UPDATED)
    op.execute("CREATE TRIGGER jobstore_work_inserted AFTER INSERT ON jobs"
               " REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT"
               " EXECUTE FUNCTION jobstore_work_inserted()")
    op.execute("CREATE TRIGGER jobstore_work_updated AFTER UPDATE OF status ON jobs"
               " FOR EACH ROW WHEN (NEW.status IS DISTINCT FROM OLD.status AND ("
               "NEW.status = 'idle' OR (OLD.concurrency_limits IS NOT NULL"
               " AND OLD.status IN ('fetched', 'accepted', 'running'))))"
               " EXECUTE FUNCTION jobstore_work_updated()")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER jobstore_work_updated ON jobs")
    op.execute("DROP TRIGGER jobstore_work_inserted ON jobs")
    op.execute("DROP FUNCTION jobstore_work_updated()")
    op.execute("DROP FUNCTION jobstore_work_inserted()")
    op.execute("DROP FUNCTION jobstore_work_shapes(text)")
