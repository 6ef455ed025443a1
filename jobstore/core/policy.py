"""A job's own policy, with HTCondor's semantics (condor_utils/user_job_policy.cpp): the retry
policy at exit (max_retries, success_exit_code, retry_until), the periodic expressions
(periodic_hold, periodic_release, periodic_remove, allowed_job_duration,
allowed_execute_duration) and the exit expressions (on_exit_hold, on_exit_remove).

Every function takes the job ad as the policy sees it (jobstore.formats.jobads.policy_ad): the
submitted attributes, the job's status attributes and the starter's latest values."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from classad2 import ClassAd, ExprTree, Value

from jobstore.core import holds

# The submit commands of a job's policy and the attributes they set (HTCondor's names).
POLICY_COMMANDS = {
    "periodic_hold": "PeriodicHold",
    "periodic_hold_reason": "PeriodicHoldReason",
    "periodic_hold_subcode": "PeriodicHoldSubCode",
    "periodic_release": "PeriodicRelease",
    "periodic_remove": "PeriodicRemove",
    "on_exit_hold": "OnExitHold",
    "on_exit_hold_reason": "OnExitHoldReason",
    "on_exit_hold_subcode": "OnExitHoldSubCode",
    "on_exit_remove": "OnExitRemove",
    "allowed_execute_duration": "AllowedExecuteDuration",
    "allowed_job_duration": "AllowedJobDuration",
}
# A job with any of these is looked at by the periodic pass.
PERIODIC_ATTRS = frozenset(
    n.lower()
    for n in ("PeriodicHold", "PeriodicRelease", "PeriodicRemove", "AllowedExecuteDuration",
              "AllowedJobDuration")
)

# HTCondor's JobStatus numbers.
IDLE, RUNNING, REMOVED, COMPLETED, HELD = 1, 2, 3, 4, 5

HOLD, RELEASE, REMOVE, REQUEUE = "hold", "release", "remove", "requeue"


@dataclass(frozen=True)
class Action:
    """What a policy expression asks for: hold (with HoldReasonCode and subcode), release,
    remove, or (on_exit_remove false) run the job again; and why."""

    kind: str
    reason: str
    code: int = holds.UNSPECIFIED
    subcode: int = 0


def has_periodic(ad: Mapping[str, Any]) -> bool:
    """Does a submitted ad (name -> value) carry a periodic expression?"""
    return any(name.lower() in PERIODIC_ATTRS for name in ad)


def periodic_action(ad: ClassAd, now: float) -> Action | None:
    """The first of the job's periodic expressions that fires, in HTCondor's order: allowed job
    and execute durations (running jobs), periodic_hold (not held), periodic_release (held, not
    by the user), periodic_remove. Undefined never fires."""
    status = _number(ad, "JobStatus")
    if status in (REMOVED, COMPLETED):
        return None
    if status == RUNNING:
        birthday = _number(ad, "ShadowBday")
        allowed = _number(ad, "AllowedJobDuration")
        if allowed is not None and birthday is not None and now - birthday >= allowed:
            return Action(HOLD, f"The job exceeded allowed job duration of {_hms(allowed)}",
                          holds.JOB_DURATION_EXCEEDED)
        began = _number(ad, "JobCurrentStartExecutingDate")
        allowed = _number(ad, "AllowedExecuteDuration")
        if (allowed is not None and began is not None and birthday is not None
                and began >= birthday and now - began > allowed):
            return Action(HOLD, f"The job exceeded allowed execute duration of {_hms(allowed)}",
                          holds.JOB_EXECUTE_EXCEEDED)
    if status != HELD and _fires(ad, "PeriodicHold"):
        return _hold(ad, "PeriodicHold")
    user_hold = _number(ad, "HoldReasonCode") == holds.USER_REQUEST
    if status == HELD and not user_hold and _fires(ad, "PeriodicRelease"):
        return Action(RELEASE, _default_reason(ad, "PeriodicRelease"))
    if _fires(ad, "PeriodicRemove"):
        return Action(REMOVE, _default_reason(ad, "PeriodicRemove"))
    return None


def exit_action(ad: ClassAd) -> Action | None:
    """At the job's exit (ExitCode, ExitBySignal, ExitSignal in `ad`): on_exit_hold first, then
    on_exit_remove evaluating to false (run again); None: the job leaves the queue."""
    if _fires(ad, "OnExitHold"):
        return _hold(ad, "OnExitHold")
    if "OnExitRemove" in ad:
        value = _value(ad, "OnExitRemove")
        if _is_number(value) and value == 0:
            return Action(REQUEUE, _default_reason(ad, "OnExitRemove", "FALSE"))
    return None


class HasExitTerms(Protocol):
    """What an exit's verdict reads of its job (a Job, or ExitTerms)."""

    @property
    def success_exit_code(self) -> int: ...

    @property
    def max_retries(self) -> int | None: ...

    @property
    def retry_until(self) -> str | None: ...


