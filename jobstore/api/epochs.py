"""htcondor2.Schedd.jobEpochHistory from the store's events: one ad per attempt of a job (an
epoch, in HTCondor's words), the job's ad with what that attempt did."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from classad2 import ClassAd

from jobstore.api.query import Shown, iter_query
from jobstore.core.jobs import Job, JobEvent
from jobstore.db.store import JobStore

# The events of an attempt that say when it started and how it ended.
_STARTS = {"start"}
_ENDS = {"exit", "evict", "hook_hold", "hook_remove", "lease_expired", "hold", "remove",
         "reject", "claim_evicted"}


def epoch_ads(store: JobStore, shown: Shown, constraint: str | None, *,
              since: Callable[[Job, ClassAd], bool] | None = None,
              match: int | None = None) -> list[ClassAd]:
    """An ad per attempt of the jobs `constraint` selects (finished or not), job by job in
    (cluster, proc) order, each job's newest attempt first; the reading stops at `match` ads,
    or at the job `since` names."""
    ads: list[ClassAd] = []
    for job in iter_query(store, shown, constraint=constraint, include_final=True):
        base = shown.ad(job)
        if since is not None and since(job, base):
            break
        for attempt, events in sorted(_attempts(store.reads.events(job.id)).items(), reverse=True):
            ads.append(_epoch_ad(shown.ad(job), attempt, events))
            if match is not None and len(ads) >= match:
                return ads
    return ads


def _attempts(events: list[JobEvent]) -> dict[int, list[JobEvent]]:
    """The events of each attempt that was handed out (attempt > 0)."""
    out: dict[int, list[JobEvent]] = {}
    for event in events:
        if event.attempt:
            out.setdefault(event.attempt, []).append(event)
    return out


def _epoch_ad(ad: ClassAd, attempt: int, events: list[JobEvent]) -> ClassAd:
    values: dict[str, Any] = {"EpochAttempt": attempt, "NumShadowStarts": attempt,
                              "EpochWriteDate": int(events[-1].time)}
    fetched = next((e for e in events if e.event == "fetch"), events[0])
    values["JobCurrentStartDate"] = int(fetched.time)
    if fetched.slot:
        values["RemoteHost"] = fetched.slot
    started = next((e for e in events if e.event in _STARTS), None)
    if started is not None:
        values["JobCurrentStartExecutingDate"] = int(started.time)
    ended = next((e for e in reversed(events) if e.event in _ENDS and e.to_status), None)
    if ended is not None:
        values["EpochEndEvent"] = ended.event
        values["EpochEndReason"] = ended.reason or ""
        for name, value in (ended.attrs or {}).items():
            if name in ("ExitCode", "ExitSignal", "ExitBySignal", "RemoteWallClockTime",
                        "RemoteUserCpu", "RemoteSysCpu"):
                values[name] = value
    for name, value in values.items():
        ad[name] = value
    return ad
