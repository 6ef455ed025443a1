"""A DAG as DAGMan shows it: its own job ad with DAGMan's counters (condor_dagman's
dagman_classad.cpp), its node status file (NODE_STATUS_FILE, dag.cpp's DumpNodeStatus) and its
jobstate log (JOBSTATE_LOG, jobstate_log.cpp), made from the store's rows when asked for: no
DAGMan process writes them."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from jobstore.formats.classads import Expr, Value, string_literal

# DAGMan's Node::status_t, by the store's dag_nodes.status
NODE_STATUS = {"waiting": 0, "ready": 1, "pre": 2, "queued": 3, "post": 4, "done": 5,
               "failed": 6, "futile": 7}
_STATUS_NAMES = ("STATUS_NOT_READY", "STATUS_READY", "STATUS_PRERUN", "STATUS_SUBMITTED",
                 "STATUS_POSTRUN", "STATUS_DONE", "STATUS_ERROR", "STATUS_FUTILE")
# the DAG's own job: JobStatus by dags.status (DAGMan's job runs until the DAG ends)
_DAG_JOB_STATUS = {"running": 2, "held": 5, "removing": 3, "removed": 3, "completed": 4,
                   "failed": 4}
SCHEDULER_UNIVERSE = 7
# the user log event names (ULOG_ without its prefix) of the store's events, as a jobstate log
# names them; NODE_READY is when DAGMan would have submitted the node's job
_JOBSTATE_EVENTS = {"node_ready": "SUBMIT", "start": "EXECUTE", "exit": "JOB_TERMINATED",
                    "evict": "JOB_EVICTED", "lease_expired": "JOB_EVICTED",
                    "claim_evicted": "JOB_EVICTED", "hold": "JOB_HELD",
                    "hook_hold": "JOB_HELD", "release": "JOB_RELEASED",
                    "remove": "JOB_ABORTED", "hook_remove": "JOB_ABORTED"}


def dag_ad(dag: Any, now: float | None = None) -> dict[str, Value]:
    """The DAG's own job ad (a jobstore.db.dags.DagBatch): what condor_q -l of DAGMan's job
    shows, its counters as DAGMan publishes them, and SET_JOB_ATTR's attributes."""
    nodes, jobs = dag.nodes, dag.jobs
    ad: dict[str, Value] = {
        "ClusterId": dag.dag_id, "ProcId": 0, "Owner": dag.owner,
        "JobBatchName": dag.batch_name, "JobUniverse": SCHEDULER_UNIVERSE,
        "JobStatus": _DAG_JOB_STATUS.get(dag.status, 2), "QDate": int(dag.submitted),
        "DAGManDagFile": dag.path,
        "DAG_AdUpdateTime": int(time.time() if now is None else now),
        "DAG_NodesTotal": sum(nodes.values()), "DAG_NodesDone": nodes.get("done", 0),
        "DAG_NodesPrerun": nodes.get("pre", 0), "DAG_NodesQueued": nodes.get("queued", 0),
        "DAG_NodesPostrun": nodes.get("post", 0), "DAG_NodesHoldrun": 0,
        "DAG_NodesReady": nodes.get("ready", 0),
        "DAG_NodesFailed": nodes.get("failed", 0), "DAG_NodesUnready": nodes.get("waiting", 0),
        "DAG_NodesFutile": nodes.get("futile", 0), "DAG_Status": dag.dag_status,
        "DAG_InRecovery": 0, "DAG_JobsSubmitted": dag.submitted_jobs,
        "DAG_JobsIdle": jobs.get("idle", 0) + jobs.get("fetched", 0),
        "DAG_JobsHeld": jobs.get("held", 0),
        "DAG_JobsRunning": jobs.get("accepted", 0) + jobs.get("running", 0),
        "DAG_JobsCompleted": jobs.get("completed", 0),
    }
    if dag.finished is not None:
        ad["CompletionDate"] = int(dag.finished)
        if dag.exit_code is not None:
            ad["ExitCode"] = dag.exit_code
    for name, text in dag.attrs.items():
        if name.lower() not in {key.lower() for key in ad}:
            ad[name] = Expr(text)
    return ad


