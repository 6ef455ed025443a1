"""Least-privilege PostgreSQL grants: the role the agent and the hooks connect as, and the
roles of the submitters.

`jobstore init` runs as the role that owns the tables. The agent (and direct-mode hooks) need
far less: read the queue, write events, and change only the columns a claim, a transition or a
report changes. Never the owner, the command, the queue, the submitted ad, the user log path or
any other column that submit decides: even an agent that was talked into it cannot.

A submitter (`jobstore grant-user`) connects as her own role: she may read everything but an
attempt's token, and write nothing but through the door's functions (migration 0019), which
take her account from the session and check every value she stores: only as the account the
database says she is (or those a queue super user may impersonate), only her own jobs (or
every job, for a super user), only the accounting groups the admin's map grants her.
"""

from __future__ import annotations

import hashlib
import re

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from jobstore.core.fairshare import check_group_name
from jobstore.core.jobs import CHANGE_COLUMNS
from jobstore.db.backends.base import UserRights
from jobstore.db.backends.postgresql.queries import GRANT_TARGETS, QUERIES
from jobstore.db.schema import jobs
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
          "grant_deliveries", "grant_vacate_requests", "grant_event_logs", "grant_files",
          "grant_files_sequence",
          "grant_store_limits", "grant_dag_engine", "grant_notify_key",
          "grant_agent_drop_update_policy", "grant_agent_update_policy",
          "grant_agent_drop_event_policy", "grant_agent_event_policy",
          "grant_agent_drop_files_policy", "grant_agent_files_policy",
          "grant_agent_drop_chunks_policy", "grant_agent_chunks_policy",
          "grant_agent_drop_job_files_policy", "grant_agent_job_files_policy", "grant_dags",
          *(f"grant_agent{drop}_{table}_policy" for table in (
              "dags", "dag_nodes", "dag_edges", "dag_categories") for drop in ("_drop", "")))

# What `jobstore grant-user` gives a submitter's role, in order: reads, and the door.
USER_GRANTS = ("user_revoke", "user_revoke_sequences", "grant_schema", "user_read",
               "user_read_jobs", "user_door")
# The door's functions (migration 0019): every write a submitter makes is one of them.
DOOR_FUNCTIONS = (
    "jobstore_new_cluster(text, text, text, integer, text, double precision, text)",
    "jobstore_queue_jobs(bigint, json, double precision)",
    "jobstore_queue_procs(bigint, bigint[], json, integer, json, json, integer, integer,"
    " double precision)",
    "jobstore_store_file(text, text, bigint)",
    "jobstore_store_chunk(text, text, integer, bytea)",
    "jobstore_add_inputs(bigint, integer, json)",
    "jobstore_act(bigint[], text, text, integer, integer, boolean, double precision)",
    "jobstore_vacate(bigint[], boolean, text, boolean, double precision)",
    "jobstore_edit(bigint[], text, text, text[], boolean, double precision)",
    "jobstore_set_factor(text, double precision)",
    "jobstore_reset_usage(text, double precision)",
    "jobstore_new_dag(text, text, text, text, integer, integer, json, double precision, text)",
    "jobstore_dag_nodes(bigint, json, json, json, double precision)",
    "jobstore_dag_settings(bigint, text, integer, integer, integer)",
    "jobstore_dag_script_options(bigint, json)",
    "jobstore_start_dag(bigint, double precision)",
    "jobstore_pause_dag(bigint, boolean, double precision)",
    "jobstore_remove_dag(bigint, text, double precision)",
)
SECRET_COLUMNS = ("token",)  # of jobs: never a submitter's to read
# A role name as PostgreSQL takes it unquoted or quoted; nothing that needs escaping in a message.
ROLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.@-]{0,62}")


class PgRoles:
    """jobstore.db.backends.Roles on PostgreSQL."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.quote = engine.dialect.identifier_preparer.quote

    def hook_statements(self, role: str) -> list[str]:
        """The statements that give `role` what the agent and the hooks need and nothing else."""
        quote = self.quote
        with self.engine.connect() as conn:
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

    def grant_hook(self, role: str) -> list[str]:
        """Apply `hook_statements` in one transaction; returns them."""
        statements = self.hook_statements(role)
        with self.engine.begin() as conn:
            for sql in statements:
                conn.execute(text(sql))
        return statements

    def user_statements(self, role: str, rights: UserRights) -> list[str]:
        """The statements that let `role` read the queue and write through the door (what it may
        do there, its rights say: `user_register`)."""
        quote = self.quote
        if not ROLE_NAME.fullmatch(role):
            raise InvalidInput(f"{role!r} is not a role name jobstore grants")
        if rights.may_impersonate is not None and not rights.super_user:
            raise InvalidInput("--may-impersonate is for a queue super user (--super-user)")
        for group in rights.accounting_groups:
            check_group_name("--accounting-group", group)
        with self.engine.connect() as conn:
            found = conn.execute(GRANT_TARGETS).mappings().one()
            if rights.may_impersonate is not None:
                self._check_pattern(conn, rights.may_impersonate)
        if found["sequence"] is None:
            raise InvalidInput("the job store's tables are missing: run `jobstore init` first")
        names = {
            "role": quote(role),
            "schema": quote(found["schema"]),
            "readable": ", ".join(quote(c.name) for c in jobs.c if c.name not in SECRET_COLUMNS),
            "door": ", ".join(DOOR_FUNCTIONS),
        }
        return [QUERIES[name].sql.format(**names) for name in USER_GRANTS]

    @staticmethod
    def _check_pattern(conn: Connection, pattern: str) -> None:
        """InvalidInput unless `pattern` is one regular expression PostgreSQL takes, alone and
        as the whole-name match jobstore_may_submit_as makes of it."""
        try:
            valid = conn.exec_driver_sql(QUERIES["user_check_pattern"].sql,
                                         {"pattern": pattern}).scalar()
        except DBAPIError as exc:
            first = str(exc.orig).strip().splitlines()[0]
            raise InvalidInput(f"--may-impersonate: {first}") from None
        if not valid:
            raise InvalidInput(f"--may-impersonate {pattern!r} is not one regular expression "
                               "PostgreSQL takes as a whole account name (its parentheses and "
                               "escapes must stand on their own)")

    def grant_user(self, role: str, rights: UserRights) -> list[str]:
        """Apply `user_statements` and record the role's rights, in one transaction."""
        statements = self.user_statements(role, rights)
        with self.engine.begin() as conn:
            for sql in statements:
                conn.execute(text(sql))
            conn.exec_driver_sql(QUERIES["user_register"].sql, {
                "role": role, "account": rights.account, "super_user": rights.super_user,
                "may_impersonate": rights.may_impersonate, "admin": rights.admin})
            for group in rights.accounting_groups:
                conn.exec_driver_sql(QUERIES["user_accounting_group"].sql, {
                    "account": rights.account or role, "name": group})
        return statements

    def revoke_user(self, role: str) -> None:
        """Take every right on the job store's tables from `role` and forget its rights."""
        quote = self.quote
        with self.engine.begin() as conn:
            conn.execute(text(QUERIES["user_revoke"].sql.format(role=quote(role))))
            conn.exec_driver_sql(QUERIES["user_forget"].sql, {"role": role})
