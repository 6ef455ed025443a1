"""The read side of the job store: jobs, autoclusters, events and the event feed."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    ColumnElement,
    Connection,
    Label,
    Select,
    and_,
    case,
    func,
    null,
    or_,
    select,
    tuple_,
)

from jobstore.core.jobs import FeedEvent, Job, JobEvent
from jobstore.core.states import FINAL, HANDED_OUT, Status
from jobstore.db.phases import status_in, status_not_in
from jobstore.db.schema import job_events, jobs, vacate_requests
from jobstore.db.transactions import Transactions
from jobstore.errors import UnknownJob

# What `jobstore q -autocluster` shows of an autocluster (jobstore.core.autoclusters): its id
# and the columns that are the same for all its jobs.
AUTOCLUSTER_KEY = (
    "autocluster_id",
    "owner",
    "submitter",
    "queue",
    "request_cpus",
    "request_memory",
    "request_disk",
    "requirements",
    "concurrency_limits",
)


def where_ran(name: str) -> Label[Any]:
    """An event's slot or host (`name`): its own, else, for a transition out of a handed-out
    status (always of the job's attempt then), its attempt's (jobstore.db.transitions.own_place):
    the row's while the attempt is the job's latest, else the first of the attempt's events
    that names one. An event that names a slot of its own, and a report that changed nothing
    (a stale one), are read as they were stored."""
    earlier = job_events.alias()
    first = (
        select(earlier.c[name])
        .where(earlier.c.job_id == job_events.c.job_id,
               earlier.c.attempt == job_events.c.attempt, earlier.c[name].is_not(None))
        .order_by(earlier.c.id)
        .limit(1)
        .scalar_subquery()
    )
    on_attempts_slot = and_(job_events.c.to_status.is_not(None),
                            job_events.c.from_status.in_(sorted(s.value for s in HANDED_OUT)),
                            job_events.c.slot.is_(None))
    attempts = case((job_events.c.attempt == jobs.c.claims, jobs.c[name]), else_=first)
    return func.coalesce(job_events.c[name], case((on_attempts_slot, attempts))).label(name)


# An event's columns as its readers select them (with jobs joined).
EVENT_SELECT = (
    *(c for c in job_events.c if c.name not in ("slot", "host")),
    where_ran("slot"),
    where_ran("host"),
)


class AttemptState(NamedTuple):
    """Where a job's attempts stand, as a node's agent asks about the attempt its slot runs."""

    status: str
    claims: int  # the current attempt
    winding_down: bool  # the current attempt was stopped and has not reported its end
    vacate: str | None = None  # its owner asked to vacate it: "graceful" or "fast"


class NodeAttempt(NamedTuple):
    """An attempt handed to a slot of a node that has not reported its end (the agent's view
    after a restart)."""

    job_id: int
    slot: str
    attempt: int
    keyword: str | None
    fetched_at: float | None
    ad: dict[str, Any]
    name: str = ""  # CLUSTER.PROC
    token: str | None = None  # the attempt's secret, while it is handed out


class JobReads:
    """Queries of the job store (JobStore adds the writes)."""

    def __init__(self, db: Transactions) -> None:
        self.db = db

    def get_job(self, job_id: int) -> Job:
        """The job `job_id` (UnknownJob), its attempt's token where the session may read it."""
        with self.db.transaction() as conn:
            row = conn.execute(self._jobs(conn).where(jobs.c.id == job_id)).first()
        if row is None:
            raise UnknownJob(job_id)
        return Job.from_row(row._mapping)

    def attempt_states(self, job_ids: Sequence[int]) -> dict[int, AttemptState]:
        """The attempt state of each of `job_ids` that exists: one indexed query."""
        if not job_ids:
            return {}
        v = vacate_requests
        q = (select(jobs.c.id, jobs.c.status, jobs.c.claims, jobs.c.winding_down_until,
                    v.c.fast)
             .outerjoin(v, and_(v.c.job_id == jobs.c.id, v.c.attempt == jobs.c.claims))
             .where(jobs.c.id.in_(list(job_ids))))
        with self.db.transaction() as conn:
            return {r.id: AttemptState(r.status, r.claims, r.winding_down_until is not None,
                                       None if r.fast is None else
                                       "fast" if r.fast else "graceful")
                    for r in conn.execute(q)}

    def attempts_on(self, hosts: Sequence[str]) -> list[NodeAttempt]:
        """The attempts handed to slots of `hosts` (Machine) whose end was not reported: the
        handed-out jobs and the stopped attempts still winding down; oldest first."""
        if not hosts:
            return []
        q = select(jobs.c.id, jobs.c.slot, jobs.c.claims, jobs.c.keyword, jobs.c.fetched_at,
                   jobs.c.ad, jobs.c.cluster_id, jobs.c.proc_id, jobs.c.token)
        handed_out = q.where(status_in(HANDED_OUT),
                             jobs.c.host.in_(list(hosts)))
        winding = q.where(jobs.c.winding_down_until.is_not(None), jobs.c.host.in_(list(hosts)))
        with self.db.transaction() as conn:
            rows = {r.id: r for r in conn.execute(handed_out)}
            rows.update({r.id: r for r in conn.execute(winding)})
        return sorted(
            (NodeAttempt(r.id, r.slot, r.claims, r.keyword, r.fetched_at, r.ad or {},
                         f"{r.cluster_id}.{r.proc_id}", r.token)
             for r in rows.values() if r.slot),
            key=lambda a: (a.fetched_at or 0.0, a.job_id),
        )

    def find_jobs(self, cluster_id: int, proc_id: int | None = None) -> list[Job]:
        """The jobs of a cluster (or one proc), as get_job reads them."""
        with self.db.transaction() as conn:
            q = self._jobs(conn).where(jobs.c.cluster_id == cluster_id)
            if proc_id is not None:
                q = q.where(jobs.c.proc_id == proc_id)
            return [Job.from_row(r._mapping) for r in conn.execute(q.order_by(jobs.c.id))]

    def _jobs(self, conn: Connection) -> Select[Any]:
        """Whole job rows, the token NULL where the session may not read it (a submitter's
        role: it names an attempt's sandbox)."""
        return select(jobs) if self.db.backend.reads_tokens(conn) else public_jobs()

    def list_jobs(
        self,
        *,
        statuses: Sequence[str] | None = None,
        owners: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        include_final: bool = False,
        final_only: bool = False,
        limit: int | None = None,
        where: ColumnElement[bool] | None = None,
        without_ad: bool = False,
    ) -> list[Job]:
        """Jobs in (cluster, proc) order; `where` is an extra filter (jobstore.db.constraint);
        `without_ad` leaves the stored ad out (Job.ad None: a projection of columns only)."""
        q = _select_jobs(without_ad).where(
            *_job_filter(statuses, owners, queues, include_final, final_only, where)
        )
        q = q.order_by(jobs.c.cluster_id, jobs.c.proc_id)
        if limit:
            q = q.limit(limit)
        with self.db.transaction() as conn:
            return [Job.from_row(r._mapping) for r in conn.execute(q)]

    def iter_jobs(
        self,
        *,
        statuses: Sequence[str] | None = None,
        owners: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        include_final: bool = False,
        final_only: bool = False,
        where: ColumnElement[bool] | None = None,
        newest_finished_first: bool = False,
        page: int = 500,
        without_ad: bool = False,
    ) -> Iterator[Job]:
        """The jobs list_jobs selects, read `page` at a time (each page its own short
        transaction, after the last row of the one before), so that a reader that stops early
        reads little and memory stays bounded: in (cluster, proc) order, or the most recently
        finished first (condor_history's order, by ix_jobs_finished); `without_ad` as in
        list_jobs."""
        terms = _job_filter(statuses, owners, queues, include_final, final_only, where)
        if newest_finished_first:
            key: tuple[Any, ...] = (jobs.c.finished_at, jobs.c.id)
            order: list[Any] = [jobs.c.finished_at.desc(), jobs.c.id.desc()]
        else:
            key = (jobs.c.cluster_id, jobs.c.proc_id)
            order = [jobs.c.cluster_id, jobs.c.proc_id]
        after: tuple[Any, ...] | None = None
        while True:
            q = _select_jobs(without_ad).where(*terms)
            if after is not None:
                q = q.where(tuple_(*key) < tuple_(*after) if newest_finished_first
                            else tuple_(*key) > tuple_(*after))
            with self.db.transaction() as conn:
                rows = [Job.from_row(r._mapping)
                        for r in conn.execute(q.order_by(*order).limit(page))]
            yield from rows
            if len(rows) < page:
                return
            last = rows[-1]
            after = ((last.finished_at, last.id) if newest_finished_first
                     else (last.cluster_id, last.proc_id))

    def has_idle(self, queue: str) -> bool:
        """Is any job of `queue` idle? One indexed read (the idle jobs' partial index): what
        a waiting fetch asks before it claims on a timer rather than on a notification."""
        q = select(jobs.c.id).where(status_in([Status.IDLE]), jobs.c.queue == queue).limit(1)
        with self.db.transaction() as conn:
            return conn.execute(q).first() is not None

    def reap_pending(self, now: float) -> bool:
        """Has a reap pass anything to do: a handed-out job whose lease ran out, or a stopped
        attempt no longer waited for? Reads of two partial indexes, so that an idle pool's
        agents take no pass (which writes)."""
        leases = select(jobs.c.id).where(status_in(HANDED_OUT), jobs.c.lease_expires_at < now)
        ends = select(jobs.c.id).where(jobs.c.winding_down_until < now)
        with self.db.transaction() as conn:
            return (conn.execute(leases.limit(1)).first() is not None
                    or conn.execute(ends.limit(1)).first() is not None)

    def police_pending(self, policed: Sequence[str]) -> bool:
        """Is any job in one of the `policed` statuses one with periodic expressions? (A read
        of their partial index: a policy pass is taken only then.)"""
        q = select(jobs.c.id).where(jobs.c.periodic.is_(True), status_in(policed)).limit(1)
        with self.db.transaction() as conn:
            return conn.execute(q).first() is not None

    def count_by_status(
        self,
        *,
        statuses: Sequence[str] | None = None,
        owners: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        include_final: bool = False,
        final_only: bool = False,
        where: ColumnElement[bool] | None = None,
    ) -> dict[str, int]:
        """How many jobs list_jobs would select, by status: one aggregate (condor_q -totals)."""
        q = (select(jobs.c.status, func.count())
             .where(*_job_filter(statuses, owners, queues, include_final, final_only, where))
             .group_by(jobs.c.status))
        with self.db.transaction() as conn:
            return {status: int(n) for status, n in conn.execute(q)}

    def autoclusters(
        self,
        *,
        statuses: Sequence[str] | None = None,
        owners: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        include_final: bool = False,
        final_only: bool = False,
        where: ColumnElement[bool] | None = None,
    ) -> list[dict[str, Any]]:
        """Jobs grouped by the autocluster the claim matches them by, counted by status with
        one GROUP BY in the database."""
        key = AUTOCLUSTER_KEY
        counts = [
            func.sum(case((jobs.c.status == s.value, 1), else_=0)).label(s.value) for s in Status
        ]
        q = (
            select(*(jobs.c[k] for k in key), func.count().label("jobs"), *counts)
            .where(*_job_filter(statuses, owners, queues, include_final, final_only, where))
            .group_by(*(jobs.c[k] for k in key))
            .order_by(*(jobs.c[k] for k in key))
        )
        with self.db.transaction() as conn:
            rows = [r._mapping for r in conn.execute(q)]
        return [
            {
                "id": r["autocluster_id"],
                **{k: r[k] for k in key},
                "jobs": int(r["jobs"]),
                "status": {s.value: int(r[s.value] or 0) for s in Status if r[s.value]},
            }
            for r in rows
        ]

    def events(self, job_id: int | None = None, *, after_id: int = 0) -> list[JobEvent]:
        """Events in id order: of one job, or of all jobs; those after `after_id`."""
        q = (
            select(*EVENT_SELECT, jobs.c.cluster_id, jobs.c.proc_id)
            .join(jobs, jobs.c.id == job_events.c.job_id)
            .where(job_events.c.id > after_id)
        )
        if job_id is not None:
            q = q.where(job_events.c.job_id == job_id)
        with self.db.transaction() as conn:
            rows = conn.execute(q.order_by(job_events.c.id))
            return [JobEvent.from_row(r._mapping) for r in rows]

    # ---- following job_events (jobstore watch) -------------------------------------------

    def last_event_id(self, before: float | None = None) -> int:
        """The highest event id (0 if none); with `before`, of the events before that time."""
        q = select(func.max(job_events.c.id))
        if before is not None:
            q = q.where(job_events.c.time < before)
        with self.db.transaction() as conn:
            return int(conn.execute(q).scalar() or 0)

    def event_feed(
        self, after_id: int, *, gaps: Sequence[tuple[int, int]] = (), limit: int = 1000
    ) -> list[FeedEvent]:
        """Events with id > `after_id` or in one of the `gaps` (lo, hi) id ranges, in id order,
        each with its job's cluster_id, proc_id, owner, queue and outcome columns (job_status,
        exit_code, exit_signal, exit_by_signal, success_exit_code); all events, the caller
        filters (it must see every id)."""
        wanted = or_(
            job_events.c.id > after_id, *(job_events.c.id.between(lo, hi) for lo, hi in gaps)
        )
        q = (
            select(
                *EVENT_SELECT,
                jobs.c.cluster_id,
                jobs.c.proc_id,
                jobs.c.owner,
                jobs.c.queue,
                jobs.c.status.label("job_status"),
                jobs.c.exit_code,
                jobs.c.exit_signal,
                jobs.c.exit_by_signal,
                jobs.c.success_exit_code,
            )
            .join(jobs, jobs.c.id == job_events.c.job_id)
            .where(wanted)
            .order_by(job_events.c.id)
            .limit(limit)
        )
        with self.db.transaction() as conn:
            return [FeedEvent.from_row(r._mapping) for r in conn.execute(q)]

    def snapshot_bounds(self) -> tuple[int, int] | None:
        """PostgreSQL: (xmin, xmax) of a snapshot taken now, so that a follower of job_events
        knows when every transaction that could still add a lower event id has ended. SQLite:
        None (one writer at a time, so event ids become visible in order)."""
        if not self.db.backend.ids_commit_out_of_order:
            return None
        with self.db.transaction() as conn:
            return self.db.backend.snapshot_bounds(conn)

    def xact_horizon(self) -> int | None:
        """PostgreSQL: a transaction id assigned now (its transaction commits at once). Every
        transaction that had an id before this call has a smaller one, so once a snapshot's
        xmin is at or past it they have all ended. (A snapshot's xmax is no such bound: it is
        one past the highest *completed* id, and a transaction still running may have a larger
        one.) SQLite: None."""
        if not self.db.backend.ids_commit_out_of_order:
            return None
        with self.db.transaction() as conn:
            return self.db.backend.xact_horizon(conn)

    def stats(self) -> list[tuple[str, str, int]]:
        q = (
            select(jobs.c.queue, jobs.c.status, func.count())
            .group_by(jobs.c.queue, jobs.c.status)
            .order_by(jobs.c.queue, jobs.c.status)
        )
        with self.db.transaction() as conn:
            return [(r[0], r[1], int(r[2])) for r in conn.execute(q)]


def public_jobs() -> Select[Any]:
    """A select of whole job rows but the attempt's token (read as NULL): what every role may
    read (a submitter's may not read the token: it names an attempt's sandbox)."""
    return select(*(c for c in jobs.c if c.name != "token"), null().label("token"))


def _select_jobs(without_ad: bool) -> Select[Any]:
    """A select of whole job rows (but the token), or of all their columns but the stored ad
    (read as NULL)."""
    if not without_ad:
        return public_jobs()
    return select(*(c for c in jobs.c if c.name not in ("ad", "token")), null().label("ad"),
                  null().label("token"))


def _job_filter(
    statuses: Sequence[str] | None,
    owners: Sequence[str] | None,
    queues: Sequence[str] | None,
    include_final: bool,
    final_only: bool,
    where: ColumnElement[bool] | None,
) -> list[ColumnElement[bool]]:
    """The WHERE terms of the job queries (`jobstore q`, `history`, autoclusters)."""
    terms: list[ColumnElement[bool]] = []
    if statuses:
        terms.append(status_in(statuses))
    elif final_only:
        terms.append(status_in(FINAL))
    elif not include_final:
        terms.append(status_not_in(FINAL))
    if owners:
        terms.append(jobs.c.owner.in_(list(owners)))
    if queues:
        terms.append(jobs.c.queue.in_(list(queues)))
    if where is not None:
        terms.append(where)
    return terms


