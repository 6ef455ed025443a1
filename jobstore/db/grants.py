"""Least-privilege PostgreSQL grants for the role the agent and the hooks connect as.

`jobstore init` runs as the role that owns the tables. The agent (and direct-mode hooks) need
far less: read the queue, write events, and change only the columns a claim, a transition or a
report changes. Never the owner, the command, the queue, the submitted ad, the user log path or
any other column that submit decides: even an agent that was talked into it cannot.
"""

from __future__ import annotations

from sqlalchemy import Engine, text

from jobstore.core.jobs import CHANGE_COLUMNS
from jobstore.db.sql import GRANT_TARGETS, QUERIES

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
          "grant_accountant", "grant_passes", "grant_events", "grant_sequence")


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
    return [QUERIES[name].sql.format(**names) for name in GRANTS]


def grant_hook_role(engine: Engine, role: str) -> list[str]:
    """Apply `hook_role_statements` in one transaction; returns them."""
    statements = hook_role_statements(engine, role)
    with engine.begin() as conn:
        for sql in statements:
            conn.execute(text(sql))
    return statements
