"""condor_submit_dag for the job store (issue 31): a DAG file read (jobstore.submit.dag), each
node's submit description read with DAGMan's macros and VARS, and the whole DAG queued in one
transaction (jobstore.db.dags), where the store does DAGMan's work from then on."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import htcondor2

from jobstore.api.submission import choose_owner, render_check
from jobstore.core.jobs import JobSpec
from jobstore.db.dags import LIVE
from jobstore.db.store import JobStore
from jobstore.node import config
from jobstore.submit.dag import Dag, DagError, Node, read_dag
from jobstore.submit.description import parse_submit_text
from jobstore.submit.values import string_literal

# condor_submit_dag's options the job store takes (Python name -> what it means here)
OPTIONS = ("maxjobs", "maxidle", "batch_name", "force", "rescue")
_FINAL_ONLY = ("DAG_STATUS", "FAILED_COUNT")
# DAGMan leaves DAGParentNodeNames empty when the names would make the job ad too long
MAX_PARENT_NAMES = 1024


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
        """The DAG in `filename` with condor_submit_dag's `options` (maxjobs, maxidle,
        batch_name, force), for `jobstore.Schedd.submit`; its options are checked now."""
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
    """Read the DAG file at `path` and queue it; DagError (one line, with the file and line)
    for what cannot run, SubmitError for a node's submit description."""
    opts = _options(options or {})
    dag = read_dag(path)
    if opts.get("rescue") is not None:
        _rescue(store, dag, opts["rescue"])
    who = choose_owner(owner, settings, store.identity())
    dag_id, clusters = store.submit_dag(
        dag, _node_specs(dag), owner=who, queue=queue or settings.queue,
        max_attempts=settings.max_attempts, batch_name=opts.get("batch_name"),
        max_jobs=opts.get("maxjobs"), max_idle=opts.get("maxidle"),
        check=render_check(settings))
    return DagSubmitted(dag_id, clusters)


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
        elif name in ("maxjobs", "maxidle"):
            try:
                number = int(value)
            except (TypeError, ValueError):
                raise DagError(f"-{name}: {value!r} is not an integer") from None
            out[name] = number if number > 0 else None
        elif name == "batch_name":
            out[name] = str(value)
    return out


def _rescue(store: JobStore, dag: Dag, old_id: int) -> None:
    """What DAGMan's rescue DAG does: the nodes the ended DAG `old_id` (of the same file) got
    done are DONE; the others run again."""
    old = store.dag_of(old_id)
    if old is None:
        raise DagError(f"-rescue {old_id}: no such DAG")
    if old.status in LIVE:
        raise DagError(f"-rescue {old_id}: the DAG is {old.status}; rm it first")
    if os.path.abspath(old.path) != dag.path:
        raise DagError(f"-rescue {old_id}: that DAG was {old.path}, not {dag.path}")
    for node in store.dag_nodes_of(old_id):
        if node.status == "done" and node.name in dag.nodes:
            dag.nodes[node.name].done = True


def _node_specs(dag: Dag) -> Callable[[Node, int], Sequence[JobSpec]]:
    """What queues a node: its submit description read as DAGMan submits it."""
    append_default = dag.config.get("DAGMAN_DEFAULT_APPEND_VARS", "false").strip().lower() in (
        "true", "1", "yes")
    texts: dict[str, str] = {}

    def specs_of(node: Node, dag_id: int) -> Sequence[JobSpec]:
        text = node.inline if node.inline is not None else _read(texts, node)
        if not node.final:
            for macro in _FINAL_ONLY:
                if f"$({macro})" in text:
                    raise DagError(f"{node.where}: node {node.name}: $({macro}) is known only "
                                   "when the DAG ends; the job store reads a node's submit "
                                   "description when the DAG is queued")
        prepended, appended, attrs = [], {}, {}
        for var in node.vars:
            value = var.value.replace("$(JOB)", node.name).replace("$(RETRY)", "0")
            if var.name.startswith("+") or var.name.lower().startswith("my."):
                attrs[var.name.split(".", 1)[1] if "." in var.name else var.name[1:]] = value
            elif (append_default if var.prepend is None else not var.prepend):
                appended[var.name] = value
            else:
                prepended.append(f"{var.name} = {value}")
        macros = {"JOB": node.name, "NODE_NAME": node.name, "RETRY": "0",
                  "DAGManJobId": str(dag_id), "DAG_STATUS": "0", "FAILED_COUNT": "0",
                  **appended}
        source = f"{node.where}: node {node.name}"
        specs = parse_submit_text("\n".join([*prepended, text]), base_dir=node.directory,
                                  extra_vars=macros, source=source)
        if not specs:
            raise DagError(f"{source}: its submit description queues no job")
        return [_as_node(spec, node, dag_id, attrs) for spec in specs]

    return specs_of


def _read(texts: dict[str, str], node: Node) -> str:
    path = node.submit_file or ""
    if path not in texts:
        try:
            with open(path, encoding="utf-8") as fh:
                texts[path] = fh.read()
        except OSError as exc:
            raise DagError(f"{node.where}: node {node.name}: {path}: {exc.strerror}") from None
    return texts[path]


def _as_node(spec: JobSpec, node: Node, dag_id: int, attrs: dict[str, str]) -> JobSpec:
    """A node's job: DAGMan's attributes, and its RETRY as the job's own retries."""
    parents = ",".join(node.parents)
    custom = {**spec.custom, **attrs, "DAGManJobId": str(dag_id),
              "DAGNodeName": string_literal(node.name),
              "DAGParentNodeNames": string_literal(parents if len(parents) <= MAX_PARENT_NAMES
                                            else "")}
    changes: dict[str, Any] = {"custom": custom}
    if node.retry:
        changes["max_retries"] = node.retry
        if node.unless_exit is not None:
            changes["retry_until"] = f"ExitCode == {node.unless_exit}"
    return dataclasses.replace(spec, **changes)
