"""The scripts of DAG nodes an access point's `jobstore schedd` runs (SCRIPT PRE and POST):
which are due there, the lease on one run of a script, its exit (which carries the DAG
forward, in the door's engine), and what a script is told of its node and DAG. A POST script
waits for its node's outputs, and a PRE script for its parents', to be home (delivered into
their Iwd, or failed once), as DAGMan's scripts run after the shadow wrote them.

Everything read here may come from a store its owner writes herself (her own SQLite file):
the service checks it before it acts, and runs nothing here but as her."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    ColumnElement,
    Select,
    Subquery,
    and_,
    case,
    exists,
    func,
    or_,
    select,
)

from jobstore.core.states import Status
from jobstore.db.backends import Door
from jobstore.db.dagengine import HOLD, POST, PRE, QUEUED, option_problem
from jobstore.db.phases import status_in
from jobstore.db.sandbox import (
    IN,
    MAX_INPUT_FILE_MB,
    MAX_INPUT_MB,
    OUT,
    FileSource,
    SandboxFiles,
)
from jobstore.db.schema import clusters, dag_edges, dag_nodes, dags, deliveries, job_files, jobs
from jobstore.db.transactions import Transactions
from jobstore.errors import InvalidInput

MAX_OPTIONS = 20_000  # characters of a node's stored script options read


class NodeScript(NamedTuple):
    """A node whose PRE or POST script is due, or runs (`token`: the run that holds it)."""

    dag_id: int
    name: str
    kind: str  # "pre" or "post"
    owner: str
    command: str | None  # the script's command line, as the DAG file gives it
    directory: str | None  # where it runs: the node's DIR
    cluster_id: int | None  # the node's jobs (None: a NOOP node)
    job_code: int | None  # its jobs' result ($RETURN)
    pre_code: int | None  # its PRE script's ($PRE_SCRIPT_RETURN)
    token: str | None
    started_at: float | None
    dag_status: str
    late: bool = False  # it has inputs to read when it is submitted (late_inputs)
    has_pre: bool = False  # it has a PRE script (else $PRE_SCRIPT_RETURN is -1)
    cap: int = 20  # the DAG's scripts of this kind that may run at once (-MaxPre, -MaxPost)
    defer: tuple[int, int] | None = None  # SCRIPT DEFER: (exit status, seconds)
    debug: tuple[str, str] | None = None  # SCRIPT DEBUG: (file, STDOUT | STDERR | ALL)
    again: bool = False  # it runs again (deferred before) or for holds (SCRIPT HOLD): an
    # owner's many of those cost the service a process each, as often as she asks


class ScriptExit(NamedTuple):
    """How one run of a node's script ended."""

    dag_id: int
    name: str
    kind: str
    token: str
    code: int


def _script(r: Any, per_dag: int, per_owner: int) -> NodeScript:
    cap = r.max_pre if r.status == PRE else r.max_post
    command = (r.pre if r.status == PRE else r.post) or None
    options = _options(r.script_options, r.status, command)
    defer, debug = options.get("defer"), options.get("debug")
    return NodeScript(r.dag_id, r.name, r.status, r.owner, command, r.directory,
                      r.cluster_id, r.job_code, r.pre_code, r.script_token,
                      r.script_started_at, r.dag_status, bool(r.late), bool(r.pre),
                      per_dag if cap is None else per_owner if cap == 0 else cap,
                      (defer[0], defer[1]) if defer else None,
                      (debug[0], debug[1]) if debug else None, r.script_after is not None)


def _in_turns(in_dag: Subquery, cap: ColumnElement[Any] | int, per_owner: int,
              limit: int) -> Select[Any]:
    """Of the rows `in_dag` numbers within their DAG (`in_dag`), those within the DAG's
    `cap` and the first `per_owner` of each owner's, each owner's oldest first and the
    owners in turn."""
    in_owner = (select(in_dag, func.row_number().over(
                    partition_by=in_dag.c.owner,
                    order_by=(in_dag.c.updated_at, in_dag.c.dag_id, in_dag.c.name))
                    .label("in_owner"))
                .where(in_dag.c.in_dag <= cap).subquery())
    return (select(in_owner).where(in_owner.c.in_owner <= per_owner)
            .order_by(in_owner.c.in_owner, in_owner.c.updated_at, in_owner.c.dag_id,
                      in_owner.c.name)
            .limit(limit))


def _hold(r: Any, per_dag: int) -> NodeScript:
    """A node's HOLD script, due or running."""
    debug = _options(r.script_options, HOLD, r.hold_script).get("debug")
    return NodeScript(r.dag_id, r.name, HOLD, r.owner, r.hold_script, r.directory,
                      r.cluster_id, r.job_code, r.pre_code, r.hold_token, r.hold_started_at,
                      r.dag_status, False, bool(r.pre_script), per_dag, None,
                      (debug[0], debug[1]) if debug else None, True)


