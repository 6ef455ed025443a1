"""How a setting's text becomes its value, by the kind its row in `settingtable` names.

Each reader gets the row, the parameter the text came from (named in the error) and the text
(None when unset), and returns the value or raises ConfigError in one line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from jobstore.errors import ConfigError
from jobstore.node.settingtable import Setting

ATTRIBUTE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


def names(raw: str | None) -> tuple[str, ...]:
    """A list setting's names (separated by commas or white space)."""
    return tuple(n for n in re.split(r"[\s,]+", raw or "") if n)


def checked_int(param: str, raw: str | None, default: int, minimum: float | None) -> int:
    """`raw` (the value of `param`) as an integer >= minimum; default if unset."""
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{param} must be an integer, not {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{param} must be at least {minimum:g}")
    return value


def checked_bool(param: str, raw: str | None, default: bool) -> bool:
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"{param} must be true or false, not {raw!r}")


def int_text(raw: str | None) -> str | None:
    """An HTCondor integer parameter as htcondor2 may give it (`60.0`) as integer text; any
    other text as it is (for the integer reader to refuse)."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return raw
    return str(int(value)) if value.is_integer() else raw


def _text(setting: Setting, param: str, raw: str | None) -> Any:
    return raw if raw is not None else setting.default


def _names(setting: Setting, param: str, raw: str | None) -> Any:
    return names(raw) or setting.default


def _integer(setting: Setting, param: str, raw: str | None) -> Any:
    if not param.startswith("JOBSTORE_") and "_JOBSTORE_" not in param:
        raw = int_text(raw)  # HTCondor's own parameter
    default = setting.default
    assert isinstance(default, int | float)
    value: float = checked_int(param, raw, int(default), setting.minimum)
    if setting.maximum is not None:
        value = min(value, setting.maximum)
    return float(value) if isinstance(default, float) else value


def _boolean(setting: Setting, param: str, raw: str | None) -> Any:
    return checked_bool(param, raw, bool(setting.default))


def _seconds(setting: Setting, param: str, raw: str | None) -> Any:
    """A number of seconds (fractions allowed): more than 0 (with `zero`, 0 too), at most the
    row's maximum."""
    if raw is None:
        return setting.default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{param} must be a number of seconds, not {raw!r}") from None
    above_lowest = value >= 0 if setting.zero else value > 0
    if not (above_lowest and (setting.maximum is None or value <= setting.maximum)):
        lowest = "from 0" if setting.zero else "more than 0"
        if setting.maximum is None:
            raise ConfigError(f"{param} must be {lowest} seconds")
        highest = f"to {setting.maximum:g}" if setting.zero else f"and at most {setting.maximum:g}"
        raise ConfigError(f"{param} must be {lowest} {highest} seconds")
    return value


def _duration(setting: Setting, param: str, raw: str | None) -> Any:
    """A duration (`2592000`, `30d`; jobstore.core.durations) in seconds."""
    if raw is None:
        return setting.default
    from jobstore.core.durations import parse_duration

    try:
        return parse_duration(raw)
    except ValueError as exc:
        raise ConfigError(f"{param}: {exc}") from None


def _attribute_names(setting: Setting, param: str, raw: str | None) -> Any:
    for name in names(raw):
        if not ATTRIBUTE_NAME.fullmatch(name):
            raise ConfigError(f"{param}: {name!r} is not an attribute name")
    return names(raw)


def _command(setting: Setting, param: str, raw: str | None) -> Any:
    """A command line; `false` (or empty, no, none, 0): none."""
    if raw is None:
        return setting.default
    return None if raw.strip().lower() in ("", "false", "no", "none", "0") else raw.strip()


def _port(setting: Setting, param: str, raw: str | None) -> Any:
    port = checked_int(param, raw, 0, 0)  # 0: not served
    if port > 65535:
        raise ConfigError(f"{param} must be a TCP port (1-65535, or 0 for none)")
    return port


def _loopback(setting: Setting, param: str, raw: str | None) -> Any:
    """A loopback address only (the metrics name owners and queues; a scraper on another host
    goes through a proxy the admin chooses)."""
    import ipaddress

    address = raw or str(setting.default)
    try:
        loopback = address == "localhost" or ipaddress.ip_address(address).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(f"{param} must be a loopback address (127.0.0.1, ::1), not {address!r}")
    return address


def _vacate_time(setting: Setting, param: str, raw: str | None) -> Any:
    """The startd's MACHINE_MAX_VACATE_TIME (an expression such as `10 * 60`); the default when
    it is unset or not a constant number (the startd's setting, not ours to refuse)."""
    if raw is None:
        return setting.default
    import classad2

    try:
        value = classad2.ExprTree(raw).eval()
    except Exception:  # noqa: BLE001 - whatever the expression does
        return setting.default
    # not isinstance: classad2's Undefined and Error are ints, and so is a bool
    return float(value) if type(value) in (int, float) and value >= 0 else setting.default


READERS: dict[str, Callable[[Setting, str, str | None], Any]] = {
    "text": _text,
    "path": _text,
    "names": _names,
    "integer": _integer,
    "boolean": _boolean,
    "seconds": _seconds,
    "duration": _duration,
    "attribute names": _attribute_names,
    "command": _command,
    "port": _port,
    "loopback address": _loopback,
    "vacate time": _vacate_time,
}
