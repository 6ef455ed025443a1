"""condor_submit_dag for the job store: a DAG file read (jobstore.submit.dag), each
node's submit description read with DAGMan's macros and VARS, and the whole DAG queued in one
transaction (jobstore.db.dags), where the store does DAGMan's work from then on."""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, overload

import htcondor2
from classad2 import ClassAd

from jobstore.api.submission import choose_owner, render_check
from jobstore.core.jobs import PLACEHOLDER_MARK, JobSpec, NodeJobs, ProcTemplate
from jobstore.db.dags import LIVE, DagBatch
from jobstore.db.store import JobStore
from jobstore.errors import DagError, SubmitError
from jobstore.formats import dagads
from jobstore.formats.classads import VERBATIM, parse_ad, render_ad, string_literal
from jobstore.node import config
from jobstore.submit.dag import Dag, Node, read_dag
from jobstore.submit.description import parse_submit_nodes, parse_submit_text
from jobstore.submit.expansion import SubmitSpecs

# condor_submit_dag's options the job store takes (Python name -> what it means here)
OPTIONS = ("maxjobs", "maxidle", "maxpre", "maxpost", "batch_name", "force", "rescue")
_FINAL_ONLY = ("DAG_STATUS", "FAILED_COUNT")
# DAGMan leaves DAGParentNodeNames empty when the names would make the job ad too long
MAX_PARENT_NAMES = 1024
_RETRY = re.compile(r"(?i)\$\(RETRY\)")


@dataclass(frozen=True)
class DagDescription:
    """What `Submit.from_dag` returns, as htcondor2's does: a DAG to queue with
    `Schedd.submit`."""

    path: str
    options: Mapping[str, Any]


class Submit(htcondor2.Submit):
    """htcondor2.Submit, whose `from_dag` the job store's Schedd takes: code that calls
    `htcondor2.Submit.from_dag` changes one import."""

    @staticmethod
    def from_dag(filename: str, options: Mapping[str, Any] | None = None,  # type: ignore[override]
                 ) -> DagDescription:
        """The DAG in `filename` with condor_submit_dag's `options` (maxjobs, maxidle, maxpre,
        maxpost, batch_name, force), for `jobstore.Schedd.submit`; its options are checked
        now."""
        _options(options or {})
        return DagDescription(os.path.abspath(filename), dict(options or {}))


@dataclass(frozen=True)
class DagSubmitted:
    """A queued DAG: its DAGManJobId, and each node's cluster."""

    dag_id: int
    clusters: dict[str, int]


def submit_dag(store: JobStore, path: str, settings: config.Settings, *,
               owner: str | None = None, queue: str | None = None,
               options: Mapping[str, Any] | None = None) -> DagSubmitted:
    """Read the DAG file at `path` and queue it, on this access point (its `jobstore schedd`
    writes the nodes' outputs and event logs); DagError (one line, with the file and line)
    for what cannot run, SubmitError for a node's submit description."""
    opts = _options(options or {})
    dag = read_dag(path)
    if opts.get("rescue") is not None:
        _rescue(store, dag, opts["rescue"])
    who = choose_owner(owner, settings, store.db.identity())
    dag_id, clusters = store.dags.submit_dag(
        dag, _node_jobs(dag), owner=who, queue=queue or settings.queue,
        max_attempts=settings.max_attempts, batch_name=opts.get("batch_name"),
        max_jobs=opts.get("maxjobs"), max_idle=opts.get("maxidle"),
        check=render_check(settings), home=settings.access_point(),
        max_pre=opts.get("maxpre"), max_post=opts.get("maxpost"))
    return DagSubmitted(dag_id, clusters)


def dag_ads(store: JobStore, ids: Sequence[int] | None = None) -> list[ClassAd]:
    """The DAGs' own job ads with DAGMan's counters (jobstore.formats.dagads): those of the
    DAGs `ids`, or of every unfinished DAG the session sees."""
    now = time.time()
    return [parse_ad(render_ad(dagads.dag_ad(dag, now))) for dag in store.dags.dag_batches(ids)]


def node_status_file(store: JobStore, dag_id: int) -> str:
    """The DAG's node status file, in DAGMan's format (DagError: no such DAG)."""
    dag = _one(store, dag_id)
    return dagads.node_status_file(dag, store.dags.dag_nodes_of(dag_id),
                                   store.dags.dag_node_jobs(dag_id))


def jobstate_log(store: JobStore, dag_id: int) -> str:
    """The DAG's jobstate log, in DAGMan's format (DagError: no such DAG)."""
    dag = _one(store, dag_id)
    return dagads.jobstate_log(dag, store.dags.dag_events(dag_id), store.dags.dag_nodes_of(dag_id))


def _one(store: JobStore, dag_id: int) -> DagBatch:
    found = store.dags.dag_batches([dag_id])
    if not found:
        raise DagError(f"no DAG {dag_id}")
    return found[0]