def _options(text: str | None, kind: str, command: str | None) -> dict[str, Any]:
    """A node's `kind` script's DEFER and DEBUG options as stored (none: an empty dict, also
    for a text the door would not have taken)."""
    if not text or len(text) > MAX_OPTIONS:
        return {}
    try:
        value = json.loads(text).get(kind)
    except (ValueError, AttributeError, RecursionError):
        return {}
    if value is None or option_problem(kind, value, command) is not None:
        return {}
    return dict(value)


class NodeJob(NamedTuple):
    """One job of a node, as a POST script is told of it."""

    proc_id: int
    status: str
    exit_code: int | None
    exit_signal: int | None
    by_signal: bool


def _outputs_away(cluster: ColumnElement[Any]) -> ColumnElement[bool]:
    """Has a completed job of `cluster` stored outputs that are not home yet (neither
    delivered nor failed)?"""
    return exists().where(
        jobs.c.cluster_id == cluster, status_in([Status.COMPLETED]),
        exists().where(job_files.c.cluster_id == jobs.c.cluster_id,
                       job_files.c.proc_id == jobs.c.proc_id,
                       job_files.c.owner == jobs.c.owner, job_files.c.direction == OUT),
        ~exists().where(deliveries.c.job_id == jobs.c.id,
                        or_(deliveries.c.delivered_at.is_not(None), deliveries.c.failures > 0)))


def _parents_outputs_away() -> ColumnElement[bool]:
    """Are a parent's outputs of the node in hand not home yet?"""
    parent = dag_nodes.alias("parent")
    return exists().where(
        dag_edges.c.dag_id == dag_nodes.c.dag_id, dag_edges.c.child == dag_nodes.c.name,
        parent.c.dag_id == dag_edges.c.dag_id, parent.c.name == dag_edges.c.parent,
        _outputs_away(parent.c.cluster_id))