def node_status_file(dag: Any, nodes: Iterable[Any], jobs: dict[str, dict[str, int]],
                     now: float | None = None) -> str:
    """The node status file DAGMan writes for NODE_STATUS_FILE: the DAG's status, one ad per
    node (`nodes`: dag_nodes rows; `jobs`: each node's job statuses counted), and the end."""
    now = time.time() if now is None else now
    ended = dag.finished is not None
    if dag.status == "completed":
        status, note = 5, "success"
    elif dag.status == "failed":
        status, note = 6, "aborted" if dag.dag_status == 3 else "failed"
    elif dag.status in ("removed", "removing"):
        status, note = 6, "removed"
    else:
        status, note = 3, "held" if dag.status == "held" else ""
    counts = dag.nodes
    held = sum(j.get("held", 0) for j in jobs.values())
    idle = sum(j.get("idle", 0) + j.get("fetched", 0) for j in jobs.values()) + held
    lines = ["[", '  Type = "DagStatus";', "  DagFiles = {", f"    {string_literal(dag.path)}",
             "  };", f"  Timestamp = {int(now)}; /* {string_literal(time.ctime(now))} */",
             f"  DagStatus = {status}; /* {string_literal(f'{_STATUS_NAMES[status]} ({note})')} */",
             f"  NodesTotal = {sum(counts.values())};",
             f"  NodesDone = {counts.get('done', 0)};",
             f"  NodesPre = {counts.get('pre', 0)};",
             f"  NodesQueued = {counts.get('queued', 0)};",
             f"  NodesPost = {counts.get('post', 0)};",
             f"  NodesReady = {counts.get('ready', 0)};",
             f"  NodesUnready = {counts.get('waiting', 0)};",
             f"  NodesFutile = {counts.get('futile', 0)};",
             f"  NodesFailed = {counts.get('failed', 0)};", f"  JobProcsHeld = {held};",
             f"  JobProcsIdle = {idle}; /* includes held */", "]"]
    for node in nodes:
        code = NODE_STATUS.get(node.status, 0)
        mine = jobs.get(node.name, {})
        details = {"futile": "Had an ancestor node fail"}.get(node.status, "")
        if node.status == "queued":
            details = "idle" if mine.get("idle", 0) + mine.get("fetched", 0) else "not_idle"
        elif node.status == "failed" and node.exit_code is not None:
            details = f"Job failed with exit code {node.exit_code}"
        queued = sum(n for s, n in mine.items() if s not in ("completed", "removed", "failed",
                                                              "waiting"))
        lines += ["[", '  Type = "NodeStatus";', f"  Node = {string_literal(node.name)};",
                  f"  NodeStatus = {code}; /* {string_literal(_STATUS_NAMES[code])} */",
                  f"  StatusDetails = {string_literal(details)};", "  RetryCount = 0;",
                  f"  JobProcsQueued = {queued};", f"  JobProcsHeld = {mine.get('held', 0)};",
                  "]"]
    lines += ["[", '  Type = "StatusEnd";', f"  EndTime = {int(now)}; /* "
              f"{string_literal(time.ctime(now))} */",
              "  NextUpdate = 0; /* \"none\" */" if ended else
              f"  NextUpdate = {int(now)}; /* {string_literal(time.ctime(now))} */", "]"]
    return "\n".join(lines) + "\n"


def jobstate_log(dag: Any, events: Sequence[Any], nodes: Iterable[Any]) -> str:
    """The jobstate log DAGMan writes for JOBSTATE_LOG (the lines Pegasus reads): DAGMan's
    start, each node job's events, each node's JOB_SUCCESS or JOB_FAILURE, DAGMan's end."""
    lines = [(dag.submitted, 0, f"INTERNAL *** DAGMAN_STARTED {dag.dag_id}.0 ***")]
    seq: dict[str, int] = {}
    last: dict[str, tuple[float, str]] = {}
    for i, event in enumerate(events, start=1):
        name = _JOBSTATE_EVENTS.get(event.event)
        if name is None:
            continue
        number = seq.setdefault(event.node, len(seq) + 1)
        lines.append((event.time, i, f"{event.node} {name} {event.cluster_id}."
                      f"{event.proc_id} - - {number}"))
        last[event.node] = (event.time, f"{event.cluster_id}.{event.proc_id}")
    for node in nodes:
        if node.status not in ("done", "failed") or node.name not in last:
            continue
        when, _job = last[node.name]
        code = 0 if node.status == "done" else (node.exit_code or 1)
        lines.append((when, len(events) + 1 + seq[node.name],
                      f"{node.name} {'JOB_SUCCESS' if code == 0 else 'JOB_FAILURE'} {code} - "
                      f"- {seq[node.name]}"))
    if dag.finished is not None:
        lines.append((dag.finished, len(events) * 2 + 2,
                      f"INTERNAL *** DAGMAN_FINISHED {dag.exit_code or 0} ***"))
    return "".join(f"{int(when)} {text}\n" for when, _order, text in sorted(
        lines, key=lambda line: (line[0], line[1])))
