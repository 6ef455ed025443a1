"""The interface every backend implements (Backend) and the values that cross it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeAlias

from sqlalchemy import URL, ColumnElement, Connection, Table
from sqlalchemy.dialects.postgresql import Insert as PgInsert
from sqlalchemy.dialects.sqlite import Insert as SqliteInsert

from jobstore.core.claims import ClaimRequest
from jobstore.core.jobs import Job, ProcTemplate
from jobstore.db.channels import Listener
from jobstore.db.rows import RowChange
from jobstore.errors import JobstoreError

# A value that crosses the seam: what a column or a bind parameter holds (JSON: objects, arrays)
Value: TypeAlias = (str | int | float | bool | bytes | datetime | None
                    | Sequence["Value"] | Mapping[str, "Value"])
Params: TypeAlias = Mapping[str, Value]  # a statement's bind parameters, by name
Row: TypeAlias = Mapping[str, Value]  # a row to insert, by column
# What Backend.begin read in the round trip that opened a transaction, for menu, read_job or
# read_jobs to take (each backend its own: a cursor, or None)
Opened: TypeAlias = object
# A row of the claim's menu: (autocluster id, submitter, concurrency_limits, head_id,
# head_priority)
MenuRow: TypeAlias = tuple[int, str, str | None, int, int]

# The reads that may open a transaction in the round trip that begins it (Backend.begin)
MENU = "idle_autoclusters"  # the claim's menu: Backend.menu
READ_JOB = "read_job"  # a report's job row and its version: Backend.read_job
READ_JOBS = "read_jobs"  # a batch of reports' job rows and their versions: Backend.read_jobs


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

    values: Params
    event: str
    from_status: str
    to_status: str


# The row-by-row claim of a backend that takes its jobs one by one: hand out `job` with these
# extra columns (Transitions' own transition)
HandOut = Callable[[Connection, Job, Params], None]

# Change.kind: a job the caller named (its event written, or nothing when the action does not
# apply to its status), one the session may not act on, one another transaction holds, one the
# DAGs moved, a DAG that changed, a NOOP node a DAG's release did at once
ACTED, DENIED, SKIPPED, MOVED, DAG, NOOP = "acted", "denied", "skipped", "moved", "dag", "noop"
# The events of condor_vacate_job and condor_vacate_job -fast: a request, not a transition
VACATES = ("vacate", "vacate_fast")


@dataclass(frozen=True, slots=True)
class Change:
    """What an action (hold, release, rm, qedit) or a DAG's move did to one job: the event it
    wrote (`to_status` None: recorded only, or nothing when `kind` is not ACTED or MOVED)."""

    job_id: int
    event: str
    from_status: str | None
    to_status: str | None
    attempt: int | None
    reason: str | None
    attrs: Mapping[str, Value] | None
    pending: bool  # a release that waits for the job's stopped attempt to end
    kind: str

    @property
    def changed(self) -> bool:
        return self.to_status is not None


@dataclass(frozen=True, slots=True)
class InputFile:
    """An input file a submit stored: its path in the sandbox, content and mode."""

    name: str
    sha256: str
    mode: int


@dataclass(frozen=True, slots=True)
class DagSettings:
    """What a DAG asks of its access point: its NODE_STATUS_FILE, written at most every
    `status_every` seconds, and the most PRE and POST scripts of it that run at once (None:
    the access point's default; 0: no limit of its own)."""

    status_file: str | None = None
    status_every: int = 60
    max_pre: int | None = None
    max_post: int | None = None


class Door(Protocol):
    """The writes of a submitter: what the schedd does for condor_submit, condor_hold,
    condor_release, condor_rm, condor_qedit, condor_submit_dag and condor_userprio. Each
    checks the session's rights and every value it stores where the caller cannot lie (on
    PostgreSQL the database's own functions, which take the owner from the session); and the
    DAGs carried forward as their nodes' jobs end, whoever ends them."""

    def new_cluster(self, conn: Connection, *, owner: str, queue: str,
                    submit_file: str | None, num_procs: int, key: str | None,
                    now: float, home: str | None = None) -> tuple[int, bool]:
        """A new cluster whose outputs go home to the access point `home` (None: spooled),
        or (with `key`) the cluster a submit of the owner's with that key made before: (its
        id, whether it is new)."""

    def queue_jobs(self, conn: Connection, jobs: Sequence[Job], held: Sequence[bool],
                   now: float) -> list[int]:
        """Queue jobs (each in its cluster_id, as Job.queued made them: idle, or waiting in a
        DAG node's cluster; `held`: submitted on hold) with their submit events: their ids."""

    def queue_procs(self, conn: Connection, job: Job, template: ProcTemplate, now: float, *,
                    clusters: list[int] | None, hold: bool) -> list[int]:
        """Queue every proc of `template` (`job`: proc 0's row with the placeholders), each
        with its submit event; `clusters`: each proc a cluster of its own. Their ids."""

    def store_file(self, conn: Connection, owner: str, sha256: str, size: int) -> bool:
        """Register `owner`'s file; whether it is new (its chunks follow, store_chunk)."""

    def store_chunk(self, conn: Connection, owner: str, sha256: str, seq: int,
                    data: bytes) -> None:
        """One chunk of a new file."""

    def add_inputs(self, conn: Connection, cluster_id: int, proc_id: int | None,
                   files: Sequence[InputFile]) -> None:
        """A cluster's (proc_id None: every proc's) or one proc's input files, stored before."""

    def act(self, conn: Connection, ids: Sequence[int], event: str, reason: str | None,
            hold: tuple[int, int], *, skip_locked: bool, now: float) -> list[Change]:
        """Hold, release or remove the jobs `ids` the session may act on (their DAGs carried
        forward): a Change for each job named, and for each the DAGs moved."""

    def edit(self, conn: Connection, ids: Sequence[int], name: str, text: str,
             edited: Sequence[Job], *, skip_locked: bool, now: float) -> list[Change]:
        """condor_qedit `name` = `text` of the waiting jobs of `ids` the session may act on
        (`edited`: each as the edit makes it, for its autocluster)."""

    def set_factor(self, conn: Connection, name: str, factor: float) -> bool:
        """condor_userprio -setfactor (the admin's); False for an unknown submitter."""

    def reset_usage(self, conn: Connection, name: str | None, now: float) -> int:
        """condor_userprio -resetusage (one submitter) or -resetall (None): rows reset."""

    def new_dag(self, conn: Connection, *, owner: str, queue: str, path: str,
                batch_name: str | None, max_jobs: int | None, max_idle: int | None,
                attrs: Mapping[str, str], now: float, home: str | None = None) -> int:
        """A DAG: its own cluster (DAGManJobId) and row, with the access point it was
        submitted on (`home`, given to its nodes' clusters too); its nodes come with
        dag_nodes."""

    def dag_nodes(self, conn: Connection, dag_id: int, nodes: Sequence[Params],
                  edges: Sequence[tuple[str, str]], categories: Mapping[str, int],
                  now: float) -> dict[str, int]:
        """A new DAG's nodes (name, procs, done, priority, category, abort_exit,
        abort_return, final), dependencies and throttles: the cluster made for each node
        with jobs, by name."""

    def dag_settings(self, conn: Connection, dag_id: int, settings: DagSettings) -> None:
        """A new DAG's settings for its access point, before its nodes."""

    def start_dag(self, conn: Connection, dag_id: int, now: float) -> list[Change]:
        """Release the nodes of a queued DAG that have no parents to wait for."""

    def pause_dag(self, conn: Connection, dag_id: int, held: bool, now: float) -> list[Change]:
        """Hold or release a running DAG (a DAG Change when it changed)."""

    def remove_dag(self, conn: Connection, dag_id: int, why: str, now: float) -> list[Change]:
        """Remove a DAG (a DAG Change when it was running or held)."""

    def jobs_ended(self, conn: Connection, job_ids: list[int], now: float, *,
                   nodes: bool = False) -> None:
        """Jobs `job_ids` ended in this transaction: carry their DAGs forward (`nodes`: their
        ads say they are DAG nodes' jobs)."""

    def node_job_started(self, conn: Connection, job: Job, now: float) -> None:
        """A DAG node's job started: a DAG with -maxidle may release more nodes."""

    def script_start(self, conn: Connection, dag_id: int, name: str, kind: str, token: str,
                     now: float) -> bool:
        """Take the lease on a DAG node's due `kind` script ("pre", "post") for the run
        `token` (the access point's service): whether it was free."""

    def script_defer(self, conn: Connection, dag_id: int, name: str, kind: str, token: str,
                     until: float) -> bool:
        """The run `token` of a node's `kind` script exited with its DEFER status: the script
        is due again from `until` on (whether the node still waited for that run)."""

    def free_nodes(self, conn: Connection, keys: Sequence[tuple[int, str]], *,
                   dags_too: bool = False) -> set[tuple[int, str]]:
        """Of the DAG nodes `keys` (DAG, name), those this transaction now holds (and their
        DAGs' rows, with `dags_too`), skipping those another transaction holds."""

    def hold_start(self, conn: Connection, dag_id: int, name: str, token: str,
                   now: float) -> bool:
        """Take the lease on node `name`'s HOLD script for the run `token`, for the holds of
        its jobs so far: whether there were holds it was not started for."""

    def hold_done(self, conn: Connection, dag_id: int, name: str, token: str) -> bool:
        """The run `token` of node `name`'s HOLD script ended."""

    def dag_script_options(self, conn: Connection, dag_id: int,
                           options: Mapping[str, Any]) -> None:
        """A new DAG's scripts' DEFER and DEBUG options, {node: {"pre": {...}, "post":
        {...}}}, given by its owner (InvalidInput for a node or a value a DAG file cannot
        give)."""

    def script_done(self, conn: Connection, dag_id: int, name: str, kind: str, token: str,
                    code: int, now: float) -> None:
        """The run `token` of a node's `kind` script exited with `code`: carry its DAG
        forward (nothing when the node no longer waits for that run)."""


@dataclass(frozen=True)
class UserRights:
    """What `jobstore grant-user` gives a role."""

    account: str | None = None  # the OS account its members submit as (None: the role's name)
    super_user: bool = False
    may_impersonate: str | None = None  # a regular expression, as QUEUE_SUPER_USER_MAY_IMPERSONATE
    admin: bool = False
    # the accounting groups its account's jobs may be charged to (`accounting_group = G`)
    accounting_groups: tuple[str, ...] = ()


class Roles(Protocol):
    """The database's roles, as `jobstore grant` and `grant-user` give them rights: each method
    returns the statements it ran (`*_statements`: only makes them)."""

    def hook_statements(self, role: str) -> list[str]:
        """What gives `role` what the agent and the hooks need and nothing else."""

    def grant_hook(self, role: str) -> list[str]:
        """Apply hook_statements in one transaction."""

    def user_statements(self, role: str, rights: UserRights) -> list[str]:
        """What lets `role` read the queue and write through the door, with `rights`."""

    def grant_user(self, role: str, rights: UserRights) -> list[str]:
        """Apply user_statements and record the role's rights, in one transaction."""

    def revoke_user(self, role: str) -> None:
        """Take every right on the job store's tables from `role` and forget its rights."""


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

    def begin(self, conn: Connection, first: str | None, params: Params,
              timeout_ms: int | None) -> Opened:
        """Open `conn`'s transaction, bounding its statements by `timeout_ms`; where the
        backend can, run the read named `first` (MENU, READ_JOB) in the same round trip and
        return what `menu` or `read_job` takes (None otherwise)."""

    def transaction(self, conn: Connection) -> AbstractContextManager[object]:
        """The transaction `begin` opened, committed at the end of its block or rolled back."""

    def error(self, exc: BaseException, url: str | URL) -> JobstoreError:
        """What a failed transaction raises: one line (Refused for a refused privilege,
        InvalidInput for a value the database's checks refused)."""

    # ---- reading and locking -------------------------------------------------------------
    def read_job(self, conn: Connection, opened: Opened, job_id: int,
                 ) -> tuple[Job | None, str | None]:
        """The job row `begin` read unlocked and its version (None, None if there is none)."""

    def read_jobs(self, conn: Connection, opened: Opened, job_ids: Sequence[int],
                  ) -> dict[int, tuple[Job, str | None]]:
        """The job rows `begin` read unlocked (READ_JOBS) and their versions, by id (the ones
        there are)."""

    def lock_job(self, conn: Connection, job_id: int) -> Job | None:
        """The job row, locked until the transaction ends."""

    def jobs_of(self, conn: Connection, ids: Sequence[int]) -> list[Job]:
        """The job rows of `ids` that the session may see."""

    def id_in(self, column: ColumnElement[int], ids: Sequence[int]) -> ColumnElement[bool]:
        """`column IN ids`, as this database takes a long list best."""

    # ---- the negotiator ------------------------------------------------------------------
    def menu(self, conn: Connection, opened: Opened, params: Params) -> list[MenuRow]:
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
    def record(self, conn: Connection, values: Row, change: RowChange | None,
               ) -> None:
        """Append the event `values` (after `change`, the job row's UPDATE, when given: it
        must hit the row, else RowChanged) and notify the followers at commit."""

    def update_row(self, conn: Connection, change: RowChange) -> None:
        """`change`, a job row's UPDATE that records no event: made only if the row is still
        in its status and attempt and, with a version (`read_job`'s), still that version; else
        RowChanged. A version where `read_job` gives none (the row is locked) is InvalidInput."""

    def insert_events(self, conn: Connection, rows: Sequence[Row]) -> None:
        """Append many events in one statement, and notify the followers once."""

    def notify(self, conn: Connection, payload: str, channel: str) -> None:
        """Announce `payload` on `channel` at commit (nothing where no one can listen)."""

    def insert_missing(self, conn: Connection, table: Table, values: Params,
                       keys: Sequence[str] | None = None) -> bool:
        """INSERT, or nothing when a row with the same key exists: whether it inserted."""

    def upsert(self, conn: Connection, table: Table, rows: Sequence[Row],
               key: str, columns: Sequence[str]) -> None:
        """INSERT `rows`, or UPDATE `columns` of those whose `key` exists."""

    def insert_rows(self, conn: Connection, table: Table, rows: Sequence[Row], *,
                    staged: bool) -> None:
        """Insert many rows of one shape (`staged`: the session is under row-level security)."""

    def insert_numbered(self, conn: Connection, table: Table, rows: Sequence[Row], *,
                        staged: bool) -> list[int]:
        """Insert rows of `table` (clusters or jobs), their new ids in order."""

    def insert_procs(self, conn: Connection, job: Job, template: ProcTemplate, now: float, *,
                     events_after: bool, clusters: list[int] | None) -> list[int]:
        """Make a templated cluster's rows on the server (only where `makes_rows_on_server`)."""

    def file_stream(self, conn: Connection, owner: str, sha256: str, first: int, last: int,
                    ) -> Iterable[bytes]:
        """The bytes of chunks `first` to `last` of a stored file, in order, the quickest way
        the database has: read to the end within the transaction (a stream left half-read
        keeps its connection busy)."""

    # ---- the session and the server ------------------------------------------------------
    def reads_tokens(self, conn: Connection) -> bool:
        """Whether the session may read an attempt's token (a submitter's role may not)."""

    def local_owner(self) -> str | None:
        """The account a root process must act as on this store, because whoever may write
        its file may write any row (a SQLite file that is not root's alone: its owner); None
        where every row's owner is what the database checked (PostgreSQL's door) or the file
        and every directory on its path are root's and nobody else may change them.
        DatabaseError when it cannot be told (a root-owned file others could swap)."""

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

    def server_warnings(self, conn: Connection) -> list[str]:
        """What in the server's settings works against a job store."""

    def roles(self) -> Roles:
        """The database's roles: `jobstore grant` and `grant-user` (InvalidInput where it has
        none: a SQLite store is one user's)."""

    def door(self, every: Callable[[], bool]) -> Door | None:
        """The database's own door for a submitter's writes (None: it has none, the package
        writes them: a SQLite store is one user's); `every`: whether a commit listener wants
        the events of jobs without a user log (Transactions.listens_to_every_job)."""


# INSERT ... ON CONFLICT, which both databases write alike: `insert` is the dialect's INSERT of
# the table (sqlalchemy.dialects.postgresql.insert or sqlite.insert)
Insert: TypeAlias = PgInsert | SqliteInsert


def insert_missing(conn: Connection, insert: Insert, values: Params,
                   keys: Sequence[str] | None) -> bool:
    """Backend.insert_missing, with the dialect's `insert`."""
    stmt = insert.values(**values).on_conflict_do_nothing(index_elements=keys)
    return conn.execute(stmt.returning(*insert.table.primary_key)).first() is not None


def upsert(conn: Connection, insert: Insert, rows: Sequence[Row], key: str,
           columns: Sequence[str]) -> None:
    """Backend.upsert, with the dialect's `insert`."""
    stmt = insert.values(rows)
    conn.execute(stmt.on_conflict_do_update(
        index_elements=[insert.table.c[key]], set_={c: stmt.excluded[c] for c in columns}))


__all__ = ["ACTED", "DAG", "DENIED", "MENU", "MOVED", "NOOP", "READ_JOB", "SKIPPED", "VACATES",
           "Backend", "Change", "Claim", "Door", "HandOut", "Identity", "InputFile", "MenuRow",
           "Opened", "Params", "Roles", "Row", "UserRights", "Value", "insert_missing", "upsert"]
