"""What the tests and the benchmarks make again and again: a slot's offer, a claim request, a
judge that takes every job, job specs and job rows, a submitted cluster, a claimed, running or
completed job and a report about its attempt. Each value has the default most callers want;
every one can be given."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobstore.core.claims import ClaimRequest, Offer, Verdict
from jobstore.core.jobs import Job, JobSpec
from jobstore.core.states import Event
from jobstore.testing.support import RECORDED_OWNER

if TYPE_CHECKING:
    from jobstore.db.store import JobStore, Outcome

# What a one-CPU slot offers: 1 CPU, 1024 MiB of memory, about 1 GB of disk (in KiB).
SLOT_OFFER = Offer(cpus=1, memory=1024, disk=10**6)
TAKE = Verdict(take=True)

Judge = Callable[[Job], Verdict]


def take_every(_job: Job) -> Verdict:
    """A claim's judge that takes every job it is shown."""
    return TAKE


def claim_request(
    *,
    queue: str = "default",
    offer: Offer = SLOT_OFFER,
    slot: str = "slot1@n",
    host: str | None = None,
    keyword: str = "JOBSTORE",
    claim_lease: int = 600,
    shape: str | None = None,
    partitionable: bool = False,
    weight: float = 1.0,
    fair_share: bool = True,
    limit: Callable[[str], float] | None = None,
) -> ClaimRequest:
    """A fetch of `slot` for `queue`; `host` is the slot's machine (what follows its @) unless
    given. The optional fields are ClaimRequest's own defaults."""
    return ClaimRequest(
        queue=queue, offer=offer, slot=slot,
        host=host if host is not None else slot.rpartition("@")[2], keyword=keyword,
        claim_lease=claim_lease, shape=shape, partitionable=partitionable, weight=weight,
        fair_share=fair_share, limit=limit)


def job_spec(proc_id: int = 0, **fields: Any) -> JobSpec:
    """A job running /bin/true in /tmp, with `fields` changed."""
    return JobSpec(**{"cmd": "/bin/true", "iwd": "/tmp", "proc_id": proc_id, **fields})


def a_job(**columns: object) -> Job:
    """An idle job of cluster 1 owned by the recorded owner, with `columns` changed: a job row
    for in-process tests of what renders or logs a job."""
    job = Job.queued(JobSpec(cmd="/bin/true"), id=1, cluster_id=1, owner=RECORDED_OWNER,
                     queue="default", ad={"Cmd": "/bin/true"}, max_attempts=1, now=0.0)
    return job.but(**columns)


def submit(store: JobStore, n: int = 1, *, owner: str = "alice", queue: str = "default",
           max_attempts: int = 3, **fields: Any) -> list[int]:
    """The ids of one new cluster of `n` idle jobs (procs 0..n-1), each `job_spec(**fields)`."""
    specs = [job_spec(i, **fields) for i in range(n)]
    return store.submissions.submit(specs, owner=owner, queue=queue, max_attempts=max_attempts)[1]


def claim(store: JobStore, req: ClaimRequest | None = None, *, judge: Judge = take_every,
          **overrides: Any) -> Job | None:
    """The job `judge` takes for `req` with `overrides` of its fields, or None. Without `req`
    the request is `claim_request(**overrides)`; with it, the fields given replace its own (a
    new slot keeps its host)."""
    if req is None:
        req = claim_request(**overrides)
    elif overrides:
        req = replace(req, **overrides)
    return store.negotiator.claim(req, judge)


def claimed(store: JobStore, req: ClaimRequest | None = None, *, judge: Judge = take_every,
            **overrides: Any) -> Job:
    """`claim`, when a job must be claimed."""
    job = claim(store, req, judge=judge, **overrides)
    assert job is not None, "no job to claim"
    return job


def report(store: JobStore, job: Job, event: Event, **kw: Any) -> Outcome:
    """`event` reported about `job`'s attempt (its token and claim), with Reports.report's
    other arguments `kw`."""
    return store.reports.report(job.id, event, token=job.token, attempt=job.claims, **kw)


def running(store: JobStore, req: ClaimRequest | None = None, *,
            changes: dict[str, Any] | None = None, **kw: Any) -> Job:
    """A job claimed for `req` (by default `claim_request()`) and reported started (pid 42,
    `changes`, Reports.report's other arguments `kw`): its row after the START."""
    job = claimed(store, req)
    out = report(store, job, Event.START, changes={"job_pid": 42, **(changes or {})}, **kw)
    assert out.after == "running", out
    return store.reads.get_job(job.id)


def completed(store: JobStore, outputs: dict[str, Path] | None = None) -> Job:
    """The next idle job claimed, started and exited 0, having sent `outputs` (its name in the
    sandbox -> the file with its content) as JOB_EXIT sends them: its row after the EXIT."""
    from jobstore.db.sandbox import OUT, FileSource

    job = running(store, lease=600)
    if outputs:
        with store.db.transaction() as conn:
            store.files.store_files(
                conn, cluster_id=job.cluster_id, proc_id=job.proc_id, owner=job.owner,
                direction=OUT, sources=[FileSource(name, str(path), 0o644)
                                        for name, path in outputs.items()],
                attempt=job.claims)
    out = report(store, job, Event.EXIT, changes={"exit_code": 0})
    assert out.after == "completed", out
    return store.reads.get_job(job.id)
