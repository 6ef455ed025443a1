"""One handler per hook: parsed input -> job store calls -> output bytes.

Nothing here knows about processes, file descriptors or signals: the hook executables and a
per-node service call the same `handle`.
"""

from __future__ import annotations

import hashlib
import math
import os
import pwd
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from classad2 import ClassAd

from jobstore.core import holds, policy
from jobstore.core.claims import ClaimRequest, Verdict
from jobstore.core.jobs import Job
from jobstore.core.states import Event
from jobstore.errors import (
    AdError,
    BadReport,
    DatabaseError,
    HookError,
    InvalidInput,
    JobstoreError,
    NotOwner,
    UnknownJob,
)
from jobstore.formats import classads, views
from jobstore.formats.classads import get_bool, get_float, get_int, get_str
from jobstore.formats.jobads import (
    ATTR_ATTEMPT,
    ATTR_JOB_ID,
    ATTR_TOKEN,
    ad_job_id,
    job_classad,
    render_job,
    transfers_files,
)
from jobstore.formats.matching import (
    slot_offer,
    slot_shape,
    slot_weight,
    why_slot_cannot_take,
)
from jobstore.node import bounded, config, spool
from jobstore.node.accounts import account_exists, owner_refusal
from jobstore.node.deferred import Pending
from jobstore.node.hookproc import STOP_JOB
from jobstore.node.reports import MAX_TEXT, REPORT_ATTRS, SERVICE, Caller, Report, check_changes
from jobstore.node.services import NodeServices

if TYPE_CHECKING:  # the store (SQLAlchemy) is imported only when a hook needs the database
    from jobstore.db.reports import AttemptReport
    from jobstore.db.store import JobStore, Outcome

# A report applied this many seconds after its hook made it (a replay from the spool) keeps
# the time it was made in its event's attrs (ReportedAt).
LATE = 1.0
# Fraction of fetches that also recover expired leases, so no extra daemon is needed.
REAP_PROBABILITY = 0.05


@dataclass
class HookRequest:
    hook: str
    argv: list[str]
    stdin: bytes
    env: Mapping[str, str] = field(default_factory=dict)
    set_deadline: Callable[[float], None] | None = None  # a process caller's hard time limit
    # Who asks: the agent names an ordinary account (SO_PEERCRED); a hook process in direct
    # mode is trusted as far as its database credentials go.
    caller: Caller = SERVICE
    # A keyword's settings as the caller read them (the agent: once, and again on SIGHUP);
    # None: read them now (a hook process serves one call).
    settings: Callable[[str | None], config.Settings] | None = None
    # The service accounts' uids as the caller resolved them (the agent: at start and on
    # SIGHUP); None: resolve them now.
    services: frozenset[int] | None = None
    # What serves the call: the caller's stores, evaluator, outbox, kept-back reports
    node: NodeServices = field(kw_only=True)

    def settings_for(self, keyword: str | None) -> config.Settings:
        """The settings of `keyword`, from the caller's reading if it made one."""
        return (self.settings or config.load_settings)(keyword)

    def service_uids(self) -> frozenset[int]:
        """The service accounts' uids, from the caller's reading if it made one."""
        if self.services is not None:
            return self.services
        return config.service_uids(config.startd_users())


@dataclass(frozen=True)
class IdleSlot:
    """A fetch that found nothing: its slot's keyword settings, queue and what it has free
    (CPUs, MiB, KiB), as a waiting fetch waits on them (jobstore.agent.fetchwait)."""

    settings: config.Settings
    queue: str
    cpus: int
    memory: int
    disk: int
    starter: int = 0  # a busy static slot's starter: the fetch waits for its end (agent)

    @property
    def database_url(self) -> str:
        return self.settings.database_url


@dataclass
class HookResponse:
    stdout: bytes = b""
    error: str | None = None
    exit_code: int = 0
    log: list[str] = field(default_factory=list)
    stale: bool = False  # the report was about a superseded attempt
    database_error: bool = False  # the database was away or refused
    spooled: bool = False  # the report could not be sent and waits in the spool
    fd: int | None = None  # an open file handed over with the answer (the caller closes it)
    idle: IdleSlot | None = None  # a fetch that found nothing for a slot that could take work


