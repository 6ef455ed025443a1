"""`jobstore.Schedd`: the job store behind the calls a workflow tool makes of `htcondor2.Schedd`
(submit, query, act, edit, history), plus what a schedd cannot do: a submit inside the caller's
own database transaction, an idempotency key, and the event feed (subscribe, watch).

    schedd = jobstore.Schedd()           # was: htcondor2.Schedd()
    result = schedd.submit(htcondor2.Submit({...}), count=10)
    for ad in schedd.query(f"ClusterId == {result.cluster()}", ["ProcId", "JobStatus"]):
        ...
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from classad2 import ClassAd, ExprTree
from sqlalchemy import Connection

from jobstore.api import query
from jobstore.api.dagmanjob import dagman_dag
from jobstore.api.dags import DagDescription, dag_ads, submit_dag
from jobstore.api.htcerrors import htcondor_errors
from jobstore.api.submission import choose_owner, render_check
from jobstore.core import holds
from jobstore.core.jobs import Job, parse_job_id
from jobstore.core.states import Event
from jobstore.db.constraint import matches
from jobstore.db.store import JobStore
from jobstore.errors import InvalidInput, SubmitError
from jobstore.formats.jobads import submitted_ad
from jobstore.node import config
from jobstore.submit.description import parse_submit_object

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
           JobAction.Remove: Event.REMOVE, JobAction.RemoveX: Event.REMOVE,
           JobAction.Vacate: Event.VACATE, JobAction.VacateFast: Event.VACATE_FAST}
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

    def __int__(self) -> int:
        return self._cluster

    def __str__(self) -> str:
        return f"{self._num_procs} job(s) submitted to cluster {self._cluster}."


class Schedd:
    """A job store, called as an htcondor2.Schedd is.

    `url` and `keyword` find the database as the `jobstore` command does (--db, --keyword:
    JOBSTORE_DATABASE_URL, the HTCondor configuration); `owner` submits for another account
    (root on a trusted session, as `jobstore submit --owner`; a queue super user's own role on
    PostgreSQL, for the accounts its QUEUE_SUPER_USER_MAY_IMPERSONATE rule allows). Errors are
    the package's (SubmitError, DatabaseError and its Refused, UnknownJob, NotOwner,
    ValueError), each with a one-line message, and each also an htcondor2.HTCondorException."""

    @htcondor_errors
    def __init__(self, url: str | None = None, keyword: str | None = None,
                 owner: str | None = None, *, store: JobStore | None = None) -> None:
        self.settings = config.load_settings(keyword, url)
        if store is None:
            if self.settings.credentials_error:
                raise config.ConfigError(self.settings.credentials_error)
            store = JobStore.from_url(self.settings.database_url,
                                      statement_timeout_ms=ADMIN_STATEMENT_TIMEOUT_MS,
                                      pool=True, max_overflow=2)
        self.store = store
        self.owner = owner
        self.shown = query.Shown(self.settings.keyword, self.settings.uid_domain)

    def close(self) -> None:
        self.store.db.engine.dispose()

    def __enter__(self) -> Schedd:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- submit ---------------------------------------------------------------------------

    @htcondor_errors
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
        submit-description text) as one cluster, as htcondor2.Schedd.submit does. A DAG
        (`jobstore.Submit.from_dag`, or htcondor2's, which describes DAGMan's job) is queued
        as `submit_dag` does.

        `connection`: a SQLAlchemy connection of the caller's, inside its transaction on this
        database; the jobs commit or roll back with the caller's own rows. `idempotency_key`:
        a submit retried with a key used before queues nothing and returns the first one's
        result. `job_queue`: the job store queue (default the keyword's JOBSTORE_QUEUE).
        Without `spool`, the jobs' outputs go home: this access point's `jobstore schedd`
        writes them into each job's Iwd as it ends; with `spool`, they wait in the store for
        `retrieve` (condor_transfer_data). The input files of a description with file transfer
        are always stored in the job store at submit, as a spool would hold them."""
        if not isinstance(description, DagDescription | str):
            description = dagman_dag(description) or description  # htcondor2's from_dag
        if isinstance(description, DagDescription):
            return self.submit_dag(description.path, description.options, job_queue=job_queue)
        if count and queue is not None:
            raise InvalidInput("submit() takes count or queue, not both")
        if count < 0:
            raise SubmitError(f"count {count} is negative")
        specs = parse_submit_object(description, base_dir=os.getcwd(), count=count,
                                    itemdata=itemdata, queue=queue)
        owner = choose_owner(self.owner, self.settings, self.store.db.identity())
        now = time.time()
        target = job_queue or self.settings.queue
        cluster, ids = self.store.submissions.submit(
            specs, owner=owner, queue=target, max_attempts=self.settings.max_attempts,
            connection=connection, idempotency_key=idempotency_key,
            check=render_check(self.settings), now=now,
            home=None if spool else self.settings.access_point(),
        )
        # made from what was inserted, not read back: nothing after the commit can fail
        first = Job.queued(specs[0], id=ids[0] if ids else 0, cluster_id=cluster, owner=owner,
                           queue=target, ad=submitted_ad(specs[0]),
                           max_attempts=self.settings.max_attempts, now=now)
        return self._result(cluster, ids, owner, first)

    @htcondor_errors
    def submit_dag(self, filename: str, options: Mapping[str, Any] | None = None, *,
                   job_queue: str | None = None) -> SubmitResult:
        """Queue the DAG in `filename` (condor_submit_dag's `options`: maxjobs, maxidle,
        batch_name, force), as `submit(Submit.from_dag(filename, options))` does: the result's
        cluster is the DAG's DAGManJobId, its ad the DAG's."""
        done = submit_dag(self.store, filename, self.settings, owner=self.owner,
                          queue=job_queue, options=options)
        dag = self.store.dags.dag_of(done.dag_id)
        ad = ClassAd()
        ad["ClusterId"], ad["NumProcs"] = done.dag_id, 1
        if dag is not None:
            ad["Owner"], ad["JobBatchName"] = dag.owner, dag.batch_name
            ad["DAG_NodesTotal"] = len(self.store.dags.dag_nodes_of(done.dag_id))
        return SubmitResult(done.dag_id, 0, 1, ad, ())

    def _result(self, cluster: int, ids: list[int], owner: str, first: Job) -> SubmitResult:
        ad = ClassAd()
        ad["ClusterId"], ad["Owner"], ad["NumProcs"] = cluster, owner, len(ids)
        shown = self.shown.ad(first)
        for name in ("Cmd", "Iwd", "QDate", "JobPrio", "RequestCpus", "RequestMemory",
                     "RequestDisk", "Requirements", "User", "AccountingGroup", "JobBatchName"):
            if name in shown:
                ad[name] = shown.lookup(name) if name == "Requirements" else shown[name]
        return SubmitResult(cluster, 0, len(ids), ad, tuple(ids))

    # ---- queries --------------------------------------------------------------------------

    @htcondor_errors
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
        `callback` when given (an ad it returns None for is left out); at most `limit` (-1:
        all), read from the database a page at a time and no further than needed."""
        jobs = query.iter_query(self.store, self.shown, constraint=_text(constraint),
                                limit=limit if limit is not None and limit >= 0 else None,
                                projection=_sql_projection(projection))
        now = int(time.time())
        out: list[Any] = []
        for ad in itertools.chain((self._ad(job, now, projection) for job in jobs),
                                  self._dag_ads(constraint)):
            if limit is not None and 0 <= limit <= len(out):
                break
            ad = _project(ad, projection)
            if callback is not None:
                ad = callback(ad)
                if ad is None:
                    continue
            out.append(ad)
        return out

    def _dag_ads(self, constraint: str | ExprTree) -> Iterator[ClassAd]:
        """The unfinished DAGs' own ads (DAGMan's job in condor_q) that match `constraint`."""
        text = _text(constraint)
        for ad in dag_ads(self.store):
            if text is None or ExprTree(text).eval(scope=ad) is True:
                yield ad

    @htcondor_errors
    def history(
        self,
        constraint: str | ExprTree | None = None,
        projection: Sequence[str] = (),
        match: int = -1,
        since: int | str | ExprTree | None = None,
    ) -> list[ClassAd]:
        """The ads of finished jobs (completed, removed, failed), the most recently finished
        first, as condor_history: at most `match` (-1: all), and only those finished after the
        job `since` names (a cluster id, "C.P", or an expression that stops the search); the
        reading stops as soon as it has them."""
        stop = _since(since)
        wanted = match if match is not None and match >= 0 and stop is None else None
        jobs = query.iter_query(self.store, self.shown, constraint=_text(constraint),
                                history=True, limit=wanted,
                                projection=() if stop else _sql_projection(projection))
        now = int(time.time())
        ads: list[ClassAd] = []
        for job in jobs:
            if match is not None and 0 <= match <= len(ads):
                break
            ad = self._ad(job, now, () if stop else projection)
            if stop is not None and stop(job, ad):
                break
            ads.append(_project(ad, projection))
        return ads

    @htcondor_errors
    def jobEpochHistory(  # noqa: N802 - htcondor2's name
        self,
        constraint: str | ExprTree | None = None,
        projection: Sequence[str] = (),
        match: int = -1,
        since: int | str | ExprTree | None = None,
    ) -> list[ClassAd]:
        """One ad per attempt of the jobs `constraint` matches (finished or not), from the
        store's events, as htcondor2.Schedd.jobEpochHistory: each job's ad with the attempt's
        number (EpochAttempt, NumShadowStarts), RemoteHost, JobCurrentStartDate and how it
        ended (EpochEndEvent, EpochEndReason, ExitCode, ...); job by job, each job's newest
        attempt first; at most `match`."""
        from jobstore.api.epochs import epoch_ads

        ads = epoch_ads(self.store, self.shown, _text(constraint), since=_since(since),
                        match=match if match is not None and match >= 0 else None)
        return [_project(ad, projection) for ad in ads]

    def spool(self, result: Any) -> None:
        """htcondor2's spool(): nothing left to do, the submit stored the jobs' input files."""

    @htcondor_errors
    def retrieve(self, job_spec: Any) -> None:
        """condor_transfer_data: write the outputs of the jobs of `job_spec` (ids or a
        constraint) where their submit description sends them (jobstore.api.retrieve)."""
        from jobstore.api.retrieve import retrieve

        ids, constraint = _spec_parts(job_spec)
        retrieve(self.store, self.shown, ids, constraint)

    def reschedule(self) -> None:
        """A no-op, as there is no negotiator to wake: nodes pull their work (each slot's next
        FETCH_WORK, or the agent's waiting fetch, sees new jobs at once)."""

    def _ad(self, job: Job, now: int, projection: Sequence[str] = ()) -> ClassAd:
        ad = self.shown.ad(job, frozenset(p.lower() for p in projection) or None)
        ad["ServerTime"] = now
        return ad

    # ---- actions --------------------------------------------------------------------------

    @htcondor_errors
    def act(self, action: Any, job_spec: Any,
            reason: str | tuple[str, int] | None = None) -> ClassAd:
        """Hold, release, remove or vacate the jobs of `job_spec` ("C.P", "C", a list of them, a
        cluster id, or a constraint), set-based a page at a time (a vacated job goes back to
        idle once its node has stopped it); `reason` is text, or (text, code)
        for a hold (HoldReasonSubCode). Returns htcondor2's ClassAd of totals (TotalSuccess,
        TotalNotFound, TotalBadStatus, TotalAlreadyDone, TotalPermissionDenied, ...)."""
        kind = _action(action)
        event = _EVENTS.get(kind)
        if event is None:
            raise InvalidInput(f"JobAction.{kind.name} is not supported by the job store "
                               "(Hold, Release, Remove, Vacate, VacateFast)")
        text, code = (reason if isinstance(reason, tuple) else (reason, 0))
        ids, constraint = _spec_parts(job_spec)
        totals, missing = query.act(
            self.store, self.shown, event, text or _DEFAULT_REASON, ids=ids,
            constraint=constraint, everyone=constraint is None and not ids,
            hold=(holds.USER_REQUEST, int(code or 0)))
        counts = dict.fromkeys(TOTALS, 0)
        counts.update(TotalSuccess=totals.success, TotalNotFound=len(missing),
                      TotalBadStatus=totals.bad_status, TotalAlreadyDone=totals.already_done,
                      TotalPermissionDenied=totals.denied,
                      TotalJobAds=totals.acted_on + totals.denied,
                      TotalChangedAds=1 if totals.success else 0)
        ad = ClassAd()
        for name, value in counts.items():
            ad[name] = value
        return ad

    @htcondor_errors
    def edit(self, job_spec: Any, attr: str, value: str | ExprTree, flags: Any = None) -> int:
        """Set attribute `attr` of the waiting (idle or held) jobs of `job_spec` to `value`
        (an expression, as condor_qedit takes it), a page of jobs per transaction; the number
        of jobs edited. ValueError for an attribute that may not change (Owner, the job
        store's own) or a bad value; NotOwner when the jobs named are all another's; TypeError
        for `flags` that are not a TransactionFlag (htcondor2's), as htcondor2's edit."""
        if flags is not None and type(flags).__name__ != "TransactionFlag":
            raise TypeError("flags must be a TransactionFlag")
        ids, constraint = _spec_parts(job_spec)
        return query.edit(self.store, self.shown, attr, str(value), ids=ids,
                          constraint=constraint)

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
    """A JobAction, ours or htcondor2's (by name); TypeError for anything else, as
    htcondor2's act raises."""
    if isinstance(action, JobAction):
        return action
    name = getattr(action, "name", None) if type(action).__name__ == "JobAction" else None
    if not isinstance(name, str) or name not in JobAction.__members__:
        raise TypeError("action must be a JobAction")
    return JobAction[name]


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


def _sql_projection(projection: Sequence[str]) -> Sequence[str]:
    """What of a projection the database is asked for (ServerTime is this process's)."""
    return [name for name in projection if name.lower() != "servertime"] or ()


def _project(ad: ClassAd, projection: Sequence[str]) -> ClassAd:
    """The ad with only the `projection` attributes (all when empty)."""
    if projection:
        wanted = {p.lower() for p in projection}
        for name in [k for k in list(ad) if k.lower() not in wanted]:
            del ad[name]
    return ad


def _spec_parts(job_spec: Any) -> tuple[list[str], str | None]:
    """A job_spec as job ids or a constraint."""
    if isinstance(job_spec, int) and not isinstance(job_spec, bool):
        return [str(job_spec)], None
    if isinstance(job_spec, ExprTree):
        return [], _text(str(job_spec))
    ids = [job_spec] if isinstance(job_spec, str) else [str(x) for x in job_spec]
    if not ids:
        raise InvalidInput("job_spec names no jobs")
    if len(ids) == 1 and not _is_job_id(ids[0]):
        return [], _text(ids[0])
    for text in ids:
        parse_job_id(text)  # ValueError for a malformed one
    return ids, None


def _since(since: int | str | ExprTree | None) -> Callable[[Job, ClassAd], bool] | None:
    if since is None:
        return None
    text = str(since).strip()
    if isinstance(since, int) or _is_job_id(text):
        cluster, proc = parse_job_id(text)
        return lambda job, _ad: job.cluster_id == cluster and proc in (None, job.proc_id)
    expr = ExprTree(text)
    return lambda _job, ad: matches(expr, ad)
