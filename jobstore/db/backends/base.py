"""The interface every backend implements (Backend) and the values that cross it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import ColumnElement, Connection, Table, Update

from jobstore.core.claims import ClaimRequest
from jobstore.core.jobs import Job, ProcTemplate
from jobstore.db.channels import Listener
from jobstore.db.rows import RowChange
from jobstore.errors import DatabaseError

# The reads that may open a transaction in the round trip that begins it (Backend.begin)
MENU = "idle_autoclusters"  # the claim's menu: Backend.menu
READ_JOB = "read_job"  # a report's job row and its version: Backend.read_job


@dataclass(frozen=True)
class Identity:
    """Who a database session is, as the database decides it (never the client)."""

    account: str  # the OS account it submits as
    trusted: bool  # the store's owner (the role of `jobstore init`): may do anything
    super_user: bool  # QUEUE_SUPER_USERS: may act on every job


@dataclass(frozen=True)
class Claim:
    """One claim's idle -> fetched, as the state machine defines it
    (Transitions.fetch_transition): the columns it sets on the job (`values`, besides `claims`
    + 1 and the slot's weight, which the row decides) and its event's name and statuses."""

    values: Mapping[str, Any]
    event: str
    from_status: str
    to_status: str


# The row-by-row claim of a backend that takes its jobs one by one: hand out `job` with these
# extra columns (Transitions' own transition)
HandOut = Callable[[Connection, Job, Mapping[str, Any]], None]


class Backend(Protocol):
    """What the job store does differently on each database."""

    can_listen: bool  # does it announce changes (LISTEN/NOTIFY), or must a watcher poll?
    ids_commit_out_of_order: bool  # may a lower id commit after a higher one (one sequence)?
    makes_rows_on_server: bool  # can it make a templated cluster's rows itself (bulk submit)?
    report_reads: tuple[bool, ...]  # a report's reads in turn: unlocked (False), locked (True)
    lost: tuple[type[BaseException], ...]  # what a lost or refused connection raises

    # ---- transactions --------------------------------------------------------------------
    def connect(self) -> Connection:
        """A connection for one transaction (the store's kept one where it has one)."""

    def release(self, conn: Connection) -> None:
        """The end of `connect`'s connection."""

    def begin(self, conn: Connection, first: str | None, params: Mapping[str, Any],
              timeout_ms: int | None) -> Any:
        """Open `conn`'s transaction, bounding its statements by `timeout_ms`; where the
        backend can, run the read named `first` (MENU, READ_JOB) in the same round trip and
        return what `menu` or `read_job` takes (None otherwise)."""

    def transaction(self, conn: Connection) -> AbstractContextManager[Any]:
        """The transaction `begin` opened, committed at the end of its block or rolled back."""

    def error(self, exc: BaseException, url: Any) -> DatabaseError:
        """What a failed transaction raises: one line (Refused for a refused privilege)."""

    # ---- reading and locking -------------------------------------------------------------
    def read_job(self, conn: Connection, opened: Any, job_id: int,
                 ) -> tuple[Job | None, str | None]:
        """The job row `begin` read unlocked and its version (None, None if there is none)."""

    def as_read(self, change: Update, version: str | None) -> Update:
        """`change` of a job row, made only to the row as `read_job` read it at `version`: it
        finds nothing if the row changed since. None: the row is locked, nothing to check."""

    def lock_job(self, conn: Connection, job_id: int) -> Job | None:
        """The job row, locked until the transaction ends."""

    def jobs_of(self, conn: Connection, ids: Sequence[int]) -> list[Job]:
        """The job rows of `ids` that the session may see."""

    def id_in(self, column: Any, ids: Sequence[int]) -> ColumnElement[bool]:
        """`column IN ids`, as this database takes a long list best."""

    # ---- the negotiator ------------------------------------------------------------------
    def menu(self, conn: Connection, opened: Any, params: Mapping[str, Any]) -> list[Any]:
        """The queue's autoclusters with idle jobs that fit the slot (`params`: queue, cpus,
        memory, disk), each with its first job: rows of (id, submitter, concurrency_limits,
        head_id, head_priority)."""

    def lock_limits(self, conn: Connection, names: Sequence[str]) -> None:
        """Serialise the claims of jobs that use these concurrency limits, until commit."""

    def take(self, conn: Connection, req: ClaimRequest, autoclusters: Sequence[int],
             claim: Claim, now: float, hand_out: HandOut) -> Job | None:
        """Hand out the first idle, unlocked job (claim order) of the first of `autoclusters`
        that has one, with its `fetch` event; the job as it is now, or None."""

    # ---- writing -------------------------------------------------------------------------
    def record(self, conn: Connection, values: dict[str, Any], change: RowChange | None,
               ) -> None:
        """Append the event `values` (after `change`, the job row's UPDATE, when given: it
        must hit the row, else RowChanged) and notify the followers at commit."""

    def insert_events(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """Append many events in one statement, and notify the followers once."""

    def notify(self, conn: Connection, payload: str, channel: str) -> None:
        """Announce `payload` on `channel` at commit (nothing where no one can listen)."""

    def insert_missing(self, conn: Connection, table: Table, values: Mapping[str, Any],
                       keys: Sequence[str] | None = None) -> bool:
        """INSERT, or nothing when a row with the same key exists: whether it inserted."""

    def upsert(self, conn: Connection, table: Table, rows: list[dict[str, Any]],
               key: str, columns: Sequence[str]) -> None:
        """INSERT `rows`, or UPDATE `columns` of those whose `key` exists."""

    def insert_rows(self, conn: Connection, table: Table, rows: list[dict[str, Any]], *,
                    staged: bool) -> None:
        """Insert many rows of one shape (`staged`: the session is under row-level security)."""

    def insert_numbered(self, conn: Connection, table: Table, rows: list[dict[str, Any]], *,
                        staged: bool) -> list[int]:
        """Insert rows of `table` (clusters or jobs), their new ids in order."""

    def insert_procs(self, conn: Connection, job: Job, template: ProcTemplate, now: float, *,
                     events_after: bool, clusters: list[int] | None) -> list[int]:
        """Make a templated cluster's rows on the server (only where `makes_rows_on_server`)."""

    def file_chunks(self, conn: Connection, owner: str, sha256: str, first: int, last: int,
                    ) -> list[Any]:
        """Chunks `first` to `last` of a stored file, rows of (data,)."""

    # ---- the session and the server ------------------------------------------------------
    def local_identity(self) -> Identity | None:
        """Who every session is, where the database has no sessions of its own (a SQLite file
        is one account's); None where the session decides (session_identity)."""

    def session_identity(self, conn: Connection) -> Identity:
        """Who `conn`'s session is, as the database decides it."""

    def snapshot_bounds(self, conn: Connection) -> tuple[int, int] | None:
        """(xmin, xmax) of a snapshot taken now (None: ids become visible in order)."""

    def xact_horizon(self, conn: Connection) -> int | None:
        """A transaction id assigned now (None: no concurrent writers)."""

    def rows_estimate(self, conn: Connection) -> int | None:
        """The planner's estimate of the job rows (None: no such estimate)."""

    def listener(self, channel: str, connect_timeout: int,
                 transaction: Callable[[], AbstractContextManager[Connection]]) -> Listener:
        """A listener on `channel` (only where `can_listen`)."""

    def quote(self) -> Callable[[str], str]:
        """How this database quotes an identifier, where it has roles (InvalidInput if not)."""


# INSERT ... ON CONFLICT, which both databases write alike: `insert` is the dialect's INSERT of
# the table (sqlalchemy.dialects.postgresql.insert or sqlite.insert)


def insert_missing(conn: Connection, insert: Any, values: Mapping[str, Any],
                   keys: Sequence[str] | None) -> bool:
    """Backend.insert_missing, with the dialect's `insert`."""
    stmt = insert.values(**values).on_conflict_do_nothing(index_elements=keys)
    return conn.execute(stmt.returning(*insert.table.primary_key.columns)).first() is not None


def upsert(conn: Connection, insert: Any, rows: list[dict[str, Any]], key: str,
           columns: Sequence[str]) -> None:
    """Backend.upsert, with the dialect's `insert`."""
    stmt = insert.values(rows)
    conn.execute(stmt.on_conflict_do_update(
        index_elements=[insert.table.c[key]], set_={c: stmt.excluded[c] for c in columns}))


__all__ = ["MENU", "READ_JOB", "Backend", "Claim", "HandOut", "Identity", "insert_missing",
           "upsert"]
