"""Values both input formats share: numbers, sizes, expressions, strings, file text, checks."""

from __future__ import annotations

import math
import os
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path

import classad2

from jobstore.core.jobs import JobSpec
from jobstore.errors import FieldError, InvalidInput, SubmitError

RESERVED_PREFIX = "jobstore"
RESERVED_ATTRS = frozenset({"hookkeyword", "jobleaseduration"})
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
INT = re.compile(r"[+-]?\d+")
# A submit file's booleans, as condor_submit reads them.
TRUE_WORDS = frozenset({"true", "yes", "t", "y", "1"})
FALSE_WORDS = frozenset({"false", "no", "f", "n", "0"})
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)")
_UNITS = {
    "": None,
    "k": 1 << 10,
    "kb": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
}


def parse_int(value: str, minimum: int | None = None) -> int:
    """An integer literal, optionally with a lower bound."""
    if not INT.fullmatch(value.strip()):
        raise InvalidInput(f"{value!r} is not an integer")
    number = int(value)
    if minimum is not None and number < minimum:
        raise InvalidInput(f"must be at least {minimum}, not {number}")
    return number


def parse_size(value: str, base_bytes: int) -> int:
    """``<number>[unit]`` -> multiples of ``base_bytes`` (rounded up); no unit = base unit."""
    match = _SIZE.fullmatch(value.strip())
    if not match:
        raise InvalidInput(f"{value!r} is not a non-negative size like 512, 2G or 1.5GB")
    unit = match.group(2).lower()
    if unit not in _UNITS:
        raise InvalidInput(
            f"unknown unit {match.group(2)!r} in {value!r} (use K, KB, M, MB, G, GB, T or TB)"
        )
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as exc:  # pragma: no cover - the regex already checked it
        raise InvalidInput(f"{value!r} is not a number") from exc
    unit_bytes = _UNITS[unit]
    size = number if unit_bytes is None else number * unit_bytes / base_bytes
    return math.ceil(size)


def old_expr_to_new(text: str) -> str:
    """Old ClassAd syntax -> new syntax: backslashes inside strings are literal in the old one.

    In the old syntax ``\\"`` escapes a quote, except at the very end of the text, where it is
    a literal backslash followed by the closing quote.
    """
    out: list[str] = []
    i, n = 0, len(text)
    in_string = False
    while i < n:
        c = text[i]
        if not in_string:
            in_string = c == '"'
            out.append(c)
        elif c == "\\":
            if text.startswith('\\"', i) and text[i + 2 :].strip():
                out.append('\\"')
                i += 2
                continue
            out.append("\\\\")
        else:
            in_string = c != '"'
            out.append(c)
        i += 1
    return "".join(out)


def _parse_expr(text: str) -> classad2.ExprTree:
    """Parse new-syntax expression text or raise ValueError."""
    try:
        return classad2.ExprTree(text)
    except Exception as exc:
        raise InvalidInput(f"{text!r} is not a valid ClassAd expression") from exc


def old_expr(text: str) -> str:
    """Validate old-syntax expression text; return it in the new syntax."""
    new = old_expr_to_new(text.strip())
    _parse_expr(new)
    return new


def parse_retry_until(value: str) -> str:
    """``retry_until``: an exit code or an expression."""
    if INT.fullmatch(value.strip()):
        return f"ExitCode == {int(value)}"
    return old_expr(value)


def check_value(what: str, value: str, *, is_string: bool = True) -> str:
    """Refuse values an old-syntax job ad cannot carry."""
    if CONTROL.search(value):
        raise FieldError(
            what,
            "contains a newline or other control character, which HTCondor's old ClassAd "
            "syntax cannot carry in a job ad",
        )
    if is_string and value.endswith("\\"):
        raise FieldError(
            what, "ends in a backslash, which cannot be written as an old ClassAd string"
        )
    return value


SUBMIT_NAMES = {
    "cmd": "executable",
    "args": "arguments",
    "env": "environment",
    "iwd": "initialdir",
    "input": "input",
    "output": "output",
    "error": "error",
    "user_log": "log",
    "requirements": "requirements",
    "retry_until": "retry_until",
}
AD_NAMES = {
    "cmd": "Cmd",
    "args": "Arguments",
    "env": "Environment",
    "iwd": "Iwd",
    "input": "In",
    "output": "Out",
    "error": "Err",
    "user_log": "UserLog",
    "requirements": "Requirements",
    "retry_until": "RetryUntil",
}
_EXPR_FIELDS = ("requirements", "retry_until")


def check_spec(spec: JobSpec, names: dict[str, str]) -> None:
    """Apply :func:`check_value` to every text field of a finished spec.

    ``names`` maps field names to the command or attribute names used in messages.
    """
    for attr, what in names.items():
        value = getattr(spec, attr)
        if value is not None:
            check_value(what, value, is_string=attr not in _EXPR_FIELDS)
    for name, value in spec.custom.items():
        check_value(name, value, is_string=False)


def check_custom_name(name: str) -> None:
    """Custom attribute names must be identifiers and not the job store's own."""
    if not IDENT.fullmatch(name):
        raise InvalidInput(f"attribute name {name!r} is not a valid identifier")
    lower = name.lower()
    if lower.startswith(RESERVED_PREFIX) or lower in RESERVED_ATTRS:
        raise InvalidInput(f"attribute {name} is reserved for the job store")


def abspath(base: str, path: str) -> str:
    """``path`` made absolute against ``base`` and normalised."""
    return os.path.normpath(os.path.join(base, path))


# --------------------------------------------------------------------------------------------
# Reading files
# --------------------------------------------------------------------------------------------


def read_text(path: Path) -> str:
    """Read a UTF-8 text file or raise SubmitError."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SubmitError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SubmitError(f"{path}: is a directory, not a file") from None
    except OSError as exc:
        raise SubmitError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SubmitError(f"{path}: not UTF-8 text (bad byte at offset {exc.start})") from None
    return text.replace("\r\n", "\n")


def check_text_controls(source: str, text: str) -> None:
    """Refuse control characters (other than tab and newline) anywhere in a file."""
    for number, line in enumerate(text.split("\n"), 1):
        if re.search(r"[\x00-\x08\x0b-\x1f\x7f]", line):
            raise SubmitError(
                f"{source}: line {number} contains a control character, which HTCondor's old "
                "ClassAd syntax cannot carry in a job ad"
            )
