"""Does a job fit a slot? The slot's offer for the SQL prefilter, and ClassAd matchmaking."""

from __future__ import annotations

import hashlib

from classad2 import ClassAd, ExprTree

from jobstore.core.claims import Offer
from jobstore.formats.classads import get_bool, get_int, get_str

# Slots whose state lets the startd accept fetched work without preempting anything. A busy slot
# would say `reject` (rank 0) or, worse, `accept` and then silently lose the job (transcript 10c).
_TAKING = {("Unclaimed", "Idle"), ("Claimed", "Idle")}


def why_slot_cannot_take(slot: ClassAd) -> str | None:
    """None when the slot can take a job now, else a short reason (no database needed)."""
    state = get_str(slot, "State")
    activity = get_str(slot, "Activity")
    if (state, activity) not in _TAKING:
        return f"slot is {state}/{activity}"
    if get_bool(slot, "Draining"):
        return "slot is draining"
    if slot.get("Start") is not None and get_bool(slot, "Start") is False:
        return "slot START is false"
    offer = slot_offer(slot)
    if offer is None or offer.cpus <= 0 or offer.memory <= 0 or offer.disk <= 0:
        return "slot has no resources left"
    return None


def slot_offer(slot: ClassAd) -> Offer | None:
    """What the slot can give: a static slot its size, a partitionable slot what it has left."""
    cpus, memory, disk = get_int(slot, "Cpus"), get_int(slot, "Memory"), get_int(slot, "Disk")
    if cpus is None or memory is None or disk is None:
        return None
    return Offer(cpus=cpus, memory=memory, disk=disk)


# Slot attributes that change from one fetch to the next without changing what the slot offers;
# left out of its shape so that verdicts are remembered across fetches (for a limited time: a
# START that looks at load or idle time is judged again when the verdict expires).
VOLATILE = frozenset(
    n.lower()
    for n in (
        "State", "Activity", "MyCurrentTime", "LastHeardFrom", "UpdateSequenceNumber",
        "EnteredCurrentState", "EnteredCurrentActivity", "LastFetchWorkSpawned",
        "LastFetchWorkCompleted", "NextFetchWorkDelay", "LoadAvg", "CondorLoadAvg",
        "TotalLoadAvg", "TotalCondorLoadAvg", "KeyboardIdle", "ConsoleIdle", "CpuBusy",
        "CpuBusyTime", "CpuIsBusy", "ClockMin", "ClockDay", "DaemonCoreDutyCycle",
        "TotalTimeUnclaimedIdle", "TotalTimeClaimedIdle", "TotalTimeClaimedBusy", "JobStarts",
        "ActivationRequests", "ClaimRequests", "JobPreemptions", "JobRankPreemptions",
        "JobUserPrioPreemptions", "NewDSlotNotMatch", "NumPids", "CpusUsage", "DiskUsage",
        "MemoryUsage", "RetirementTimeRemaining", "TimeToLive", "LastBenchmark",
    )
)
_VOLATILE_PREFIXES = ("recent", "monitorself", "expectedmachine", "child")


def slot_shape(slot: ClassAd, *extra: str) -> str:
    """A digest of everything in the slot ad that a match could depend on (all but VOLATILE),
    with `extra` (the caller's own settings that judge a job)."""
    parts = list(extra)
    for name in sorted(slot.keys(), key=str.lower):
        low = name.lower()
        if low in VOLATILE or low.startswith(_VOLATILE_PREFIXES):
            continue
        parts.append(f"{low}={slot.lookup(name)}")
    return hashlib.sha256("\n".join(parts).encode("utf-8", "surrogateescape")).hexdigest()


def slot_weight(slot: ClassAd) -> float:
    """What a job holds when it takes this static slot: SlotWeight (SLOT_WEIGHT, by default the
    slot's Cpus), at least 0."""
    try:
        value = slot.eval("SlotWeight") if "SlotWeight" in slot else None
    except Exception:
        value = None
    if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
        value = get_int(slot, "Cpus") or 1
    return max(0.0, float(value))


def matches(job: ClassAd, slot: ClassAd) -> bool:
    """Both sides willing, as the negotiator would say: the job's Requirements against the slot,
    and the slot's Requirements (START && WithinResourceLimits) against the job."""
    return attribute_true(job, "Requirements", slot) and attribute_true(slot, "Requirements", job)


def attribute_true(my: ClassAd, name: str, target: ClassAd) -> bool:
    """Attribute `name` of `my` is true against `target` (true when `my` has none; an error is
    false)."""
    if name not in my:
        return True
    try:
        value = my.lookup(name)
        if not isinstance(value, ExprTree):
            return value is True
        return value.eval(scope=my, target=target) is True
    except Exception:
        return False