class DagScripts:
    """The DAG node scripts of an access point."""

    def __init__(self, db: Transactions, door: Door, files: SandboxFiles) -> None:
        self.db = db
        self.door = door
        self.files = files

    def due(self, home: str, *, owner: str | None = None, per_dag: int = 20,
            per_owner: int = 100, limit: int = 1000) -> list[NodeScript]:
        """The nodes of DAGs submitted on `home` (only `owner`'s, if given) whose script may
        start now (a PRE script only in a running DAG; neither before the outputs it may read
        are home): at most `per_dag` of each DAG's PRE and of its POST scripts (or what the
        DAG's -MaxPre and -MaxPost say; 0: `per_owner`) and `per_owner` of each owner's,
        each owner's oldest first and the owners in turn, so that nobody's many scripts keep
        another's waiting."""
        cap = case((dag_nodes.c.status == PRE, dags.c.max_pre), else_=dags.c.max_post)
        in_dag = (self._rows(home, owner)
                  .add_columns(func.row_number().over(
                      partition_by=(dag_nodes.c.dag_id, dag_nodes.c.status),
                      order_by=(dag_nodes.c.updated_at, dag_nodes.c.name)).label("in_dag"),
                      case((cap.is_(None), per_dag), (cap == 0, per_owner),
                           else_=cap).label("cap"))
                  .where(dag_nodes.c.script_token.is_(None),
                         or_(dag_nodes.c.script_after.is_(None),
                             dag_nodes.c.script_after <= time.time()),
                         or_(and_(dag_nodes.c.status == POST,
                                  ~_outputs_away(dag_nodes.c.cluster_id)),
                             and_(dag_nodes.c.status == PRE, dags.c.status == "running",
                                  ~_parents_outputs_away())))
                  .subquery())
        q = _in_turns(in_dag, in_dag.c.cap, per_owner, limit)
        with self.db.transaction() as conn:
            return [_script(r, per_dag, per_owner) for r in conn.execute(q)]

    def due_holds(self, home: str, *, owner: str | None = None, per_dag: int = 20,
                  per_owner: int = 100, limit: int = 1000) -> list[NodeScript]:
        """The nodes of DAGs submitted on `home` (only `owner`'s, if given) whose HOLD script
        may start now (a job of theirs was held since it last started, or ever, and none
        runs): at most `per_dag` of each DAG's and `per_owner` of each owner's, the owners
        in turn, as `due`."""
        holds = (select(func.coalesce(func.sum(jobs.c.num_holds), 0))
                 .where(jobs.c.cluster_id == dag_nodes.c.cluster_id).scalar_subquery())
        in_dag = (self._holds(home, owner)
                  .add_columns(func.row_number().over(
                      partition_by=dag_nodes.c.dag_id,
                      order_by=(dag_nodes.c.updated_at, dag_nodes.c.name)).label("in_dag"))
                  .where(dag_nodes.c.hold_token.is_(None),
                         holds > func.coalesce(dag_nodes.c.holds_seen, 0))
                  .subquery())
        q = _in_turns(in_dag, per_dag, per_owner, limit)
        with self.db.transaction() as conn:
            return [_hold(r, per_dag) for r in conn.execute(q)]

    def held_by(self, home: str, prefix: str, *, owner: str | None = None,
                per_dag: int = 20, per_owner: int = 100) -> list[NodeScript]:
        """The nodes of DAGs submitted on `home` whose script a run whose token begins with
        `prefix` holds (their HOLD scripts' runs too)."""
        q = self._rows(home, owner).where(
            dag_nodes.c.script_token.startswith(prefix, autoescape=True))
        holds = self._holds(home, owner).where(
            dag_nodes.c.hold_token.startswith(prefix, autoescape=True))
        with self.db.transaction() as conn:
            return [_script(r, per_dag, per_owner) for r in conn.execute(q)] + [
                _hold(r, per_dag) for r in conn.execute(holds)]

    @staticmethod
    def _holds(home: str, owner: str | None) -> Select[Any]:
        q = (select(dag_nodes.c.dag_id, dag_nodes.c.name, dag_nodes.c.owner,
                    dag_nodes.c.updated_at, dag_nodes.c.hold_script, dag_nodes.c.directory,
                    dag_nodes.c.cluster_id,
                    dag_nodes.c.job_code, dag_nodes.c.pre_code, dag_nodes.c.pre_script,
                    dag_nodes.c.hold_token, dag_nodes.c.hold_started_at,
                    dags.c.status.label("dag_status"), dag_nodes.c.script_options)
             .join(dags, dags.c.id == dag_nodes.c.dag_id)
             .join(clusters, and_(clusters.c.id == dag_nodes.c.dag_id,
                                  clusters.c.home == home))
             .where(dag_nodes.c.hold_script.is_not(None),
                    dag_nodes.c.status.in_((QUEUED, POST))))
        return q if owner is None else q.where(dag_nodes.c.owner == owner)

    @staticmethod
    def _rows(home: str, owner: str | None) -> Select[Any]:
        q = (select(dag_nodes.c.dag_id, dag_nodes.c.name, dag_nodes.c.status,
                    dag_nodes.c.owner, dag_nodes.c.updated_at,
                    func.coalesce(dag_nodes.c.pre_script, "").label("pre"),
                    func.coalesce(dag_nodes.c.post_script, "").label("post"),
                    dag_nodes.c.directory, dag_nodes.c.cluster_id, dag_nodes.c.job_code,
                    dag_nodes.c.pre_code, dag_nodes.c.script_token,
                    dag_nodes.c.script_started_at, dags.c.status.label("dag_status"),
                    dag_nodes.c.late_inputs.is_not(None).label("late"), dags.c.max_pre,
                    dags.c.max_post, dag_nodes.c.script_options, dag_nodes.c.script_after)
             .join(dags, dags.c.id == dag_nodes.c.dag_id)
             .join(clusters, and_(clusters.c.id == dag_nodes.c.dag_id,
                                  clusters.c.home == home))
             .where(dag_nodes.c.status.in_((PRE, POST))))
        return q if owner is None else q.where(dag_nodes.c.owner == owner)

    def holding(self, keys: Sequence[tuple[int, str, str]]
                ) -> dict[tuple[int, str, str], str | None]:
        """The run that holds each node's `kind` script now (None: none), by (DAG, node,
        kind)."""
        out: dict[tuple[int, str, str], str | None] = {}
        with self.db.transaction() as conn:
            for dag_id in {d for d, _, _ in keys}:
                names = list({n for d, n, _ in keys if d == dag_id})
                for name, status, token, hold in conn.execute(
                        select(dag_nodes.c.name, dag_nodes.c.status, dag_nodes.c.script_token,
                               dag_nodes.c.hold_token)
                        .where(dag_nodes.c.dag_id == dag_id, dag_nodes.c.name.in_(names))):
                    for kind in (PRE, POST):
                        out[(dag_id, name, kind)] = token if status == kind else None
                    out[(dag_id, name, HOLD)] = hold if status in (QUEUED, POST) else None
        return out

    def start(self, runs: Sequence[tuple[NodeScript, str]]) -> list[bool]:
        """Take the lease on each script for its run's token, in one transaction: whether
        each was free (a node another transaction holds is not: its owner's may)."""
        now = time.time()
        with self.db.transaction() as conn:
            free = self.door.free_nodes(conn, [(s.dag_id, s.name) for s, _ in runs])
            return [(script.dag_id, script.name) in free and (
                self.door.hold_start(conn, script.dag_id, script.name, token, now)
                if script.kind == HOLD else
                self.door.script_start(conn, script.dag_id, script.name, script.kind, token,
                                       now)) for script, token in runs]

    def defer(self, deferred: Sequence[tuple[ScriptExit, float]]) -> list[ScriptExit]:
        """The runs that exited with their script's DEFER status, each due again from its
        time on, in one transaction: those given (not those whose node or DAG another
        transaction holds, to be given on a later pass)."""
        with self.db.transaction() as conn:
            free = self.door.free_nodes(conn, [(r.dag_id, r.name) for r, _ in deferred],
                                        dags_too=True)
            for run, until in deferred:
                if (run.dag_id, run.name) in free:
                    self.door.script_defer(conn, run.dag_id, run.name, run.kind, run.token,
                                           until)
        return [run for run, _ in deferred if (run.dag_id, run.name) in free]

    def done(self, ended: Sequence[ScriptExit]) -> list[ScriptExit]:
        """The runs that ended, each with its exit, in one transaction: those given (not
        those whose node or DAG another transaction holds, to be given on a later pass)."""
        now = time.time()
        with self.db.transaction() as conn:
            free = self.door.free_nodes(conn, [(r.dag_id, r.name) for r in ended], dags_too=True)
            for run in ended:
                if (run.dag_id, run.name) not in free:
                    continue
                if run.kind == HOLD:
                    self.door.hold_done(conn, run.dag_id, run.name, run.token)
                else:
                    self.door.script_done(conn, run.dag_id, run.name, run.kind, run.token,
                                          run.code, now)
        return [run for run in ended if (run.dag_id, run.name) in free]

    def late_inputs(self, dag_id: int, name: str) -> str | None:
        """The node's inputs to read when it is submitted, as the door stored them (JSON)."""
        with self.db.transaction() as conn:
            return conn.execute(select(dag_nodes.c.late_inputs).where(
                dag_nodes.c.dag_id == dag_id, dag_nodes.c.name == name)).scalar()

    def input_limits(self) -> tuple[int, int]:
        """The store's limits on an input file and on a job's inputs, in bytes."""
        limits = self.files.input_limits()
        return limits[MAX_INPUT_FILE_MB] << 20, limits[MAX_INPUT_MB] << 20

    def inputs_done(self, run: ScriptExit, cluster_id: int, owner: str,
                    files: Sequence[FileSource]) -> bool:
        """Store a node's late inputs as its jobs' (`files`: copies of this process's own;
        the store's limits apply) and give its PRE step's exit 0, in one transaction: its
        jobs are released with their inputs, or not at all. InputTooLarge for inputs over
        the limits, InvalidInput for a name its jobs' sandbox has already (their
        executable's). False when another transaction holds the node or its DAG (nothing
        stored: the next pass tries again)."""
        now = time.time()
        with self.db.transaction() as conn:
            if not self.door.free_nodes(conn, [(run.dag_id, run.name)], dags_too=True):
                return False
            stored = conn.execute(select(job_files.c.proc_id, job_files.c.name).where(
                job_files.c.cluster_id == cluster_id, job_files.c.direction == IN)).all()
            clash = sorted({name for _, name in stored} & {f.name for f in files})
            if clash:
                raise InvalidInput(f"{clash[0]} would be in the sandbox twice")
            # a proc with inputs of its own (its `input`) takes those, not the cluster's
            for proc_id in [None, *sorted({p for p, _ in stored if p is not None})]:
                self.files.store_files(conn, cluster_id=cluster_id, proc_id=proc_id,
                                       owner=owner, direction=IN, sources=files)
            self.door.script_done(conn, run.dag_id, run.name, PRE, run.token, 0, now)
        return True

    def node_jobs(self, cluster_id: int) -> list[NodeJob]:
        """The jobs of a node's cluster, by ProcId."""
        with self.db.transaction() as conn:
            return [NodeJob(*r) for r in conn.execute(
                select(jobs.c.proc_id, jobs.c.status, jobs.c.exit_code, jobs.c.exit_signal,
                       func.coalesce(jobs.c.exit_by_signal, False))
                .where(jobs.c.cluster_id == cluster_id).order_by(jobs.c.proc_id))]

    def counts(self, dag_id: int) -> dict[str, int]:
        """The DAG's nodes by status (what $DONE_COUNT, $FAILED_COUNT ... count)."""
        with self.db.transaction() as conn:
            return dict(conn.execute(select(dag_nodes.c.status, func.count())
                                     .where(dag_nodes.c.dag_id == dag_id)
                                     .group_by(dag_nodes.c.status)).all())

    def dag_status(self, dag_id: int) -> int:
        """DAGMan's DAG_Status of the DAG as it stands."""
        with self.db.transaction() as conn:
            return int(conn.execute(select(dags.c.dag_status).where(dags.c.id == dag_id))
                       .scalar() or 0)
