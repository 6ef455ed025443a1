"""Who may do what, decided by the database: the queue's roles, and row-level security.

A submitter connects as her own role (peer on the local socket, SCRAM or a certificate
remotely). The functions below tell, from `session_user` (which no client can change without
being a superuser), which OS account the session is (`jobstore_account`: the role's name, or
the account `jobstore grant-user --account` mapped it to), whether it is the store's owner
(`jobstore_trusted`: the role `jobstore init` ran as, or a member of it) and whether it is a
queue super user (`jobstore_super_user`). The policies let anyone read, as condor_q does; let a
session insert a cluster, a job or an autocluster only for an owner it may submit as
(`jobstore_may_submit_as`: itself, or for a super user an account its `may_impersonate` regular
expression matches, as QUEUE_SUPER_USER_MAY_IMPERSONATE), an event only for a job it may act on,
and change only the jobs it may act on (its own, or every one for a super user), never into a
running attempt (a submitter's job row is new or at rest: no token, no lease, no slot); only an
attempt that is handed out winds down on its slot, whoever writes it (a trigger), so that no row
a submitter wrote makes an agent vacate a slot. The table's owner is not subject to the
policies. An agent's role (`jobstore grant`) gets a policy of its own that
lets it change every job (its column privileges already say which columns); the roles that had
the agent's grants before this migration get theirs here. An autocluster is unique by its owner
and signature (no longer the signature alone), so that a submitter cannot insert the row that
another's jobs would join.

Revision ID: 0012
Revises: 0011
"""

import hashlib

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

FUNCTIONS = """
CREATE FUNCTION jobstore_trusted() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_catalog, pg_temp AS $$
    SELECT pg_has_role(session_user, c.relowner, 'MEMBER')
    FROM pg_class c WHERE c.oid = '{schema}.jobs'::regclass
$$;

CREATE FUNCTION jobstore_account() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT q.account FROM queue_roles q WHERE q.role = session_user),
                    session_user::text)
$$;

CREATE FUNCTION jobstore_super_user() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_catalog, pg_temp AS $$
    SELECT jobstore_trusted() OR EXISTS (
        SELECT 1 FROM queue_roles q JOIN pg_roles r ON r.rolname = q.role
        WHERE q.super_user AND pg_has_role(session_user, r.oid, 'MEMBER'))
$$;

CREATE FUNCTION jobstore_check_winding_down() RETURNS trigger
LANGUAGE plpgsql SET search_path = {schema}, pg_catalog, pg_temp AS $$
BEGIN
    IF OLD.phase <> 'out' THEN
        RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', MESSAGE = 'job ' || OLD.id
            || ': only an attempt that is handed out winds down on its slot';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobstore_winding_down BEFORE UPDATE OF winding_down_until ON jobs FOR EACH ROW
WHEN (NEW.winding_down_until IS NOT NULL
      AND NEW.winding_down_until IS DISTINCT FROM OLD.winding_down_until)
EXECUTE FUNCTION jobstore_check_winding_down();

CREATE FUNCTION jobstore_may_submit_as(owner text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = {schema}, pg_catalog, pg_temp AS $$
    SELECT owner = jobstore_account() OR jobstore_trusted() OR EXISTS (
        SELECT 1 FROM queue_roles q JOIN pg_roles r ON r.rolname = q.role
        WHERE q.super_user AND q.may_impersonate IS NOT NULL
          AND pg_has_role(session_user, r.oid, 'MEMBER')
          AND owner ~ ('^(?:' || q.may_impersonate || ')$'))
$$;
"""

# (table, policy, command, USING, WITH CHECK); `(SELECT f())` is computed once per statement
OWN = "owner = (SELECT jobstore_account())"
ACTS = f"{OWN} OR (SELECT jobstore_super_user())"
SUBMITS = f"{OWN} OR jobstore_may_submit_as(owner)"
# What a submitter's job row may be: new (nothing of a claim in it), and after her hold,
# release, rm or edit (no attempt running: no token, no lease). The agent's policy is its own.
FRESH = ("status IN ('idle', 'held') AND claims = 0 AND token IS NULL AND slot IS NULL"
         " AND host IS NULL AND keyword IS NULL AND lease_expires_at IS NULL"
         " AND winding_down_until IS NULL")
