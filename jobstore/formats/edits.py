"""condor_qedit's rules for a job in the store: which attributes may change while a job waits,
and the columns and submitted attributes an edit changes."""

from __future__ import annotations

from typing import Any

from classad2 import ExprTree

from jobstore.core.jobs import Job
from jobstore.errors import InvalidInput
from jobstore.formats.classads import Expr
from jobstore.formats.jobads import RESERVED, to_json

# Attributes the job store computes from its columns (jobstore.formats.views.job_ad).
COMPUTED = frozenset(n.lower() for n in (
    "JobStatus", "JobstoreStatus", "NumJobStarts", "JobstoreClaims", "EnteredCurrentStatus",
    "ExitCode", "ExitSignal", "ExitBySignal", "RemoteHost", "JobPid", "RemoteUserCpu",
    "RemoteSysCpu", "ImageSize", "MemoryUsage", "ResidentSetSize", "JobStartDate",
    "JobCurrentStartDate", "JobCurrentStartExecutingDate", "ShadowBday", "CompletionDate",
    "HoldReason", "LastReason", "HoldReasonCode", "HoldReasonSubCode", "NumHolds",
))
# Integer attributes kept in a column of their own: lower-case name -> column.
_INT_COLUMNS = {"jobprio": "priority", "requestcpus": "request_cpus",
                "requestmemory": "request_memory", "requestdisk": "request_disk"}


def edit_target(attr: str, value: str) -> tuple[str, str]:
    """The attribute and expression text of an edit, checked: ValueError for an attribute that
    may not change or a value that is not one ClassAd expression."""
    name = attr.strip()
    low = name.lower()
    if not name.isidentifier() or low in RESERVED or low in COMPUTED or low.startswith(
            "jobstore"):
        raise InvalidInput(f"{name}: this attribute cannot be edited")
    try:
        text = str(ExprTree(str(value)))
    except Exception:
        raise InvalidInput(f"{name}: {value!r} is not a ClassAd expression") from None
    if "\n" in text or "\r" in text:
        raise InvalidInput(f"{name}: the value may not contain a newline")
    return name, text


def edit_changes(job: Job, name: str, text: str) -> dict[str, Any]:
    """The columns of `job` that setting attribute `name` to `text` changes (its `ad`, and
    the column that holds the attribute when one does)."""
    low = name.lower()
    ad = {k: v for k, v in (job.ad or {}).items() if k.lower() != low}
    changes: dict[str, Any] = {}
    if low in _INT_COLUMNS:
        value = ExprTree(text).eval()
        if type(value) is not int or (low != "jobprio" and value < 0):
            raise InvalidInput(f"{name}: {text} is not a non-negative integer")
        changes[_INT_COLUMNS[low]] = value
    else:
        ad[name] = to_json(Expr(text))
        if low == "requirements":
            changes["requirements"] = text
    changes["ad"] = ad
    return changes


__all__ = ["edit_target", "edit_changes", "COMPUTED"]
