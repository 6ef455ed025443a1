"""One door into the queue: submitters write only through the database's own functions.

On PostgreSQL a submitter's role keeps SELECT (of every column of `jobs` but the attempt's
token) and EXECUTE on the door's functions (0019_one_door.sql): they take the owner from the
session and check every value they store (the reserved attributes of `job_attr_rules`, the
bounds of an ad and of an expression, the accounting groups of `accounting_groups`, the
autocluster of every job, a DAG's nodes made from its own clusters). Her INSERT, UPDATE and
DELETE on the tables and USAGE of their sequences go; so do the agent's grants on the DAG
tables (the database carries DAGs forward: jobstore_dag_jobs_ended). The store's schema takes
CREATE from PUBLIC (nothing a submitter makes can stand in for what a function names). An
idempotency key is unique per owner (no submitter can take another's). The notifications the
agents act on are signed with a key of notify_keys, which only the owner and the agents' roles
read. Both backends get the three tables.

Revision ID: 0019
Revises: 0018
"""

import hashlib
from pathlib import Path

import sqlalchemy as sa
from alembic import op

from jobstore.db.migrations.shared import AGENT_ROLES, USER_ROLES

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# HTCondor's SYSTEM_IMMUTABLE_JOB_ATTRS and SYSTEM_SECURE_JOB_ATTRS, and every attribute that
# picks an account, a hook, a keyword or a claim on the node, or that the job store computes
# from its columns: never in a submitted ad, never edited.
IMMUTABLE = (
    "Owner", "User", "OsUser", "JobUniverse", "ClusterId", "ProcId", "MyType", "TargetType",
    "HookKeyword", "JobKeyword", "JobLeaseDuration", "StarterHandlesAlives", "QDate",
    "GlobalJobId", "ClaimId", "Capability", "ClaimIds", "ChildClaimIds", "ClaimIdList",
    "TransferKey", "AccountingGroup", "ConcurrencyLimits", "x509userProxySubject",
    "x509UserProxyEmail", "x509UserProxyVOName", "x509UserProxyFirstFQAN",
    "x509UserProxyFQAN", "TotalSubmitProcs", "AuthTokenSubject", "AuthTokenIssuer",
    "AuthTokenGroups", "AuthTokenId", "AuthTokenScopes", "AuthTokenProject", "JobStatus",
    "EnteredCurrentStatus", "RemoteHost", "JobPid", "NumJobStarts", "JobStartDate",
    "JobCurrentStartDate", "CompletionDate", "HoldReasonCode", "HoldReasonSubCode",
    "NumHolds",
)
# Set at submit (the accounting group, which the database checks against the admin's map;
# the URLs PREPARE_JOB fetches as the job's user), never edited.
AT_SUBMIT = ("AcctGroup", "AcctGroupUser", "JobstoreInputUrls")
# A DAG node's job's, set to its DAG and node by the database's check, never edited.
DAG_NODE = ("DAGManJobId", "DAGNodeName", "DAGParentNodeNames")
# The functions a submitter's role calls, and those an agent's role calls.
DOOR = ("jobstore_new_cluster(text, text, text, integer, text, double precision)",
        "jobstore_queue_jobs(bigint, json, double precision)",
        "jobstore_queue_procs(bigint, bigint[], json, integer, json, json, integer, integer,"
        " double precision)",
        "jobstore_store_file(text, text, bigint)",
        "jobstore_store_chunk(text, text, integer, bytea)",
        "jobstore_add_inputs(bigint, integer, json)",
        "jobstore_act(bigint[], text, text, integer, integer, boolean, double precision)",
        "jobstore_edit(bigint[], text, text, text[], boolean, double precision)",
        "jobstore_set_factor(text, double precision)",
        "jobstore_reset_usage(text, double precision)",
        "jobstore_new_dag(text, text, text, text, integer, integer, json, double precision)",
        "jobstore_dag_nodes(bigint, json, json, json, double precision)",
        "jobstore_start_dag(bigint, double precision)",
        "jobstore_pause_dag(bigint, boolean, double precision)",
        "jobstore_remove_dag(bigint, text, double precision)")
ENGINE = ("jobstore_dag_jobs_ended(bigint[], double precision)",
          "jobstore_dag_node_started(bigint, double precision)", "jobstore_sign(text)")
