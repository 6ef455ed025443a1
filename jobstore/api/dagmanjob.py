"""DAGMan's job as htcondor2.Submit.from_dag describes it (`condor_dagman` in the scheduler
universe, `-Dag FILE` and condor_submit_dag's options in its arguments): the DAG it stands for,
for Schedd.submit to queue as condor_submit_dag would. What DAGMan would do that the job store
does not is refused with one line naming it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from jobstore.api.dags import DagDescription
from jobstore.errors import DagError
from jobstore.formats.classads import parse_ad

# its arguments that say nothing the job store acts on: DAGMan's own files, version and debug
IGNORED = {"-f": 0, "-l": 1, "-lockfile": 1, "-csdversion": 1, "-dagman": 1, "-autorescue": 1,
           "-allowversionmismatch": 0, "-verbose": 0, "-debug": 1, "-suppress_notification": 0,
           "-dont_suppress_notification": 0}
TAKEN = {"-maxjobs": "maxjobs", "-maxidle": "maxidle", "-maxpre": "maxpre",
         "-maxpost": "maxpost"}
# what from_dag writes in DAGMan's submit description besides its arguments
DESCRIPTION = {"universe", "executable", "arguments", "getenv", "output", "error", "log",
               "environment", "remove_kill_sig", "on_exit_remove", "my.jobbatchname",
               "my.otherjobremoverequirements", "my.isdaemoncore", "queue"}


def dagman_dag(description: Any) -> DagDescription | None:
    """The DAG a DAGMan job's description runs (None: `description` is no DAGMan job);
    DagError for one that asks for what the job store does not do."""
    if not isinstance(description, Mapping) and not hasattr(description, "items"):
        return None
    items = {str(k).lower(): str(v) for k, v in dict(description.items()).items()}
    if os.path.basename(items.get("executable", "")) != "condor_dagman":
        return None
    extra = sorted(set(items) - DESCRIPTION)
    if extra:
        raise DagError(f"Submit.from_dag: {extra[0]} is not supported by the job store for a "
                       "DAG (only condor_submit_dag's -maxjobs, -maxidle, -maxpre, -maxpost "
                       "and -batch-name)")
    if items.get("universe", "scheduler").lower() != "scheduler":
        raise DagError("Submit.from_dag: condor_dagman runs in the scheduler universe")
    dag, options = _arguments(arguments(items.get("arguments", "")))
    path = os.path.abspath(dag)
    log = items.get("log")
    if log is not None and os.path.abspath(log) != path + ".dagman.log":
        raise DagError(f"Submit.from_dag: log {log!r}: the DAG's own log is "
                       f"{os.path.basename(path)}.dagman.log, beside it")
    if "my.jobbatchname" in items:
        try:
            name = parse_ad(f"JobBatchName = {items['my.jobbatchname']}").get("JobBatchName")
        except Exception:  # noqa: BLE001 - whatever it holds, one line
            name = None
        if not isinstance(name, str):
            raise DagError("Submit.from_dag: JobBatchName is not a string")
        options["batch_name"] = name
    return DagDescription(path, options)


def arguments(text: str) -> list[str]:
    """HTCondor's arguments (the new syntax, in double quotes): whitespace between them, a
    single quote around what is taken whole, two of them in it for one."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1].replace('""', '"')
    out: list[str] = []
    word: list[str] | None = None
    quoted = False
    i = 0
    while i < len(text):
        c = text[i]
        if c == "'":
            if quoted and text[i + 1:i + 2] == "'":
                word = (word or []) + ["'"]
                i += 2
                continue
            quoted = not quoted
            word = word or []
        elif c.isspace() and not quoted:
            if word is not None:
                out.append("".join(word))
                word = None
        else:
            word = (word or []) + [c]
        i += 1
    if quoted:
        raise DagError("Submit.from_dag: its arguments have an unclosed quote")
    if word is not None:
        out.append("".join(word))
    return out


def _arguments(args: list[str]) -> tuple[str, dict[str, Any]]:
    """The DAG file and the options of condor_dagman's `args`."""
    dags: list[str] = []
    options: dict[str, Any] = {}
    i = 0
    while i < len(args):
        name = args[i].lower()
        if name == "-dag" and i + 1 < len(args):
            dags.append(args[i + 1])
            i += 2
        elif name in TAKEN and i + 1 < len(args):
            options[TAKEN[name]] = args[i + 1]
            i += 2
        elif name in IGNORED and i + IGNORED[name] < len(args):
            i += 1 + IGNORED[name]
        else:
            raise DagError(f"Submit.from_dag: condor_dagman's {args[i]} is not supported by the "
                           "job store (only -maxjobs, -maxidle, -maxpre, -maxpost and "
                           "-batch-name)")
    if len(dags) != 1:
        raise DagError("Submit.from_dag: one DAG file, as -Dag FILE (several are one DAG to "
                       "DAGMan: not supported by the job store)")
    return dags[0], options


__all__ = ["arguments", "dagman_dag"]