AT_REST = "status IN ('idle', 'held', 'removed') AND token IS NULL AND lease_expires_at IS NULL"
POLICIES = (
    ("clusters", "jobstore_read", "SELECT", "true", None),
    ("clusters", "jobstore_submit", "INSERT", None, SUBMITS),
    ("clusters", "jobstore_prune", "DELETE", "true", None),
    ("autoclusters", "jobstore_read", "SELECT", "true", None),
    ("autoclusters", "jobstore_submit", "INSERT", None, SUBMITS),
    ("autoclusters", "jobstore_prune", "DELETE", "true", None),
    ("autocluster_limits", "jobstore_read", "SELECT", "true", None),
    ("autocluster_limits", "jobstore_submit", "INSERT", None,
     "EXISTS (SELECT 1 FROM autoclusters a WHERE a.id = autocluster_id"
     " AND (a.owner = (SELECT jobstore_account()) OR jobstore_may_submit_as(a.owner)))"),
    ("autocluster_limits", "jobstore_prune", "DELETE", "true", None),
    ("jobs", "jobstore_read", "SELECT", "true", None),
    ("jobs", "jobstore_submit", "INSERT", None, f"({SUBMITS}) AND {FRESH}"),
    ("jobs", "jobstore_act", "UPDATE", ACTS, f"({ACTS}) AND {AT_REST}"),
    ("jobs", "jobstore_prune", "DELETE", "true", None),
    ("job_events", "jobstore_read", "SELECT", "true", None),
    ("job_events", "jobstore_record", "INSERT", None,
     "EXISTS (SELECT 1 FROM jobs j WHERE j.id = job_id"
     " AND (j.owner = (SELECT jobstore_account()) OR (SELECT jobstore_super_user())))"),
    ("job_events", "jobstore_prune", "DELETE", "true", None),
)
TABLES = ("clusters", "autoclusters", "autocluster_limits", "jobs", "job_events")
# The roles that hold the agent's grants (`jobstore grant`): UPDATE of jobs.status.
AGENT_ROLES = """
SELECT DISTINCT grantee FROM information_schema.column_privileges
WHERE table_schema = current_schema() AND table_name = 'jobs' AND column_name = 'status'
  AND privilege_type = 'UPDATE' AND grantee <> 'PUBLIC'
  AND grantee <> (SELECT tableowner FROM pg_tables
                  WHERE schemaname = current_schema() AND tablename = 'jobs')
"""


def upgrade() -> None:
    op.create_table(
        "queue_roles",
        sa.Column("role", sa.String(63), primary_key=True),
        sa.Column("account", sa.String(64)),
        sa.Column("super_user", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("may_impersonate", sa.Text),
        sa.Column("admin", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    with op.batch_alter_table("autoclusters") as batch:  # SQLite: the table is made again
        batch.drop_constraint("uq_autoclusters_signature", type_="unique")
        batch.create_unique_constraint("uq_autoclusters_owner_signature", ["owner", "signature"])
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    schema = bind.execute(sa.text("SELECT quote_ident(current_schema())")).scalar_one()
    for statement in FUNCTIONS.format(schema=schema).split(";\n\n"):
        op.execute(statement.strip().rstrip(";"))
    for table, name, command, using, check in POLICIES:
        clauses = (f" USING ({using})" if using else "") + (
            f" WITH CHECK ({check})" if check else "")
        op.execute(f"CREATE POLICY {name} ON {table} FOR {command}{clauses}")
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    quote = bind.dialect.identifier_preparer.quote
    for role in bind.execute(sa.text(AGENT_ROLES)).scalars():
        for statement in agent_policies(role, quote(role)):
            op.execute(statement)


def agent_policies(role: str, quoted: str) -> list[str]:
    """The policies of an agent's role, as `jobstore grant` makes them: it changes every job
    and records its events (its column privileges say what it may change)."""
    name = "jobstore_agent_" + hashlib.sha1(role.encode()).hexdigest()[:16]
    return [
        f"CREATE POLICY {name} ON jobs FOR UPDATE TO {quoted} USING (true) WITH CHECK (true)",
        f"CREATE POLICY {name} ON job_events FOR INSERT TO {quoted} WITH CHECK (true)",
    ]


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        for table in TABLES:
            op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
            names = bind.execute(sa.text(
                "SELECT quote_ident(policyname) FROM pg_policies"
                " WHERE schemaname = current_schema() AND tablename = :t"),
                {"t": table}).scalars().all()
            for name in names:
                op.execute(f"DROP POLICY {name} ON {table}")
        op.execute("DROP TRIGGER jobstore_winding_down ON jobs")
        for fn in ("jobstore_check_winding_down()", "jobstore_may_submit_as(text)",
                   "jobstore_super_user()",
                   "jobstore_account()", "jobstore_trusted()"):
            op.execute(f"DROP FUNCTION {fn}")
    op.drop_table("queue_roles")
    with op.batch_alter_table("autoclusters") as batch:
        batch.drop_constraint("uq_autoclusters_owner_signature", type_="unique")
        batch.create_unique_constraint("uq_autoclusters_signature", ["signature"])