# Functions that write, called only by the door's and the engine's (as the tables' owner).
INTERNAL = ("jobstore_clock(double precision)", "jobstore_check_submitter(text)",
            "jobstore_autoclusters(text, json, double precision)",
            "jobstore_too_wide(text, text[], json, jsonb, integer)",
            "jobstore_significant(json)", "jobstore_per_job(text)",
            "jobstore_number_problem(text)",
            "jobstore_cluster_status(bigint)",
            "jobstore_apply_act(bigint[], text, text, integer, integer, double precision, text)",
            "jobstore_dag_acted_on(bigint, text)", "jobstore_dag_node_verdict(bigint)",
            "jobstore_dag_move_jobs(bigint[], text, text, double precision, text)",
            "jobstore_dag_parents_done(bigint, text[], double precision)",
            "jobstore_dag_make_futile(bigint, text[], double precision, text)",
            "jobstore_dag_abort(bigint, double precision, text, integer, integer)",
            "jobstore_dag_node_ended(bigint, text, integer, double precision)",
            "jobstore_dag_release_ready(bigint, double precision, boolean)",
            "jobstore_dag_end(bigint, double precision)",
            "jobstore_dag_advance(bigint, double precision)")
TABLES = ("clusters", "jobs", "job_events", "autoclusters", "autocluster_limits",
          "concurrency_limits", "submitters", "passes", "slots", "sandbox_files",
          "sandbox_chunks", "job_files", "store_limits", "dags", "dag_nodes", "dag_edges",
          "dag_categories", "queue_roles", "job_attr_rules", "accounting_groups")
# Read by the owner and the agents' roles only: the key that signs their notifications
PRIVATE = ("notify_keys",)
DAG_TABLES = ("dags", "dag_nodes", "dag_edges", "dag_categories")
# What a submitter's role reads of jobs: every column but the attempt's token.
SECRET_COLUMNS = ("token",)


def upgrade() -> None:
    op.create_table(
        "job_attr_rules",
        sa.Column("name", sa.String(100), primary_key=True),  # lower case
        sa.Column("rule", sa.String(16), nullable=False),  # immutable, submit, dag, protected
        sa.Column("origin", sa.String(16), nullable=False,
                  server_default="system"),  # system, or config (jobstore init)
    )
    op.create_table(
        "notify_keys",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("key", sa.Text, nullable=False),
    )
    op.create_table(
        "accounting_groups",
        sa.Column("account", sa.String(64), primary_key=True),  # or * for every account
        sa.Column("name", sa.String(100), primary_key=True),
    )
    rules = sa.table("job_attr_rules", sa.column("name"), sa.column("rule"))
    op.bulk_insert(rules, [{"name": n.lower(), "rule": "immutable"} for n in IMMUTABLE]
                   + [{"name": n.lower(), "rule": "submit"} for n in AT_SUBMIT]
                   + [{"name": n.lower(), "rule": "dag"} for n in DAG_NODE])
    with op.batch_alter_table("clusters") as batch:
        batch.drop_index("ix_clusters_idempotency_key")
        batch.create_index("ix_clusters_owner_idempotency_key", ["owner", "idempotency_key"],
                           unique=True)
    # status first: a statement about one node by its key never reads the DAG's nodes of a
    # status instead (the planner cannot tell them apart where it has no statistics yet)
    op.drop_index("ix_dag_nodes_status", table_name="dag_nodes")
    op.create_index("ix_dag_nodes_status", "dag_nodes", ["status", "dag_id"])
    # what matching sees of an autocluster's jobs besides its columns (md5 of the significant
    # attributes; the door refuses a job whose own differ)
    with op.batch_alter_table("autoclusters") as batch:
        batch.add_column(sa.Column("significant", sa.String(32)))
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    schema = bind.execute(sa.text("SELECT quote_ident(current_schema())")).scalar_one()
    quote = bind.dialect.identifier_preparer.quote
    if bind.execute(sa.text(
            "SELECT pg_has_role(current_user, n.nspowner, 'USAGE') FROM pg_namespace n"
            " WHERE n.oid = current_schema()::regnamespace")).scalar():
        op.execute(f"REVOKE CREATE ON SCHEMA {schema} FROM PUBLIC")
    source = Path(__file__).with_suffix(".sql").read_text(encoding="utf-8")
    dbapi = bind.connection.dbapi_connection
    assert dbapi is not None
    cursor = dbapi.cursor()
    cursor.execute(source.replace("@schema@", schema))
    cursor.close()
    # the significant attributes of each autocluster's jobs, as its first job has them
    op.execute("UPDATE autoclusters a SET significant = jobstore_significant(j.ad)"
               " FROM (SELECT DISTINCT ON (autocluster_id) autocluster_id, ad FROM jobs"
               " ORDER BY autocluster_id, id) j WHERE j.autocluster_id = a.id")
    # a pattern that is not one whole-name match is no rule (jobstore grant-user refuses one)
    op.execute("UPDATE queue_roles SET may_impersonate = NULL"
               " WHERE NOT jobstore_valid_pattern(may_impersonate)")
    op.execute("ALTER TABLE queue_roles ADD CONSTRAINT ck_queue_roles_may_impersonate"
               " CHECK (may_impersonate IS NULL OR jobstore_valid_pattern(may_impersonate))")
    for table in ("clusters", "autoclusters", "autocluster_limits", "jobs", "job_events",
                  "sandbox_files", "sandbox_chunks", "job_files", *DAG_TABLES):
        op.execute(f"DROP POLICY IF EXISTS jobstore_submit ON {table}")
        op.execute(f"DROP POLICY IF EXISTS jobstore_act ON {table}")
    op.execute("DROP POLICY IF EXISTS jobstore_record ON job_events")
    for fn in (*DOOR, *ENGINE, *INTERNAL):
        op.execute(f"REVOKE EXECUTE ON FUNCTION {fn} FROM PUBLIC")
    op.execute("REVOKE ALL ON notify_keys FROM PUBLIC")
    for role in bind.execute(sa.text(USER_ROLES)).scalars():
        for statement in submitter_grants(quote(role), schema):
            op.execute(statement)
    for role in bind.execute(sa.text(AGENT_ROLES)).scalars():
        for statement in agent_dag_grants(role, quote(role)):
            op.execute(statement)


