"""Does a job fit a slot? The slot's offer for the SQL prefilter, and ClassAd matchmaking."""

from __future__ import annotations

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


def matches(job: ClassAd, slot: ClassAd) -> bool:
    """Both sides willing, as the negotiator would say: the job's Requirements against the slot,
    and the slot's Requirements (START && WithinResourceLimits) against the job."""
    return _requirements_true(job, slot) and _requirements_true(slot, job)


def _requirements_true(my: ClassAd, target: ClassAd) -> bool:
    if "Requirements" not in my:
        return True
    try:
        value = my.lookup("Requirements")
        if not isinstance(value, ExprTree):
            return value is True
        return value.eval(scope=my, target=target) is True
    except Exception:
        return False