def _options(options: Mapping[str, Any]) -> dict[str, Any]:
    """condor_submit_dag's options as htcondor2.Submit.from_dag takes them (names without the
    dash, `batch-name` or `batch_name`); one that means nothing here is refused."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        name = key.lstrip("-").replace("-", "_").lower()
        if name not in OPTIONS:
            raise DagError(f"condor_submit_dag option {key!r} is not supported by the job store"
                           f" (only {', '.join('-' + o.replace('_', '-') for o in OPTIONS)})")
        if name == "rescue":
            try:
                out[name] = int(value)
            except (TypeError, ValueError):
                raise DagError(f"-rescue: {value!r} is not a DAG's id") from None
        elif name in ("maxjobs", "maxidle", "maxpre", "maxpost"):
            try:
                number = int(value)
            except (TypeError, ValueError):
                raise DagError(f"-{name}: {value!r} is not an integer") from None
            if name in ("maxpre", "maxpost"):  # 0: no limit of the DAG's own
                out[name] = max(number, 0)
            else:
                out[name] = number if number > 0 else None
        elif name == "batch_name":
            out[name] = str(value)
    return out


def _rescue(store: JobStore, dag: Dag, old_id: int) -> None:
    """What DAGMan's rescue DAG does: the nodes the ended DAG `old_id` (of the same file) got
    done are DONE; the others run again."""
    old = store.dags.dag_of(old_id)
    if old is None:
        raise DagError(f"-rescue {old_id}: no such DAG")
    if old.status in LIVE:
        raise DagError(f"-rescue {old_id}: the DAG is {old.status}; rm it first")
    if os.path.abspath(old.path) != dag.path:
        raise DagError(f"-rescue {old_id}: that DAG was {old.path}, not {dag.path}")
    for node in store.dags.dag_nodes_of(old_id):
        if node.status == "done" and node.name in dag.nodes:
            dag.nodes[node.name].done = True


class _Group(NamedTuple):
    """What nodes must share to be read with one parse of their submit description."""

    text: str
    directory: str
    before: tuple[str, ...]  # the VARS set before the text, by name
    after: tuple[str, ...]  # and those set after it
    attrs: tuple[tuple[str, str], ...]  # VARS +attr
    retry: int
    unless_exit: int | None
    final: bool
    late: bool  # its transfer_input_files read when it is submitted (_late_inputs)


class _Member(NamedTuple):
    """A node of a group, with its VARS set before and after the text."""

    node: Node
    before: dict[str, str]
    after: dict[str, str]

    def variables(self) -> dict[str, str]:
        """What the node sets after the text: its appended VARS and DAGMan's node macros."""
        return {**self.after, "JOB": self.node.name, "NODE_NAME": self.node.name}


def _node_jobs(dag: Dag) -> Callable[[int], list[NodeJobs]]:
    """What queues the nodes not DONE: their submit descriptions read as DAGMan submits each
    node, once for all the nodes that share one (and the same VARS names)."""
    append_default = dag.config.get("DAGMAN_DEFAULT_APPEND_VARS", "false").strip().lower() in (
        "true", "1", "yes")
    texts: dict[str, str] = {}

    def jobs_of(dag_id: int) -> list[NodeJobs]:
        groups: dict[_Group, list[_Member]] = {}
        for node in dag.nodes.values():
            if node.noop or node.done:
                continue
            text = node.inline if node.inline is not None else _read(texts, node)
            if not node.final:
                for macro in _FINAL_ONLY:
                    if f"$({macro})" in text:
                        raise DagError(f"{node.where}: node {node.name}: $({macro}) is known "
                                       "only when the DAG ends; the job store reads a node's "
                                       "submit description when the DAG is queued")
            if node.retry and (_RETRY.search(text) or any(_RETRY.search(v.value)
                                                           for v in node.vars)):
                raise DagError(f"{node.where}: node {node.name}: $(RETRY) would be 0 in every "
                               "try: a RETRY runs the node's job again (its max_retries), "
                               "it does not submit it anew")
            before, after, attrs = {}, {}, {}
            for var in node.vars:
                value = var.value.replace("$(JOB)", node.name).replace("$(RETRY)", "0")
                if var.name.startswith("+") or var.name.lower().startswith("my."):
                    attrs[var.name.split(".", 1)[1] if "." in var.name else var.name[1:]] = value
                elif (append_default if var.prepend is None else not var.prepend):
                    after[var.name] = value
                else:
                    before[var.name] = value
            key = _Group(text, node.directory, tuple(before), tuple(after),
                         tuple(attrs.items()), node.retry, node.unless_exit, node.final,
                         _late_inputs(node))
            groups.setdefault(key, []).append(_Member(node, before, after))
        return [_group_jobs(key, members, dag_id) for key, members in groups.items()]

    return jobs_of


