"""Turn a submit description or a plain ClassAd file into a list of :class:`JobSpec`.

Submit descriptions are read with ``htcondor2.Submit`` (the condor_submit language: macros,
``+Attr``, queue statements); plain ClassAd files are read in either the old (``Name = value``
lines, ads separated by blank lines) or the new (``[ ... ]``) syntax.

Every bad input raises :class:`SubmitError` with a one-line message that names the file and,
where possible, the command or attribute.

Conventions of the produced :class:`JobSpec`:

* ``args`` / ``env`` are HTCondor "new" (V2 raw) syntax strings: what the job ad's
  ``Arguments`` / ``Environment`` string attributes hold, without the outer double quotes that
  the submit language uses.
* Expression texts (``requirements``, ``retry_until``, ``custom`` values) are in the *new*
  ClassAd syntax, i.e. ``classad2.ExprTree(text)`` parses them with the intended meaning.
  Submit files and old-syntax ClassAd files use the old syntax, in which a backslash inside a
  string is literal; such backslashes are doubled on the way in.  Outside strings with
  backslashes the text is kept as written.
* ``retry_until`` given as a plain integer ``N`` becomes ``ExitCode == N``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import classad2
import htcondor2

__all__ = [
    "MAX_PROCS",
    "JobSpec",
    "SubmitError",
    "join_args_v2",
    "load_jobs",
    "old_expr_to_new",
    "parse_classad_file",
    "parse_submit_file",
    "parse_submit_text",
    "split_args_v2",
]

MAX_PROCS = 100_000
"""Largest number of procs one submit file may produce."""

RESERVED_PREFIX = "jobstore"
RESERVED_ATTRS = frozenset({"hookkeyword", "jobleaseduration"})

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_V2_SPACE = " \t\n\r\v\f"
_INT = re.compile(r"[+-]?\d+")
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
_QUEUE_LINE = re.compile(r"(?i)queue(?:\s|$)")
_QUEUE_KEYWORD = re.compile(r"(?i)(?:^|(?<=[\s,]))(in|from|matching)(?=\s|\(|$)")
_CLUSTER_SENTINEL = "JOBSTORE_CLUSTER_ID_IS_NOT_KNOWN_AT_SUBMIT_TIME"
_DEFAULT_REQUEST_MEMORY = 128
_DEFAULT_REQUEST_DISK = 1024


class _FieldError(ValueError):
    """A bad value, with the command or attribute it belongs to."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(message)
        self.what = what


