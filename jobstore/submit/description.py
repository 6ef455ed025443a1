"""Submit descriptions (the condor_submit language), read with htcondor2.Submit: macros,
``+Attr``, queue statements."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import htcondor2

from jobstore.core.jobs import (
    JobSpec,
)
from jobstore.errors import SubmitError
from jobstore.submit.expansion import SubmitExpander, SubmitSpecs
from jobstore.submit.queuestatement import (
    QUEUE_KEYWORD,
    QUEUE_LINE,
    check_count,
    count_text,
    given_items,
    queue_count,
    queue_items,
    queue_vars,
    without_queue,
)
from jobstore.submit.values import (
    CONTROL,
    IDENT,
    check_text_controls,
    read_text,
)

# Lines whose meaning depends on the macros set when the text is parsed.
_PARSE_TIME = re.compile(r"(?im)^\s*(?:if|elif|include)\b")


def parse_submit_file(
    path: str | Path, *, extra_vars: dict[str, str] | None = None
) -> Sequence[JobSpec]:
    """Read a submit description file; ``extra_vars`` are macros set after the file's own."""
    path = Path(path)
    text = read_text(path)
    base_dir = Path(os.path.abspath(path)).parent
    return parse_submit_text(text, base_dir=base_dir, extra_vars=extra_vars, source=str(path))


def parse_submit_text(
    text: str,
    *,
    base_dir: str | Path,
    extra_vars: dict[str, str] | None = None,
    source: str | None = None,
    late_inputs: bool = False,
) -> Sequence[JobSpec]:
    """Parse submit-language ``text``; relative paths resolve against ``base_dir``;
    ``late_inputs``: transfer_input_files are left to be read later (JobSpec.late_inputs).

    ``queue ... from FILE`` and ``queue ... matching GLOB`` are resolved against ``base_dir``
    too (the process's working directory is changed for the duration of that call).
    """
    source = source or "submit description"
    base = _base_dir(source, base_dir)
    with contextlib.chdir(base):
        submit = _submit_from_text(source, text)
        for name, value in (extra_vars or {}).items():
            _set_extra_var(source, submit, name, value)
    return _specs(source, base, submit, late_inputs=late_inputs)


def parse_submit_nodes(
    text: str,
    *,
    base_dir: str | Path,
    extra_vars: Mapping[str, str],
    items: list[dict[str, str]],
    before: Iterable[str] = (),
    source: str,
    late_inputs: bool = False,
) -> SubmitSpecs | None:
    """One parse for many DAG nodes: item i's variables set after the text's own (as
    `extra_vars` are), and each item a cluster of its own of one job (proc 0, its counters 0).
    None when the text must be read once per node: it makes other than one job, it reads
    variables while it is parsed (`if`, `include`), or it sets one of `before` (the variables a
    node sets before the text, which the text's own value would override)."""
    if _PARSE_TIME.search(text):
        return None
    base = _base_dir(source, base_dir)
    with contextlib.chdir(base):
        submit = _submit_from_text(source, text)
        own = {key.lower() for key in submit}
        if (submit.getQArgs() or "").strip() not in ("", "1") or own & {
                name.lower() for name in before}:
            return None
        for name, value in extra_vars.items():
            _set_extra_var(source, submit, name, value)
        for item in items:
            for name, value in item.items():
                _check_extra_var(source, name, value)
        keys = {k.lower(): k for k in submit}
    expander = SubmitExpander(source, base, submit, keys, per_cluster=True,
                              late_inputs=late_inputs)
    return expander.specs(items, 1)


def parse_submit_object(
    description: htcondor2.Submit | Mapping[str, str] | str,
    *,
    base_dir: str | Path,
    count: int = 0,
    itemdata: Iterable[str] | Iterable[Mapping[str, str]] | None = None,
    queue: str | None = None,
    source: str = "submit description",
) -> Sequence[JobSpec]:
    """Parse a description as htcondor2.Schedd.submit takes it (an htcondor2.Submit, a dict of
    commands, or submit-language text) with its overrides: `queue` (the queue statement's
    arguments), `itemdata` (dicts of variables, or lines split into the queue statement's
    variables) and `count` (each item's count, when not 0)."""
    base = _base_dir(source, base_dir)
    if isinstance(description, str):
        text = description if queue is None else without_queue(description)
        with contextlib.chdir(base):
            submit = _submit_from_text(source, text)
    else:
        given = description
        pairs = dict(given.items())
        for key, value in pairs.items():
            check_text_controls(source, f"{key} = {value}")
        submit = _make_submit(source, "")
        submit.update(pairs)
        if isinstance(given, htcondor2.Submit) and queue is None:
            queue = given.getQArgs() or ""
            if itemdata is None and QUEUE_KEYWORD.search(queue):
                itemdata = list(given.itemdata() or [])
    if queue is not None:
        queue = re.sub(r"(?i)^\s*queue\b", "", queue).strip()
        if CONTROL.search(queue.replace("\n", " ")):
            raise SubmitError(f"{source}: queue: control character in the queue statement")
        submit.setQArgs(queue)
    return _specs(source, base, submit, itemdata, count)


