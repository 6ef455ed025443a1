"""Durations as admins write them: seconds, or a number with a unit (`90s`, `15m`, `12h`,
`30d`). Pure code."""

from __future__ import annotations

import re

from jobstore.errors import InvalidInput

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.I)


def parse_duration(text: str) -> float:
    """Seconds in `text` (`2592000`, `30d`); ValueError with a one-line reason otherwise."""
    found = _DURATION.match(text)
    if not found:
        raise InvalidInput(f"{text!r} is not a duration (seconds, or a number with s, m, h, d or w:"
                           " 30d)")
    return float(found.group(1)) * UNITS[(found.group(2) or "s").lower()]


def describe(seconds: float) -> str:
    """`2592000` -> `30d`: the largest unit that divides it, for messages."""
    for unit in ("w", "d", "h", "m"):
        if seconds >= UNITS[unit] and seconds % UNITS[unit] == 0:
            return f"{int(seconds // UNITS[unit])}{unit}"
    return f"{seconds:g}s"
