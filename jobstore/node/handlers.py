"""One handler per hook: parsed input -> job store calls -> output bytes (FETCH_WORK's in
`fetching`; every report goes through `sending`).

Nothing here knows about processes, file descriptors or signals: the hook executables and a
per-node service call the same `handle`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from classad2 import ClassAd

from jobstore.core import holds
from jobstore.core.states import Event
from jobstore.errors import (
    AdError,
    BadReport,
    DatabaseError,
    HookError,
)
from jobstore.formats import classads
from jobstore.formats.classads import get_bool, get_float, get_int, get_str
from jobstore.node import config
from jobstore.node.fetching import fetch_job
from jobstore.node.hookcall import HookRequest, HookResponse
from jobstore.node.hookproc import STOP_JOB
from jobstore.node.reports import MAX_TEXT
from jobstore.node.sending import ours, report


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


def reply_fetch(request: HookRequest) -> HookResponse:
    if len(request.argv) != 1 or request.argv[0] not in ("accept", "reject"):
        raise HookError("REPLY_FETCH needs one argument, accept or reject")
    reply = classads.split_reply_fetch(classads.decode(request.stdin))
    event = Event.ACCEPT if request.argv[0] == "accept" else Event.REJECT
    return report(
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
    return report(request, reply.job, Event.CLAIM_EVICTED, slot=get_str(reply.slot, "Name"))


# A launch error's codes that always hold the job: its inputs could not be put in its sandbox
TRANSFER_HOLDS = (holds.TRANSFER_INPUT_ERROR, holds.MAX_TRANSFER_INPUT_SIZE_EXCEEDED)


def prepare_job(request: HookRequest) -> HookResponse:
    job = _starter_ad(request)
    if job is None:
        return HookResponse()
    slot = request.env.get("_CONDOR_SLOT")
    problem = get_str(job, "JobstoreLaunchError") if ours(job) else None
    code = get_int(job, "JobstoreLaunchErrorCode") or 0
    if problem and (code in TRANSFER_HOLDS or request.settings_for(
        config.starter_keyword(get_str(job, "HookKeyword"))
    ).check_launch):  # found as the job's user (launchcheck, the sandbox): hold, never run
        job["HoldReason"] = f"Error from {slot or 'the execute node'}: {problem}"
        job["HoldReasonCode"] = code
        job["HoldReasonSubCode"] = get_int(job, "JobstoreLaunchErrorSubCode") or 0
        resp = report(request, job, Event.HOOK_HOLD, slot=slot)
        return _not_started(f"not started: {problem}", resp.log)
    resp = report(request, job, Event.PREPARE, slot=slot)
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


def update_job_info(request: HookRequest) -> HookResponse:
    job = _starter_ad(request)
    if job is None:
        return HookResponse()
    event = Event.START if get_int(job, "JobPid") else Event.UPDATE
    resp = report(
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
    if ours(job) and get_bool(job, "JobstoreHandOff") is True:
        outbox = request.node.outbox
        if outbox is not None:  # the rest is sent by the agent, which records the exit after
            return outbox(request, job)
        job["JobstoreOutputError"] = ("Failed to transfer the job's output files: not sent in "
                                      "JOB_EXIT's time, and no jobstore agent to hand them to")
    problem = get_str(job, "JobstoreOutputError") if ours(job) else None
    if problem and event == Event.EXIT:  # its outputs could not be sent back: hold, as HTCondor
        job["HoldReason"] = problem
        job["HoldReasonCode"] = (holds.MAX_TRANSFER_OUTPUT_SIZE_EXCEEDED
                                 if get_int(job, "JobstoreOutputErrorCode")
                                 == holds.MAX_TRANSFER_OUTPUT_SIZE_EXCEEDED
                                 else holds.TRANSFER_OUTPUT_ERROR)
        job["HoldReasonSubCode"] = 0
        event = Event.HOOK_HOLD
    elif event == Event.EXIT and ours(job) and get_bool(job, "JobstoreCheckpointed") is True:
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
    return report(request, job, event, slot=request.env.get("_CONDOR_SLOT"), changes=changes)


def _starter_ad(request: HookRequest) -> ClassAd | None:
    if request.hook != "job_exit" and request.argv:
        raise HookError(f"{request.hook} takes no arguments")
    return classads.parse_ad(classads.decode(request.stdin))


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


_HANDLERS: dict[str, Callable[[HookRequest], HookResponse]] = {
    "fetch_job": fetch_job,
    "reply_fetch": reply_fetch,
    "evict_claim": evict_claim,
    "prepare_job": prepare_job,
    "update_job_info": update_job_info,
    "job_exit": job_exit,
}
