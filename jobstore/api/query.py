"""What `jobstore q`, `history`, `events` and `hold`/`release`/`rm` do, for any caller: job ids
and constraints to jobs, autoclusters, and admin actions on the jobs found."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from classad2 import ClassAd, ExprTree

from jobstore.core.jobs import Job, parse_job_id
from jobstore.core.states import FINAL, Event
from jobstore.db.constraint import matches, plan
from jobstore.db.store import AUTOCLUSTER_KEY, JobStore, Outcome
from jobstore.errors import UnknownJob
from jobstore.formats import views

__all__ = ["select_jobs", "query_jobs", "history_jobs", "autoclusters", "act", "Shown"]

FINAL_VALUES = frozenset(s.value for s in FINAL)


class Shown:
    """How the jobs' ads look to a query: the keyword and UID domain their ads are made with."""

    def __init__(self, keyword: str, uid_domain: str) -> None:
        self.keyword = keyword
        self.uid_domain = uid_domain

    def ad(self, job: Job) -> ClassAd:
        """The job's ad as condor_q shows it (constraints, -af, -l)."""
        return views.job_ad(job, keyword=self.keyword, uid_domain=self.uid_domain)


def select_jobs(store: JobStore, ids: Sequence[str]) -> list[Job]:
    """The jobs named by HTCondor job ids (`12` for a whole cluster, `12.3` for one proc), in
    the order named; ValueError for a malformed id, UnknownJob for one that names no job."""
    jobs: list[Job] = []
    for text in ids:
        cluster, proc = parse_job_id(text)
        found = store.find_jobs(cluster, proc)
        if not found:
            raise UnknownJob(text)
        jobs.extend(found)
    return jobs


def query_jobs(
    store: JobStore, shown: Shown, ids: Sequence[str] = (), constraint: str | None = None,
    *, limit: int | None = None, **filters: Any,
) -> list[Job]:
    """The jobs a query shows: named by `ids`, or found by `filters` (JobStore.list_jobs); the
    conjuncts of `constraint` that translate are evaluated in SQL, the rest by classad2 on each
    job's ad; at most `limit` of them. ConstraintError for a constraint that does not parse."""
    p = plan(constraint) if constraint else None
    if ids:
        jobs = select_jobs(store, ids)
        residual = ExprTree(p.text) if p else None
    else:
        residual = p.residual if p else None
        jobs = store.list_jobs(where=p.where if p else None,
                               limit=limit if residual is None else None, **filters)
    if residual is not None:
        jobs = [j for j in jobs if matches(residual, shown.ad(j))]
    return jobs[:limit] if limit else jobs


def history_jobs(
    store: JobStore, shown: Shown, ids: Sequence[str] = (), constraint: str | None = None,
    *, limit: int | None = None, **filters: Any,
) -> list[Job]:
    """The finished jobs of a query (completed, removed, failed), the most recently finished
    first, as condor_history lists them; at most `limit`."""
    jobs = query_jobs(store, shown, ids, constraint, final_only=True, **filters)
    jobs = [j for j in jobs if j.status in FINAL_VALUES]
    jobs.sort(key=lambda j: (j.finished_at or 0.0, j.id), reverse=True)
    return jobs[:limit] if limit else jobs


def autoclusters(
    store: JobStore, shown: Shown, ids: Sequence[str] = (), constraint: str | None = None,
    **filters: Any,
) -> list[dict[str, Any]]:
    """The jobs of a query grouped by autocluster (JobStore.autoclusters' form): one GROUP BY
    in the database when the whole query translates to SQL, else grouped here."""
    p = plan(constraint) if constraint else None
    if ids or (p and p.residual is not None):
        return views.group_jobs(query_jobs(store, shown, ids, constraint, **filters),
                                AUTOCLUSTER_KEY)
    return store.autoclusters(where=p.where if p else None, **filters)


def act(
    store: JobStore, ids: Sequence[str], event: Event, reason: str | None = None
) -> list[tuple[Job, Outcome]]:
    """Hold, release or remove the jobs named by `ids`: each job with its outcome."""
    return [(job, store.admin(job.id, event, reason)) for job in select_jobs(store, ids)]