class SubmitError(Exception):
    """A submit description or ClassAd file cannot be turned into jobs."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class JobSpec:
    """One job to be stored (see docs/design.md)."""

    cmd: str
    args: str = ""
    env: str = ""
    iwd: str = ""
    input: str | None = None
    output: str | None = None
    error: str | None = None
    request_cpus: int = 1
    request_memory: int = _DEFAULT_REQUEST_MEMORY
    request_disk: int = _DEFAULT_REQUEST_DISK
    requirements: str | None = None
    priority: int = 0
    max_retries: int | None = None
    success_exit_code: int = 0
    retry_until: str | None = None
    user_log: str | None = None
    custom: dict[str, str] = field(default_factory=dict)
    proc_id: int = 0


# --------------------------------------------------------------------------------------------
# Argument and environment syntax
# --------------------------------------------------------------------------------------------


def split_args_v2(raw: str) -> list[str]:
    """Split a V2 raw argument string (single quotes group, ``''`` is a literal quote)."""
    words: list[str] = []
    i, n = 0, len(raw)
    while i < n:
        if raw[i] in _V2_SPACE:
            i += 1
            continue
        word: list[str] = []
        while i < n and raw[i] not in _V2_SPACE:
            if raw[i] != "'":
                word.append(raw[i])
                i += 1
                continue
            i += 1
            while True:
                if i >= n:
                    raise ValueError("unterminated single quote")
                if raw[i] == "'":
                    if raw.startswith("''", i):
                        word.append("'")
                        i += 2
                        continue
                    i += 1
                    break
                word.append(raw[i])
                i += 1
        words.append("".join(word))
    return words


def _quote_word(word: str, force: bool = False) -> str:
    """Quote one word for a V2 raw string if it needs it."""
    if force or not word or "'" in word or any(c in _V2_SPACE for c in word):
        return "'" + word.replace("'", "''") + "'"
    return word


def join_args_v2(words: Iterable[str]) -> str:
    """Join words into a V2 raw string; the result never ends in a backslash."""
    words = list(words)
    quoted = [_quote_word(w) for w in words]
    if words and words[-1].endswith("\\"):
        quoted[-1] = _quote_word(words[-1], force=True)
    return " ".join(quoted)


def _v2_unquote(value: str) -> str:
    """Submit-file ``"..."`` (V2 quoted) value -> V2 raw string."""
    out: list[str] = []
    i, n = 1, len(value)
    while i < n:
        c = value[i]
        if c == '"':
            if value.startswith('""', i):
                out.append('"')
                i += 2
                continue
            if value[i + 1 :].strip():
                raise ValueError("unexpected text after the closing double quote")
            return "".join(out)
        out.append(c)
        i += 1
    raise ValueError("missing closing double quote")


def _split_v1_wacked(value: str) -> list[str]:
    """Old submit-file argument syntax: whitespace separates, ``\\"`` is a literal quote."""
    words: list[str] = []
    for token in value.split():
        word: list[str] = []
        i = 0
        while i < len(token):
            if token.startswith('\\"', i):
                word.append('"')
                i += 2
            elif token[i] == '"':
                raise ValueError(
                    "unescaped double quote in old-syntax arguments "
                    '(write \\" or put the whole value in double quotes)'
                )
            else:
                word.append(token[i])
                i += 1
        words.append("".join(word))
    return words


def _args_to_v2(value: str) -> str:
    """Submit ``arguments`` value (new or old syntax) -> V2 raw string."""
    if value.startswith('"'):
        return join_args_v2(split_args_v2(_v2_unquote(value)))
    return join_args_v2(_split_v1_wacked(value))


def _env_words_to_v2(entries: Iterable[str]) -> str:
    """Validate ``NAME=value`` entries and join them as a V2 raw environment string."""
    merged: dict[str, str] = {}
    for entry in entries:
        name, eq, val = entry.partition("=")
        if not eq or not name:
            raise ValueError(f"entry {entry!r} is not NAME=value")
        if any(c in _V2_SPACE for c in name):
            raise ValueError(f"variable name {name!r} contains whitespace")
        merged[name] = val
    return join_args_v2(f"{k}={v}" for k, v in merged.items())


def _env_to_v2(value: str) -> str:
    """Submit ``environment`` value (new quoted or old ``;`` syntax) -> V2 raw string."""
    if value.startswith('"'):
        return _env_words_to_v2(split_args_v2(_v2_unquote(value)))
    return _env_v1_to_v2(value)


def _env_v1_to_v2(value: str) -> str:
    """Old ``A=1;B=2`` environment -> V2 raw string."""
    return _env_words_to_v2(e.strip() for e in value.split(";") if e.strip())


# --------------------------------------------------------------------------------------------
# Values: numbers, sizes, expressions, strings
# --------------------------------------------------------------------------------------------


def _parse_int(value: str, minimum: int | None = None) -> int:
    """An integer literal, optionally with a lower bound."""
    if not _INT.fullmatch(value.strip()):
        raise ValueError(f"{value!r} is not an integer")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ValueError(f"must be at least {minimum}, not {number}")
    return number


