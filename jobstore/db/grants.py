"""Least-privilege PostgreSQL grants: the role the agent and the hooks connect as, and the
roles of the submitters.

`jobstore init` runs as the role that owns the tables. The agent (and direct-mode hooks) need
far less: read the queue, write events, and change only the columns a claim, a transition or a
report changes. Never the owner, the command, the queue, the submitted ad, the user log path or
any other column that submit decides: even an agent that was talked into it cannot.

A submitter (`jobstore grant-user`) connects as her own role: she may read everything, queue
jobs and act on jobs, and the row-level security of migration 0012 limits which: only as the
account the database says she is (or those a queue super user may impersonate), only her own
jobs (or every job, for a super user).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from jobstore.core.jobs import CHANGE_COLUMNS
from jobstore.db.backends import backend_for
from jobstore.db.sql import GRANT_TARGETS, QUERIES
from jobstore.errors import InvalidInput

# Columns of `jobs` written by the claim, the state transitions and the reports; nothing else.
HOOK_UPDATE_COLUMNS = (
    "status",
    "token",
    "claims",
    "attempts",
    "lease_expires_at",
    "lease_renewed_until",
    "slot",
    "host",
    "keyword",
    "fetched_at",
    "started_at",
    "finished_at",
    "updated_at",
    "reason",
    "slot_weight",
    "hold_code",
    "hold_subcode",
    "num_holds",
    "winding_down_until",
    "release_pending",
    "num_starts",
    "first_started_at",
    "wall_clock",
    *CHANGE_COLUMNS,
)

# The statements of queries.sql that make the grants, in order.
GRANTS = ("grant_revoke", "grant_schema", "grant_read", "grant_update", "grant_limit_locks",
          "grant_accountant", "grant_passes", "grant_slots", "grant_events", "grant_sequence",
          "grant_files", "grant_files_sequence", "grant_store_limits",
          "grant_agent_drop_update_policy", "grant_agent_update_policy",
          "grant_agent_drop_event_policy", "grant_agent_event_policy",
          "grant_agent_drop_files_policy", "grant_agent_files_policy",
          "grant_agent_drop_chunks_policy", "grant_agent_chunks_policy",
          "grant_agent_drop_job_files_policy", "grant_agent_job_files_policy", "grant_dags",
          *(f"grant_agent{drop}_{table}_policy" for table in (
              "dags", "dag_nodes", "dag_edges", "dag_categories") for drop in ("_drop", "")))

# Columns of `jobs` a submitter may change on the jobs she may act on: what hold, release, rm
# and condor_qedit write (a hold or rm ends an attempt: its token, lease and wall clock). Never
# the ids, the owner, the queue, the claim (claims, slot, host, keyword), the slot's weight that
# fair share counts, or the usage and exit a slot reported.
USER_UPDATE_COLUMNS = (
    "priority", "ad", "cmd", "request_cpus", "request_memory", "request_disk",
    "requirements", "max_attempts", "success_exit_code", "retry_until", "max_retries",
    "user_log", "submitter", "concurrency_limits", "autocluster_id", "periodic",
    "reason", "hold_code", "hold_subcode", "num_holds", "release_pending",
    "winding_down_until", "attempts", "token", "finished_at", "wall_clock",
    "lease_expires_at", "updated_at", "status", "lease_renewed_until",
)
USER_GRANTS = ("user_revoke", "grant_schema", "user_read", "user_submit", "user_files",
               "user_store_limits", "user_dags", "user_submitters", "user_act",
               "user_sequences_grant")
# A role name as PostgreSQL takes it unquoted or quoted; nothing that needs escaping in a message.
ROLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.@-]{0,62}")


@dataclass(frozen=True)
class UserRights:
    """What `jobstore grant-user` gives a role."""

    account: str | None = None  # the OS account its members submit as (None: the role's name)
    super_user: bool = False
    may_impersonate: str | None = None  # a regular expression, as QUEUE_SUPER_USER_MAY_IMPERSONATE
    admin: bool = False


def hook_role_statements(engine: Engine, role: str) -> list[str]:
    """The statements that give `role` what the agent and the hooks need and nothing else."""
    quote = backend_for(engine).quote()
    with engine.connect() as conn:
        found = conn.execute(GRANT_TARGETS).mappings().one()
    if found["sequence"] is None:
        raise InvalidInput("the job store's tables are missing: run `jobstore init` first")
    names = {
        "role": quote(role),
        "schema": quote(found["schema"]),
        "sequence": found["sequence"],  # already quoted by pg_get_serial_sequence
        "files_sequence": found["files_sequence"],
        "columns": ", ".join(quote(c) for c in HOOK_UPDATE_COLUMNS),
        "policy": "jobstore_agent_" + hashlib.sha1(role.encode()).hexdigest()[:16],
    }
    return [QUERIES[name].sql.format(**names) for name in GRANTS]


def grant_hook_role(engine: Engine, role: str) -> list[str]:
    """Apply `hook_role_statements` in one transaction; returns them."""
    statements = hook_role_statements(engine, role)
    with engine.begin() as conn:
        for sql in statements:
            conn.execute(text(sql))
    return statements


def user_role_statements(engine: Engine, role: str, rights: UserRights) -> list[str]:
    """The statements that let `role` submit, read, and act on what its rights allow."""
    quote = backend_for(engine).quote()
    if not ROLE_NAME.fullmatch(role):
        raise InvalidInput(f"{role!r} is not a role name jobstore grants")
    if rights.may_impersonate is not None and not rights.super_user:
        raise InvalidInput("--may-impersonate is for a queue super user (--super-user)")
    with engine.connect() as conn:
        schema = conn.execute(GRANT_TARGETS).mappings().one()["schema"]
        found = conn.execute(QUERIES["user_sequences"].clause).mappings().one()
        if rights.may_impersonate is not None:
            _check_pattern(conn, rights.may_impersonate)
    if any(v is None for v in found.values()):
        raise InvalidInput("the job store's tables are missing: run `jobstore init` first")
    names = {
        "role": quote(role),
        "schema": quote(schema),
        "sequences": ", ".join(str(v) for v in found.values()),
        "columns": ", ".join(quote(c) for c in USER_UPDATE_COLUMNS),
    }
    out = [QUERIES[name].sql.format(**names) for name in USER_GRANTS]
    if rights.admin:
        out.append(QUERIES["user_admin"].sql.format(**names))
    return out


def _check_pattern(conn: Connection, pattern: str) -> None:
    """ValueError unless the database takes `pattern` as jobstore_may_submit_as will use it
    (PostgreSQL's regular expressions, not Python's)."""
    try:
        conn.exec_driver_sql(QUERIES["user_check_pattern"].sql, {"pattern": pattern})
    except DBAPIError as exc:
        first = str(exc.orig).strip().splitlines()[0]
        raise InvalidInput(f"--may-impersonate is not a regular expression PostgreSQL takes: "
                           f"{first}") from None


def grant_user_role(engine: Engine, role: str, rights: UserRights) -> list[str]:
    """Apply `user_role_statements` and record the role's rights, in one transaction."""
    statements = user_role_statements(engine, role, rights)
    with engine.begin() as conn:
        for sql in statements:
            conn.execute(text(sql))
        conn.exec_driver_sql(QUERIES["user_register"].sql, {
            "role": role, "account": rights.account, "super_user": rights.super_user,
            "may_impersonate": rights.may_impersonate, "admin": rights.admin})
    return statements


def revoke_user_role(engine: Engine, role: str) -> None:
    """Take every right on the job store's tables from `role` and forget its rights."""
    quote = backend_for(engine).quote()
    with engine.begin() as conn:
        conn.execute(text(QUERIES["user_revoke"].sql.format(role=quote(role))))
        conn.exec_driver_sql(QUERIES["user_forget"].sql, {"role": role})
