"""A starter's or startd's report of an attempt, sent to the job store: checked as a spooled
one will be (reports.Report), written to the spool first, then kept back for the attempt's
next report (the agent) or applied; and the spool's replay of what was left."""

from __future__ import annotations

import functools
import hashlib
import math
import os
import pwd
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from classad2 import ClassAd

from jobstore.core import policy
from jobstore.core.jobs import Job
from jobstore.core.states import Event
from jobstore.errors import (
    BadReport,
    DatabaseError,
    ForeignReport,
    HookError,
    InvalidInput,
    JobstoreError,
    NotOwner,
    UnknownJob,
)
from jobstore.formats import classads, views
from jobstore.formats.classads import get_int, get_str
from jobstore.formats.jobads import (
    ATTR_ATTEMPT,
    ATTR_JOB_ID,
    ATTR_TOKEN,
    ad_job_id,
)
from jobstore.node import config, spool
from jobstore.node.deferred import Pending
from jobstore.node.hookcall import HookRequest, HookResponse
from jobstore.node.reports import MAX_TEXT, REPORT_ATTRS, SERVICE, Caller, Report, check_changes
from jobstore.node.services import NodeServices

if TYPE_CHECKING:  # the store (SQLAlchemy) is imported only when a hook needs the database
    from jobstore.db.reports import AttemptReport
    from jobstore.db.store import Outcome

# A report applied this many seconds after its hook made it (a replay from the spool) keeps
# the time it was made in its event's attrs (ReportedAt).
LATE = 1.0


def ours(job: ClassAd) -> bool:
    """Is this the ad of a job store job's attempt (not another system's job)?"""
    return get_int(job, ATTR_JOB_ID) is not None and get_str(job, ATTR_TOKEN) is not None


def valid_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    """The changes a report may make, without values out of their column's bounds (an ad
    from the starter may carry anything)."""
    out = {}
    for name, value in changes.items():
        try:
            check_changes({name: value})
        except BadReport:
            continue
        out[name] = value
    return out


def _report_attrs(job: ClassAd) -> dict[str, Any]:
    """The usage and exit attributes of a starter's ad, as a report may carry them."""
    attrs: dict[str, Any] = {}
    for name in REPORT_ATTRS:
        value = classads.get(job, name)
        if isinstance(value, str):
            attrs[name] = value[:MAX_TEXT]
        elif isinstance(value, bool | int | float) and math.isfinite(value) and abs(value) < 2**63:
            attrs[name] = value
    return attrs


