"""Job rows as ClassAds: what is stored at submit time and what FETCH_WORK hands to the startd."""

from __future__ import annotations

import math
import os
import re
from typing import Any

from classad2 import ClassAd, ExprTree

from jobstore.core.jobs import Job, JobSpec
from jobstore.errors import AdError
from jobstore.formats.classads import Expr, Value, get_int, render_ad

# Attributes that identify our job and its attempt in the starter hooks.
ATTR_JOB_ID = "JobstoreJobId"
ATTR_ATTEMPT = "JobstoreAttempt"
ATTR_TOKEN = "JobstoreToken"
ATTR_QUEUE = "JobstoreQueue"
ATTR_SANDBOX = "JobstoreSandbox"  # true: the job's Iwd is its sandbox (file transfer)

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
        # set by the accounting_group, accounting_group_user and concurrency_limits commands
        "AccountingGroup",
        "AcctGroup",
        "AcctGroupUser",
        "ConcurrencyLimits",
        # HTCondor's SYSTEM_IMMUTABLE_JOB_ATTRS and SYSTEM_SECURE_JOB_ATTRS (never submitted)
        "MyType",
        "TargetType",
        "x509userProxySubject",
        "x509UserProxyEmail",
        "x509UserProxyVOName",
        "x509UserProxyFirstFQAN",
        "x509UserProxyFQAN",
        "TotalSubmitProcs",
        "AuthTokenSubject",
        "AuthTokenIssuer",
        "AuthTokenGroups",
        "AuthTokenId",
        "AuthTokenScopes",
        "AuthTokenProject",
    )
)
# The job store's own attributes a submit stores (the URLs PREPARE_JOB fetches)
SUBMITTED = frozenset({"jobstoreinputurls"})
# What accounting_group stores, which job_attrs keeps where it names the job's submitter
ACCOUNTING = frozenset({"acctgroup", "acctgroupuser"})
# The longest string or expression a job ad can carry (FETCH_WORK prints at most
# classads.MAX_JOB_AD_BYTES): libclassad parses and prints recursively, and a much longer
# expression can overflow its stack (the database refuses longer ones: migration 0019)
MAX_VALUE_CHARS = 10240


def ad_job_id(ad: ClassAd) -> str:
    """CLUSTER.PROC of a job ad, as condor_q numbers the job (views.job_id of a row)."""
    return f"{get_int(ad, 'ClusterId')}.{get_int(ad, 'ProcId')}"


def to_json(value: Value) -> Any:
    """A ClassAd value as JSON: expressions become {"expr": text}."""
    return {"expr": str(value)} if isinstance(value, Expr) else value


def from_json(value: Any) -> Value:
    if isinstance(value, dict):
        return Expr(value["expr"])
    return value


def submitted_ad(spec: JobSpec) -> dict[str, Any]:
    """The attributes stored with a job at submit (the `ad` column), as JSON values; raises
    AdError for a +Attr the job store sets itself."""
    attrs: dict[str, Value] = {"Cmd": spec.cmd}
    if spec.args_v1:  # condor_submit keeps the old syntax as Args
        attrs["Args"] = spec.args_v1
    elif spec.args:
        attrs["Arguments"] = spec.args
    if spec.env:
        attrs["Environment"] = spec.env
    attrs["Iwd"] = spec.iwd
    for name, value in (("In", spec.input), ("Out", spec.output), ("Err", spec.error)):
        if value:
            attrs[name] = value
    if spec.requirements:
        attrs["Requirements"] = Expr(spec.requirements)
    if spec.user_log:
        attrs["UserLog"] = spec.user_log
    if spec.accounting_group:
        attrs["AcctGroup"] = spec.accounting_group
        if spec.accounting_group_user:
            attrs["AcctGroupUser"] = spec.accounting_group_user
    if spec.max_retries is not None:
        attrs["MaxRetries"] = spec.max_retries
        attrs["SuccessExitCode"] = spec.success_exit_code
    for name, text in spec.custom.items():
        if name.lower() in RESERVED or name.lower() in {a.lower() for a in attrs}:
            raise AdError(f"+{name}: attribute is set by the job store and cannot be submitted")
        attrs[name] = Expr(text)
    return {name: to_json(value) for name, value in attrs.items()}


def stored_attrs(ad: dict[str, Any] | None, *, strict: bool = True) -> dict[str, Value]:
    """A job's stored attributes as a reader takes them, whatever wrote them: never one the
    job store sets itself (Owner, OsUser, HookKeyword, ... its own Jobstore* ones but the URL
    inputs a submit stores), never a value a job ad cannot carry: one longer than it can hold,
    or not a string, a boolean, a 64-bit integer, a finite real or an expression (AdError;
    `strict` False: the value `error`, so that condor_q shows such a job instead of failing)."""
    out: dict[str, Value] = {}
    for name, value in (ad or {}).items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            if strict:
                raise AdError(f"{str(name)[:100]!r}: not an attribute name")
            continue
        low = name.lower()
        if (low in RESERVED and low not in ACCOUNTING) or (
                low.startswith("jobstore") and low not in SUBMITTED):
            continue
        problem = _value_problem(value)
        if problem is not None:
            if strict:
                raise AdError(f"{name}: {problem}")
            out[name] = Expr("error")
            continue
        out[name] = from_json(value)
    return out


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")
_INT64 = 1 << 63


