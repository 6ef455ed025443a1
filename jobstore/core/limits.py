"""Concurrency limits as HTCondor spells them: `concurrency_limits = NAME[:n], ...` in a submit
file; `<NAME>_LIMIT`, `CONCURRENCY_LIMIT_DEFAULT_<SET>` (for `SET.member`) and
`CONCURRENCY_LIMIT_DEFAULT` in the configuration. Names are case-insensitive."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping

from jobstore.errors import InvalidInput

UNLIMITED = math.inf
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*\Z")


def parse(text: str | None) -> dict[str, float]:
    """`"XSW, fileserver:3"` -> {"xsw": 1.0, "fileserver": 3.0}; ValueError on bad syntax."""
    limits: dict[str, float] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, amount = item.partition(":")
        name = name.strip()
        if not _NAME.match(name) or name.endswith("."):
            raise InvalidInput(f"bad concurrency limit name {name!r}")
        try:
            units = float(amount) if sep else 1.0
        except ValueError:
            raise InvalidInput(f"bad amount in concurrency limit {item!r}") from None
        if not math.isfinite(units) or units <= 0:
            raise InvalidInput(f"concurrency limit {item!r}: the amount must be positive")
        limits[name.lower()] = limits.get(name.lower(), 0.0) + units
    return limits


def render(limits: Mapping[str, float]) -> str | None:
    """The canonical text (sorted, `:n` only when not 1) of parsed limits; None when empty."""
    if not limits:
        return None
    return ",".join(
        name if units == 1 else f"{name}:{units:g}" for name, units in sorted(limits.items())
    )


def maximum(name: str, param: Callable[[str], str | None]) -> float:
    """The configured maximum of limit `name`: <NAME>_LIMIT, else CONCURRENCY_LIMIT_DEFAULT_<SET>
    when the name is SET.member, else CONCURRENCY_LIMIT_DEFAULT, else unlimited. `param` reads
    one configuration value; one that is not a number raises ValueError."""
    upper = name.upper()
    names = [f"{upper}_LIMIT"]
    if "." in upper:
        names.append(f"CONCURRENCY_LIMIT_DEFAULT_{upper.split('.', 1)[0]}")
    names.append("CONCURRENCY_LIMIT_DEFAULT")
    for param_name in names:
        raw = param(param_name)
        if raw is None:
            continue
        try:
            value = float(raw)
        except ValueError:
            raise InvalidInput(f"{param_name} must be a number, not {raw!r}") from None
        return max(0.0, value)
    return UNLIMITED


def over(
    needed: Mapping[str, float], in_use: Mapping[str, float], limit: Callable[[str], float]
) -> str | None:
    """The first limit (by name) that one more job needing `needed` would exceed, else None."""
    for name in sorted(needed):
        if in_use.get(name, 0.0) + needed[name] > limit(name) + 1e-9:
            return name
    return None
