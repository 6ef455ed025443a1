"""The job's retry policy at exit: HTCondor's max_retries, success_exit_code and retry_until."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from classad2 import ClassAd, ExprTree

from jobstore.core.jobs import Job


def exit_verdict(job: Job, exit_attrs: Mapping[str, Any]) -> tuple[bool, bool]:
    """(did the job succeed, does its policy want another run) for a JOB_EXIT `exit`.

    `exit_attrs` holds the JOB_EXIT ad's ExitCode, ExitBySignal and ExitSignal values.
    """
    by_signal = exit_attrs.get("ExitBySignal") is True
    code = exit_attrs.get("ExitCode")
    code = code if isinstance(code, int) and not isinstance(code, bool) else None
    succeeded = not by_signal and code == job.success_exit_code
    if succeeded or job.max_retries is None:
        return succeeded, False
    return succeeded, not _retry_until_met(job.retry_until, exit_attrs, code, by_signal)


def _retry_until_met(
    retry_until: str | None, exit_attrs: Mapping[str, Any], code: int | None, by_signal: bool
) -> bool:
    """HTCondor's retry_until: an exit code, or an expression over the exit attributes."""
    if not retry_until:
        return False
    text = retry_until.strip()
    if text.lstrip("-").isdigit():
        return not by_signal and code == int(text)
    ad = ClassAd()
    for name in ("ExitCode", "ExitBySignal", "ExitSignal"):
        if exit_attrs.get(name) is not None:
            ad[name] = exit_attrs[name]
    try:
        return ExprTree(text).eval(scope=ad) is True
    except Exception:
        return False
