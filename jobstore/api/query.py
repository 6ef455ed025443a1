"""What `jobstore q`, `history`, `events` and `hold`/`release`/`rm` do, for any caller: job ids,
users and constraints to jobs, autoclusters, and actions on the jobs found.

Lists are paged in the database: the conjuncts of a constraint that translate to SQL filter
there, with ORDER BY and LIMIT; the rest of the constraint is evaluated on each job's ad as the
pages stream in, and the reading stops once `limit` jobs matched."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from classad2 import ClassAd, ExprTree
from sqlalchemy import ColumnElement, and_, or_, true

from jobstore.core import holds
from jobstore.core.jobs import Job, parse_job_id
from jobstore.core.states import Event
from jobstore.db.constraint import matches, plan
from jobstore.db.schema import jobs as jobs_table
from jobstore.db.store import AUTOCLUSTER_KEY, ActTotals, JobStore
from jobstore.errors import InvalidInput, NotOwner, UnknownJob
from jobstore.formats import views

__all__ = ["select_jobs", "query_jobs", "history_jobs", "autoclusters", "act", "Shown",
           "Selection", "status_counts", "edit"]


class Shown:
    """How the jobs' ads look to a query: the keyword and UID domain their ads are made with."""

    def __init__(self, keyword: str, uid_domain: str) -> None:
        self.keyword = keyword
        self.uid_domain = uid_domain

    def ad(self, job: Job, only: frozenset[str] | None = None) -> ClassAd:
        """The job's ad as condor_q shows it (constraints, -af, -l); with `only` (lower-case
        names), just those attributes."""
        return views.job_ad(job, keyword=self.keyword, uid_domain=self.uid_domain, only=only)


@dataclass(frozen=True)
class Selection:
    """Which jobs a command names: job ids (CLUSTER, CLUSTER.PROC), users and a constraint,
    as SQL (`where`) and the rest of the constraint (`residual`, evaluated on each ad)."""

    where: ColumnElement[bool] | None
    residual: ExprTree | None

    @classmethod
    def of(cls, ids: Sequence[str] = (), users: Sequence[str] = (),
           constraint: str | None = None) -> Selection:
        """ValueError for a malformed job id, ConstraintError for a constraint that does not
        parse. Ids and users add up (condor_q 12 alice: cluster 12 and alice's jobs); a
        constraint narrows them."""
        named = [_id_term(text) for text in ids] + [jobs_table.c.owner == u for u in users]
        terms = [or_(*named)] if named else []
        p = plan(constraint) if constraint else None
        if p is not None and p.where is not None:
            terms.append(p.where)
        return cls(and_(*terms) if terms else None, p.residual if p else None)

    def keep(self, shown: Shown) -> Callable[[Job], bool] | None:
        """The residual as a test of one job, or None when SQL says it all."""
        residual = self.residual
        if residual is None:
            return None
        return lambda job: matches(residual, shown.ad(job))


def _id_term(text: str) -> ColumnElement[bool]:
    cluster, proc = parse_job_id(text)
    term = jobs_table.c.cluster_id == cluster
    return term if proc is None else and_(term, jobs_table.c.proc_id == proc)


def select_jobs(store: JobStore, ids: Sequence[str]) -> list[Job]:
    """The jobs named by HTCondor job ids (`12` for a whole cluster, `12.3` for one proc), in
    the order named; ValueError for a malformed id, UnknownJob for one that names no job."""
    jobs: list[Job] = []
    for text in ids:
        cluster, proc = parse_job_id(text)
        found = store.reads.find_jobs(cluster, proc)
        if not found:
            raise UnknownJob(text)
        jobs.extend(found)
    return jobs


def iter_query(
    store: JobStore, shown: Shown, ids: Sequence[str] = (), constraint: str | None = None,
    *, users: Sequence[str] = (), limit: int | None = None, history: bool = False,
    projection: Sequence[str] = (), **filters: Any,
) -> Iterator[Job]:
    """The jobs of a query, streamed from the database: condor_q's (cluster, proc) order, or
    with `history` condor_history's (the most recently finished first, finished jobs only);
    at most `limit`. With a `projection` of attributes that come from columns only
    (views.COLUMN_ATTRIBUTES) and a constraint SQL says whole, the stored ads are not read
    (the jobs' `ad` is None)."""
    sel = Selection.of(ids, users, constraint)
    keep = sel.keep(shown)
    if history:
        filters["final_only"] = True
    if keep is None and projection and all(
            name.lower() in views.COLUMN_ATTRIBUTES for name in projection):
        filters["without_ad"] = True
    if keep is None and limit and not history:
        found: Iterator[Job] = iter(store.reads.list_jobs(where=sel.where, limit=limit, **filters))
    else:
        page = min(limit, 500) if limit and keep is None else 500
        found = store.reads.iter_jobs(where=sel.where, newest_finished_first=history, page=page,
                                      **filters)
        if keep is not None:
            found = (job for job in found if keep(job))
    return islice(found, limit) if limit else found