def _value_problem(value: Any) -> str | None:
    """Why a stored JSON value cannot be a job ad's (None: it can)."""
    if isinstance(value, dict):
        expr = value.get("expr") if len(value) == 1 else None
        if not isinstance(expr, str):
            return "not a value a job ad can carry"
        value = expr
    if isinstance(value, str):
        return (f"a value larger than a job ad can carry (more than {MAX_VALUE_CHARS} "
                "characters)") if len(value) > MAX_VALUE_CHARS else None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if -_INT64 <= value < _INT64 else "an integer out of range"
    if isinstance(value, float):
        return None if math.isfinite(value) and abs(value) < 1e300 else "a number out of range"
    return "not a value a job ad can carry"


def job_attrs(
    job: Job, *, keyword: str, uid_domain: str, job_lease_duration: int, strict: bool = True
) -> dict[str, Value]:
    """Every attribute of the job ad for one attempt (the attempt's token included); `strict`
    as stored_attrs."""
    attrs = stored_attrs(job.ad, strict=strict)
    group, group_user = attrs.pop("AcctGroup", None), attrs.pop("AcctGroupUser", None)
    attrs.update(
        Owner=job.owner,
        User=f"{job.owner}@{uid_domain}",
        JobUniverse=5,
        ClusterId=int(job.cluster_id),
        ProcId=int(job.proc_id),
        QDate=int(job.submitted_at),
        JobPrio=int(job.priority),
        RequestCpus=int(job.request_cpus),
        RequestMemory=int(job.request_memory),
        RequestDisk=int(job.request_disk),
        HookKeyword=keyword,
        JobLeaseDuration=job_lease_duration,
    )
    if job.submitter != job.owner:
        # the fair-share account the database derived: its group and user as submitted only
        # where they name it
        attrs["AccountingGroup"] = job.submitter
        user = group_user if isinstance(group_user, str) and group_user else job.owner
        if isinstance(group, str) and f"{group}.{user}" == job.submitter:
            attrs["AcctGroup"], attrs["AcctGroupUser"] = group, user
        else:
            attrs["AcctGroupUser"] = job.owner
    if job.concurrency_limits:
        attrs["ConcurrencyLimits"] = job.concurrency_limits
    attrs[ATTR_JOB_ID] = int(job.id)
    attrs[ATTR_QUEUE] = job.queue
    if job.token:
        attrs[ATTR_ATTEMPT] = int(job.claims)
        attrs[ATTR_TOKEN] = job.token
    return attrs


def transfers_files(job: Job) -> bool:
    """Does the job have condor_submit's file transfer (ShouldTransferFiles = "YES")?"""
    value = (job.ad or {}).get("ShouldTransferFiles")
    return isinstance(value, dict) and value.get("expr", "").strip().upper() == '"YES"'


def in_sandbox(attrs: dict[str, Value], sandbox: str) -> None:
    """Move a job with file transfer into its sandbox on the node: `sandbox` becomes its Iwd
    (PREPARE_JOB makes it and puts the inputs there), the executable that travels with it is
    the one there, and its standard input, output and error are files there, by their last
    component (JOB_EXIT brings them back with the outputs)."""
    attrs[ATTR_SANDBOX] = True
    attrs["JobstoreSubmitIwd"] = attrs.get("Iwd", "")
    attrs["Iwd"] = sandbox
    if attrs.get("TransferExecutable") != Expr("false"):
        attrs["Cmd"] = f"{sandbox}/{os.path.basename(str(attrs.get('Cmd', '')))}"
    for name in ("In", "Out", "Err"):
        value = attrs.get(name)
        if isinstance(value, str) and value and value != "/dev/null":
            attrs[name] = os.path.basename(value)


def render_job(job: Job, *, sandbox: str | None = None, **kw: Any) -> str:
    """The FETCH_WORK output for a claimed job (in `sandbox`, for a job with file transfer);
    raises classads.AdError if it cannot be sent."""
    attrs = job_attrs(job, **kw)
    if sandbox is not None:
        in_sandbox(attrs, sandbox)
    return render_ad(attrs)


def job_classad(job: Job, **kw: Any) -> ClassAd:
    """The job as a ClassAd, for matchmaking against a slot ad."""
    ad = ClassAd()
    for name, value in job_attrs(job, **kw).items():
        ad[name] = ExprTree(str(value)) if isinstance(value, Expr) else value
    return ad