# ---- entry point ----------------------------------------------------------------------------


def handle(request: HookRequest) -> HookResponse:
    """Run one hook. Never raises: failures come back as `error` with empty stdout and exit 0
    (only PREPARE_JOB's status matters to HTCondor, and a failed report must not stop a job)."""
    handler = _HANDLERS.get(request.hook)
    if handler is None:
        return HookResponse(error=f"unknown hook {request.hook!r}")
    try:
        return handler(request)
    except DatabaseError as exc:
        return HookResponse(error=f"{request.hook}: {exc}", database_error=True)
    except (HookError, AdError, BadReport, config.ConfigError) as exc:
        return HookResponse(error=f"{request.hook}: {exc}")
    except Exception as exc:  # a bug: report one line, never a traceback on the hook's stderr
        return HookResponse(error=f"{request.hook}: internal error: {type(exc).__name__}: {exc}")


# ---- FETCH_WORK -----------------------------------------------------------------------------

FRESH_AD = 10.0  # seconds: a slot ad at most this old was written for the fetch now running


def busy_starter(slot: ClassAd) -> int:
    """The pid of the starter running a static slot's job (Claimed/Busy): a condor_starter
    of this machine, or one that has ended since the startd wrote the ad (moments ago: not a
    recorded ad); else 0. Its fetch may wait for the job's end, to answer for the slot then,
    Claimed/Idle: an empty answer there would end the slot's claim."""
    if (get_str(slot, "State"), get_str(slot, "Activity")) != ("Claimed", "Busy"):
        return 0
    if get_str(slot, "SlotType") != "Static" or slot_offer(slot) is None:
        return 0
    pid = get_int(slot, "StarterPid")
    if pid is None or pid <= 1:
        return 0
    try:
        with open(f"/proc/{pid}/comm", "rb") as fh:
            return pid if fh.read().strip() == b"condor_starter" else 0
    except FileNotFoundError:
        made = get_int(slot, "MyCurrentTime")
        return pid if made is not None and abs(time.time() - made) < FRESH_AD else 0
    except OSError:
        return 0


