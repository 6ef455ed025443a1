"""The queue statement of a submit description, as condor_submit reads it: its variables, its
items (`in`, `from`, `matching`, or a caller's itemdata) and its count."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import classad2
import htcondor2

from jobstore.errors import SubmitError
from jobstore.submit.limits import MAX_PROCS
from jobstore.submit.values import (
    CONTROL,
    IDENT,
    INT,
)

QUEUE_LINE = re.compile(r"(?i)queue(?:\s|$)")
QUEUE_KEYWORD = re.compile(r"(?i)(?:^|(?<=[\s,]))(in|from|matching)(?=\s|\(|$)")


def without_queue(text: str) -> str:
    """The text up to its first queue statement (replaced by the caller's)."""
    lines = text.replace("\r\n", "\n").split("\n")
    cut = next((i for i, ln in enumerate(lines) if QUEUE_LINE.match(ln.strip())), len(lines))
    return "\n".join(lines[:cut]) + "\n"


def queue_vars(qargs: str) -> list[str]:
    """The variables a queue statement names (`x, y from ...`), or ["Item"]."""
    match = QUEUE_KEYWORD.search(qargs)
    head = qargs if match is None else qargs[: match.start(1)]
    names = [t for t in re.split(r"[\s,]+", head.strip()) if t and IDENT.fullmatch(t)]
    return names or ["Item"]


def given_items(source: str, itemdata: Iterable[Any], names: list[str]) -> list[dict[str, str]]:
    """htcondor2's itemdata: dicts (the first one's keys are the variables) or lines."""
    items: list[dict[str, str]] = []
    keys: list[str] | None = None
    for n, item in enumerate(itemdata):
        if isinstance(item, Mapping):
            keys = keys or [str(k) for k in item]
            row = {k: str(item.get(k, "")).strip() for k in keys}
        else:
            parts = re.split(r"[\s,]+", str(item).strip(), maxsplit=len(names) - 1)
            row = dict(zip(names, parts + [""] * (len(names) - len(parts)), strict=True))
        for key, value in row.items():
            if not IDENT.fullmatch(key):
                raise SubmitError(f"{source}: itemdata: {key!r} is not a variable name")
            if CONTROL.search(value):
                raise SubmitError(f"{source}: itemdata item {n}: control character in {key}")
        items.append(row)
        if len(items) > MAX_PROCS:
            raise SubmitError(f"{source}: itemdata: more than {MAX_PROCS} items")
    return items


def queue_items(source: str, submit: htcondor2.Submit) -> tuple[list[dict[str, str]], int]:
    """The queue statement's item rows (one empty row for plain ``queue N``) and count N."""
    qargs = (submit.getQArgs() or "").strip()
    match = QUEUE_KEYWORD.search(qargs)
    count = queue_count(source, submit, count_text(qargs))
    if match is None:
        return [{}], count
    if match.group(1).lower() == "from" and qargs.endswith("|"):
        raise SubmitError(f"{source}: queue: 'from' a command's output is not supported")
    try:
        rows = submit.itemdata()
        items = [] if rows is None else [dict(row) for row in rows]
    except Exception as exc:
        raise SubmitError(f"{source}: queue {qargs}: {exc}") from None
    return items, count


def count_text(qargs: str) -> str:
    """The count of a queue statement's arguments (`3`, `3 x in (...)`), "1" when it has
    none."""
    match = QUEUE_KEYWORD.search(qargs)
    head = qargs if match is None else qargs[: match.start(1)]
    tokens = [t for t in re.split(r"[\s,]+", head.strip()) if t]
    if match is None and head.strip():
        return head.strip()
    if tokens and not IDENT.fullmatch(tokens[0]):
        return tokens[0]
    return "1"


def queue_count(source: str, submit: htcondor2.Submit, text: str) -> int:
    """Expand and evaluate the count of a queue statement."""
    submit["JobstoreQueueCount"] = text
    try:
        expanded = submit.expand("JobstoreQueueCount").strip()
    except Exception as exc:
        raise SubmitError(f"{source}: queue: cannot expand count {text!r}: {exc}") from None
    if INT.fullmatch(expanded):
        return check_count(source, int(expanded), expanded)
    try:
        value = classad2.ExprTree(expanded).eval()
    except Exception:
        value = None
    if type(value) is int:  # not bool, not classad2.Value (an IntEnum)
        return check_count(source, value, expanded)
    raise SubmitError(f"{source}: queue: count {expanded!r} is not an integer")


def check_count(source: str, count: int, text: str) -> int:
    """Queue counts must be non-negative and bounded."""
    if count < 0:
        raise SubmitError(f"{source}: queue: count {text!r} is negative")
    if count > MAX_PROCS:
        raise SubmitError(f"{source}: queue: {count} procs is more than the limit of {MAX_PROCS}")
    return count