def report(
    request: HookRequest,
    job: ClassAd,
    event: Event,
    *,
    slot: str | None,
    host: str | None = None,
    changes: dict[str, Any] | None = None,
) -> HookResponse:
    """Send one report about the attempt named in the job ad; other systems' jobs are left alone.

    The report goes to the local spool first and leaves it once the database has it, so that a
    database outage or a killed hook loses nothing (replayed by the next call, the agent or
    `jobstore replay`). It is checked as a spooled one will be (`Report.parse`) before that.
    """
    if not ours(job):
        return HookResponse(log=["not a job store job; left alone"])
    job_id, attempt, token = (
        get_int(job, ATTR_JOB_ID),
        get_int(job, ATTR_ATTEMPT),
        get_str(job, ATTR_TOKEN),
    )
    name = ad_job_id(job)
    keyword = config.starter_keyword(get_str(job, "HookKeyword"))
    settings = request.settings_for(keyword)
    report = Report.parse(
        {
            "keyword": settings.keyword,
            "job_id": job_id,
            "event": str(event),
            "token": token,
            "attempt": attempt,
            "changes": valid_changes(changes or {}),
            "attrs": _report_attrs(job),
            "slot": slot or None,
            "host": host or None,
            "time": time.time(),
            "store": store_identity(settings.database_url),
            "caller_uid": request.caller.uid,
        }
    )
    record = report.record()
    log: list[str] = []
    spool_dir = Path(settings.spool)
    try:
        send = spool_sender(request.service_uids(), node=request.node)
        replayed = spool.replay(spool_dir, send, limit=20, group=record_group)
        if replayed.sent or replayed.left or replayed.bad:
            log.append(
                f"replayed {replayed.sent} spooled report(s), {replayed.left} left, "
                f"{replayed.bad} quarantined"
            )
        # held by this process while it sends: a concurrent replayer must not send it too
        spooled = spool.hold(spool_dir, record)
    except OSError as exc:
        spooled = None
        unusable = f"spool unusable, reporting directly: {exc}"
        log.append(unusable)
    deferred = request.node.deferred
    earlier: list[Pending] = []
    try:
        # who reports, checked before anything is kept back or taken: a report that is refused
        # here never touches another's kept-back ones
        prepared = attempt_report(report, SERVICE, settings, node=request.node)
        if deferred is not None and spooled is not None:
            key = (settings.keyword, job_id or 0, attempt or 0)
            uid = -1 if request.caller.uid is None else request.caller.uid
            if deferred.may_keep(key, event, get_int(job, "JobPid") is not None, uid):
                deferred.keep(Pending(key, prepared, spooled, settings, uid))
                return HookResponse(log=[*log, f"job {name} attempt {attempt}: {event}, "
                                               "applied with the attempt's next report"])
            earlier = deferred.take(key)
        if earlier:
            before, outcome = apply_reports([*[p.report for p in earlier], prepared], settings,
                                            node=request.node)
            log.extend(_kept_back_log(earlier, before))
        else:
            reports = request.node.store_for(settings).reports
            outcome = reports.apply_report(prepared[1], prepared[2])
    except (UnknownJob, NotOwner) as exc:
        # before the database (no earlier ones were taken), or the last report's own result
        # after its transaction committed with the earlier ones
        for item in earlier:
            spool.done(item.spooled.path)
        if spooled:
            spool.done(spooled.path)
        if isinstance(exc, UnknownJob):
            raise HookError(f"job {name} is not in the job store") from None
        raise HookError(str(exc)) from None
    except (DatabaseError, config.ConfigError) as exc:
        for item in earlier:
            spool.release(item.spooled)
        if spooled is None:
            raise HookError(f"{event} for job {name} not sent: {exc}; {unusable}") from None
        spool.release(spooled)
        return HookResponse(
            log=[*log, f"job {name}: {event} spooled in {spool_dir} ({exc})"],
            error=f"{event} for job {name} kept in the spool: {exc}",
            database_error=isinstance(exc, DatabaseError),
            spooled=True,
        )
    except BaseException:
        for item in earlier:
            spool.release(item.spooled)
        if spooled:
            spool.release(spooled)
        raise
    for item in earlier:
        spool.done(item.spooled.path)
    if spooled:
        spool.done(spooled.path)
    note = f"job {name} attempt {attempt}: {event} {outcome.before} -> {outcome.after}"
    if outcome.stale:
        note += " (stale report, recorded only)"
    return HookResponse(log=[*log, note], stale=outcome.stale)


@functools.lru_cache(maxsize=64)
def store_identity(url: str) -> str:
    """A fingerprint of the database a report belongs to: of the URL without its password, so
    that a report spooled by a hook that could not read the password is still recognised (and
    never the URL itself, which may hold the password)."""
    from sqlalchemy.engine import make_url

    try:
        url = make_url(url)._replace(password=None).render_as_string(hide_password=False)
    except Exception:
        pass
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def send_record(
    record: Mapping[str, Any],
    writer: Caller = SERVICE,
    settings: config.Settings | None = None,
    *,
    node: NodeServices,
) -> Outcome:
    """Apply one report (fresh or spooled) to the job store of its keyword. `writer` is who
    handed it over (a spool file's owner); the record is checked as untrusted input first
    (BadReport), and an ordinary account may report only on its own jobs (NotOwner). `settings`
    are the keyword's, when the caller has them already."""
    return apply_report(Report.parse(record, writer), writer, settings, node=node)


def apply_report(
    report: Report, writer: Caller = SERVICE, settings: config.Settings | None = None, *,
    node: NodeServices,
) -> Outcome:
    """Apply a checked report (see `send_record`)."""
    settings, job_id, r = attempt_report(report, writer, settings, node=node)
    return node.store_for(settings).reports.apply_report(job_id, r)


def apply_reports(reports: list[Prepared], settings: config.Settings, *, node: NodeServices,
                  ) -> tuple[list[Outcome | JobstoreError], Outcome]:
    """Apply the agent's reports about one attempt (`attempt_report`'s) in one transaction, in
    their order: the results of all but the last, and the last one's outcome (its error raised,
    as apply_report raises it)."""
    *before, last = node.store_for(settings).reports.report_many(
        [(job_id, r) for _, job_id, r in reports])
    if isinstance(last, JobstoreError):
        raise last
    return before, last


