"""The job database schema, defined once; Alembic migrations are checked against it."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Computed,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# SQLite only autoincrements INTEGER PRIMARY KEY, PostgreSQL wants BIGINT for big tables.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def Epoch() -> Float:  # noqa: N802 - reads like a type in the table definitions
    """A point in time: float seconds since the epoch (UTC), the same on every backend."""
    return Float(precision=53)


clusters = Table(
    "clusters",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("owner", String(64), nullable=False),
    Column("queue", String(64), nullable=False),
    Column("submit_file", Text),
    Column("num_procs", Integer, nullable=False),
    Column("submitted_at", Epoch(), nullable=False),
    # Chosen by the submitter: a submit of hers retried with the same key returns this cluster
    # (unique per owner: no submitter can take another's key; migration 0019).
    Column("idempotency_key", String(255)),
    # The access point whose `jobstore schedd` writes the jobs' outputs into their Iwd (its
    # JOBSTORE_SCHEDD_NAME at submit); NULL: spooled, the outputs wait for transfer-data
    # (migration 0022).
    Column("home", String(255)),
    Index("ix_clusters_owner_idempotency_key", "owner", "idempotency_key", unique=True),
)

# Outputs written home by an access point's `jobstore schedd` (migration 0022): a job's row is
# taken under a lease before its files are written and marked delivered in the transaction
# after, so a restarted or second service never writes them again once delivered; the pruner
# deletes it with its job.
deliveries = Table(
    "deliveries",
    metadata,
    Column("job_id", BigId, primary_key=True, autoincrement=False),
    Column("attempt", Integer, nullable=False),
    Column("home", String(255), nullable=False),
    Column("leased_until", Epoch(), nullable=False),
    Column("delivered_at", Epoch()),
    Column("files", Integer),
    Column("error", Text),
    Column("failures", Integer, nullable=False, server_default=text("0")),
)

# condor_vacate_job (migration 0029): the attempt of a job its owner asked to vacate, which
# the node's agent vacates (gracefully, or fast); the job goes back to idle as its JOB_EXIT
# evict reports. Written through the door only; the pruner deletes it with its job.
vacate_requests = Table(
    "vacate_requests",
    metadata,
    Column("job_id", BigId, primary_key=True, autoincrement=False),
    Column("attempt", Integer, nullable=False),
    Column("fast", Boolean, nullable=False),
    Column("requested_at", Epoch(), nullable=False),
)

# Where a follower of job_events that must not lose or repeat an event stands (migration
# 0023): every id up to `high` was handled but for `gaps`, JSON [[id, horizon], ...] of ids not
# seen yet that a transaction still running may commit (jobstore.api.feed). One row per follower
# (`name`: an access point's event logs, "userlog:HOME" or "userlog:HOME:OWNER").
event_cursors = Table(
    "event_cursors",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("high", BigInteger, nullable=False),
    Column("gaps", Text),
    Column("updated_at", Epoch(), nullable=False),
)

# The last event of each job that an access point's `jobstore schedd` appended to its job event
# log (migration 0023): an event read again (a cursor kept lower) is never appended twice. The
# pruner deletes it with its job.
logged_events = Table(
    "logged_events",
    metadata,
    Column("job_id", BigId, primary_key=True, autoincrement=False),
    Column("event_id", BigInteger, nullable=False),
)

# When the access point wrote each DAG's NODE_STATUS_FILE (migration 0028).
dag_files = Table(
    "dag_files",
    metadata,
    Column("dag_id", BigId, primary_key=True, autoincrement=False),
    Column("written_at", Epoch(), nullable=False),
    Column("final", Boolean, nullable=False),  # written after the DAG ended
)

# What an access point's `jobstore schedd` wrote of a DAG's own job event log (DAGMan's job's
# log, `<dag file>.dagman.log`; migration 0023): 1 its submit and execute, 2 its end too. The
# pruner deletes it with its DAG.
dagman_logs = Table(
    "dagman_logs",
    metadata,
    Column("dag_id", BigId, primary_key=True, autoincrement=False),
    Column("written", Integer, nullable=False),
    Column("updated_at", Epoch(), nullable=False),
)

# Jobs that are the same in everything matching looks at (jobstore.core.autoclusters).
autoclusters = Table(
    "autoclusters",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("signature", String(64), nullable=False),
    Column("queue", String(64), nullable=False),
    Column("owner", String(64), nullable=False),
    Column("submitter", String(255), nullable=False),
    Column("request_cpus", Integer, nullable=False),
    Column("request_memory", Integer, nullable=False),
    Column("request_disk", BigInteger, nullable=False),
    Column("requirements", Text),
    Column("concurrency_limits", Text),
    Column("created_at", Epoch(), nullable=False),
    # md5 of the significant attributes as JSON (what matching sees of the ad, keys lower case):
    # the door refuses a job whose own differ (PostgreSQL; NULL elsewhere)
    Column("significant", String(32)),
    # with its owner: a submitter cannot make the row another one's jobs would join (0012)
    UniqueConstraint("owner", "signature"),
)

# The concurrency limits an autocluster's jobs each use: name -> units.
autocluster_limits = Table(
    "autocluster_limits",
    metadata,
    Column("autocluster_id", BigId, ForeignKey("autoclusters.id"), primary_key=True),
    Column("name", String(255), primary_key=True),
    Column("amount", Float, nullable=False),
    Index("ix_autocluster_limits_name", "name"),
)

# One row per concurrency limit ever named: a claim of a job that uses it locks the row.
concurrency_limits = Table(
    "concurrency_limits",
    metadata,
    Column("name", String(255), primary_key=True),
)

# condor_userprio's table: one row per submitter, updated by the accountant.
submitters = Table(
    "submitters",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("factor", Float, nullable=False, server_default=text("1")),
    Column("priority", Float, nullable=False, server_default=text("0.5")),
    Column("usage", Float, nullable=False, server_default=text("0")),
    Column("in_use", Float, nullable=False, server_default=text("0")),
    Column("updated_at", Epoch(), nullable=False),
    Column("first_usage", Epoch()),
    Column("last_usage", Epoch()),
)

# Who may do what on PostgreSQL (migration 0012, `jobstore grant-user`): the OS account a role
# submits as (NULL: its own name), whether its members are queue super users (act on every job;
# submit as the accounts `may_impersonate`, a regular expression, matches) and admins
# (condor_userprio's changes). The database's own functions read it (jobstore_account, ...).
queue_roles = Table(
    "queue_roles",
    metadata,
    Column("role", String(63), primary_key=True),
    Column("account", String(64)),
    Column("super_user", Boolean, nullable=False, server_default=false()),
    Column("may_impersonate", Text),
    Column("admin", Boolean, nullable=False, server_default=false()),
)

# The rules on a job's submitted attributes (migration 0019), by lower-case name: `immutable`
# (never submitted, never edited: the job store sets it, or it picks an account, a hook or a
# claim on the node), `submit` (set at submit from what the database checks, never edited),
# `protected` (edited by a queue super user only: PROTECTED_JOB_ATTRS); `origin` system, or
# config (IMMUTABLE_JOB_ATTRS, PROTECTED_JOB_ATTRS and SECURE_JOB_ATTRS, by `jobstore init`).
job_attr_rules = Table(
    "job_attr_rules",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("rule", String(16), nullable=False),
    Column("origin", String(16), nullable=False, server_default="system"),
)

# The key that signs the notifications the agents act on (migration 0019: jobstore_sign;
# jobstore.db.channels checks them), read by the tables' owner and the agents' roles only.
notify_keys = Table(
    "notify_keys",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("key", Text, nullable=False),
)

# The admin's map of accounting groups (migration 0019): an account (`*`: every account) may
# have its jobs charged to `name` (AccountingGroup name.account); HTCondor's accounting_group
# is free text, the job store's is what this map grants.
accounting_groups = Table(
    "accounting_groups",
    metadata,
    Column("account", String(64), primary_key=True),
    Column("name", String(100), primary_key=True),
)

# The slots of the pool as their nodes' agents last published them (`jobstore status`, `q
# -better-analyze`; migration 0014): the slot ad as the startd gave it to FETCH_WORK (old
# ClassAd syntax), upserted every UPDATE_INTERVAL, gone from view after its lifetime.
slots = Table(
    "slots",
    metadata,
    Column("name", String(255), primary_key=True),
    Column("machine", String(255), nullable=False),
    Column("ad", Text, nullable=False),
    Column("updated_at", Epoch(), nullable=False),
    Column("expires_at", Epoch(), nullable=False),
    Index("ix_slots_expires_at", "expires_at"),
)

# A job's files (migration 0015): content-addressed per owner, so that a cluster of
# 10,000 jobs that share a 100 MB input stores it once, and no owner can name another's file by
# its hash (the owner is part of every key; row-level security shows each owner only hers).
# A file's bytes are `sandbox_chunks` of CHUNK bytes in order.
# DAGs (migration 0017): a DAG is a cluster id of its own (its DAGManJobId); its nodes'
# jobs wait (status `waiting`) until their parents are done, and the transaction that ends a
# node's last job releases its children (the DAG engine: PostgreSQL's jobstore_dag_*
# functions, jobstore.db.dagengine on SQLite).
dags = Table(
    "dags",
    metadata,
    Column("id", BigId, ForeignKey("clusters.id"), primary_key=True),
    Column("owner", String(255), nullable=False),
    Column("path", Text, nullable=False),
    Column("batch_name", String(255), nullable=False),
    Column("status", String(16), nullable=False),  # running, held, completed, failed, removed
    Column("dag_status", Integer, nullable=False, server_default=text("0")),  # DAG_Status
    Column("exit_code", Integer),
    Column("max_jobs", Integer),
    Column("max_idle", Integer),
    Column("attrs", Text),  # SET_JOB_ATTR, as JSON
    Column("created_at", Epoch(), nullable=False),
    Column("finished_at", Epoch()),
    Column("status_file", Text),  # NODE_STATUS_FILE
    Column("status_every", Integer),  # its least seconds between writes
    Column("max_pre", Integer),  # -MaxPre: its PRE scripts that run at once (0: no limit)
    Column("max_post", Integer),  # -MaxPost
)

dag_nodes = Table(
    "dag_nodes",
    metadata,
    Column("dag_id", BigId, primary_key=True),
    Column("name", String(255), primary_key=True),
    Column("owner", String(255), nullable=False),
    Column("cluster_id", BigId),  # its jobs (none for a NOOP node)
    # waiting ready pre queued post done failed futile (pre, post: its script is due or runs)
    Column("status", String(8), nullable=False),
    Column("pending", Integer, nullable=False),  # parents not done yet
    Column("priority", Integer, nullable=False, server_default=text("0")),
    Column("category", String(255)),
    Column("abort_exit", Integer),
    Column("abort_return", Integer),
    Column("final", Boolean, nullable=False, server_default=false()),
    Column("exit_code", Integer),
    Column("updated_at", Epoch(), nullable=False),
    # SCRIPT PRE and POST (run on the access point, in `directory`), PRE_SKIP
    Column("pre_script", Text),
    Column("post_script", Text),
    Column("pre_skip", Integer),
    Column("directory", Text),
    Column("pre_code", Integer),  # its PRE script's exit ($PRE_SCRIPT_RETURN)
    Column("job_code", Integer),  # its jobs' result, for its POST script ($RETURN)
    Column("script_token", String(64)),  # the run of the script started (a lease)
    Column("script_started_at", Epoch()),
    # its transfer_input_files read when it is submitted: JSON [[path, name], ...]
    Column("late_inputs", Text),
    # SCRIPT DEFER and DEBUG, JSON by kind: {"pre": {"defer": [status, seconds], "debug":
    # [file, "STDOUT" | "STDERR" | "ALL"]}, "post": {...}}
    Column("script_options", Text),
    Column("script_after", Epoch()),  # a deferred script is due again from then on
    # SCRIPT HOLD: its command line, the run that holds it (a lease of its own) and the holds
    # of the node's jobs it was last started for
    Column("hold_script", Text),
    Column("hold_token", String(64)),
    Column("hold_started_at", Epoch()),
    Column("holds_seen", BigInteger),
    Index("ix_dag_nodes_cluster_id", "cluster_id"),
    Index("ix_dag_nodes_status", "status", "dag_id"),
)

dag_edges = Table(
    "dag_edges",
    metadata,
    Column("dag_id", BigId, primary_key=True),
    Column("parent", String(255), primary_key=True),
    Column("child", String(255), primary_key=True),
    Column("owner", String(255), nullable=False),
    Index("ix_dag_edges_child", "dag_id", "child"),
)

dag_categories = Table(
    "dag_categories",
    metadata,
    Column("dag_id", BigId, primary_key=True),
    Column("name", String(255), primary_key=True),
    Column("owner", String(255), nullable=False),
    Column("maxjobs", Integer, nullable=False),
)

# What a submit may store, set by `jobstore init` from the configuration (JOBSTORE_MAX_INPUT_
# FILE_MB, JOBSTORE_MAX_INPUT_MB); on PostgreSQL the database's triggers enforce them too.
store_limits = Table(
    "store_limits",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", BigInteger, nullable=False),
)

sandbox_files = Table(
    "sandbox_files",
    metadata,
    Column("owner", String(255), primary_key=True),
    Column("sha256", String(64), primary_key=True),
    Column("size", BigInteger, nullable=False),
    Column("created_at", Epoch(), nullable=False),
)

sandbox_chunks = Table(
    "sandbox_chunks",
    metadata,
    Column("owner", String(255), primary_key=True),
    Column("sha256", String(64), primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("data", LargeBinary, nullable=False),
)

# Which files a job takes into its sandbox (direction 'in': the cluster's, proc_id NULL, or one
# proc's) and brings back ('out': one job's, from the attempt that sent them), by their path in
# the sandbox and their mode.
job_files = Table(
    "job_files",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("cluster_id", BigInteger, nullable=False),
    Column("proc_id", Integer),
    Column("direction", String(4), nullable=False),
    Column("name", Text, nullable=False),
    Column("owner", String(255), nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("mode", Integer, nullable=False),
    Column("attempt", Integer),
    Column("created_at", Epoch(), nullable=False),
    Index("ix_job_files_cluster_id", "cluster_id", "proc_id"),
    Index("ix_job_files_owner", "owner", "sha256"),
)

# When a pool-wide periodic pass (the policy pass) last ran: one runner per interval.
passes = Table(
    "passes",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("last_run_at", Epoch(), nullable=False),
)

# jobs.phase, computed from the status (jobstore.core.states.PHASES; tests/unit/test_sql.py checks):
# the indexes name the phase, never the status, so that accept and start, which change the
# status within a phase, are HOT updates on PostgreSQL (no new index entries). Migration 0010.
PHASE = (
    "CASE WHEN status IN ('fetched', 'accepted', 'running') THEN 'out'"
    " WHEN status IN ('completed', 'removed', 'failed') THEN 'done' ELSE status END"
)
# The partial indexes' predicates.
CLAIMABLE = "phase = 'idle'"
OUT_PHASE = "phase = 'out'"  # the handed-out jobs (core.states.HANDED_OUT)
FINISHED = "phase = 'done'"
UNFINISHED = "phase <> 'done'"

jobs = Table(
    "jobs",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("cluster_id", BigId, ForeignKey("clusters.id"), nullable=False),
    Column("proc_id", Integer, nullable=False),
    Column("queue", String(64), nullable=False),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    Column("owner", String(64), nullable=False),
    # The job as submitted: attribute name -> ClassAd expression text (old syntax).
    Column("ad", JSON, nullable=False),
    Column("cmd", Text, nullable=False),
    Column("request_cpus", Integer, nullable=False),
    Column("request_memory", Integer, nullable=False),
    Column("request_disk", BigInteger, nullable=False),
    Column("requirements", Text),
    Column("max_attempts", Integer, nullable=False),
    Column("success_exit_code", Integer, nullable=False, server_default=text("0")),
    Column("retry_until", Text),
    Column("max_retries", Integer),
    Column("user_log", Text),
    Column("submitted_at", Epoch(), nullable=False),
    Column("submitter", String(255)),
    Column("concurrency_limits", Text),
    Column("autocluster_id", BigId, ForeignKey("autoclusters.id")),
    Column("periodic", Boolean),
    # What transitions and reports change, in PostgreSQL's order of the columns (migration
    # 0008), the most often changed last: a same-page UPDATE logs only the bytes from the first
    # changed column to the end of the row, never the ad and the others set at submit.
    Column("reason", Text),
    Column("hold_code", Integer),
    Column("hold_subcode", Integer),
    Column("num_holds", Integer),
    Column("release_pending", Boolean),
    Column("winding_down_until", Epoch()),
    # `claims` is the fencing counter, `attempts` counts tries against the limit.
    Column("claims", Integer, nullable=False, server_default=text("0")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("keyword", String(64)),
    Column("slot", String(255)),
    Column("host", String(255)),
    Column("fetched_at", Epoch()),
    Column("slot_weight", Float),
    Column("token", String(64)),
    Column("finished_at", Epoch()),
    Column("first_started_at", Epoch()),
    Column("num_starts", Integer),
    Column("started_at", Epoch()),
    Column("wall_clock", Float),
    Column("exit_code", Integer),
    Column("exit_signal", Integer),
    Column("exit_by_signal", Boolean),
    Column("job_pid", Integer),
    Column("remote_user_cpu", Float),
    Column("remote_sys_cpu", Float),
    Column("image_size", BigInteger),
    Column("memory_usage", BigInteger),
    Column("lease_expires_at", Epoch()),
    Column("updated_at", Epoch(), nullable=False),
    Column("status", String(16), nullable=False),
    # A lease renewal that changes no indexed column (jobstore.core.jobs.Job; migration 0009).
    Column("lease_renewed_until", Epoch()),
    # Stored on PostgreSQL, computed on reading on SQLite (which cannot add a stored column
    # to a table: migration 0010).
    Column("phase", String(8), Computed(PHASE, persisted=True), nullable=False),
    UniqueConstraint("cluster_id", "proc_id"),
    # The claim path: a queue's idle autoclusters (a skip scan), and each one's idle jobs in
    # claim order; partial, so finished jobs cost nothing.
    Index(
        "ix_jobs_claim",
        "queue",
        "autocluster_id",
        text("priority DESC"),
        "id",
        postgresql_where=text(CLAIMABLE),
        sqlite_where=text(CLAIMABLE),
    ),
    # The reaper's path: handed-out jobs by lease expiry.
    Index(
        "ix_jobs_lease",
        "lease_expires_at",
        postgresql_where=text(OUT_PHASE),
        sqlite_where=text(OUT_PHASE),
    ),
    # Fair share and concurrency limits: what the handed-out jobs hold, by submitter, and by
    # autocluster within its submitter (an autocluster has one).
    Index(
        "ix_jobs_active",
        "submitter",
        "autocluster_id",
        "slot_weight",
        postgresql_where=text(OUT_PHASE),
        sqlite_where=text(OUT_PHASE),
    ),
    # The periodic pass: jobs with periodic policy expressions.
    Index(
        "ix_jobs_periodic",
        "id",
        postgresql_where=text("periodic"),
        sqlite_where=text("periodic"),
    ),
    # Attempts stopped by the store whose end has not been reported (the agent's restart, a
    # pending release).
    Index(
        "ix_jobs_winding_down",
        "host",
        postgresql_where=text("winding_down_until IS NOT NULL"),
        sqlite_where=text("winding_down_until IS NOT NULL"),
    ),
    # Retention: finished jobs, oldest first (jobstore.db.retention).
    Index(
        "ix_jobs_finished",
        "finished_at",
        postgresql_where=text(FINISHED),
        sqlite_where=text(FINISHED),
    ),
    # condor_q's order over the unfinished jobs (`q -limit`, Schedd.query(limit=)): the
    # schedd's queue, without the history the table also holds (migration 0013).
    Index(
        "ix_jobs_queue_order",
        "cluster_id",
        "proc_id",
        postgresql_where=text(UNFINISHED),
        sqlite_where=text(UNFINISHED),
    ),
    # condor_q and the store's gauges: the unfinished jobs only, by phase (the status within
    # one is read from the row), so that a phase change is one entry here (none for the job
    # that finishes). History by owner goes through ix_jobs_finished.
    Index(
        "ix_jobs_unfinished",
        "queue",
        "phase",
        "owner",
        postgresql_where=text(UNFINISHED),
        sqlite_where=text(UNFINISHED),
    ),
)

job_events = Table(
    "job_events",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    # No foreign key (migration 0011): every event is written while its transaction holds the
    # job's row, and the pruner deletes a job's events with it.
    Column("job_id", BigId, nullable=False),
    Column("time", Epoch(), nullable=False),
    Column("event", String(32), nullable=False),
    Column("from_status", String(16)),
    Column("to_status", String(16)),
    Column("attempt", Integer),
    Column("slot", String(255)),
    Column("host", String(255)),
    Column("reason", Text),
    Column("attrs", JSON),
    Index("ix_job_events_job_id", "job_id"),
)

# PostgreSQL storage parameters per table (set by migration 0006). The hot tables are vacuumed
# after a small share of their rows died, not the default 20 %, so that a busy pool's dead
# tuples stay few; the jobs table leaves room in its pages for HOT updates of a report.
STORAGE_PARAMETERS: dict[str, dict[str, str]] = {
    "jobs": {
        "fillfactor": "80",
        "autovacuum_vacuum_scale_factor": "0.02",
        "autovacuum_vacuum_threshold": "200",
        "autovacuum_analyze_scale_factor": "0.02",
    },
    "job_events": {
        "autovacuum_vacuum_scale_factor": "0.02",
        "autovacuum_vacuum_insert_scale_factor": "0.05",
        "autovacuum_analyze_scale_factor": "0.05",
    },
    "clusters": {
        "autovacuum_vacuum_scale_factor": "0.05",
        "autovacuum_analyze_scale_factor": "0.05",
    },
    "submitters": {"autovacuum_vacuum_scale_factor": "0", "autovacuum_vacuum_threshold": "100"},
    "passes": {"autovacuum_vacuum_scale_factor": "0", "autovacuum_vacuum_threshold": "100"},
}

__all__ = [
    "metadata",
    "STORAGE_PARAMETERS",
    "clusters",
    "autoclusters",
    "autocluster_limits",
    "concurrency_limits",
    "submitters",
    "passes",
    "job_attr_rules",
    "notify_keys",
    "accounting_groups",
    "slots",
    "sandbox_files",
    "sandbox_chunks",
    "job_files",
    "jobs",
    "job_events",
    "Epoch",
    "BigId",
]
