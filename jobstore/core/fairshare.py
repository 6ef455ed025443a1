"""Fair share between submitters, as HTCondor's accountant and condor_userprio define it.

A submitter's real priority is a decayed average of the resources it holds (weighted slots,
SLOT_WEIGHT), with half-life PRIORITY_HALFLIFE and a floor of 0.5; its effective priority is
that times its priority factor. Smaller is better. Each submitter's fair share of the slots is
proportional to 1 / effective priority (the negotiator's pie), and a fetching slot goes to the
submitter that stays furthest below its share when it takes one more slot.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from jobstore.errors import InvalidInput

MIN_PRIORITY = 0.5  # HTCondor's lowest real priority
DEFAULT_HALFLIFE = 86400.0  # PRIORITY_HALFLIFE: one day
DEFAULT_FACTOR = 1.0


@dataclass(frozen=True, slots=True)
class Usage:
    """One submitter's accounting row (`submitters`), with the resources it holds now."""

    name: str
    factor: float
    priority: float  # real priority as of `updated_at`
    usage: float  # accumulated weighted slot-seconds as of `updated_at`
    updated_at: float
    in_use: float  # weighted slots held now (fetched, accepted or running jobs)
    last_usage: float | None = None  # last time it held a slot


_GROUP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,99}\Z")


def check_group_name(what: str, value: str) -> str:
    """An accounting group or group user name (letters, digits, `_.@-`); ValueError if not."""
    if not _GROUP_NAME.match(value):
        raise InvalidInput(f"{what} {value!r} is not a valid name (letters, digits, _ . @ -)")
    return value


def submitter_name(owner: str, accounting_group: str | None, group_user: str | None) -> str:
    """HTCondor's submitter (AccountingGroup): `group.user` with an accounting group (the user is
    accounting_group_user, else the owner), else the owner."""
    if accounting_group:
        check_group_name("accounting_group", accounting_group)
        if group_user:
            check_group_name("accounting_group_user", group_user)
        return f"{accounting_group}.{group_user or owner}"
    return owner


def decayed(priority: float, in_use: float, elapsed: float, halflife: float) -> float:
    """Real priority after `elapsed` seconds holding `in_use` weighted slots."""
    if elapsed <= 0:
        return max(MIN_PRIORITY, priority)
    beta = 0.5 ** (elapsed / halflife) if halflife > 0 else 0.0
    return max(MIN_PRIORITY, priority * beta + in_use * (1.0 - beta))


def real_priority(u: Usage) -> float:
    """The real priority as the accountant last wrote it (as the negotiator uses it between two
    of its updates: what a submitter took since then counts in its `in_use`)."""
    return max(MIN_PRIORITY, u.priority)


def effective_priority(u: Usage) -> float:
    return real_priority(u) * u.factor


def accrued(u: Usage, now: float, halflife: float) -> Usage:
    """The row after an accountant's update at `now`: priority decayed towards what it holds,
    usage accumulated over the interval, last usage stamped while it holds slots."""
    elapsed = max(0.0, now - u.updated_at)
    return Usage(
        name=u.name,
        factor=u.factor,
        priority=decayed(u.priority, u.in_use, elapsed, halflife),
        usage=u.usage + u.in_use * elapsed,
        updated_at=now,
        in_use=u.in_use,
        last_usage=now if u.in_use > 0 else u.last_usage,
    )


def fair_order(usages: Iterable[Usage]) -> list[str]:
    """Submitters in the order a fetching slot should serve them: by the share each would hold
    with one more slot ((in use + 1) x effective priority), then by effective priority."""

    def key(u: Usage) -> tuple[float, float, str]:
        effective = effective_priority(u)
        return ((u.in_use + 1.0) * effective, effective, u.name)

    return [u.name for u in sorted(usages, key=key)]
