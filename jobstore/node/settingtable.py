"""Every setting of the job store, declared once: its parameter, type, default and meaning.

`jobstore.node.config` reads the configuration through this table, the dataclasses there take
their defaults from it, and docs/settings.md is rendered from it (`python -m
jobstore.node.settingspage`; a test fails when the page and the table differ).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from jobstore.node.hookproc import DEFAULT_SOCKET
from jobstore.node.hooktable import FETCH_WAIT_LIMIT
from jobstore.node.sandbox import OUTPUT_SECONDS, URL_SECONDS

# How a setting is looked up (the page explains each):
KEYWORD = "keyword"  # <KEYWORD>_JOBSTORE_X, then JOBSTORE_X (`param` is JOBSTORE_X)
NODE = "node"  # the parameter as named, once per node (the agent's, HTCondor's own)
ENVIRONMENT = "environment"  # only the hook's environment variable of that name


class Setting(NamedTuple):
    """One setting. `kind` says how its text is read (config's readers); `default` is the
    value when it is unset, `shown` the default as the page shows it when the value alone
    would not say it."""

    param: str
    field: str
    kind: str
    default: object
    meaning: str
    scope: str = KEYWORD
    minimum: float | None = None
    maximum: float | None = None  # a larger value is refused ("seconds") or taken as this
    environment: bool = False  # $<param> wins over the configuration
    fallback: str | None = None  # HTCondor's own parameter, read when this one is unset
    joined: tuple[str, ...] = ()  # further parameters whose lists are read with this one
    zero: bool = False  # "seconds": 0 is allowed
    shown: str | None = None
    unit: str = ""


KEYWORD_SETTINGS: tuple[Setting, ...] = (
    Setting("JOBSTORE_DATABASE_URL", "database_url", "database url", None,
            "SQLAlchemy URL of the job store, e.g. `postgresql+psycopg://jobstore@db/jobstore`",
            environment=True,
            shown="a SQLite file under `~/.local/share/htcondor-jobstore`"),
    Setting("JOBSTORE_DATABASE_PASSWORD_FILE", "", "path", None,
            "file whose first line is the database password (mode 600, as libpq wants a "
            ".pgpass); keeps it out of world-readable configuration"),
    Setting("JOBSTORE_QUEUE", "queue", "text", "default", "the queue this keyword pulls from"),
    Setting("JOBSTORE_ALLOWED_OWNERS", "allowed_owners", "names", ("*",),
            "accounts whose jobs may run (`*`: any ordinary account); root and system accounts "
            "(uid < 1000, nobody) are always refused, at submit and again at fetch"),
    Setting("JOBSTORE_SCHEDD_NAME", "schedd_name", "text", None,
            "the name of this access point: a job submitted here (not spooled) has its "
            "outputs written into its Iwd by the `jobstore schedd` of that name",
            fallback="SCHEDD_NAME", environment=True,
            shown="HTCondor's `SCHEDD_NAME`, else the host's name"),
    Setting("JOBSTORE_UID_DOMAIN", "uid_domain", "text", "localdomain",
            "the domain in `User = \"owner@domain\"`", fallback="UID_DOMAIN",
            shown="HTCondor's `UID_DOMAIN` (its default: the host's name)"),
    Setting("JOBSTORE_CLAIM_LEASE", "claim_lease", "integer", 120,
            "a fetched or accepted job that no starter hook reports on within this time goes "
            "back to idle", minimum=5, unit="s"),
    Setting("JOBSTORE_LEASE_DURATION", "lease_duration", "integer", 900,
            "a running job whose starter stops reporting for this long goes back to idle; keep "
            "it above 2.5 × `STARTER_UPDATE_INTERVAL` (300 s by default): a report renews it "
            "unless it was renewed within its last tenth, so one lost update never lets it run "
            "out", minimum=10, unit="s"),
    Setting("JOBSTORE_MAX_ATTEMPTS", "max_attempts", "integer", 5,
            "attempts of a job without `max_retries`", minimum=1),
    Setting("JOBSTORE_JOB_LEASE_DURATION", "job_lease_duration", "integer", 2400,
            "`JobLeaseDuration` put in the job ad (bounds the fetch claim's Claimed/Idle time)",
            minimum=60, unit="s"),
    Setting("JOBSTORE_CONNECT_TIMEOUT", "connect_timeout", "integer", 3,
            "how long a hook or the agent waits to connect to the database", minimum=1,
            unit="s"),
    Setting("JOBSTORE_STATEMENT_TIMEOUT_MS", "statement_timeout_ms", "integer", 5000,
            "the longest one statement of a hook or the agent may take", minimum=100,
            unit="ms"),
    Setting("JOBSTORE_FETCH_DEADLINE", "fetch_deadline", "integer", 10.0,
            "fetch_job prints nothing and exits after this long, whatever it is waiting for "
            "(in agent mode, plus the wait the agent announces)", minimum=1, unit="s"),
    Setting("JOBSTORE_FETCH_WAIT", "fetch_wait", "integer", 5.0,
            "agent mode: a fetch that finds nothing waits up to this long in the agent for "
            "work that fits its slot (each between 0.75 and 1 × this, at random; 0: answer at "
            "once); the agent moves the hook's deadline on by as much (`50-jobstore.conf` sets "
            "120)", minimum=0, maximum=FETCH_WAIT_LIMIT, unit="s"),
    Setting("JOBSTORE_HOOK_LOG", "hook_log", "path", None,
            "file where the hooks and the agent log the calls (REPLY_FETCH and UPDATE_JOB_INFO "
            "have no stderr)", environment=True),
    Setting("JOBSTORE_SPOOL", "spool", "path", "/var/lib/jobstore/spool",
            "local directory (root's, mode 1733; files 0600) where a report waits until the "
            "database has it; the agent creates it", environment=True),
    Setting("JOBSTORE_DAG_SCRIPTS", "dag_scripts", "path", "/var/lib/jobstore/dagscripts",
            "where `jobstore schedd` keeps the exits of the DAG node scripts it runs, so that a "
            "restarted service loses none: its own directory, mode 0700, with a directory in "
            "it per access point and store (it makes them; run as an ordinary account, "
            "~/.local/state/htcondor-jobstore/dagscripts); no directory above it may be one "
            "another account may change, unless sticky",
            environment=True),
    Setting("JOBSTORE_SANDBOX_ROOT", "sandbox_root", "path", "/var/lib/jobstore/sandboxes",
            "where fetched jobs with file transfer get their sandboxes: root's, mode 1777 (the "
            "agent makes it; without an agent, the admin: `install -d -m 1777 -o root DIR`)",
            environment=True),
    Setting("JOBSTORE_MAX_OUTPUT_FILE_MB", "max_output_mb", "integer", 1024,
            "the largest output file a job sends back into the store (the agent refuses more)",
            minimum=1, unit="MB"),
    Setting("JOBSTORE_MAX_OUTPUT_MB", "max_job_output_mb", "integer", 0,
            "what one attempt of a job may send back in all, outputs and checkpoints (0: its "
            "`RequestDisk`); `jobstore init` writes it into the store, the agent and the "
            "database enforce it", minimum=0, unit="MB"),
    Setting("JOBSTORE_MAX_INPUT_FILE_MB", "max_input_file_mb", "integer", 1024,
            "the largest input file a job may store at submit: `jobstore init` writes it into "
            "the store, every submit reads it from there, and PostgreSQL's triggers refuse more "
            "whatever the client", minimum=0, unit="MB"),
    Setting("JOBSTORE_MAX_INPUT_MB", "max_input_mb", "integer", 4096,
            "the most input one job may store at submit (as `MAX_INPUT_FILE_MB`)", minimum=0,
            unit="MB"),
    Setting("JOBSTORE_INPUT_CACHE_MB", "input_cache_mb", "integer", 10240,
            "the agent's copies of inputs on this node (`SANDBOX_ROOT/.jobstore-cache`), least "
            "recently used first out", minimum=0, unit="MB"),
    Setting("JOBSTORE_FAIR_SHARE", "fair_share", "boolean", True,
            "a fetching slot serves the submitter furthest below its share of the slots, as the "
            "negotiator does (`false`: `priority` and age only)"),
    Setting("JOBSTORE_PRIORITY_HALFLIFE", "priority_halflife", "seconds", 86400.0,
            "the half-life of a submitter's real priority", fallback="PRIORITY_HALFLIFE",
            unit="s"),
    Setting("JOBSTORE_PRIORITY_UPDATE_INTERVAL", "priority_update_interval", "integer", 60,
            "how often the accountant writes the submitters' decayed priorities and usage",
            minimum=1, unit="s"),
    Setting("JOBSTORE_CONCURRENCY_LIMITS", "concurrency_limits", "boolean", True,
            "enforce the jobs' `concurrency_limits` (maxima from `<NAME>_LIMIT`, "
            "`CONCURRENCY_LIMIT_DEFAULT`)"),
    Setting("JOBSTORE_PERIODIC_EXPR_INTERVAL", "periodic_expr_interval", "integer", 60,
            "how often the jobs' periodic policy (`periodic_hold`, ...) is evaluated",
            minimum=1, fallback="PERIODIC_EXPR_INTERVAL", unit="s"),
    Setting("JOBSTORE_CHECK_LAUNCH", "check_launch", "boolean", True,
            "PREPARE_JOB holds a job that its user cannot start (its executable, its directory), "
            "with HTCondor's hold reason, before it runs"),
    Setting("JOBSTORE_HISTORY_RETENTION", "history_retention", "duration", 30 * 86400.0,
            "how long finished jobs and their events are kept (`30d`, `12h`, seconds; 0 keeps "
            "everything)", shown="30d"),
    Setting("JOBSTORE_PRUNE_INTERVAL", "prune_interval", "integer", 300,
            "how often the agents prune the history, pool-wide", minimum=10, unit="s"),
    Setting("IMMUTABLE_JOB_ATTRS", "immutable_attrs", "attribute names", (),
            "attributes never submitted nor edited; `jobstore init` writes "
            "them into the store, whose door enforces them (HTCondor's system lists always "
            "apply)", scope=NODE, joined=("SECURE_JOB_ATTRS",)),
    Setting("PROTECTED_JOB_ATTRS", "protected_attrs", "attribute names", (),
            "attributes only a queue super user edits (as "
            "`IMMUTABLE_JOB_ATTRS`)", scope=NODE),
)

AGENT_SETTINGS: tuple[Setting, ...] = (
    Setting("JOBSTORE_AGENT_SOCKET", "socket", "path", DEFAULT_SOCKET,
            "the agent's unix socket; `55-jobstore-agent.conf` hands it to the hooks in "
            "`STARTD_ENVIRONMENT`", scope=NODE, environment=True),
    Setting("JOBSTORE_AGENT_STARTD_USERS", "startd_users", "names", ("condor",),
            "the service accounts the startd's hooks run as (their calls are served first; a "
            "job never runs as one of them)", scope=NODE,
            shown="`condor` (and, for the agent, its own account)"),
    Setting("JOBSTORE_AGENT_LOG", "log", "path", None,
            "the agent's log (`55-jobstore-agent.conf`: `$(LOG)/JobstoreAgentLog`)",
            scope=NODE),
    Setting("JOBSTORE_AGENT_WORKERS", "workers", "integer", 8,
            "threads that serve the hooks' calls", scope=NODE, minimum=2),
    Setting("JOBSTORE_AGENT_SERVICE_WORKERS", "service_workers", "integer", 2,
            "of those, kept for the service accounts' calls (less than `WORKERS`)",
            scope=NODE, minimum=1),
    Setting("JOBSTORE_AGENT_MAX_SERVICE_CLIENTS", "max_service_clients", "integer", 512,
            "connections of the service accounts, in all", scope=NODE, minimum=1),
    Setting("JOBSTORE_AGENT_MAX_CLIENTS", "max_clients", "integer", 128,
            "connections of all other accounts together", scope=NODE, minimum=1),
    Setting("JOBSTORE_AGENT_MAX_CLIENTS_PER_UID", "max_clients_per_uid", "integer", 16,
            "... and of each of them", scope=NODE, minimum=1),
    Setting("JOBSTORE_AGENT_MAX_BYTES_PER_UID", "max_bytes_per_uid", "integer", 8 * 1024 * 1024,
            "request bytes in flight per account other than a service account", scope=NODE,
            minimum=64 * 1024, unit="B", shown="8 MiB"),
    Setting("JOBSTORE_AGENT_READ_TIMEOUT", "read_timeout", "integer", 5.0,
            "how long a caller may take to send its request", scope=NODE, minimum=1,
            unit="s"),
    Setting("JOBSTORE_AGENT_REPLAY_INTERVAL", "replay_interval", "integer", 60,
            "how often the agent sends the reports left in the spools", scope=NODE, minimum=1,
            unit="s"),
    Setting("JOBSTORE_AGENT_DB_OVERFLOW", "db_overflow", "integer", 0,
            "database connections opened beyond the kept one under a burst (closed right "
            "after use)", scope=NODE, minimum=0),
    Setting("JOBSTORE_AGENT_WATCH_INTERVAL", "watch_interval", "integer", 2.0,
            "seconds between two looks at the attempts this node runs", scope=NODE,
            minimum=1, unit="s"),
    Setting("JOBSTORE_AGENT_WATCH_LISTEN", "watch_listen", "boolean", True,
            "on PostgreSQL, be told of stopped attempts (LISTEN/NOTIFY) besides looking; "
            "`false`: look only", scope=NODE),
    Setting("JOBSTORE_AGENT_VACATE_COMMAND", "vacate_command", "text", None,
            "a command run instead of the startd's vacate (an emulator's)", scope=NODE),
    Setting("JOBSTORE_AGENT_NUDGE_COMMAND", "nudge_command", "command",
            "condor_update_machine_ad",
            "what sends the startd `UPDATE_MACHINE_AD` so that its slots fetch at once "
            "(`false`: nothing)", scope=NODE),
    Setting("JOBSTORE_AGENT_METRICS_PORT", "metrics_port", "port", 0,
            "serve Prometheus metrics on this port (0: not served)", scope=NODE),
    Setting("JOBSTORE_AGENT_METRICS_ADDRESS", "metrics_address", "loopback address",
            "127.0.0.1", "the metrics' address: a loopback address only", scope=NODE),
    Setting("JOBSTORE_AGENT_METRICS_STORE", "metrics_store", "boolean", False,
            "the metrics carry the job store's view too (`jobstore metrics`)", scope=NODE),
    Setting("JOBSTORE_AGENT_EXPRESSION_TIMEOUT", "expression_timeout", "seconds", 2.0,
            "the longest a job's expression may take to evaluate", scope=NODE, maximum=3600,
            unit="s"),
    Setting("JOBSTORE_AGENT_EXPRESSION_WORKERS", "expression_workers", "integer", 3,
            "the processes that evaluate the jobs' expressions", scope=NODE, minimum=1),
    Setting("JOBSTORE_AGENT_REPORT_DELAY", "report_delay", "seconds", 1.0,
            "the longest REPLY_FETCH's and UPDATE_JOB_INFO's reports wait for the attempt's "
            "next one, to go in with it (0: each applied as it comes)", scope=NODE,
            maximum=30, zero=True, unit="s"),
    Setting("MACHINE_MAX_VACATE_TIME", "max_vacate_time", "vacate time", 600.0,
            "a graceful vacate's longest grace (a constant expression)",
            scope=NODE, unit="s"),
    Setting("UPDATE_INTERVAL", "update_interval", "integer", 300,
            "how often the agent publishes the startd's slot ads", scope=NODE,
            minimum=1, unit="s"),
    Setting("CLASSAD_LIFETIME", "classad_lifetime", "integer", 900,
            "how long a published slot ad is shown", scope=NODE, minimum=1,
            unit="s"),
)

# Read from the environment of a hook or a command only (never from the configuration).
ENVIRONMENT_ONLY: tuple[Setting, ...] = (
    Setting("JOBSTORE_HOOK_MODE", "", "text", None,
            "`direct`: the hooks never ask the agent; `agent`: they never work without it "
            "(empty: ask the agent, work alone when it cannot be reached)", scope=ENVIRONMENT),
    Setting("JOBSTORE_OUTPUT_SECONDS", "", "seconds", OUTPUT_SECONDS,
            "how long JOB_EXIT may spend sending outputs before it hands the rest to the agent",
            scope=ENVIRONMENT, zero=True, unit="s"),
    Setting("JOBSTORE_URL_TIMEOUT", "", "seconds", URL_SECONDS,
            "how long a URL input may keep PREPARE_JOB waiting for its next bytes",
            scope=ENVIRONMENT, minimum=0.1, unit="s"),
    Setting("JOBSTORE_COMMAND_SERVER", "", "boolean", True,
            "`false`: `jobstore` commands never hand their work to a running command server",
            scope=ENVIRONMENT),
    Setting("JOBSTORE_WATCH_POLL", "", "boolean", False,
            "`jobstore watch` polls instead of LISTEN, as `--poll` (behind PgBouncer in "
            "transaction mode)", scope=ENVIRONMENT),
)

ALL_SETTINGS = KEYWORD_SETTINGS + AGENT_SETTINGS + ENVIRONMENT_ONLY
BY_PARAM = {s.param: s for s in ALL_SETTINGS}
BY_FIELD = {s.field: s for s in KEYWORD_SETTINGS if s.field}
AGENT_BY_FIELD = {s.field: s for s in AGENT_SETTINGS}


def default(field: str) -> Any:
    """The default of a keyword's setting, by its field in config.Settings."""
    return BY_FIELD[field].default


def agent_default(field: str) -> Any:
    """The default of an agent setting, by its field in config.AgentSettings."""
    return AGENT_BY_FIELD[field].default
