"""The PostgreSQL backend's statements (queries.sql), by name."""

from __future__ import annotations

from functools import lru_cache

from jobstore.db.backends.statements import load

QUERIES = load("jobstore.db.backends.postgresql")
# {name} in a statement is never a value: an identifier or a SET list, filled in before.
CLAIM_IN_AUTOCLUSTERS = QUERIES["claim_in_autoclusters"].sql  # str.format(assignments=...)
IDLE_AUTOCLUSTERS = QUERIES["idle_autoclusters"].sql
BEGIN_TRANSACTION = QUERIES["begin_transaction"].sql
JOB_HEADS = QUERIES["job_heads"].sql
READ_JOB = QUERIES["read_job"].sql
READ_JOBS = QUERIES["read_jobs"].sql
LOCK_JOB = QUERIES["lock_job"].sql
RECORD_TRANSITION = QUERIES["record_transition"].sql  # str.format(assignments=...)
RECORD_EVENT = QUERIES["record_event"].sql
UPDATE_JOB_ROW = QUERIES["update_job_row"].sql  # str.format(assignments=...)
INSERT_EVENTS = QUERIES["insert_events"].sql
FILE_CHUNKS = QUERIES["file_chunks"].sql
LOCK_LIMITS = QUERIES["lock_limits"].sql
NOTIFY_EVENT = QUERIES["notify_event"].sql
NOTIFY_SIGNED = QUERIES["notify_signed"].sql
NOTIFY_KEY = QUERIES["notify_key"].sql
# ids reserved from a table's sequence (PostgreSQL's COPY of numbered rows), by table
NEXT_IDS = {"jobs": QUERIES["next_job_ids"].sql, "clusters": QUERIES["next_cluster_ids"].sql}
LISTEN_EVENTS = QUERIES["listen_events"].sql
LISTEN_STOPS = QUERIES["listen_stops"].sql
LISTEN_WORK = QUERIES["listen_work"].sql
# without parameters, run through SQLAlchemy
SNAPSHOT_BOUNDS = QUERIES["snapshot_bounds"].clause
XACT_HORIZON = QUERIES["xact_horizon"].clause
GRANT_TARGETS = QUERIES["grant_targets"].clause
SESSION_IDENTITY = QUERIES["session_identity"].clause
READS_TOKENS = QUERIES["reads_tokens"].clause
TABLE_ROWS_ESTIMATE = QUERIES["table_rows_estimate"].clause
AUTOVACUUM_SETTING = QUERIES["autovacuum_setting"].clause


@lru_cache(maxsize=16)
def opening(first: str | None) -> str:
    """BEGIN_TRANSACTION followed by the transaction's `first` statement, if any: one simple
    query, one round trip (jobstore.db.backends.postgresql.driver.begin)."""
    return BEGIN_TRANSACTION if first is None else f"{BEGIN_TRANSACTION}; {first}"


def without_begin(statement: str) -> str:
    """The transaction's first statement in an `opening` (`statement` itself otherwise): what
    to EXPLAIN."""
    prefix = f"{BEGIN_TRANSACTION}; "
    return statement[len(prefix):] if statement.startswith(prefix) else statement
