"""`jobstore.Schedd`: the job store behind the calls a workflow tool makes of `htcondor2.Schedd`
(submit, query, act, edit, history), plus what a schedd cannot do: a submit inside the caller's
own database transaction, an idempotency key, and the event feed (subscribe, watch).

    schedd = jobstore.Schedd()           # was: htcondor2.Schedd()
    result = schedd.submit(htcondor2.Submit({...}), count=10)
    for ad in schedd.query(f"ClusterId == {result.cluster()}", ["ProcId", "JobStatus"]):
        ...
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from classad2 import ClassAd, ExprTree
from sqlalchemy import Connection

from jobstore.api import query
from jobstore.api.submission import choose_owner, render_check
from jobstore.core.jobs import Job, parse_job_id
from jobstore.core.states import FINAL, Event
from jobstore.db.constraint import matches
from jobstore.db.store import JobStore, Outcome
from jobstore.errors import UnknownJob
from jobstore.node import config
from jobstore.submit.description import parse_submit_object
from jobstore.submit.errors import SubmitError

__all__ = ["Schedd", "SubmitResult", "JobAction"]

ADMIN_STATEMENT_TIMEOUT_MS = 300_000


class JobAction(IntEnum):
    """htcondor2.JobAction's values (an htcondor2.JobAction is taken as well)."""

    Hold = 1
    Release = 2
    Remove = 3
    RemoveX = 4
    Vacate = 5
    VacateFast = 6
    Suspend = 8
    Continue = 9


_EVENTS = {JobAction.Hold: Event.HOLD, JobAction.Release: Event.RELEASE,
           JobAction.Remove: Event.REMOVE, JobAction.RemoveX: Event.REMOVE}
_DEFAULT_REASON = "Python-initiated action"
TOTALS = ("TotalSuccess", "TotalNotFound", "TotalBadStatus", "TotalAlreadyDone",
          "TotalPermissionDenied", "TotalJobAds", "TotalError", "TotalChangedAds")


@dataclass(frozen=True)
class SubmitResult:
    """What htcondor2.Schedd.submit returns: the cluster, its procs, and the cluster ad."""

    _cluster: int
    _first_proc: int
    _num_procs: int
    _clusterad: ClassAd
    job_ids: tuple[int, ...] = ()  # the job store's own ids (jobstore.JobStore)

    def cluster(self) -> int:
        return self._cluster

    def first_proc(self) -> int:
        return self._first_proc

    def num_procs(self) -> int:
        return self._num_procs

    def clusterad(self) -> ClassAd:
        return self._clusterad

    def __str__(self) -> str:
        return f"{self._num_procs} job(s) submitted to cluster {self._cluster}."