def _parse_size(value: str, base_bytes: int) -> int:
    """``<number>[unit]`` -> multiples of ``base_bytes`` (rounded up); no unit = base unit."""
    match = _SIZE.fullmatch(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not a non-negative size like 512, 2G or 1.5GB")
    unit = match.group(2).lower()
    if unit not in _UNITS:
        raise ValueError(
            f"unknown unit {match.group(2)!r} in {value!r} (use K, KB, M, MB, G, GB, T or TB)"
        )
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as exc:  # pragma: no cover - the regex already checked it
        raise ValueError(f"{value!r} is not a number") from exc
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
        raise ValueError(f"{text!r} is not a valid ClassAd expression") from exc


def _old_expr(text: str) -> str:
    """Validate old-syntax expression text; return it in the new syntax."""
    new = old_expr_to_new(text.strip())
    _parse_expr(new)
    return new


def _retry_until(value: str) -> str:
    """``retry_until``: an exit code or an expression."""
    if _INT.fullmatch(value.strip()):
        return f"ExitCode == {int(value)}"
    return _old_expr(value)


def _check_value(what: str, value: str, *, is_string: bool = True) -> str:
    """Refuse values an old-syntax job ad cannot carry."""
    if _CONTROL.search(value):
        raise _FieldError(
            what,
            "contains a newline or other control character, which HTCondor's old ClassAd "
            "syntax cannot carry in a job ad",
        )
    if is_string and value.endswith("\\"):
        raise _FieldError(
            what, "ends in a backslash, which cannot be written as an old ClassAd string"
        )
    return value


_SUBMIT_NAMES = {
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
_AD_NAMES = {
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


def _check_spec(spec: JobSpec, names: dict[str, str]) -> None:
    """Apply :func:`_check_value` to every text field of a finished spec.

    ``names`` maps field names to the command or attribute names used in messages.
    """
    for attr, what in names.items():
        value = getattr(spec, attr)
        if value is not None:
            _check_value(what, value, is_string=attr not in _EXPR_FIELDS)
    for name, value in spec.custom.items():
        _check_value(name, value, is_string=False)


def _check_custom_name(name: str) -> None:
    """Custom attribute names must be identifiers and not the job store's own."""
    if not _IDENT.fullmatch(name):
        raise ValueError(f"attribute name {name!r} is not a valid identifier")
    lower = name.lower()
    if lower.startswith(RESERVED_PREFIX) or lower in RESERVED_ATTRS:
        raise ValueError(f"attribute {name} is reserved for the job store")


def _abspath(base: str, path: str) -> str:
    """``path`` made absolute against ``base`` and normalised."""
    return os.path.normpath(os.path.join(base, path))


# --------------------------------------------------------------------------------------------
# Reading files
# --------------------------------------------------------------------------------------------


def _read_text(path: Path) -> str:
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


def _check_text_controls(source: str, text: str) -> None:
    """Refuse control characters (other than tab and newline) anywhere in a file."""
    for number, line in enumerate(text.split("\n"), 1):
        if re.search(r"[\x00-\x08\x0b-\x1f\x7f]", line):
            raise SubmitError(
                f"{source}: line {number} contains a control character, which HTCondor's old "
                "ClassAd syntax cannot carry in a job ad"
            )


# --------------------------------------------------------------------------------------------
# Submit descriptions
# --------------------------------------------------------------------------------------------

_COMMANDS: dict[str, tuple[str, ...]] = {
    "executable": ("executable",),
    "arguments": ("arguments",),
    "environment": ("environment", "env"),
    "input": ("input",),
    "output": ("output",),
    "error": ("error",),
    "initialdir": ("initialdir", "initial_dir"),
    "request_cpus": ("request_cpus", "requestcpus"),
    "request_memory": ("request_memory", "requestmemory"),
    "request_disk": ("request_disk", "requestdisk"),
    "requirements": ("requirements",),
    "priority": ("priority", "prio"),
    "max_retries": ("max_retries",),
    "success_exit_code": ("success_exit_code",),
    "retry_until": ("retry_until",),
    "log": ("log",),
    "universe": ("universe",),
    "transfer_input_files": ("transfer_input_files",),
}


def parse_submit_file(
    path: str | Path, *, extra_vars: dict[str, str] | None = None
) -> list[JobSpec]:
    """Read a submit description file; ``extra_vars`` are macros set after the file's own."""
    path = Path(path)
    text = _read_text(path)
    base_dir = Path(os.path.abspath(path)).parent
    return parse_submit_text(text, base_dir=base_dir, extra_vars=extra_vars, source=str(path))


def parse_submit_text(
    text: str,
    *,
    base_dir: str | Path,
    extra_vars: dict[str, str] | None = None,
    source: str | None = None,
) -> list[JobSpec]:
    """Parse submit-language ``text``; relative paths resolve against ``base_dir``.

    ``queue ... from FILE`` and ``queue ... matching GLOB`` are resolved against ``base_dir``
    too (the process's working directory is changed for the duration of that call).
    """
    source = source or "submit description"
    base = os.path.abspath(base_dir)
    if not os.path.isdir(base):
        raise SubmitError(f"{source}: base directory {base} does not exist")
    text = text.replace("\r\n", "\n")
    _check_text_controls(source, text)
    _check_submit_lines(source, text)
    with contextlib.chdir(base):
        submit = _make_submit(source, text)
        for name, value in (extra_vars or {}).items():
            _set_extra_var(source, submit, name, value)
        keys = {k.lower(): k for k in submit}
        items, count = _queue_items(source, submit)
    return _SubmitExpander(source, base, submit, keys).specs(items, count)


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
        if _QUEUE_LINE.match(line):
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
        if _QUEUE_LINE.match(line):
            return None
    return None


def _set_extra_var(source: str, submit: htcondor2.Submit, name: str, value: str) -> None:
    """Set one caller-supplied macro."""
    if not _IDENT.fullmatch(name):
        raise SubmitError(f"{source}: variable name {name!r} is not a valid identifier")
    if _CONTROL.search(value):
        raise SubmitError(
            f"{source}: variable {name} contains a newline or other control character"
        )
    submit[name] = value


def _queue_items(source: str, submit: htcondor2.Submit) -> tuple[list[dict[str, str]], int]:
    """The queue statement's item rows (one empty row for plain ``queue N``) and count N."""
    qargs = (submit.getQArgs() or "").strip()
    match = _QUEUE_KEYWORD.search(qargs)
    head = qargs if match is None else qargs[: match.start(1)]
    tokens = [t for t in re.split(r"[\s,]+", head.strip()) if t]
    count_text = "1"
    if match is None and head.strip():
        count_text = head.strip()
    elif tokens and not _IDENT.fullmatch(tokens[0]):
        count_text = tokens[0]
    count = _queue_count(source, submit, count_text)
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


def _queue_count(source: str, submit: htcondor2.Submit, text: str) -> int:
    """Expand and evaluate the count of a queue statement."""
    submit["JobstoreQueueCount"] = text
    try:
        expanded = submit.expand("JobstoreQueueCount").strip()
    except Exception as exc:
        raise SubmitError(f"{source}: queue: cannot expand count {text!r}: {exc}") from None
    if _INT.fullmatch(expanded):
        return _check_count(source, int(expanded), expanded)
    try:
        value = classad2.ExprTree(expanded).eval()
    except Exception:
        value = None
    if type(value) is int:  # not bool, not classad2.Value (an IntEnum)
        return _check_count(source, value, expanded)
    raise SubmitError(f"{source}: queue: count {expanded!r} is not an integer")


def _check_count(source: str, count: int, text: str) -> int:
    """Queue counts must be non-negative and bounded."""
    if count < 0:
        raise SubmitError(f"{source}: queue: count {text!r} is negative")
    if count > MAX_PROCS:
        raise SubmitError(f"{source}: queue: {count} procs is more than the limit of {MAX_PROCS}")
    return count


class _SubmitExpander:
    """Expands the commands of a parsed submit description once per proc."""

    def __init__(self, source: str, base: str, submit: htcondor2.Submit, keys: dict[str, str]):
        self.source = source
        self.base = base
        self.submit = submit
        self.commands = self._command_keys(keys)
        self.custom_keys = {k[3:]: k for low, k in keys.items() if low.startswith("my.")}
        self.dynamic = any("$" in submit[k] for k in self._used_keys())
        submit["Cluster"] = submit["ClusterId"] = _CLUSTER_SENTINEL

    @staticmethod
    def _command_keys(keys: dict[str, str]) -> dict[str, str]:
        """Canonical command -> the key the file used for it (first alias present)."""
        found: dict[str, str] = {}
        for command, aliases in _COMMANDS.items():
            for alias in aliases:
                if alias in keys:
                    found[command] = keys[alias]
                    break
        return found

    def _used_keys(self) -> list[str]:
        return [*self.commands.values(), *self.custom_keys.values()]

    def specs(self, items: list[dict[str, str]], count: int) -> list[JobSpec]:
        """One JobSpec per (item, step)."""
        total = len(items) * count
        if total > MAX_PROCS:
            raise SubmitError(
                f"{self.source}: queue: {total} procs is more than the limit of {MAX_PROCS}"
            )
        if total == 0:
            raise SubmitError(f"{self.source}: the queue statement produces no jobs")
        specs: list[JobSpec] = []
        proc = 0
        for row, item in enumerate(items):
            for step in range(count):
                if specs and not self.dynamic:
                    first = specs[0]
                    specs.append(
                        dataclasses.replace(first, proc_id=proc, custom=dict(first.custom))
                    )
                else:
                    self._set_proc_vars(item, proc, step, row)
                    specs.append(self._spec(proc))
                proc += 1
        return specs

    def _set_proc_vars(self, item: dict[str, str], proc: int, step: int, row: int) -> None:
        """Set item variables and the per-proc built-in macros."""
        for name, value in item.items():
            self.submit[name] = value
        for name in ("Process", "ProcId"):
            self.submit[name] = str(proc)
        self.submit["Step"] = str(step)
        self.submit["Row"] = self.submit["ItemIndex"] = str(row)
        if not item:
            self.submit["Item"] = ""

    def _expand(self, key: str, what: str, proc: int) -> str:
        """Expand one command for the current proc (an empty value counts as unset)."""
        raw = self.submit.get(key, "").strip()
        if not raw:
            return ""
        try:
            value = self.submit.expand(key).strip()
        except Exception:
            raise self._error(what, f"cannot expand the macros in {raw!r}", proc) from None
        if _CLUSTER_SENTINEL in value:
            message = "$(Cluster)/$(ClusterId) is not known when jobs are read for the job store"
            raise self._error(what, message, proc)
        return value

    def _error(self, what: str, message: str, proc: int) -> SubmitError:
        where = f" (proc {proc})" if self.dynamic else ""
        return SubmitError(f"{self.source}{where}: {what}: {message}")

    def _spec(self, proc: int) -> JobSpec:
        """Build the JobSpec of one proc."""
        values = {
            command: self._expand(key, command, proc) for command, key in self.commands.items()
        }
        values = {k: v for k, v in values.items() if v != ""}
        custom = {}
        for name, key in self.custom_keys.items():
            value = self._expand(key, f"+{name}", proc)
            if value != "":
                custom[name] = value
        return self._build(values, custom, proc)

    def _build(self, values: dict[str, str], custom: dict[str, str], proc: int) -> JobSpec:
        """Convert expanded command values, naming the command in any error."""
        current = "executable"

        def conv(command: str, func: Callable[[str], Any], default: Any = None) -> Any:
            nonlocal current
            current = command
            return func(values[command]) if command in values else default

        try:
            self._check_unsupported(values)
            iwd = conv("initialdir", lambda v: _abspath(self.base, v), self.base)
            cmd = conv("executable", lambda v: _abspath(iwd, v))
            if cmd is None:
                raise ValueError("missing: every job needs an executable")
            spec = JobSpec(
                cmd=cmd,
                args=conv("arguments", _args_to_v2, ""),
                env=conv("environment", _env_to_v2, ""),
                iwd=iwd,
                input=conv("input", str),
                output=conv("output", str),
                error=conv("error", str),
                request_cpus=conv("request_cpus", lambda v: _parse_int(v, 1), 1),
                request_memory=conv(
                    "request_memory", lambda v: _parse_size(v, 1 << 20), _DEFAULT_REQUEST_MEMORY
                ),
                request_disk=conv(
                    "request_disk", lambda v: _parse_size(v, 1 << 10), _DEFAULT_REQUEST_DISK
                ),
                requirements=conv("requirements", _old_expr),
                priority=conv("priority", _parse_int, 0),
                max_retries=conv("max_retries", lambda v: _parse_int(v, 0)),
                success_exit_code=conv("success_exit_code", _parse_int, 0),
                retry_until=conv("retry_until", _retry_until),
                user_log=conv("log", lambda v: _abspath(iwd, v)),
                proc_id=proc,
            )
            _check_spec(spec, _SUBMIT_NAMES)
        except ValueError as exc:
            raise self._error(getattr(exc, "what", current), str(exc), proc) from None
        spec.custom = self._custom(custom, proc)
        return spec

    @staticmethod
    def _check_unsupported(values: dict[str, str]) -> None:
        """Universe other than vanilla and file transfer cannot be honoured."""
        universe = values.get("universe", "vanilla")
        if universe.lower() != "vanilla":
            raise _FieldError(
                "universe",
                f"{universe!r} is not supported; jobs fetched from the job store run in the "
                "vanilla universe",
            )
        if values.get("transfer_input_files"):
            raise _FieldError(
                "transfer_input_files",
                "is not supported: jobs fetched from the job store have no file transfer "
                "(use a shared file system)",
            )

    def _custom(self, custom: dict[str, str], proc: int) -> dict[str, str]:
        """Validate ``+Attr`` / ``MY.Attr`` values."""
        result: dict[str, str] = {}
        for name, value in custom.items():
            try:
                _check_custom_name(name)
                if name.lower() in _AD_FIELDS:
                    raise ValueError(f"{name} is set by a submit command; use the command instead")
                _check_value(f"+{name}", value, is_string=False)
                result[name] = _old_expr(value)
            except ValueError as exc:
                raise self._error(getattr(exc, "what", f"+{name}"), str(exc), proc) from None
        return result


# --------------------------------------------------------------------------------------------
# Plain ClassAd files
# --------------------------------------------------------------------------------------------

_OLD_LINE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*(.*?)\s*")


def parse_classad_file(path: str | Path) -> list[JobSpec]:
    """Read one or several job ads (old or new syntax); attribute names as in a job ad."""
    path = Path(path)
    text = _read_text(path)
    _check_text_controls(str(path), text)
    base = str(Path(os.path.abspath(path)).parent)
    if _first_content(text).startswith("["):
        ads = _parse_new_ads(str(path), text)
    else:
        ads = _parse_old_ads(str(path), text)
    if not ads:
        raise SubmitError(f"{path}: no ClassAds in the file")
    if len(ads) > MAX_PROCS:
        raise SubmitError(f"{path}: {len(ads)} ads is more than the limit of {MAX_PROCS}")
    return [_spec_from_ad(str(path), number, ad, base) for number, ad in enumerate(ads)]


def _strip_comment_lines(text: str) -> list[tuple[int, str]]:
    """Numbered lines without ``#`` and ``//`` comment lines."""
    result = []
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if line.startswith("#") or line.startswith("//"):
            continue
        result.append((number, raw))
    return result


def _first_content(text: str) -> str:
    """The text from its first non-blank, non-comment line on."""
    for _, raw in _strip_comment_lines(text):
        if raw.strip():
            return raw.strip()
    return ""


def _parse_old_line(line: str) -> tuple[str, str] | None:
    """``Name = value`` -> (name, new-syntax expression text), or None if it is not one."""
    match = _OLD_LINE.fullmatch(line)
    if not match:
        return None
    try:
        return match.group(1), _old_expr(match.group(2))
    except ValueError:
        return None


def _parse_old_ads(source: str, text: str) -> list[dict[str, str]]:
    """Old syntax: ``Name = value`` lines, ads separated by blank lines."""
    ads: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for number, raw in _strip_comment_lines(text):
        if not raw.strip():
            if current:
                ads.append(current)
            current = {}
            continue
        parsed = _parse_old_line(raw)
        if parsed is None:
            raise SubmitError(
                f"{source}: line {number}: not 'Name = value' with a valid ClassAd expression: "
                f"{raw.strip()!r}"
            )
        name, expr = parsed
        for existing in [k for k in current if k.lower() == name.lower()]:
            del current[existing]
        current[name] = expr
    if current:
        ads.append(current)
    return ads


def _parse_new_ads(source: str, text: str) -> list[dict[str, str]]:
    """New syntax: one or more ``[ ... ]`` ads."""
    ads = []
    for chunk in _split_new_ads(source, text):
        try:
            ad = classad2.ClassAd(chunk)
        except Exception:
            raise SubmitError(f"{source}: invalid new-syntax ClassAd: {_shorten(chunk)}") from None
        ads.append({name: _one_line(str(ad.lookup(name))) for name in ad})
    return ads


def _one_line(text: str) -> str:
    """Collapse the multi-line layout classad2 uses for lists and nested ads.

    Strings never contain raw newlines in unparsed new-syntax text (they are escaped), so every
    newline is layout.
    """
    return re.sub(r"\s*\n\s*", " ", text).strip()


def _shorten(text: str, limit: int = 60) -> str:
    """A one-line excerpt of ``text`` for messages."""
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= limit else flat[: limit - 3] + "...")


def _split_new_ads(source: str, text: str) -> list[str]:
    """Cut new-syntax text into top-level ``[ ... ]`` chunks (strings and comments aware)."""
    chunks: list[str] = []
    depth, start, i, n = 0, 0, 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'" and depth > 0:
            i = _skip_quoted(source, text, i)
            continue
        if text.startswith("//", i) or (c == "#" and depth == 0):
            i = text.find("\n", i) if "\n" in text[i:] else n
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise SubmitError(f"{source}: unterminated /* comment")
            i = end + 2
            continue
        if c == "[":
            start = i if depth == 0 else start
            depth += 1
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise SubmitError(f"{source}: unbalanced ']'")
            if depth == 0:
                chunks.append(text[start : i + 1])
        elif depth == 0 and not c.isspace() and c != ";":
            raise SubmitError(f"{source}: unexpected text outside of an ad: {_shorten(text[i:])}")
        i += 1
    if depth:
        raise SubmitError(f"{source}: unterminated ad (missing ']')")
    return chunks


def _skip_quoted(source: str, text: str, i: int) -> int:
    """Index just past the string or quoted name starting at ``i``."""
    quote, j = text[i], i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == quote:
            return j + 1
        j += 1
    raise SubmitError(f"{source}: unterminated quoted text: {_shorten(text[i:])}")


_AD_FIELDS = {
    "cmd", "args", "arguments", "env", "environment", "iwd", "in", "out", "err",
    "requestcpus", "requestmemory", "requestdisk", "requirements", "jobprio", "maxretries",
    "successexitcode", "retryuntil", "userlog",
}  # fmt: skip


def _spec_from_ad(source: str, number: int, attrs: dict[str, str], base: str) -> JobSpec:
    """Build the JobSpec of ad ``number`` (its index is the proc id)."""
    ad = classad2.ClassAd()
    for name, expr in attrs.items():
        ad[name] = classad2.ExprTree(expr)
    lower = {name.lower(): name for name in attrs}
    where = f"{source} (ad {number + 1})"
    current = "Cmd"

    def get(attr: str, kind: type, default: Any = None) -> Any:
        nonlocal current
        current = attr
        if attr.lower() not in lower:
            return default
        text = attrs[lower[attr.lower()]]
        value = ad.eval(lower[attr.lower()])
        if type(value) is not kind:  # bool and classad2.Value are int subclasses
            raise ValueError(f"must be {'an integer' if kind is int else 'a string'}, not {text}")
        return value

    try:
        iwd = _abspath(base, get("Iwd", str, base))
        cmd = get("Cmd", str)
        if cmd is None:
            raise ValueError("missing: every job ad needs a Cmd attribute")
        spec = JobSpec(
            cmd=_abspath(iwd, cmd),
            args=_ad_args(get),
            env=_ad_env(get),
            iwd=iwd,
            input=get("In", str),
            output=get("Out", str),
            error=get("Err", str),
            request_cpus=get("RequestCpus", int, 1),
            request_memory=get("RequestMemory", int, _DEFAULT_REQUEST_MEMORY),
            request_disk=get("RequestDisk", int, _DEFAULT_REQUEST_DISK),
            priority=get("JobPrio", int, 0),
            max_retries=get("MaxRetries", int),
            success_exit_code=get("SuccessExitCode", int, 0),
            proc_id=number,
        )
        _check_ad_numbers(spec)
        current = "UserLog"
        log = get("UserLog", str)
        spec.user_log = None if log is None else _abspath(iwd, log)
        spec.requirements = attrs.get(lower.get("requirements", ""))
        spec.retry_until = _ad_retry_until(attrs.get(lower.get("retryuntil", "")))
        current = "Requirements"
        _check_spec(spec, _AD_NAMES)
        spec.custom = _ad_custom(attrs)
    except ValueError as exc:
        raise SubmitError(f"{where}: {getattr(exc, 'what', current)}: {exc}") from None
    return spec


def _ad_args(get: Callable[..., Any]) -> str:
    """``Arguments`` (V2 raw, normalised) or else ``Args`` (V1: whitespace separated)."""
    v2 = get("Arguments", str)
    if v2 is not None:
        return join_args_v2(split_args_v2(v2))
    v1 = get("Args", str)
    return "" if v1 is None else join_args_v2(v1.split())


def _ad_env(get: Callable[..., Any]) -> str:
    """``Environment`` (V2 raw) or else ``Env`` (V1: ``;`` separated)."""
    v2 = get("Environment", str)
    if v2 is not None:
        return _env_words_to_v2(split_args_v2(v2))
    v1 = get("Env", str)
    return "" if v1 is None else _env_v1_to_v2(v1)


def _ad_retry_until(expr: str | None) -> str | None:
    """An integer literal RetryUntil means an exit code."""
    if expr is not None and _INT.fullmatch(expr.strip()):
        return f"ExitCode == {int(expr)}"
    return expr


def _check_ad_numbers(spec: JobSpec) -> None:
    """The same bounds as the submit commands."""
    if spec.request_cpus < 1:
        raise _FieldError("RequestCpus", f"must be at least 1, not {spec.request_cpus}")
    if spec.request_memory < 0:
        raise _FieldError("RequestMemory", f"must not be negative, not {spec.request_memory}")
    if spec.request_disk < 0:
        raise _FieldError("RequestDisk", f"must not be negative, not {spec.request_disk}")
    if spec.max_retries is not None and spec.max_retries < 0:
        raise _FieldError("MaxRetries", f"must not be negative, not {spec.max_retries}")


def _ad_custom(attrs: dict[str, str]) -> dict[str, str]:
    """Every attribute that is not a JobSpec field."""
    custom = {}
    for name, expr in attrs.items():
        if name.lower() in _AD_FIELDS:
            continue
        try:
            _check_custom_name(name)
        except ValueError as exc:
            raise _FieldError(name, str(exc)) from None
        _check_value(name, expr, is_string=False)
        custom[name] = expr
    return custom


# --------------------------------------------------------------------------------------------
# Either
# --------------------------------------------------------------------------------------------


def load_jobs(path: str | Path) -> list[JobSpec]:
    """Read ``path`` as a plain ClassAd file if it looks like one, else as a submit file."""
    path = Path(path)
    text = _read_text(path)
    if _looks_like_classad(text):
        return parse_classad_file(path)
    return parse_submit_file(path)


def _looks_like_classad(text: str) -> bool:
    """New syntax, or only ``Name = <ClassAd expression>`` lines including a Cmd.

    A file with a ``Cmd = ...`` line and no queue statement is read as a (broken) ClassAd file
    too, so that its error message points at the bad line instead of the missing queue.
    """
    if _first_content(text).startswith("["):
        return True
    lines = [raw.strip() for _, raw in _strip_comment_lines(text)]
    if any(re.match(r"(?i)cmd\s*=", line) for line in lines) and not any(
        _QUEUE_LINE.match(line) for line in lines
    ):
        return True
    names = []
    for _, raw in _strip_comment_lines(text):
        if not raw.strip():
            continue
        parsed = _parse_old_line(raw)
        if parsed is None:
            return False
        names.append(parsed[0].lower())
    return "cmd" in names
