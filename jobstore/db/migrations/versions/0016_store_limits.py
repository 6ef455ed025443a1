"""What a submit may store: the largest input file and the most input per job, set by
`jobstore init` from the configuration, read by every submit; on PostgreSQL the database itself
refuses more, whatever the client: a trigger on sandbox_files (a file larger than the limit,
unless the session may claim jobs: the agent storing an output), one on job_files (a job's
inputs over the per-job limit), and one on sandbox_chunks (bytes beyond their file's size).

And a repair of 0015, which took every role that may update jobs.status for an agent's: the
submitters' roles granted before it may too (hold, release, rm), and got the agent's policies
on the files (every owner's) and DELETE. Their policies and DELETE go; an agent's role is one
that may update jobs.slot, which no submitter's may.

Revision ID: 0016
Revises: 0015
"""

import hashlib

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

LIMIT = """
CREATE FUNCTION jobstore_store_limit(what text, fallback bigint) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT value FROM store_limits WHERE name = what), fallback) * 1048576
$$
"""
CHECK_FILE = """
CREATE FUNCTION jobstore_check_file() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    largest bigint := jobstore_store_limit('max_input_file_mb', 1024);
BEGIN
    IF NEW.size > largest AND NOT has_column_privilege('jobs', 'slot', 'UPDATE') THEN
        RAISE EXCEPTION 'a file of % MB is more than the % MB an input file may be '
            '(JOBSTORE_MAX_INPUT_FILE_MB)', NEW.size / 1048576, largest / 1048576
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$
"""
CHECK_CHUNK = """
CREATE FUNCTION jobstore_check_chunk() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF length(NEW.data) > 1048576 OR NEW.seq::bigint * 1048576 + length(NEW.data) > coalesce(
            (SELECT size FROM sandbox_files f
             WHERE f.owner = NEW.owner AND f.sha256 = NEW.sha256), -1) THEN
        RAISE EXCEPTION 'a chunk beyond the size of its file' USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$
"""
CHECK_INPUTS = """
CREATE FUNCTION jobstore_check_inputs() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    most bigint := jobstore_store_limit('max_input_mb', 4096);
    over record;
BEGIN
    SELECT a.cluster_id, a.proc_id, t.total INTO over
    FROM (SELECT DISTINCT cluster_id, proc_id FROM added WHERE direction = 'in') a,
         LATERAL (SELECT sum(j.size) AS total FROM job_files j
                  WHERE j.cluster_id = a.cluster_id AND j.proc_id IS NOT DISTINCT FROM a.proc_id
                    AND j.direction = 'in') t
    WHERE t.total > most
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'the inputs of cluster % are % MB, more than the % MB a job may store '
            '(JOBSTORE_MAX_INPUT_MB)', over.cluster_id, over.total / 1048576, most / 1048576
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END $$
"""


FILES = ("sandbox_files", "sandbox_chunks", "job_files")
# The roles 0015 gave an agent's policy on the files, and whether each may claim jobs.
POLICY_ROLES = """
SELECT DISTINCT r.rolname, has_column_privilege(r.oid, 'jobs', 'slot', 'UPDATE') AS agent
FROM pg_policies p JOIN pg_roles r ON r.rolname = ANY (p.roles)
WHERE p.schemaname = current_schema() AND p.tablename = 'sandbox_files'
  AND p.policyname LIKE 'jobstore\\_agent\\_%'
"""


def upgrade() -> None:
    op.create_table(
        "store_limits",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_store_limits"),
    )
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    for statement in (LIMIT, CHECK_FILE, CHECK_CHUNK, CHECK_INPUTS):
        op.execute(statement)
    op.execute("CREATE TRIGGER jobstore_file_limit BEFORE INSERT ON sandbox_files"
               " FOR EACH ROW EXECUTE FUNCTION jobstore_check_file()")
    op.execute("CREATE TRIGGER jobstore_chunk_limit BEFORE INSERT ON sandbox_chunks"
               " FOR EACH ROW EXECUTE FUNCTION jobstore_check_chunk()")
    op.execute("CREATE TRIGGER jobstore_inputs_limit AFTER INSERT ON job_files"
               " REFERENCING NEW TABLE AS added FOR EACH STATEMENT"
               " EXECUTE FUNCTION jobstore_check_inputs()")
    quote = bind.dialect.identifier_preparer.quote
    for role, agent in bind.execute(sa.text(POLICY_ROLES)).all():
        if agent:
            continue
        policy = "jobstore_agent_" + hashlib.sha1(role.encode()).hexdigest()[:16]
        for table in FILES:
            op.execute(f"DROP POLICY IF EXISTS {policy} ON {table}")
        op.execute(f"REVOKE DELETE ON {', '.join(FILES)} FROM {quote(role)}")
    roles = bind.execute(sa.text(
        "SELECT DISTINCT grantee FROM information_schema.table_privileges"
        " WHERE table_schema = current_schema() AND table_name = 'job_files'"
        " AND privilege_type = 'INSERT' AND grantee <> 'PUBLIC'")).scalars()
    for role in roles:  # every role that stores files reads the limits
        op.execute(f"GRANT SELECT ON store_limits TO {quote(role)}")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER jobstore_inputs_limit ON job_files")
        op.execute("DROP TRIGGER jobstore_chunk_limit ON sandbox_chunks")
        op.execute("DROP TRIGGER jobstore_file_limit ON sandbox_files")
        for name in ("jobstore_check_inputs()", "jobstore_check_chunk()",
                     "jobstore_check_file()", "jobstore_store_limit(text, bigint)"):
            op.execute(f"DROP FUNCTION {name}")
    op.drop_table("store_limits")