def _group_jobs(key: _Group, members: list[_Member], dag_id: int) -> NodeJobs:
    """The jobs of nodes that share a submit description: one parse for them all where the
    description allows it (each node's VARS set after the text, which then sets none of them),
    else one per node (its prepended VARS as lines before the text)."""
    macros = {"RETRY": "0", "DAGManJobId": str(dag_id), "DAG_STATUS": "0", "FAILED_COUNT": "0"}
    nodes = [m.node for m in members]
    attrs = dict(key.attrs)
    first = nodes[0]
    source = f"{first.where}: node {first.name}"
    shared = None
    if len(members) > 1:
        shared = parse_submit_nodes(key.text, base_dir=key.directory, extra_vars=macros,
                                    items=[{**m.before, **m.variables()} for m in members],
                                    before=key.before, source=source, late_inputs=key.late)
    if shared is None:
        specs = [_node_specs(m.node, "\n".join(
            [*(f"{name} = {value}" for name, value in m.before.items()), key.text]),
            {**macros, **m.variables()}, dag_id, attrs, key.late) for m in members]
        return NodeJobs([node.name for node in nodes], specs)
    return NodeJobs([node.name for node in nodes], _SharedSpecs(shared, nodes, dag_id, attrs),
                    _node_template(shared, nodes, dag_id, attrs))


def _late_inputs(node: Node) -> bool:
    """Are the node's transfer_input_files read when it is submitted (its parents done, their
    outputs home), as DAGMan reads a node's submit description then? A node with parents,
    and the FINAL node, may take what others make."""
    return bool(node.parents) or node.final


def _node_specs(node: Node, text: str, macros: dict[str, str], dag_id: int,
                attrs: dict[str, str], late: bool) -> list[JobSpec]:
    source = f"{node.where}: node {node.name}"
    specs = parse_submit_text(text, base_dir=node.directory, extra_vars=macros, source=source,
                              late_inputs=late)
    if not specs:
        raise DagError(f"{source}: its submit description queues no job")
    return [_as_node(spec, node.name, _parent_names(node), dag_id, attrs, node)
            for spec in specs]


class _SharedSpecs(Sequence[Sequence[JobSpec]]):
    """Each node's one job, made from the shared parse when it is read."""

    def __init__(self, specs: SubmitSpecs, nodes: list[Node], dag_id: int,
                 attrs: dict[str, str]):
        self._specs, self._nodes, self._dag_id, self._attrs = specs, nodes, dag_id, attrs

    def __len__(self) -> int:
        return len(self._nodes)

    @overload
    def __getitem__(self, index: int) -> Sequence[JobSpec]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Sequence[JobSpec]]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        node = self._nodes[index]
        try:
            spec = self._specs[index]
        except SubmitError as exc:
            raise DagError(f"{node.where}: node {node.name}: {exc}") from None
        return [_as_node(spec, node.name, _parent_names(node), self._dag_id, self._attrs, node)]


def _node_template(specs: SubmitSpecs, nodes: list[Node], dag_id: int,
                   attrs: dict[str, str]) -> ProcTemplate | None:
    """The nodes' jobs as one template whose item rows are the nodes, with DAGMan's
    attributes; None when a name would not be the same text in JSON and in a ClassAd
    string."""
    template = specs.template()
    names = [node.name for node in nodes]
    parents = [_parent_names(node) for node in nodes]
    if template is None or not all(VERBATIM.fullmatch(v) and PLACEHOLDER_MARK not in v
                                   for v in (*names, *parents)):
        return None
    nonce = secrets.token_hex(6)
    name, parent = f"JOBSTORENODE0X{nonce}", f"JOBSTORENODE1X{nonce}"
    spec = _as_node(template.spec, name, parent, dag_id, attrs, nodes[0])
    return dataclasses.replace(template, spec=spec,
                               items={**template.items, name: names, parent: parents})


def _parent_names(node: Node) -> str:
    """DAGParentNodeNames; empty where the names would make the job ad too long."""
    parents = ",".join(node.parents)
    return parents if len(parents) <= MAX_PARENT_NAMES else ""


def _read(texts: dict[str, str], node: Node) -> str:
    path = node.submit_file or ""
    if path not in texts:
        try:
            with open(path, encoding="utf-8") as fh:
                texts[path] = fh.read()
        except OSError as exc:
            raise DagError(f"{node.where}: node {node.name}: {path}: {exc.strerror}") from None
    return texts[path]


def _as_node(spec: JobSpec, name: str, parents: str, dag_id: int, attrs: dict[str, str],
             node: Node) -> JobSpec:
    """A node's job: DAGMan's attributes, and its RETRY as the job's own retries (DagError
    for `hold = true`, which would hold it before its parents are done)."""
    if spec.hold:
        raise DagError(f"{node.where}: node {node.name}: hold = true is not supported in a "
                       "node's submit description (DAGMan holds such a job when its parents "
                       "are done; here it would be held, and could be released, before)")
    custom = {**spec.custom, **attrs, "DAGManJobId": str(dag_id),
              "DAGNodeName": string_literal(name), "DAGParentNodeNames": string_literal(parents)}
    changes: dict[str, Any] = {"custom": custom}
    if node.retry:
        changes["max_retries"] = node.retry
        if node.unless_exit is not None:
            changes["retry_until"] = f"ExitCode == {node.unless_exit}"
    return dataclasses.replace(spec, **changes)