def apply_kept_back(items: list[Pending], *, node: NodeServices) -> list[str]:
    """Apply reports the agent kept back (deferred.Deferred.due, drain): each database's in
    one transaction; the spool keeps those a database did not take. Lines for its log."""
    lines: list[str] = []
    by_store: dict[str, list[Pending]] = {}
    for item in items:
        by_store.setdefault(item.settings.database_url, []).append(item)
    groups = list(by_store.values())
    for i, group in enumerate(groups):
        try:
            results = node.store_for(group[0].settings).reports.report_many(
                [(job_id, r) for _, job_id, r in (item.report for item in group)])
        except Exception as exc:  # this database's stay in the spool; the others go on
            for item in group:
                spool.release(item.spooled)
            lines.append(f"{len(group)} report(s) kept in the spool: {exc}")
            continue
        except BaseException:
            for rest in groups[i:]:
                for item in rest:
                    spool.release(item.spooled)
            raise
        for item in group:
            spool.done(item.spooled.path)
        lines.extend(_kept_back_log(group, results))
    return lines


def _kept_back_log(items: list[Pending], results: list[Outcome | JobstoreError]) -> list[str]:
    out = []
    for item, result in zip(items, results, strict=True):
        _, job_id, r = item.report
        what = f"job {job_id} attempt {r.attempt}: {r.event}"
        if isinstance(result, JobstoreError):
            out.append(f"{what}: not applied ({result})")
        else:
            out.append(f"{what} {result.before} -> {result.after}"
                       + (" (stale report, recorded only)" if result.stale else ""))
    return out


# A report as the store applies it: its keyword's settings, the job, the report itself.
Prepared = tuple[config.Settings, int, "AttemptReport"]


def attempt_report(
    report: Report, writer: Caller = SERVICE, settings: config.Settings | None = None, *,
    node: NodeServices,
) -> Prepared:
    """A checked report (see `send_record`) as the store applies it: its keyword's settings,
    the job, and the report itself."""
    from jobstore.db.reports import AttemptReport

    if settings is None or settings.keyword != report.keyword:
        settings = config.load_settings(report.keyword)
    if report.store != store_identity(settings.database_url):
        raise ForeignReport(report.job_id)
    author = report.author(writer)
    owner = None if author.uid is None else _account_name(author.uid, report.job_id)
    event = report.event
    if event in (Event.REJECT, Event.CLAIM_EVICTED):
        lease = None
    elif event == Event.ACCEPT:
        lease = settings.claim_lease
    else:
        lease = settings.lease_duration
    attrs = dict(report.attrs)
    exit_policy = None
    if event == Event.EXIT:

        def exit_policy(row: Job) -> policy.ExitVerdict:
            if not policy.exit_evaluates(row.ad, row.retry_until):  # no worker needed
                return policy.exit_verdict(row, attrs)
            with node.reading(report.keyword, row.id):
                return node.evaluator.exit_verdict(row, attrs, views.policy_ad(row, attrs))

    late = time.time() - report.time >= LATE
    return settings, report.job_id, AttemptReport(
        event,
        token=report.token,
        attempt=report.attempt,
        changes=report.changes,
        attrs={**attrs, "ReportedAt": report.time} if late else attrs,
        lease=lease,
        slot=report.slot,
        host=report.host,
        exit_policy=exit_policy,
        now=time.time() if late else min(report.time, time.time()),
        owner=owner,
        keyword=settings.keyword,
    )


def spool_sender(services: frozenset[int], *, node: NodeServices
                 ) -> Callable[[Any, int], spool.Later | spool.NotMine | None]:
    """`send` for `spool.replay`: a file of this account or of a service account is the
    service's; any other account's is that account's report, about its own jobs only. A
    database that is away keeps the report (and its keyword's later ones) for later."""
    me = os.geteuid()

    def send(record: Any, uid: int) -> spool.Later | spool.NotMine | None:
        writer = SERVICE if uid == me or uid in services else Caller(uid)
        try:
            send_record(record, writer, node=node)
        except (DatabaseError, config.ConfigError) as exc:
            return spool.Later(str(exc))
        except ForeignReport:
            if writer is SERVICE:
                return spool.NotMine()
            # an ordinary account's report about another store: never applied here, and it
            # must not keep the genuine ones from being looked at (quarantined)
            raise InvalidInput("a report about another job store") from None
        return None

    return send


def record_group(record: Any) -> object:
    """Reports of one keyword are replayed in order; another keyword's database may be up."""
    return record.get("keyword") if isinstance(record, dict) else None


def _account_name(uid: int, job_id: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        raise NotOwner(job_id, f"uid {uid}") from None
