"""The hand-written SQL statements (queries.sql), loaded once, each by its name."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files

from sqlalchemy import TextClause, bindparam, text

from jobstore.errors import InvalidInput


@dataclass(frozen=True)
class Statement:
    """One named statement of queries.sql."""

    name: str
    purpose: str  # its comment lines
    sql: str  # without the trailing semicolon

    @property
    def clause(self) -> TextClause:
        return text(self.sql)

    def expanding(self, *names: str) -> TextClause:
        """The statement with `IN :name` parameters that take a list."""
        return text(self.sql).bindparams(*(bindparam(n, expanding=True) for n in names))


_NAME = re.compile(r"^-- name: (\w+)\n", re.M)


def parse(source: str) -> dict[str, Statement]:
    """The statements of a queries.sql text, by name: the comment lines after `-- name:` are the
    purpose, the SQL runs to the first line that ends with `;`; whatever follows (a comment about
    the next statements) is not part of it. ValueError for a statement without either."""
    found: dict[str, Statement] = {}
    parts = _NAME.split(source)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = body.strip().splitlines()
        lead = next((i for i, ln in enumerate(lines) if not ln.startswith("--")), len(lines))
        end = next((i for i in range(lead, len(lines)) if lines[i].rstrip().endswith(";")), -1)
        purpose = " ".join(ln[2:].strip() for ln in lines[:lead])
        sql = "\n".join(lines[lead : end + 1]).strip().rstrip(";")
        if not purpose or not sql or name in found:
            raise InvalidInput(f"queries.sql: statement {name} needs a purpose, SQL and one name")
        found[name] = Statement(name, purpose, sql)
    return found


QUERIES = parse(files("jobstore.db").joinpath("queries.sql").read_text(encoding="utf-8"))
# One parameter style per statement: PostgreSQL's own take psycopg's %(name)s and run on the
# psycopg connection (jobstore.db.backends.postgresql.driver); the portable ones, which both
# backends run through SQLAlchemy, take :name ({name} is never a value: an identifier or a SET
# list, filled in before).
CLAIM_IN_AUTOCLUSTERS = QUERIES["claim_in_autoclusters"].sql  # str.format(assignments=...)
IDLE_AUTOCLUSTERS = QUERIES["idle_autoclusters"].sql
BEGIN_TRANSACTION = QUERIES["begin_transaction"].sql
JOB_HEADS = QUERIES["job_heads"].sql
READ_JOB = QUERIES["read_job"].sql
READ_JOBS = QUERIES["read_jobs"].sql
LOCK_JOB = QUERIES["lock_job"].sql
RECORD_TRANSITION = QUERIES["record_transition"].sql  # str.format(assignments=...)
RECORD_EVENT = QUERIES["record_event"].sql
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
# portable
IDLE_AUTOCLUSTERS_PORTABLE = QUERIES["idle_autoclusters_portable"].clause
SUBMITTER_USAGE = QUERIES["submitter_usage"].expanding("names")
LIMITS_IN_USE = QUERIES["limits_in_use"].expanding("names")
PORTABLE = frozenset({"idle_autoclusters_portable", "submitter_usage", "limits_in_use"})


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
