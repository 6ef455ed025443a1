"""A DAG's settings for the access point's `jobstore schedd`: its NODE_STATUS_FILE (kept current
as DAGMan keeps it: its path and least seconds between writes) and the most PRE and POST
scripts of it that run at once (-MaxPre, -MaxPost), recorded in `dags` through the door
(`jobstore_dag_settings`, which checks them: an absolute path of one line, counts of 0 or
more, before the DAG has nodes); `dag_files` is when the service wrote the status file (and
whether after the DAG's end), which only the agents' roles (as which it connects) read and
write.

Revision ID: 0028
Revises: 0027
"""

import sqlalchemy as sa
from alembic import op

from jobstore.db.migrations.shared import AGENT_ROLES, USER_ROLES

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

FUNCTION = "jobstore_dag_settings(bigint, text, integer, integer, integer)"
SQL = r"""
-- A DAG's NODE_STATUS_FILE (written at most every p_status_every seconds) and the most PRE and
-- POST scripts of it that run at once (0: as many as the access point lets one owner run),
-- given by its owner when she queues it (before its nodes).
CREATE FUNCTION jobstore_dag_settings(p_dag bigint, p_status_file text, p_status_every integer,
    p_max_pre integer, p_max_post integer)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    d dags%ROWTYPE;
BEGIN
    SELECT * INTO d FROM dags WHERE id = p_dag FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JS004', MESSAGE = format('no DAG %s', p_dag);
    END IF;
    PERFORM jobstore_check_submitter(d.owner);
    IF EXISTS (SELECT 1 FROM dag_nodes n WHERE n.dag_id = p_dag) THEN
        PERFORM jobstore_bad(format('DAG %s has its nodes already', p_dag));
    END IF;
    IF p_status_file !~ '^/' OR length(p_status_file) > 4096
       OR p_status_file ~ '[\x01-\x1f\x7f]' OR p_status_every NOT BETWEEN 0 AND 86400 THEN
        PERFORM jobstore_bad(format('DAG %s: NODE_STATUS_FILE is an absolute path of one '
                                    'line, written at most every 0 to 86400 s', d.path));
    END IF;
    IF p_max_pre NOT BETWEEN 0 AND 1000000 OR p_max_post NOT BETWEEN 0 AND 1000000 THEN
        PERFORM jobstore_bad(format('DAG %s: -MaxPre and -MaxPost are 0 or more', d.path));
    END IF;
    UPDATE dags SET status_file = p_status_file, status_every = p_status_every,
        max_pre = p_max_pre, max_post = p_max_post
    WHERE id = p_dag;
END $$;
"""


def upgrade() -> None:
    op.add_column("dags", sa.Column("status_file", sa.Text()))
    op.add_column("dags", sa.Column("status_every", sa.Integer()))
    op.add_column("dags", sa.Column("max_pre", sa.Integer()))
    op.add_column("dags", sa.Column("max_post", sa.Integer()))
    op.create_table(
        "dag_files",
        sa.Column("dag_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  autoincrement=False, nullable=False),
        sa.Column("written_at", sa.Float(precision=53), nullable=False),
        sa.Column("final", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("dag_id", name="pk_dag_files"),
    )
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    schema = bind.execute(sa.text("SELECT quote_ident(current_schema())")).scalar_one()
    dbapi = bind.connection.dbapi_connection
    assert dbapi is not None
    cursor = dbapi.cursor()
    cursor.execute(SQL.replace("@schema@", schema))
    cursor.close()
    quote = bind.dialect.identifier_preparer.quote
    op.execute(f"REVOKE EXECUTE ON FUNCTION {FUNCTION} FROM PUBLIC")
    for role in bind.execute(sa.text(USER_ROLES)).scalars():
        op.execute(f"GRANT EXECUTE ON FUNCTION {FUNCTION} TO {quote(role)}")
    for role in bind.execute(sa.text(AGENT_ROLES)).scalars():
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON dag_files TO {quote(role)}")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION {FUNCTION}")
    op.drop_table("dag_files")
    op.drop_column("dags", "max_post")
    op.drop_column("dags", "max_pre")
    op.drop_column("dags", "status_every")
    op.drop_column("dags", "status_file")