@dataclass(frozen=True)
class ExitTerms:
    """A job's exit terms alone (sent to node.evalworker)."""

    success_exit_code: int
    max_retries: int | None
    retry_until: str | None


@dataclass(frozen=True)
class ExitVerdict:
    """How a job's exit ends: did it succeed, does its policy want another run, or a hold."""

    succeeded: bool
    retry: bool
    hold: Action | None = None


def exit_evaluates(attrs: Iterable[str], retry_until: str | None) -> bool:
    """Does an exit's verdict evaluate an expression of the job's own: on_exit_hold or
    on_exit_remove among its attributes `attrs`, or a retry_until that is not an exit code?
    Without one, `exit_verdict` without the ad gives the same verdict and evaluates nothing."""
    if retry_until and not _EXIT_CODE.fullmatch(retry_until.strip()):
        return True
    return any(name.lower() in _EXIT_EXPRESSIONS for name in attrs)


_EXIT_EXPRESSIONS = frozenset({"onexithold", "onexitremove"})
_EXIT_CODE = re.compile(r"-?[0-9]+")  # a retry_until that is an exit code, not an expression


def exit_verdict(job: HasExitTerms, exit_attrs: Mapping[str, Any], ad: ClassAd | None = None
                 ) -> ExitVerdict:
    """The verdict for a JOB_EXIT `exit`: on_exit_hold and on_exit_remove (when `ad`, the policy
    ad with the exit attributes, is given), else max_retries, success_exit_code, retry_until.

    `exit_attrs` holds the JOB_EXIT ad's ExitCode, ExitBySignal and ExitSignal values.
    """
    by_signal = exit_attrs.get("ExitBySignal") is True
    code = exit_attrs.get("ExitCode")
    code = code if isinstance(code, int) and not isinstance(code, bool) else None
    succeeded = not by_signal and code == job.success_exit_code
    if ad is not None:
        action = exit_action(ad)
        if action is not None and action.kind == HOLD:
            return ExitVerdict(succeeded, False, action)
        if action is not None and action.kind == REQUEUE:
            return ExitVerdict(False, True)
        if "OnExitRemove" in ad:  # it said remove (or is undefined): the job leaves the queue
            return ExitVerdict(succeeded, False)
    if succeeded or job.max_retries is None:
        return ExitVerdict(succeeded, False)
    return ExitVerdict(succeeded, not _retry_until_met(job.retry_until, exit_attrs, code,
                                                       by_signal))


def _retry_until_met(
    retry_until: str | None, exit_attrs: Mapping[str, Any], code: int | None, by_signal: bool
) -> bool:
    """HTCondor's retry_until: an exit code, or an expression over the exit attributes."""
    if not retry_until:
        return False
    text = retry_until.strip()
    if _EXIT_CODE.fullmatch(text):
        return not by_signal and code == int(text)
    ad = ClassAd()
    for name in ("ExitCode", "ExitBySignal", "ExitSignal"):
        if exit_attrs.get(name) is not None:
            ad[name] = exit_attrs[name]
    try:
        return ExprTree(text).eval(scope=ad) is True
    except Exception:
        return False


# ---- evaluation ------------------------------------------------------------------------------


def _value(ad: ClassAd, name: str) -> Any:
    try:
        return ad.eval(name)
    except Exception:
        return None


def _is_number(value: Any) -> bool:
    """A number or a boolean; never classad2's Undefined or Error (int subclasses too)."""
    return isinstance(value, int | float) and not isinstance(value, Value) and value == value


def _number(ad: ClassAd, name: str) -> float | None:
    if name not in ad:
        return None
    value = _value(ad, name)
    return float(value) if _is_number(value) else None


def _fires(ad: ClassAd, name: str) -> bool:
    """HTCondor's test: the expression evaluates to a number (a boolean is one) that is not 0."""
    if name not in ad:
        return False
    value = _value(ad, name)
    return _is_number(value) and value != 0


def _hold(ad: ClassAd, name: str) -> Action:
    """A policy hold: HoldReasonCode 3, the expression's Reason and SubCode when they evaluate
    to a string and a number."""
    reason = _value(ad, f"{name}Reason") if f"{name}Reason" in ad else None
    subcode = _number(ad, f"{name}SubCode")
    if not isinstance(reason, str) or not reason:
        reason = _default_reason(ad, name)
    return Action(HOLD, reason, holds.JOB_POLICY, int(subcode or 0))


def _default_reason(ad: ClassAd, name: str, value: str = "TRUE") -> str:
    expr = ad.lookup(name)
    return f"The job attribute {name} expression '{expr}' evaluated to {value}"


def _hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
