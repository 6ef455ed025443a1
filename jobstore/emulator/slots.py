"""The startd's slots: their state, their claims, and the ad each publishes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import classad2

from jobstore.emulator import classad_wire as wire
from jobstore.emulator.model import EmulatorConfig
from jobstore.emulator.slotad import WITHIN_RESOURCE_LIMITS, base_ad
from jobstore.emulator.starter import Starter


@dataclass
class Claim:
    id: str
    fetch: bool  # a CLAIM_FETCH claim (False: the opportunistic claim of an idle slot)
    rank: float = 0.0
    job_ad: classad2.ClassAd | None = None
    last_job_ad: classad2.ClassAd | None = None
    idle_since: float | None = None  # monotonic; Claimed/Idle lease bookkeeping
    lease: float = 1200.0


@dataclass
class Slot:
    name: str  # slot1@host, slot1_2@host
    short: str  # slot1, slot1_2
    kind: str  # Static | Partitionable | Dynamic
    slot_id: int
    cpus: int
    memory: int
    disk: int
    claim: Claim
    dslot_id: int | None = None
    parent: Slot | None = None
    state: str = "Unclaimed"
    activity: str = "Idle"
    entered_state: int = 0
    entered_activity: int = 0
    fetching: bool = False
    fetch_broken: bool = False  # FETCH_WORK exec failed: this slot never fetches again (2.9)
    delete_after_fetch: bool = False
    deleted: bool = False
    last_spawned: int = 0
    last_completed: int = 0
    completed_mono: float | None = None
    next_fetch_delay: int = -1
    next_due: float | None = 0.0
    starter: Starter | None = None
    job_starts: int = 0
    children: list[Slot] = field(default_factory=list)

    def set_state(self, state: str, activity: str) -> None:
        now = int(time.time())
        if state != self.state:
            self.entered_state = now
        if state != self.state or activity != self.activity:
            self.entered_activity = now
        self.state, self.activity = state, activity


def public_ad(
    slot: Slot, config: EmulatorConfig, *, sinful: str, port: int, start_time: int,
    all_slots: list[Slot],
) -> classad2.ClassAd:
    """The slot's ad as the startd publishes it (and hands to FETCH_WORK)."""
    cfg = config
    now = int(time.time())
    ad = base_ad(cfg.host, sinful, port)
    lt = time.localtime(now)
    claimed = slot.state in ("Claimed", "Preempting")
    ad.update(
        {
            "Activity": slot.activity,
            "ClockDay": (lt.tm_wday + 1) % 7,
            "ClockMin": lt.tm_hour * 60 + lt.tm_min,
            "ConsoleIdle": now - start_time,
            "Cpus": slot.cpus,
            "CurrentRank": float(slot.claim.rank if claimed else 0.0),
            "DaemonStartTime": start_time,
            "DetectedCpus": cfg.cpus,
            "DetectedMemory": cfg.memory,
            "Disk": slot.disk,
            "EnteredCurrentActivity": slot.entered_activity,
            "EnteredCurrentState": slot.entered_state,
            "ExpectedMachineGracefulDrainingBadput": 0,
            "ExpectedMachineGracefulDrainingCompletion": now,
            "ExpectedMachineQuickDrainingBadput": 0,
            "ExpectedMachineQuickDrainingCompletion": now,
            "FileSystemDomain": cfg.uid_domain,
            "JobStarts": slot.job_starts,
            "KeyboardIdle": now - start_time,
            "LastBenchmark": 0,
            "LastFetchWorkCompleted": slot.last_completed,
            "LastFetchWorkSpawned": slot.last_spawned,
            "LastHeardFrom": now,
            "Machine": cfg.host,
            "Memory": slot.memory,
            "MonitorSelfTime": start_time,
            "MyCurrentTime": now,
            "Name": slot.name,
            "NextFetchWorkDelay": slot.next_fetch_delay,
            "RecentJobStarts": slot.job_starts,
            "SlotID": slot.slot_id,
            "SlotType": slot.kind,
            "SlotTypeID": 1,
            "State": slot.state,
            "TotalCpus": float(cfg.cpus),
            "TotalDisk": cfg.disk,
            "TotalMemory": cfg.memory,
            "TotalSlotCpus": slot.cpus,
            "TotalSlotDisk": float(slot.disk),
            "TotalSlotMemory": slot.memory,
            "TotalSlots": sum(1 for s in all_slots if not s.deleted),
            "UidDomain": cfg.uid_domain,
        }
    )
    ad["Rank"] = classad2.ExprTree(cfg.rank)
    ad["Requirements"] = classad2.ExprTree("Start && WithinResourceLimits")
    ad["Start"] = classad2.ExprTree(cfg.start)
    ad["WithinResourceLimits"] = classad2.ExprTree(WITHIN_RESOURCE_LIMITS)
    if slot.kind == "Partitionable":
        _publish_children(ad, slot, start_time)
    elif slot.kind == "Dynamic":
        ad.update({"DynamicSlot": True, "DSlotId": slot.dslot_id or 0, "IsSplittable": True})
        ad.update({"ParentSlotId": slot.slot_id, "PslotRollupInformation": True})
    if claimed and slot.claim.fetch:
        _publish_claim(ad, slot)
    return ad

def _publish_children(ad: classad2.ClassAd, slot: Slot, start_time: int) -> None:
    kids = [k for k in slot.children if not k.deleted]
    ad.update(
        {
            "PartitionableSlot": True,
            "PslotRollupInformation": True,
            "NumDynamicSlots": len(kids),
            "NumDynamicSlotsTime": start_time,
            "ChildAccountingGroup": [],
            "ChildActivity": [k.activity for k in kids],
            "ChildCpus": [k.cpus for k in kids],
            "ChildCurrentRank": [float(k.claim.rank) for k in kids],
            "ChildDSlotId": [k.dslot_id or 0 for k in kids],
            "ChildDisk": [k.disk for k in kids],
            "ChildEnteredCurrentState": [k.entered_state for k in kids],
            "ChildMemory": [k.memory for k in kids],
            "ChildName": [k.name for k in kids],
            "ChildRemoteOwner": [],
            "ChildRemoteUser": [],
            "ChildRetirementTimeRemaining": [],
            "ChildState": [k.state for k in kids],
        }
    )

def _publish_claim(ad: classad2.ClassAd, slot: Slot) -> None:
    claim = slot.claim
    public = "#".join(claim.id.split("#")[:3]) + "#..."
    ad["PublicClaimId"] = public
    ad["ClaimEndTime"] = 0
    job = claim.job_ad or claim.last_job_ad
    if job is not None:
        for src, dst in (("Owner", "RemoteOwner"), ("User", "RemoteUser")):
            value = wire.eval_attr(job, src)
            if type(value) is str:
                ad[dst] = value
    if slot.starter is not None and claim.job_ad is not None:
        job = claim.job_ad
        cluster, proc = wire.eval_attr(job, "ClusterId"), wire.eval_attr(job, "ProcId")
        if type(cluster) is int and cluster > 0:
            ad["JobId"] = f"{cluster}.{proc if type(proc) is int else 0}"
        ad["JobStart"] = slot.entered_activity
        ad["JobUniverse"] = 5
        ad["StarterPid"] = 0