def fetch_job(request: HookRequest) -> HookResponse:
    if request.argv:
        raise HookError(f"FETCH_WORK takes no arguments, got {len(request.argv)}")
    slot = classads.parse_ad(classads.decode(request.stdin))
    name = get_str(slot, "Name")
    if not name:
        raise HookError("slot ad has no Name")
    busy = why_slot_cannot_take(slot)
    # only a caller that holds fetches (the agent: settings read once) can wait for a job's end
    starter = busy_starter(slot) if busy and request.settings is not None else 0
    if busy and not starter:
        return HookResponse(log=[f"{name}: no fetch, {busy}"])
    keyword = config.slot_keyword(name, get_int(slot, "SlotTypeID"))
    if not keyword:
        raise HookError(
            f"no STARTD_JOB_HOOK_KEYWORD or {config.slot_id_from_name(name)}"
            "_JOB_HOOK_KEYWORD for this slot"
        )
    settings = request.settings_for(keyword)
    if starter:  # no claim: the agent lets it wait for the job's end (agent.fetchwait)
        size = slot_offer(slot)
        assert size is not None  # busy_starter checked it
        return HookResponse(log=[f"{name}: no fetch, {busy}"], idle=IdleSlot(
            settings, settings.queue, size.cpus, size.memory, size.disk, starter))
    if request.set_deadline is not None:
        request.set_deadline(settings.fetch_deadline)
    store = request.node.store_for(settings)
    notes = upkeep(store, settings)
    offer = slot_offer(slot)
    assert offer is not None  # why_slot_cannot_take checked it
    ad_kw = {
        "keyword": settings.keyword,
        "uid_domain": settings.uid_domain,
        "job_lease_duration": settings.job_lease_duration,
    }

    def judge(job: Job) -> Verdict:
        refused = owner_refusal(job.owner, settings)
        if refused:
            return Verdict(hold_reason=refused)
        if not account_exists(job.owner):
            return Verdict()
        try:
            with request.node.reading(settings.keyword, job.id):
                return Verdict(take=request.node.evaluator.matches(job_classad(job, **ad_kw),
                                                                   slot))
        except AdError as exc:  # a stored value no reader takes (past the database's checks)
            return Verdict(hold_reason=f"its job ad cannot be read: {exc}",
                           hold_code=holds.JOB_POLICY_UNDEFINED)
        except bounded.TooCostly as exc:
            costly = exc.hold("Its Requirements (or the slot's START against it)")
            return Verdict(hold_reason=costly.reason, hold_code=costly.code)
        except Exception as exc:  # whatever else its stored values make a reader do: that
            # job's problem, never every slot's (no fetch would get past it)
            return Verdict(hold_reason=f"its job ad cannot be read: {_what(exc)}",
                           hold_code=holds.JOB_POLICY_UNDEFINED)

    request_ = ClaimRequest(
        queue=settings.queue,
        offer=offer,
        slot=name,
        host=get_str(slot, "Machine"),
        keyword=settings.keyword,
        claim_lease=settings.claim_lease,
        shape=slot_shape(slot, settings.keyword, settings.uid_domain, *settings.allowed_owners),
        partitionable=get_bool(slot, "PartitionableSlot") is True,
        weight=slot_weight(slot),
        fair_share=settings.fair_share,
        limit=config.limit_maximum if settings.concurrency_limits else None,
    )
    job = store.claim(request_, judge)
    if job is None:
        return HookResponse(log=notes, idle=IdleSlot(settings, settings.queue, offer.cpus,
                                                     offer.memory, offer.disk))
    try:
        with request.node.reading(settings.keyword, job.id):
            text = render_job(job, sandbox=sandbox_dir(job, settings), **ad_kw)
    except Exception as exc:  # AdError, or whatever else its stored values do to a reader
        why = str(exc) if isinstance(exc, AdError) else _what(exc)
        store.report(
            job.id,
            Event.HOLD,
            token=job.token,
            attempt=job.claims,
            attrs={"error": why},
            reason=f"job ad cannot be sent: {why}",
        )
        raise HookError(f"job {views.job_id(job)} put on hold: {why}") from None
    return HookResponse(
        stdout=text.encode("utf-8", "surrogateescape"),
        log=[*notes, f"{name}: fetched job {views.job_id(job)} attempt {job.claims}"],
    )


def _what(exc: BaseException) -> str:
    """An unexpected error as one bounded line of a hold reason."""
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def sandbox_dir(job: Job, settings: config.Settings) -> str | None:
    """Where a job with file transfer runs on this node: a directory of its own per attempt
    under the sandbox root (PREPARE_JOB makes it), named after a hash of the attempt's secret
    token, so that nobody can guess it before the fetch and the agent finds it again from the
    job's row, never from what a hook says."""
    if not transfers_files(job) or not job.token:
        return None
    tag = hashlib.sha256(b"sandbox:" + job.token.encode()).hexdigest()[:16]
    return os.path.join(settings.sandbox_root, f"{job.cluster_id}.{job.proc_id}.{job.claims}-{tag}")


def upkeep(store: JobStore, settings: config.Settings) -> list[str]:
    """What a fetch does now and then (REAP_PROBABILITY), so that no extra daemon is needed:
    recover expired leases, update the submitters' priorities, run the periodic policy pass when
    due. A failure here is logged and never costs the fetch its job."""
    return _maintain(store, settings) if random.random() < REAP_PROBABILITY else []


def _maintain(store: JobStore, settings: config.Settings) -> list[str]:
    try:
        store.reap(limit=50)
        store.update_priorities(
            halflife=settings.priority_halflife, interval=settings.priority_update_interval
        )
        store.police_due(settings.periodic_expr_interval)
    except DatabaseError as exc:
        return [f"upkeep (lease recovery, priorities, policy) failed: {exc}"]
    return []


# ---- REPLY_FETCH and EVICT_CLAIM (startd side) ---------------------------------------------


def reply_fetch(request: HookRequest) -> HookResponse:
    if len(request.argv) != 1 or request.argv[0] not in ("accept", "reject"):
        raise HookError("REPLY_FETCH needs one argument, accept or reject")
    reply = classads.split_reply_fetch(classads.decode(request.stdin))
    event = Event.ACCEPT if request.argv[0] == "accept" else Event.REJECT
    return _report(
        request,
        reply.job,
        event,
        slot=get_str(reply.slot, "Name"),
        host=get_str(reply.slot, "Machine"),
    )