class Schedd:
    """A job store, called as an htcondor2.Schedd is.

    `url` and `keyword` find the database as the `jobstore` command does (--db, --keyword:
    JOBSTORE_DATABASE_URL, the HTCondor configuration); `owner` submits for another account
    (root on a trusted session, as `jobstore submit --owner`; a queue super user's own role on
    PostgreSQL, for the accounts its QUEUE_SUPER_USER_MAY_IMPERSONATE rule allows). Errors are
    the package's (SubmitError, DatabaseError and its Refused, UnknownJob, NotOwner,
    ValueError), each with a one-line message."""

    def __init__(self, url: str | None = None, keyword: str | None = None,
                 owner: str | None = None, *, store: JobStore | None = None) -> None:
        self.settings = config.load_settings(keyword, url)
        if store is None:
            if self.settings.credentials_error:
                raise config.ConfigError(self.settings.credentials_error)
            store = JobStore.from_url(self.settings.database_url,
                                      statement_timeout_ms=ADMIN_STATEMENT_TIMEOUT_MS)
        self.store = store
        self.owner = owner
        self.shown = query.Shown(self.settings.keyword, self.settings.uid_domain)

    def close(self) -> None:
        self.store.engine.dispose()

    def __enter__(self) -> Schedd:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- submit ---------------------------------------------------------------------------

    def submit(
        self,
        description: Any,
        count: int = 0,
        spool: bool = False,
        itemdata: Iterable[str] | Iterable[Mapping[str, str]] | None = None,
        queue: str | None = None,
        *,
        connection: Connection | None = None,
        idempotency_key: str | None = None,
        job_queue: str | None = None,
    ) -> SubmitResult:
        """Queue the jobs of `description` (an htcondor2.Submit, a dict of submit commands, or
        submit-description text) as one cluster, as htcondor2.Schedd.submit does.

        `connection`: a SQLAlchemy connection of the caller's, inside its transaction on this
        database; the jobs commit or roll back with the caller's own rows. `idempotency_key`:
        a submit retried with a key used before queues nothing and returns the first one's
        result. `job_queue`: the job store queue (default the keyword's JOBSTORE_QUEUE)."""
        if spool:
            raise ValueError("spool=True is not supported: the job store has no file transfer")
        if count < 0:
            raise SubmitError(f"count {count} is negative")
        specs = parse_submit_object(description, base_dir=os.getcwd(), count=count,
                                    itemdata=itemdata, queue=queue)
        owner = choose_owner(self.owner, self.settings, self.store.identity())
        cluster, ids = self.store.submit(
            specs, owner=owner, queue=job_queue or self.settings.queue,
            max_attempts=self.settings.max_attempts, connection=connection,
            idempotency_key=idempotency_key, check=render_check(self.settings),
        )
        return self._result(cluster, ids, owner, connection)

    def _result(self, cluster: int, ids: list[int], owner: str,
                connection: Connection | None) -> SubmitResult:
        ad = ClassAd()
        ad["ClusterId"], ad["Owner"], ad["NumProcs"] = cluster, owner, len(ids)
        if ids and connection is None:  # (inside the caller's transaction: not visible here)
            first = self.shown.ad(self.store.get_job(ids[0]))
            for name in ("Cmd", "Iwd", "QDate", "JobPrio", "RequestCpus", "RequestMemory",
                         "RequestDisk", "Requirements", "User", "AccountingGroup"):
                if name in first:
                    ad[name] = first.lookup(name) if name == "Requirements" else first[name]
        return SubmitResult(cluster, 0, len(ids), ad, tuple(ids))

    # ---- queries --------------------------------------------------------------------------

    def query(
        self,
        constraint: str | ExprTree = "true",
        projection: Sequence[str] = (),
        callback: Callable[[ClassAd], Any] | None = None,
        limit: int = -1,
        opts: Any = None,
    ) -> list[Any]:
        """The ads of the jobs in the queue (not finished) that match `constraint`, with only
        the `projection` attributes when given (as condor_q -af), each passed through
        `callback` when given; at most `limit` (-1: all)."""
        jobs = query.query_jobs(self.store, self.shown, constraint=_text(constraint))
        return _shape(self._ads(jobs), projection, callback, limit)

    def history(
        self,
        constraint: str | ExprTree | None = None,
        projection: Sequence[str] = (),
        match: int = -1,
        since: int | str | ExprTree | None = None,
    ) -> list[ClassAd]:
        """The ads of finished jobs (completed, removed, failed), the most recently finished
        first, as condor_history: at most `match` (-1: all), and only those finished after the
        job `since` names (a cluster id, "C.P", or an expression that stops the search)."""
        jobs = query.history_jobs(self.store, self.shown, constraint=_text(constraint))
        stop = _since(since)
        ads = []
        for job, ad in zip(jobs, self._ads(jobs), strict=True):
            if stop is not None and stop(job, ad):
                break
            ads.append(ad)
        return _shape(ads, projection, None, match)

    def _ads(self, jobs: Iterable[Job]) -> list[ClassAd]:
        return [self.shown.ad(j) for j in jobs]

    # ---- actions --------------------------------------------------------------------------

    def act(self, action: Any, job_spec: Any, reason: str | None = None) -> ClassAd:
        """Hold, release or remove the jobs of `job_spec` ("C.P", "C", a list of them, a cluster
        id, or a constraint); returns htcondor2's ClassAd of totals (TotalSuccess,
        TotalNotFound, TotalBadStatus, TotalAlreadyDone, TotalJobAds, ...)."""
        kind = _action(action)
        event = _EVENTS.get(kind)
        if event is None:
            raise ValueError(f"JobAction.{kind.name} is not supported by the job store "
                             "(Hold, Release, Remove)")
        totals = dict.fromkeys(TOTALS, 0)
        jobs, totals["TotalNotFound"] = self._spec_jobs(job_spec)
        totals["TotalJobAds"] = len(jobs)
        for job in jobs:
            outcome = self.store.admin(job.id, event, reason or _DEFAULT_REASON)
            totals[_total(outcome, event)] += 1
        totals["TotalChangedAds"] = 1 if totals["TotalSuccess"] else 0
        ad = ClassAd()
        for name, value in totals.items():
            ad[name] = value
        return ad

    def edit(self, job_spec: Any, attr: str, value: str | ExprTree, flags: Any = None) -> int:
        """Set attribute `attr` of the waiting (idle or held) jobs of `job_spec` to `value`
        (an expression, as condor_qedit takes it); the number of jobs edited. ValueError for
        an attribute that may not change (Owner, the job store's own) or a bad value."""
        jobs, _ = self._spec_jobs(job_spec)
        text = str(value)
        return sum(1 for job in jobs if self.store.edit(job.id, attr, text))

    def _spec_jobs(self, job_spec: Any) -> tuple[list[Job], int]:
        """The jobs a job_spec names, and how many of its ids named none."""
        if isinstance(job_spec, int) and not isinstance(job_spec, bool):
            job_spec = str(job_spec)
        if isinstance(job_spec, ExprTree):
            return query.query_jobs(self.store, self.shown, constraint=str(job_spec)), 0
        ids = [job_spec] if isinstance(job_spec, str) else [str(x) for x in job_spec]
        if len(ids) == 1 and not _is_job_id(ids[0]):  # a constraint
            return query.query_jobs(self.store, self.shown, constraint=ids[0]), 0
        jobs: list[Job] = []
        missing = 0
        for text in ids:
            try:
                jobs.extend(query.select_jobs(self.store, [text]))
            except UnknownJob:
                missing += 1
        return jobs, missing

    # ---- what a schedd cannot do ----------------------------------------------------------

    def subscribe(self, **options: Any) -> Any:
        """jobstore.subscribe on this job store: its JobEvents and JobFinished records."""
        from jobstore.api.watch import subscribe

        return subscribe(self.store, **options)

    def watch(self, callback: Callable[[Any], None], **options: Any) -> Any:
        """jobstore.watch on this job store: `callback` for each record, from a thread."""
        from jobstore.api.watch import watch

        return watch(self.store, callback, **options)


