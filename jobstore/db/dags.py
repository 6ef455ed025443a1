"""DAGs in the store: DAGMan's work done by the job store itself.

A DAG is queued whole, in one transaction, through the door (backends.Door): its own cluster id
(the nodes' DAGManJobId), a `dags` row, a `dag_nodes` row per node with a cluster of its own
for its jobs, which wait (status `waiting`, never claimable) until the node is released. The
transaction that ends a node's last job carries its DAG forward (the door's engine: the
database's own on PostgreSQL, jobstore.db.dagengine on SQLite), whoever ends the job: a hook,
the agent, `jobstore rm`, the policy pass or the reaper. This module queues DAGs and reads
them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from sqlalchemy import Connection, func, select

from jobstore.core.jobs import Job, JobSpec, NodeJobs
from jobstore.core.states import FINAL_VALUES
from jobstore.db.backends import DAG, DagSettings, Door
from jobstore.db.dagengine import DONE, FAILED, LIVE, QUEUED
from jobstore.db.jsontext import json_value
from jobstore.db.schema import dag_nodes, dags, job_events, jobs
from jobstore.db.transactions import Transactions
from jobstore.errors import DagError

if TYPE_CHECKING:  # a hook's store never reads a DAG file: no submit package to import
    from jobstore.submit.dag import Dag, Node

# the jobs of the nodes to queue (those not DONE, not NOOP), for the DAG's id
NodeSpecs = Callable[[int], Sequence[NodeJobs]]


class DagBatch(NamedTuple):
    """An unfinished DAG as condor_q's batch view counts it."""

    dag_id: int
    owner: str
    batch_name: str
    submitted: float
    status: str
    nodes: dict[str, int]  # node status -> count
    jobs: dict[str, int]  # its nodes' jobs: status -> count
    clusters: tuple[int, int] | None  # the first and last cluster of its unfinished jobs
    path: str
    dag_status: int  # DAGMan's DAG_Status
    exit_code: int | None  # once it ended
    finished: float | None
    attrs: dict[str, str]  # SET_JOB_ATTR: name -> ClassAd expression
    submitted_jobs: int  # the jobs of its released nodes (DAG_JobsSubmitted)


class NodeEvent(NamedTuple):
    """An event of a DAG node's job (a DAG's jobstate log)."""

    time: float
    node: str
    event: str
    cluster_id: int
    proc_id: int


class NodeJobsQueue(Protocol):
    """What the DAGs need of the store's submit: their nodes' jobs queued into the clusters
    made for them (jobstore.db.submissions)."""

    def submit_nodes(self, conn: Connection, groups: Sequence[NodeJobs],
                     clusters_of: dict[str, int], *, owner: str, queue: str,
                     max_attempts: int, now: float,
                     check: Callable[[Job], None] | None, home: str | None = None) -> None:
        """The nodes' jobs, waiting, in `conn` (`home`: their access point's, which writes
        their event logs)."""