def evict_claim(request: HookRequest) -> HookResponse:
    if request.argv:
        raise HookError("EVICT_CLAIM takes no arguments")
    reply = classads.split_reply_fetch(classads.decode(request.stdin))
    return _report(request, reply.job, Event.CLAIM_EVICTED, slot=get_str(reply.slot, "Name"))


# ---- starter hooks --------------------------------------------------------------------------


def prepare_job(request: HookRequest) -> HookResponse:
    job = _starter_ad(request)
    if job is None:
        return HookResponse()
    slot = request.env.get("_CONDOR_SLOT")
    problem = get_str(job, "JobstoreLaunchError") if _ours(job) else None
    code = get_int(job, "JobstoreLaunchErrorCode") or 0
    if problem and (code == holds.TRANSFER_INPUT_ERROR or request.settings_for(
        config.starter_keyword(get_str(job, "HookKeyword"))
    ).check_launch):  # found as the job's user (launchcheck, the sandbox): hold, never run
        job["HoldReason"] = f"Error from {slot or 'the execute node'}: {problem}"
        job["HoldReasonCode"] = code
        job["HoldReasonSubCode"] = get_int(job, "JobstoreLaunchErrorSubCode") or 0
        resp = _report(request, job, Event.HOOK_HOLD, slot=slot)
        return _not_started(f"not started: {problem}", resp.log)
    resp = _report(request, job, Event.PREPARE, slot=slot)
    if resp.exit_code:
        return resp
    if resp.stale:
        # This attempt was superseded (lease expired, held, removed): stop it before it runs,
        # so the job never runs twice. HTCondor then runs JOB_EXIT evict.
        return _not_started(
            "superseded attempt; the job store gave this job to another slot or stopped it",
            resp.log,
        )
    return resp


def _not_started(message: str, log: list[str]) -> HookResponse:
    """PREPARE_JOB's refusal: the starter does not run the job (HookStatusCode 301, exit 1) and
    says why; the message is made safe to quote in the ClassAd string."""
    msg = "".join(c if c.isprintable() and c not in '"\\' else "?" for c in message[:MAX_TEXT])
    out = f'HookStatusCode = 301\nHookStatusMessage = "{msg}"\n'
    return HookResponse(stdout=out.encode("utf-8", "surrogateescape"),
                        error=f"prepare_job: {msg}", exit_code=1, log=log)


def _ours(job: ClassAd) -> bool:
    """Is this the ad of a job store job's attempt (not another system's job)?"""
    return get_int(job, ATTR_JOB_ID) is not None and get_str(job, ATTR_TOKEN) is not None


def update_job_info(request: HookRequest) -> HookResponse:
    job = _starter_ad(request)
    if job is None:
        return HookResponse()
    event = Event.START if get_int(job, "JobPid") else Event.UPDATE
    resp = _report(
        request, job, event, slot=request.env.get("_CONDOR_SLOT"), changes=_usage_changes(job)
    )
    if resp.stale and get_int(job, "JobPid"):
        # The attempt was held, removed or given to another slot: the hook process (the job's
        # user) ends the job's process (hookproc.stop_job); the JOB_EXIT that follows is stale.
        resp.exit_code = STOP_JOB
    return resp


