"""Autoclusters: jobs that are the same in everything matching looks at are matched once.

HTCondor's schedd groups jobs by their significant attributes (SIGNIFICANT_ATTRIBUTES). Here an
autocluster is the queue, the owner, the submitter, the resource requests, the Requirements, the
concurrency limits and every submitted attribute except those that tell one job of a cluster from
another (`PER_JOB`). A slot judges one job of each autocluster and the verdict holds for all.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from jobstore.core.jobs import Job

# Submitted attributes that differ between otherwise identical jobs and that matching does not
# look at (a slot START that names one of them sees the autocluster's first job's value).
PER_JOB = frozenset(
    n.lower()
    for n in (
        "Cmd", "Arguments", "Args", "Environment", "Env", "Iwd", "In", "Out", "Err", "UserLog",
        "ProcId", "ClusterId", "QDate", "JobPrio", "GlobalJobId",
        "DAGManJobId", "DAGNodeName", "DAGParentNodeNames",  # a DAG node's (jobstore.db.dags)
    )
)

# The job columns that are part of an autocluster, besides the significant submitted attributes.
KEY_COLUMNS = (
    "queue",
    "owner",
    "submitter",
    "request_cpus",
    "request_memory",
    "request_disk",
    "requirements",
    "concurrency_limits",
)


def significant_attrs(ad: dict[str, Any]) -> dict[str, Any]:
    """The submitted attributes that matching may look at."""
    return {name: value for name, value in ad.items() if name.lower() not in PER_JOB}


def signature(job: Job) -> str:
    """A stable digest of everything that puts `job` in its autocluster."""
    key = {name: getattr(job, name) for name in KEY_COLUMNS}
    key["ad"] = {k.lower(): v for k, v in significant_attrs(job.ad or {}).items()}
    text = json.dumps(key, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()

