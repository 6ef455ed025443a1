"""Either format: a file read as a ClassAd file if it looks like one, else as a submit file."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from jobstore.core.jobs import JobSpec
from jobstore.submit.classadfile import (
    first_content,
    parse_classad_file,
    parse_old_line,
    strip_comment_lines,
)
from jobstore.submit.description import parse_submit_file
from jobstore.submit.queuestatement import QUEUE_LINE
from jobstore.submit.values import read_text


def load_jobs(path: str | Path) -> Sequence[JobSpec]:
    """Read ``path`` as a plain ClassAd file if it looks like one, else as a submit file (its
    jobs made one at a time as they are read: expansion.SubmitSpecs)."""
    path = Path(path)
    text = read_text(path)
    if _looks_like_classad(text):
        return parse_classad_file(path)
    return parse_submit_file(path)


def _looks_like_classad(text: str) -> bool:
    """New syntax, or only ``Name = <ClassAd expression>`` lines including a Cmd.

    A file with a ``Cmd = ...`` line and no queue statement is read as a (broken) ClassAd file
    too, so that its error message points at the bad line instead of the missing queue.
    """
    if first_content(text).startswith("["):
        return True
    lines = [raw.strip() for _, raw in strip_comment_lines(text)]
    if any(re.match(r"(?i)cmd\s*=", line) for line in lines) and not any(
        QUEUE_LINE.match(line) for line in lines
    ):
        return True
    names = []
    for _, raw in strip_comment_lines(text):
        if not raw.strip():
            continue
        parsed = parse_old_line(raw)
        if parsed is None:
            return False
        names.append(parsed[0].lower())
    return "cmd" in names
