"""FETCH_WORK's handler: a slot ad in, a claimed job's ad out (or nothing, and what the slot
could take, for a fetch that may wait in the agent)."""

from __future__ import annotations

import hashlib
import os
import random
import time
from typing import TYPE_CHECKING

from classad2 import ClassAd

from jobstore.core import holds
from jobstore.core.claims import ClaimRequest, Verdict
from jobstore.core.jobs import Job
from jobstore.core.states import Event
from jobstore.errors import (
    AdError,
    DatabaseError,
    HookError,
    TooCostly,
    WorkerUnavailable,
)
from jobstore.formats import classads, views
from jobstore.formats.classads import get_bool, get_int, get_str
from jobstore.formats.jobads import (
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
from jobstore.node import bounded, config
from jobstore.node.accounts import account_exists, owner_refusal
from jobstore.node.hookcall import HookRequest, HookResponse, IdleSlot

if TYPE_CHECKING:  # the store (SQLAlchemy) is imported only when a hook needs the database
    from jobstore.db.store import JobStore

# Fraction of fetches that also recover expired leases, so no extra daemon is needed.
REAP_PROBABILITY = 0.05
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
        except TooCostly as exc:
            costly = bounded.costly_hold(
                exc, "Its Requirements (or the slot's START against it)")
            return Verdict(hold_reason=costly.reason, hold_code=costly.code)
        except WorkerUnavailable:  # the node's trouble, not the job's: nothing is claimed
            raise
        except Exception as exc:  # whatever else its stored values make a reader do: that
            # job's problem, never every slot's (no fetch would get past it)
            return Verdict(hold_reason=f"its job ad cannot be read: {what(exc)}",
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
    job = store.negotiator.claim(request_, judge)
    if job is None:
        return HookResponse(log=notes, idle=IdleSlot(settings, settings.queue, offer.cpus,
                                                     offer.memory, offer.disk))
    try:
        with request.node.reading(settings.keyword, job.id):
            text = render_job(job, sandbox=sandbox_dir(job, settings), **ad_kw)
    except Exception as exc:  # AdError, or whatever else its stored values do to a reader
        why = str(exc) if isinstance(exc, AdError) else what(exc)
        store.reports.report(
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


def what(exc: BaseException) -> str:
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
        store.maintenance.reap(limit=50)
        store.negotiator.update_priorities(
            halflife=settings.priority_halflife, interval=settings.priority_update_interval
        )
        store.maintenance.police_due(settings.periodic_expr_interval)
    except DatabaseError as exc:
        return [f"upkeep (lease recovery, priorities, policy) failed: {exc}"]
    return []