def _action(action: Any) -> JobAction:
    """A JobAction (ours or htcondor2's, by name) or its name."""
    name = action if isinstance(action, str) else getattr(action, "name", None)
    try:
        return JobAction[name] if name else JobAction(int(action))
    except (KeyError, ValueError):
        raise ValueError(f"{action!r} is not a JobAction") from None


def _text(constraint: str | ExprTree | None) -> str | None:
    if constraint is None:
        return None
    text = str(constraint).strip()
    return None if text.lower() in ("", "true") else text


def _is_job_id(text: str) -> bool:
    try:
        parse_job_id(text)
    except ValueError:
        return False
    return True


def _shape(ads: list[ClassAd], projection: Sequence[str], callback: Callable[[ClassAd], Any]
           | None, limit: int) -> list[Any]:
    if limit is not None and limit >= 0:
        ads = ads[:limit]
    if projection:
        wanted = {p.lower() for p in projection}
        for ad in ads:
            for name in [k for k in list(ad) if k.lower() not in wanted]:
                del ad[name]
    return [callback(ad) for ad in ads] if callback is not None else ads


def _since(since: int | str | ExprTree | None) -> Callable[[Job, ClassAd], bool] | None:
    if since is None:
        return None
    text = str(since).strip()
    if isinstance(since, int) or _is_job_id(text):
        cluster, proc = parse_job_id(text)
        return lambda job, _ad: job.cluster_id == cluster and proc in (None, job.proc_id)
    expr = ExprTree(text)
    return lambda _job, ad: matches(expr, ad)


def _total(outcome: Outcome, event: Event) -> str:
    if outcome.changed or outcome.pending:
        return "TotalSuccess"
    done = {Event.HOLD: "held", Event.REMOVE: "removed"}.get(event)  # a release: not held
    if outcome.before == done:
        return "TotalAlreadyDone"
    if outcome.before in {s.value for s in FINAL}:
        return "TotalAlreadyDone" if event == Event.REMOVE else "TotalBadStatus"
    return "TotalBadStatus"
