"""Least-privilege PostgreSQL grants for the role the agent and the hooks connect as.

`jobstore init` runs as the role that owns the tables. The agent (and direct-mode hooks) need
far less: read the queue, write events, and change only the columns a claim, a transition or a
report changes. Never the owner, the command, the queue, the submitted ad, the user log path or
any other column that submit decides: even an agent that was talked into it cannot.
"""

from __future__ import annotations

from sqlalchemy import Engine, text

from jobstore.core.jobs import CHANGE_COLUMNS
from jobstore.db.sql import GRANT_TARGETS

# Columns of `jobs` written by the claim, the state transitions and the reports; nothing else.
HOOK_UPDATE_COLUMNS = (
    "status",
    "token",
    "claims",
    "attempts",
    "lease_expires_at",
    "slot",
    "host",
    "keyword",
    "fetched_at",
    "started_at",
    "finished_at",
    "updated_at",
    "reason",
    *CHANGE_COLUMNS,
)
TABLES = ("clusters", "jobs", "job_events")

# Named statements (`{role}`, `{schema}`, `{sequence}` are quoted identifiers filled in below).
# revoke: start from nothing on the job store's tables.
REVOKE_SQL = "REVOKE ALL ON clusters, jobs, job_events FROM {role}"
# schema: let the role see the schema the tables live in.
SCHEMA_SQL = "GRANT USAGE ON SCHEMA {schema} TO {role}"
# read: the queue, the clusters (job ads) and the events (user logs, watch).
READ_SQL = "GRANT SELECT ON clusters, jobs, job_events TO {role}"
# update: the columns a claim, a transition or a report may change (also FOR UPDATE locks).
UPDATE_SQL = "GRANT UPDATE ({columns}) ON jobs TO {role}"
# events: append the transition and report events, and take their ids.
EVENTS_SQL = "GRANT INSERT ON job_events TO {role}"
SEQUENCE_SQL = "GRANT USAGE ON SEQUENCE {sequence} TO {role}"


def hook_role_statements(engine: Engine, role: str) -> list[str]:
    """The statements that give `role` what the agent and the hooks need and nothing else."""
    if engine.dialect.name != "postgresql":
        raise ValueError("database roles exist on PostgreSQL only")
    quote = engine.dialect.identifier_preparer.quote
    with engine.connect() as conn:
        found = conn.execute(GRANT_TARGETS).mappings().one()
    if found["sequence"] is None:
        raise ValueError("the job store's tables are missing: run `jobstore init` first")
    names = {
        "role": quote(role),
        "schema": quote(found["schema"]),
        "sequence": found["sequence"],  # already quoted by pg_get_serial_sequence
        "columns": ", ".join(quote(c) for c in HOOK_UPDATE_COLUMNS),
    }
    return [
        sql.format(**names)
        for sql in (REVOKE_SQL, SCHEMA_SQL, READ_SQL, UPDATE_SQL, EVENTS_SQL, SEQUENCE_SQL)
    ]


def grant_hook_role(engine: Engine, role: str) -> list[str]:
    """Apply `hook_role_statements` in one transaction; returns them."""
    statements = hook_role_statements(engine, role)
    with engine.begin() as conn:
        for sql in statements:
            conn.execute(text(sql))
    return statements
