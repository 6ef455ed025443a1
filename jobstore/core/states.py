"""The job state machine: states, events and the transitions between them. Pure code, no I/O.

The table `TRANSITIONS` is the one place that says what may happen; docs/states.md shows it as a
table.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Status(StrEnum):
    WAITING = "waiting"  # a DAG node's job whose parents are not done: never claimable
    IDLE = "idle"
    FETCHED = "fetched"
    ACCEPTED = "accepted"
    RUNNING = "running"
    COMPLETED = "completed"
    HELD = "held"
    REMOVED = "removed"
    FAILED = "failed"


class Event(StrEnum):
    SUBMIT = "submit"
    FETCH = "fetch"  # FETCH_WORK handed the job to a slot
    ACCEPT = "accept"  # REPLY_FETCH accept
    REJECT = "reject"  # REPLY_FETCH reject
    CLAIM_EVICTED = "claim_evicted"  # EVICT_CLAIM (never sent by current HTCondor)
    PREPARE = "prepare"  # PREPARE_JOB
    UPDATE = "update"  # UPDATE_JOB_INFO before the job has a pid
    START = "start"  # UPDATE_JOB_INFO with JobPid: the job runs
    EXIT = "exit"  # JOB_EXIT exit
    EVICT = "evict"  # JOB_EXIT evict
    HOOK_HOLD = "hook_hold"  # JOB_EXIT hold
    HOOK_REMOVE = "hook_remove"  # JOB_EXIT remove
    LEASE_EXPIRED = "lease_expired"
    HOLD = "hold"  # jobstore hold
    RELEASE = "release"  # jobstore release
    REMOVE = "remove"  # jobstore rm
    NODE_READY = "node_ready"  # its DAG node's parents are done: queued
    NODE_FUTILE = "node_futile"  # its DAG node will never run (a parent failed, DAG ended)
    POST_SCRIPT = "post_script"  # its DAG node's POST script ended: a record, no transition
    VACATE = "vacate"  # condor_vacate_job: its slot asked to vacate it (a record, no transition)
    VACATE_FAST = "vacate_fast"  # condor_vacate_job -fast


# The Status of a status text (or of a Status): a dict lookup, where Status(text) is Enum's
# call (several Python calls, on every transition).
STATUS_OF: dict[str, Status] = {s.value: s for s in Status}
FINAL = frozenset({Status.COMPLETED, Status.REMOVED, Status.FAILED})
FINAL_VALUES = frozenset(s.value for s in FINAL)  # the same as the texts the rows hold
HANDED_OUT = frozenset({Status.FETCHED, Status.ACCEPTED, Status.RUNNING})
# Each status's phase: the status at the grain the job table's indexes need (the database keeps
# it in a column computed from the status, `jobs.phase`), so that a transition within a phase
# (accept, start) changes no indexed column and PostgreSQL updates the row in place.
PHASES: dict[Status, str] = {
    Status.WAITING: "waiting",
    Status.IDLE: "idle",
    Status.FETCHED: "out",
    Status.ACCEPTED: "out",
    Status.RUNNING: "out",
    Status.HELD: "held",
    Status.COMPLETED: "done",
    Status.REMOVED: "done",
    Status.FAILED: "done",
}

# Sentinel targets resolved by `decide`: the job goes back to idle or, out of attempts, fails;
# or it ends as the job's retry policy says.
REQUEUE = "requeue"
EXIT_POLICY = "exit-policy"

_S = Status
TRANSITIONS: dict[Event, dict[Status, Status | str]] = {
    Event.FETCH: {_S.IDLE: _S.FETCHED},
    Event.ACCEPT: {_S.FETCHED: _S.ACCEPTED},
    Event.REJECT: {_S.FETCHED: _S.IDLE, _S.ACCEPTED: _S.IDLE},
    Event.CLAIM_EVICTED: {_S.FETCHED: _S.IDLE, _S.ACCEPTED: _S.IDLE},
    Event.PREPARE: {_S.FETCHED: _S.ACCEPTED, _S.ACCEPTED: _S.ACCEPTED},
    Event.UPDATE: {_S.FETCHED: _S.ACCEPTED, _S.ACCEPTED: _S.ACCEPTED, _S.RUNNING: _S.RUNNING},
    Event.START: {_S.FETCHED: _S.RUNNING, _S.ACCEPTED: _S.RUNNING, _S.RUNNING: _S.RUNNING},
    Event.EXIT: {s: EXIT_POLICY for s in HANDED_OUT},
    Event.EVICT: {s: REQUEUE for s in HANDED_OUT},
    Event.HOOK_HOLD: {s: _S.HELD for s in HANDED_OUT},
    Event.HOOK_REMOVE: {s: _S.REMOVED for s in HANDED_OUT},
    Event.LEASE_EXPIRED: {s: REQUEUE for s in HANDED_OUT},
    Event.HOLD: {s: _S.HELD for s in (_S.IDLE, *HANDED_OUT)},
    Event.RELEASE: {_S.HELD: _S.IDLE},
    Event.REMOVE: {s: _S.REMOVED for s in (_S.WAITING, _S.IDLE, _S.HELD, *HANDED_OUT)},
    Event.NODE_READY: {_S.WAITING: _S.IDLE},
    Event.NODE_FUTILE: {_S.WAITING: _S.REMOVED},
}

# Reports from the hooks of one attempt; the others are admin or store events.
# Events of the startd's hooks (REPLY_FETCH, EVICT_CLAIM), which run as the condor account.
STARTD_EVENTS = frozenset({Event.ACCEPT, Event.REJECT, Event.CLAIM_EVICTED})
# Events of the starter's hooks (PREPARE_JOB, UPDATE_JOB_INFO, JOB_EXIT), run as the job's user.
STARTER_EVENTS = frozenset(
    {
        Event.PREPARE,
        Event.UPDATE,
        Event.START,
        Event.EXIT,
        Event.EVICT,
        Event.HOOK_HOLD,
        Event.HOOK_REMOVE,
    }
)
HOOK_REPORTS = STARTD_EVENTS | STARTER_EVENTS
# States in which the job is no longer handed out, so its attempt token is void.
_ENDS_ATTEMPT = frozenset({_S.WAITING, _S.IDLE, _S.HELD, _S.COMPLETED, _S.REMOVED, _S.FAILED})


@dataclass(frozen=True)
class Decision:
    """What to do with an event: `to_status` None means record it, change nothing."""

    to_status: Status | None
    counts_attempt: bool = False
    ends_attempt: bool = False
    reason: str | None = None


def decide(
    event: Event,
    status: Status,
    *,
    attempts: int,
    max_attempts: int,
    exit_succeeded: bool = True,
    retry_wanted: bool = False,
) -> Decision:
    """Where `event` takes a job in `status`.

    `attempts` is the number of attempts used before this event. For EXIT, `exit_succeeded` and
    `retry_wanted` come from the job's retry policy (max_retries, success_exit_code, retry_until).
    """
    target = TRANSITIONS.get(event, {}).get(status)
    if target is None:
        return Decision(None, reason=f"{event} ignored in state {status}")
    counts = False
    reason = None
    if target == EXIT_POLICY:
        if exit_succeeded or not retry_wanted:
            target = _S.COMPLETED
        else:
            target, counts, reason = _requeue(attempts, max_attempts, "exit code asks for a retry")
    elif target == REQUEUE:
        target, counts, reason = _requeue(attempts, max_attempts, str(event))
    new = STATUS_OF[target]
    return Decision(new, counts_attempt=counts, ends_attempt=new in _ENDS_ATTEMPT, reason=reason)


def _requeue(attempts: int, max_attempts: int, why: str) -> tuple[Status, bool, str]:
    used = attempts + 1
    if used >= max_attempts:
        return _S.FAILED, True, f"{why}; all {max_attempts} attempts used"
    return _S.IDLE, True, f"{why}; attempt {used} of {max_attempts} used, back to idle"


def is_final(status: Status | str) -> bool:
    return Status(status) in FINAL


__all__ = [
    "Status",
    "Event",
    "Decision",
    "decide",
    "TRANSITIONS",
    "HOOK_REPORTS",
    "STARTD_EVENTS",
    "STARTER_EVENTS",
    "FINAL",
    "FINAL_VALUES",
    "HANDED_OUT",
    "PHASES",
    "STATUS_OF",
    "is_final",
]