def _base_dir(source: str, base_dir: str | Path) -> str:
    base = os.path.abspath(base_dir)
    if not os.path.isdir(base):
        raise SubmitError(f"{source}: base directory {base} does not exist")
    return base


def _submit_from_text(source: str, text: str) -> htcondor2.Submit:
    """Submit-language text, checked line by line, as an htcondor2.Submit (in the base
    directory: an `include` is relative to it)."""
    text = text.replace("\r\n", "\n")
    check_text_controls(source, text)
    _check_submit_lines(source, text)
    return _make_submit(source, text)


def _specs(source: str, base: str, submit: htcondor2.Submit,
           itemdata: Iterable[str] | Iterable[Mapping[str, str]] | None = None,
           count: int = 0, late_inputs: bool = False) -> Sequence[JobSpec]:
    """The jobs of a parsed description: its queue statement's items (or `itemdata`), each
    `count` times when not 0."""
    qargs = (submit.getQArgs() or "").strip()
    with contextlib.chdir(base):
        keys = {k.lower(): k for k in submit}
        if itemdata is None:
            items, n = queue_items(source, submit)
        else:
            items = given_items(source, itemdata, queue_vars(qargs))
            n = queue_count(source, submit, count_text(qargs))
    if count:
        n = check_count(source, count, str(count))
    return SubmitExpander(source, base, submit, keys, late_inputs=late_inputs).specs(items, n)


def _check_submit_lines(source: str, text: str) -> None:
    """Exactly one queue statement; no commands run while parsing."""
    queues: list[int] = []
    in_block = continued = False
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        was_continued, continued = continued, line.endswith("\\")
        if was_continued:
            continue
        if in_block:
            in_block = not line.startswith(")")
            continue
        if not line or line.startswith("#"):
            continue
        if re.match(r"(?i)include\s+command\b", line) or (
            re.match(r"(?i)include\s*:", line) and line.endswith("|")
        ):
            raise SubmitError(
                f"{source}: line {number}: 'include' of a command's output is not supported"
            )
        if QUEUE_LINE.match(line):
            queues.append(number)
            in_block = line.endswith("(")
    if not queues:
        raise SubmitError(f"{source}: no queue statement")
    if len(queues) > 1:
        raise SubmitError(
            f"{source}: line {queues[1]}: only one queue statement is supported "
            f"(first one on line {queues[0]})"
        )


def _make_submit(source: str, text: str) -> htcondor2.Submit:
    """``htcondor2.Submit(text)`` with errors turned into SubmitError."""
    try:
        return htcondor2.Submit(text)
    except Exception as exc:
        detail = _find_bad_line(text) or str(exc)
        raise SubmitError(f"{source}: syntax error: {detail}") from None


_SUBMIT_LINE = re.compile(
    r"""(?ix)
    (?: [+A-Za-z_$(][^=:]*? \s* = .*            # name = value
      | (?:include|use|error|warning)\b .* : .*   # include : file, use template : x
      | (?:if|elif)\b .*  | else | endif
      | queue\b .*
    )$"""
)


def _find_bad_line(text: str) -> str | None:
    """The first line that is not a submit statement, for a better syntax error message."""
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if line and not line.startswith("#") and not _SUBMIT_LINE.match(line):
            return f"line {number}: cannot parse {line!r}"
        if QUEUE_LINE.match(line):
            return None
    return None


def _set_extra_var(source: str, submit: htcondor2.Submit, name: str, value: str) -> None:
    """Set one caller-supplied macro."""
    _check_extra_var(source, name, value)
    submit[name] = value


def _check_extra_var(source: str, name: str, value: str) -> None:
    """A caller-supplied macro's name and value are ones a submit description can hold."""
    if not IDENT.fullmatch(name):
        raise SubmitError(f"{source}: variable name {name!r} is not a valid identifier")
    if CONTROL.search(value):
        raise SubmitError(
            f"{source}: variable {name} contains a newline or other control character"
        )