def submitter_grants(role: str, schema: str) -> list[str]:
    """A submitter's role as `jobstore grant-user` makes it now (`role` quoted)."""
    readable = [c for c in jobs_columns() if c not in SECRET_COLUMNS]
    return [
        f"REVOKE ALL ON {', '.join((*TABLES, *PRIVATE))} FROM {role}",
        f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {schema} FROM {role}",
        f"GRANT USAGE ON SCHEMA {schema} TO {role}",
        f"GRANT SELECT ON {', '.join(t for t in TABLES if t != 'jobs')} TO {role}",
        f"GRANT SELECT ({', '.join(readable)}) ON jobs TO {role}",
        *(f"GRANT EXECUTE ON FUNCTION {fn} TO {role}" for fn in DOOR),
    ]


def agent_dag_grants(role: str, quoted: str) -> list[str]:
    """An agent's role reads the DAGs and carries them forward through the database's engine;
    it no longer writes their tables."""
    name = "jobstore_agent_" + hashlib.sha1(role.encode()).hexdigest()[:16]
    out = [f"REVOKE INSERT, UPDATE, DELETE ON {', '.join(DAG_TABLES)} FROM {quoted}"]
    out += [f"DROP POLICY IF EXISTS {name} ON {table}" for table in DAG_TABLES]
    out += [f"CREATE POLICY {name} ON {table} FOR SELECT TO {quoted} USING (true)"
            for table in DAG_TABLES]
    out += [f"GRANT EXECUTE ON FUNCTION {fn} TO {quoted}" for fn in ENGINE]
    out += [f"GRANT SELECT ON job_attr_rules, accounting_groups, notify_keys TO {quoted}"]
    return out


def jobs_columns() -> list[str]:
    bind = op.get_bind()
    return list(bind.execute(sa.text(
        "SELECT quote_ident(column_name) FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = 'jobs'"
        " ORDER BY ordinal_position")).scalars())


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        raise NotImplementedError("0019 is not undone on PostgreSQL: restore a backup")
    with op.batch_alter_table("clusters") as batch:
        batch.drop_index("ix_clusters_owner_idempotency_key")
        batch.create_index("ix_clusters_idempotency_key", ["idempotency_key"], unique=True)
    with op.batch_alter_table("autoclusters") as batch:
        batch.drop_column("significant")
    op.drop_index("ix_dag_nodes_status", table_name="dag_nodes")
    op.create_index("ix_dag_nodes_status", "dag_nodes", ["dag_id", "status"])
    op.drop_table("accounting_groups")
    op.drop_table("notify_keys")
    op.drop_table("job_attr_rules")
