"""JSON columns as the job store writes and reads them, on every database."""

from __future__ import annotations

import json
from typing import Any


def json_text(value: Any) -> str:
    """A JSON column's text as the job store writes it: without the spaces after `,` and `:`
    (a job's ad and every event's attrs are in the WAL and on disk once per row)."""
    return json.dumps(value, separators=(",", ":"))


# What a reader gets for a JSON value nested deeper than Python's decoder goes: an object whose
# one name is no attribute name, so that a job's ad that holds it cannot be read (its job held;
# formats.jobads.stored_attrs) and nothing else fails on it
TOO_DEEP = {"!": "nested too deeply to read"}


def json_value(text: str | bytes) -> Any:
    """A JSON column's value as the store reads it: never a RecursionError."""
    try:
        return json.loads(text)
    except RecursionError:
        return dict(TOO_DEEP)