def query_jobs(
    store: JobStore, shown: Shown, ids: Sequence[str] = (), constraint: str | None = None,
    *, limit: int | None = None, **filters: Any,
) -> list[Job]:
    """The jobs a query shows (`iter_query`), as a list."""
    return list(iter_query(store, shown, ids, constraint, limit=limit, **filters))


def history_jobs(
    store: JobStore, shown: Shown, ids: Sequence[str] = (), constraint: str | None = None,
    *, limit: int | None = None, **filters: Any,
) -> list[Job]:
    """The finished jobs of a query (completed, removed, failed), the most recently finished
    first, as condor_history lists them; at most `limit`."""
    return list(iter_query(store, shown, ids, constraint, limit=limit, history=True,
                           **filters))


def status_counts(
    store: JobStore, shown: Shown, ids: Sequence[str] = (), constraint: str | None = None,
    *, users: Sequence[str] = (), **filters: Any,
) -> dict[str, int]:
    """The jobs of a query counted by status (condor_q -totals): one aggregate in the
    database when the constraint translates, else counted as the pages stream."""
    sel = Selection.of(ids, users, constraint)
    if sel.residual is None:
        return store.reads.count_by_status(where=sel.where, **filters)
    counts: dict[str, int] = {}
    for job in iter_query(store, shown, ids, constraint, users=users, **filters):
        counts[job.status] = counts.get(job.status, 0) + 1
    return counts


def autoclusters(
    store: JobStore, shown: Shown, ids: Sequence[str] = (), constraint: str | None = None,
    *, users: Sequence[str] = (), **filters: Any,
) -> list[dict[str, Any]]:
    """The jobs of a query grouped by autocluster (JobReads.autoclusters' form): one GROUP BY
    in the database when the whole query translates to SQL, else grouped here."""
    sel = Selection.of(ids, users, constraint)
    if sel.residual is not None:
        return views.group_jobs(iter_query(store, shown, ids, constraint, users=users,
                                           **filters), AUTOCLUSTER_KEY)
    return store.reads.autoclusters(where=sel.where, **filters)


def act(
    store: JobStore, shown: Shown, event: Event, reason: str | None, *,
    ids: Sequence[str] = (), users: Sequence[str] = (), constraint: str | None = None,
    everyone: bool = False, hold: tuple[int, int] = (holds.USER_REQUEST, 0),
) -> tuple[ActTotals, list[str]]:
    """Hold, release or remove the unfinished jobs of job ids, users, a constraint, or with
    `everyone` all the jobs this session may act on: set-based, a page per transaction
    (PagedActions.act_where). Returns the totals and the ids that named no unfinished job."""
    if not (ids or users or constraint or everyone):
        raise InvalidInput("name the jobs: JOB, USER, -constraint EXPR or -all")
    sel = Selection.of(ids, users, constraint)
    missing = [text for text in ids if not store.reads.count_by_status(where=_id_term(text))]
    where = sel.where if sel.where is not None else true()
    return store.actions.act_where(where, event, reason, keep=sel.keep(shown), hold=hold), missing


def edit(
    store: JobStore, shown: Shown, attr: str, value: str, *, ids: Sequence[str] = (),
    constraint: str | None = None,
) -> int:
    """condor_qedit of the waiting jobs of job ids or a constraint, set-based in pages
    (PagedActions.edit_where): how many were edited; NotOwner when the jobs named are all
    another's (those of a constraint that are not this session's are left out)."""
    sel = Selection.of(ids, (), constraint)
    where = sel.where if sel.where is not None else true()
    totals = store.actions.edit_where(where, attr, value, keep=sel.keep(shown))
    if totals.denied and not totals.acted_on:
        raise NotOwner(totals.denied_names[0], store.db.identity().account,  # type: ignore[arg-type]
                       "edit")
    return totals.success
