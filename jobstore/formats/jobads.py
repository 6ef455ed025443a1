"""Job rows as ClassAds: what is stored at submit time and what FETCH_WORK hands to the startd."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from classad2 import ClassAd, ExprTree

from jobstore.formats.classads import Expr, Value, render_ad

# Attributes that identify our job and its attempt in the starter hooks.
ATTR_JOB_ID = "JobstoreJobId"
ATTR_ATTEMPT = "JobstoreAttempt"
ATTR_TOKEN = "JobstoreToken"
ATTR_QUEUE = "JobstoreQueue"

# Attributes a submitter may not set: the job store decides them, or HTCondor gives them powers
# (JobKeyword fills the ad from configuration; HookKeyword picks other hooks; OsUser/User/Owner
# pick the account; private names never reach the starter).
RESERVED = frozenset(
    n.lower()
    for n in (
        "Owner",
        "User",
        "OsUser",
        "JobUniverse",
        "ClusterId",
        "ProcId",
        "HookKeyword",
        "JobKeyword",
        "JobLeaseDuration",
        "StarterHandlesAlives",
        "QDate",
        "GlobalJobId",
        ATTR_JOB_ID,
        ATTR_ATTEMPT,
        ATTR_TOKEN,
        ATTR_QUEUE,
        "ClaimId",
        "Capability",
        "ClaimIds",
        "ChildClaimIds",
        "ClaimIdList",
        "TransferKey",
    )
)


def to_json(value: Value) -> Any:
    """A ClassAd value as JSON: expressions become {"expr": text}."""
    return {"expr": str(value)} if isinstance(value, Expr) else value


def from_json(value: Any) -> Value:
    if isinstance(value, dict):
        return Expr(value["expr"])
    return value


def job_attrs(
    job: Mapping[str, Any], *, keyword: str, uid_domain: str, job_lease_duration: int
) -> dict[str, Value]:
    """Every attribute of the job ad for one attempt (the attempt's token included)."""
    attrs: dict[str, Value] = {k: from_json(v) for k, v in (job["ad"] or {}).items()}
    attrs.update(
        Owner=job["owner"],
        User=f"{job['owner']}@{uid_domain}",
        JobUniverse=5,
        ClusterId=int(job["cluster_id"]),
        ProcId=int(job["proc_id"]),
        QDate=int(job["submitted_at"]),
        JobPrio=int(job["priority"]),
        RequestCpus=int(job["request_cpus"]),
        RequestMemory=int(job["request_memory"]),
        RequestDisk=int(job["request_disk"]),
        HookKeyword=keyword,
        JobLeaseDuration=job_lease_duration,
    )
    attrs[ATTR_JOB_ID] = int(job["id"])
    attrs[ATTR_QUEUE] = job["queue"]
    if job.get("token"):
        attrs[ATTR_ATTEMPT] = int(job["claims"])
        attrs[ATTR_TOKEN] = job["token"]
    return attrs


def render_job(job: Mapping[str, Any], **kw: Any) -> str:
    """The FETCH_WORK output for a claimed job; raises classads.AdError if it cannot be sent."""
    return render_ad(job_attrs(job, **kw))


def job_classad(job: Mapping[str, Any], **kw: Any) -> ClassAd:
    """The job as a ClassAd, for matchmaking against a slot ad."""
    ad = ClassAd()
    for name, value in job_attrs(job, **kw).items():
        ad[name] = ExprTree(str(value)) if isinstance(value, Expr) else value
    return ad