def job_exit(request: HookRequest) -> HookResponse:
    if len(request.argv) != 1 or request.argv[0] not in ("exit", "evict", "hold", "remove"):
        raise HookError("JOB_EXIT needs one argument: exit, evict, hold or remove")
    job = _starter_ad(request)
    if job is None:
        return HookResponse()
    event = {
        "exit": Event.EXIT,
        "evict": Event.EVICT,
        "hold": Event.HOOK_HOLD,
        "remove": Event.HOOK_REMOVE,
    }[request.argv[0]]
    if _ours(job) and get_bool(job, "JobstoreHandOff") is True:
        outbox = request.node.outbox
        if outbox is not None:  # the rest is sent by the agent, which records the exit after
            return outbox(request, job)
        job["JobstoreOutputError"] = ("Failed to transfer the job's output files: not sent in "
                                      "JOB_EXIT's time, and no jobstore agent to hand them to")
    problem = get_str(job, "JobstoreOutputError") if _ours(job) else None
    if problem and event == Event.EXIT:  # its outputs could not be sent back: hold, as HTCondor
        job["HoldReason"] = problem
        job["HoldReasonCode"] = holds.TRANSFER_OUTPUT_ERROR
        job["HoldReasonSubCode"] = 0
        event = Event.HOOK_HOLD
    elif event == Event.EXIT and _ours(job) and get_bool(job, "JobstoreCheckpointed") is True:
        # exited with its checkpoint_exit_code, checkpoint stored: requeued to go on from it
        job["VacateReason"] = (f"checkpointed (exit code {get_int(job, 'ExitCode')}); "
                               "the next attempt starts from its checkpoint")
        event = Event.EVICT
    changes = _usage_changes(job)
    by_signal = get_bool(job, "ExitBySignal")
    changes.update(
        exit_by_signal=by_signal,
        exit_code=get_int(job, "ExitCode"),
        exit_signal=get_int(job, "ExitSignal"),
    )
    return _report(request, job, event, slot=request.env.get("_CONDOR_SLOT"), changes=changes)


def _starter_ad(request: HookRequest) -> ClassAd | None:
    if request.hook != "job_exit" and request.argv:
        raise HookError(f"{request.hook} takes no arguments")
    return classads.parse_ad(classads.decode(request.stdin))


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


def _usage_changes(job: ClassAd) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    pid = get_int(job, "JobPid")
    if pid:
        changes["job_pid"] = pid
    for col, attr in (("remote_user_cpu", "RemoteUserCpu"), ("remote_sys_cpu", "RemoteSysCpu")):
        value = get_float(job, attr)
        if value is not None:
            changes[col] = value
    for col, attr in (("image_size", "ImageSize"), ("memory_usage", "MemoryUsage")):
        value = get_int(job, attr)
        if value is not None:
            changes[col] = value
    return changes


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


def _report(
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
    if not _ours(job):
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
            outcome = request.node.store_for(settings).apply_report(prepared[1], prepared[2])
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
    return node.store_for(settings).apply_report(job_id, r)


def apply_reports(reports: list[Prepared], settings: config.Settings, *, node: NodeServices,
                  ) -> tuple[list[Outcome | JobstoreError], Outcome]:
    """Apply the agent's reports about one attempt (`attempt_report`'s) in one transaction, in
    their order: the results of all but the last, and the last one's outcome (its error raised,
    as apply_report raises it)."""
    *before, last = node.store_for(settings).report_many(
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
            results = node.store_for(group[0].settings).report_many(
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
        raise spool.NotMine(report.job_id)
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
                 ) -> Callable[[Any, int], Outcome]:
    """`send` for `spool.replay`: a file of this account or of a service account is the
    service's; any other account's is that account's report, about its own jobs only. A
    database that is away keeps the report (and its keyword's later ones) for later."""
    me = os.geteuid()

    def send(record: Any, uid: int) -> Outcome:
        writer = SERVICE if uid == me or uid in services else Caller(uid)
        try:
            return send_record(record, writer, node=node)
        except (DatabaseError, config.ConfigError) as exc:
            raise spool.Later(record_group(record), str(exc)) from None
        except spool.NotMine:
            if writer is SERVICE:
                raise
            # an ordinary account's report about another store: never applied here, and it
            # must not keep the genuine ones from being looked at (quarantined)
            raise InvalidInput("a report about another job store") from None

    return send


def record_group(record: Any) -> object:
    """Reports of one keyword are replayed in order; another keyword's database may be up."""
    return record.get("keyword") if isinstance(record, dict) else None


def _account_name(uid: int, job_id: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        raise NotOwner(job_id, f"uid {uid}") from None


_HANDLERS: dict[str, Callable[[HookRequest], HookResponse]] = {
    "fetch_job": fetch_job,
    "reply_fetch": reply_fetch,
    "evict_claim": evict_claim,
    "prepare_job": prepare_job,
    "update_job_info": update_job_info,
    "job_exit": job_exit,
}