class DagStore:
    """Queue, hold, release and remove DAGs through the door; read them."""

    def __init__(self, db: Transactions, door: Door, nodes: NodeJobsQueue) -> None:
        self.db = db
        self.door = door
        self.nodes = nodes

    def submit_dag(self, dag: Dag, specs_of: NodeSpecs, *, owner: str, queue: str,
                   max_attempts: int, batch_name: str | None = None,
                   max_jobs: int | None = None, max_idle: int | None = None,
                   check: Callable[[Job], None] | None = None,
                   connection: Connection | None = None,
                   home: str | None = None, max_pre: int | None = None,
                   max_post: int | None = None) -> tuple[int, dict[str, int]]:
        """Queue `dag` in one transaction: (its DAGManJobId, each node's cluster). `specs_of`
        gives the jobs of the nodes to queue (their submit descriptions read with DAGMan's
        macros) for the DAG's id. The nodes without parents (or whose parents are DONE) are
        released at once. `home`: the access point it is submitted on, whose `jobstore
        schedd` writes its nodes' outputs and event logs, and runs its scripts (at most
        `max_pre` PRE and `max_post` POST scripts at once; 0: no limit of its own)."""
        now = time.time()
        with self.db.transaction(connection) as conn:
            config_jobs = _config_int(dag.config.get("DAGMAN_MAX_JOBS_SUBMITTED"))
            config_idle = _config_int(dag.config.get("DAGMAN_MAX_JOBS_IDLE"))
            dag_id = self.door.new_dag(
                conn, owner=owner, queue=queue, path=dag.path, batch_name=batch_name,
                max_jobs=max_jobs if max_jobs is not None else config_jobs,
                max_idle=max_idle if max_idle is not None else config_idle,
                attrs=dag.job_attrs, now=now, home=home)
            settings = DagSettings(
                dag.status_file, dag.status_every,
                max_pre if max_pre is not None else _config_int(
                    dag.config.get("DAGMAN_MAX_PRE_SCRIPTS"), least=0),
                max_post if max_post is not None else _config_int(
                    dag.config.get("DAGMAN_MAX_POST_SCRIPTS"), least=0))
            if settings != DagSettings(status_every=dag.status_every):
                self.door.dag_settings(conn, dag_id, settings)
            groups = specs_of(dag_id)
            procs = {}  # a node's jobs (a template's nodes are one each: none is read)
            late: dict[str, list[list[str]] | None] = {}  # inputs read when it is submitted
            for group in groups:
                for i, name in enumerate(group.names):
                    if group.template is not None:
                        procs[name] = 1
                        late[name] = _late(name, [group.template.spec])
                    else:
                        procs[name] = len(group.specs[i])
                        late[name] = _late(name, group.specs[i])
            nodes = [{"name": node.name, "procs": procs.get(node.name, 0),
                      "done": node.done, "priority": node.priority, "category": node.category,
                      "abort_exit": node.abort_exit, "abort_return": node.abort_return,
                      "final": node.final, "pre_script": node.pre_script,
                      "post_script": node.post_script, "pre_skip": node.pre_skip,
                      "directory": node.directory
                      if node.pre_script or node.post_script or node.hold_script else None,
                      "late_inputs": late.get(node.name)}
                     for node in dag.nodes.values()]
            edges = [(parent, node.name) for node in dag.nodes.values()
                     for parent in node.parents]
            clusters_of = self.door.dag_nodes(conn, dag_id, nodes, edges, dag.maxjobs, now)
            options = {node.name: _script_options(node) for node in dag.nodes.values()
                       if node.script_options or node.hold_script}
            if options:
                self.door.dag_script_options(conn, dag_id, options)
            self.nodes.submit_nodes(conn, groups, clusters_of, owner=owner, queue=queue,
                                    max_attempts=max_attempts, now=now, check=check,
                                    home=home)
            self.door.start_dag(conn, dag_id, now)
        return dag_id, clusters_of

    def dag_of(self, dag_id: int) -> Any | None:
        """The `dags` row of a DAGManJobId (None: not a DAG this session sees)."""
        with self.db.transaction() as conn:
            return conn.execute(select(dags).where(dags.c.id == dag_id)).first()

    def dag_batches(self, ids: Sequence[int] | None = None) -> list[DagBatch]:
        """The unfinished DAGs this session sees (or the DAGs `ids`, ended or not), with their
        nodes and their jobs counted."""
        which = dags.c.status.in_(LIVE) if ids is None else dags.c.id.in_(list(ids))
        with self.db.transaction() as conn:
            rows = conn.execute(select(dags).where(which).order_by(dags.c.id)).all()
            ids = [r.id for r in rows]
            if not ids:
                return []
            nodes: dict[int, dict[str, int]] = {}
            for dag_id, status, n in conn.execute(
                    select(dag_nodes.c.dag_id, dag_nodes.c.status, func.count())
                    .where(dag_nodes.c.dag_id.in_(ids))
                    .group_by(dag_nodes.c.dag_id, dag_nodes.c.status)):
                nodes.setdefault(dag_id, {})[status] = n
            counted: dict[int, dict[str, int]] = {}
            spans: dict[int, tuple[int, int]] = {}
            submitted: dict[int, int] = {}
            for dag_id, node_status, status, n, first, last in conn.execute(
                    select(dag_nodes.c.dag_id, dag_nodes.c.status, jobs.c.status, func.count(),
                           func.min(jobs.c.cluster_id), func.max(jobs.c.cluster_id))
                    .join(jobs, jobs.c.cluster_id == dag_nodes.c.cluster_id)
                    .where(dag_nodes.c.dag_id.in_(ids))
                    .group_by(dag_nodes.c.dag_id, dag_nodes.c.status, jobs.c.status)):
                mine = counted.setdefault(dag_id, {})
                mine[status] = mine.get(status, 0) + n
                if node_status in (QUEUED, DONE, FAILED):
                    submitted[dag_id] = submitted.get(dag_id, 0) + n
                if status not in FINAL_VALUES:
                    low, high = spans.get(dag_id, (first, last))
                    spans[dag_id] = (min(low, first), max(high, last))
        return [DagBatch(r.id, r.owner, r.batch_name, r.created_at, r.status,
                         nodes.get(r.id, {}), counted.get(r.id, {}), spans.get(r.id),
                         r.path, r.dag_status, r.exit_code, r.finished_at,
                         _attrs(r.attrs), submitted.get(r.id, 0))
                for r in rows]

    def dag_node_jobs(self, dag_id: int) -> dict[str, dict[str, int]]:
        """Each node's jobs of a DAG, counted by status."""
        out: dict[str, dict[str, int]] = {}
        with self.db.transaction() as conn:
            for name, status, n in conn.execute(
                    select(dag_nodes.c.name, jobs.c.status, func.count())
                    .join(jobs, jobs.c.cluster_id == dag_nodes.c.cluster_id)
                    .where(dag_nodes.c.dag_id == dag_id)
                    .group_by(dag_nodes.c.name, jobs.c.status)):
                out.setdefault(name, {})[status] = n
        return out

    def dag_events(self, dag_id: int) -> list[NodeEvent]:
        """The events of a DAG's node jobs, in the order they happened."""
        with self.db.transaction() as conn:
            rows = conn.execute(
                select(job_events.c.time, dag_nodes.c.name, job_events.c.event,
                       jobs.c.cluster_id, jobs.c.proc_id)
                .join(jobs, jobs.c.cluster_id == dag_nodes.c.cluster_id)
                .join(job_events, job_events.c.job_id == jobs.c.id)
                .where(dag_nodes.c.dag_id == dag_id).order_by(job_events.c.id))
            return [NodeEvent(*row) for row in rows]

    def dag_nodes_of(self, dag_id: int) -> list[Any]:
        """The nodes of a DAG, in their file's order of names."""
        with self.db.transaction() as conn:
            return list(conn.execute(select(dag_nodes).where(dag_nodes.c.dag_id == dag_id)
                                     .order_by(dag_nodes.c.name)))

    def pause_dag(self, dag_id: int, held: bool) -> bool:
        """Hold (no node released until it is released) or release a running DAG, as
        condor_hold and condor_release of DAGMan's job do; whether it changed."""
        with self.db.transaction() as conn:
            changes = self.door.pause_dag(conn, dag_id, held, time.time())
        return any(c.kind == DAG for c in changes)

    def remove_dag(self, dag_id: int, why: str = "the DAG was removed") -> bool:
        """condor_rm of DAGMan's job: the nodes that have not run never will, the queued ones'
        jobs are removed, and the DAG ends (removed; its FINAL node still runs)."""
        with self.db.transaction() as conn:
            changes = self.door.remove_dag(conn, dag_id, why, time.time())
        return any(c.kind == DAG for c in changes)


def _attrs(text: str | None) -> dict[str, str]:
    """A DAG's SET_JOB_ATTR attributes as stored (name -> expression text)."""
    value = json_value(text) if text else {}
    return {k: v for k, v in value.items() if isinstance(v, str)} if isinstance(value, dict) else {}


def _script_options(node: Node) -> dict[str, dict[str, Any]]:
    """A node's scripts' options for the door: DEFER and DEBUG by kind, and its HOLD
    script's command line."""
    out: dict[str, dict[str, Any]] = {k: dict(v) for k, v in node.script_options.items()}
    if node.hold_script:
        out["hold"] = {"command": node.hold_script, **out.get("hold", {})}
    return out


def _config_int(text: str | None, least: int = 1) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= least else None


def _late(name: str, specs: Sequence[JobSpec]) -> list[list[str]] | None:
    """The transfer_input_files a node's jobs take when it is submitted (None: none); every
    job of a node takes the same, read once for them all."""
    first = specs[0].late_inputs if specs else ()
    if any(spec.late_inputs != first for spec in specs):
        raise DagError(f"node {name}: its jobs' transfer_input_files differ; the job store "
                       "reads a node's inputs once, for all of its jobs, when it is submitted")
    return [list(pair) for pair in first] or None
