"""Plain ClassAd files, in the old (``Name = value`` lines, ads separated by blank lines) or
the new (``[ ... ]``) syntax."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import classad2

from jobstore.core import limits
from jobstore.core.fairshare import check_group_name
from jobstore.core.jobs import DEFAULT_REQUEST_DISK, DEFAULT_REQUEST_MEMORY, JobSpec
from jobstore.errors import FieldError, InvalidInput, SubmitError
from jobstore.submit.limits import MAX_PROCS
from jobstore.submit.syntax import env_v1_to_v2, env_words_to_v2, join_args_v2, split_args_v2
from jobstore.submit.values import (
    AD_NAMES,
    INT,
    abspath,
    check_custom_name,
    check_spec,
    check_text_controls,
    check_value,
    old_expr,
    read_text,
)

_OLD_LINE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*(.*?)\s*")


def parse_classad_file(path: str | Path) -> list[JobSpec]:
    """Read one or several job ads (old or new syntax); attribute names as in a job ad."""
    path = Path(path)
    text = read_text(path)
    check_text_controls(str(path), text)
    base = str(Path(os.path.abspath(path)).parent)
    if first_content(text).startswith("["):
        ads = _parse_new_ads(str(path), text)
    else:
        ads = _parse_old_ads(str(path), text)
    if not ads:
        raise SubmitError(f"{path}: no ClassAds in the file")
    if len(ads) > MAX_PROCS:
        raise SubmitError(f"{path}: {len(ads)} ads is more than the limit of {MAX_PROCS}")
    return [_spec_from_ad(str(path), number, ad, base) for number, ad in enumerate(ads)]


def strip_comment_lines(text: str) -> list[tuple[int, str]]:
    """Numbered lines without ``#`` and ``//`` comment lines."""
    result = []
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if line.startswith("#") or line.startswith("//"):
            continue
        result.append((number, raw))
    return result


def first_content(text: str) -> str:
    """The text from its first non-blank, non-comment line on."""
    for _, raw in strip_comment_lines(text):
        if raw.strip():
            return raw.strip()
    return ""


def parse_old_line(line: str) -> tuple[str, str] | None:
    """``Name = value`` -> (name, new-syntax expression text), or None if it is not one."""
    match = _OLD_LINE.fullmatch(line)
    if not match:
        return None
    try:
        return match.group(1), old_expr(match.group(2))
    except ValueError:
        return None


def _parse_old_ads(source: str, text: str) -> list[dict[str, str]]:
    """Old syntax: ``Name = value`` lines, ads separated by blank lines."""
    ads: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for number, raw in strip_comment_lines(text):
        if not raw.strip():
            if current:
                ads.append(current)
            current = {}
            continue
        parsed = parse_old_line(raw)
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


AD_FIELDS = {
    "cmd", "args", "arguments", "env", "environment", "iwd", "in", "out", "err",
    "requestcpus", "requestmemory", "requestdisk", "requirements", "jobprio", "maxretries",
    "successexitcode", "retryuntil", "userlog", "acctgroup", "acctgroupuser", "accountinggroup",
    "concurrencylimits",
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
            raise InvalidInput(f"must be {'an integer' if kind is int else 'a string'}, not {text}")
        return value

    try:
        iwd = abspath(base, get("Iwd", str, base))
        cmd = get("Cmd", str)
        if cmd is None:
            raise InvalidInput("missing: every job ad needs a Cmd attribute")
        spec = JobSpec(
            cmd=abspath(iwd, cmd),
            args=_ad_args(get),
            env=_ad_env(get),
            iwd=iwd,
            input=get("In", str),
            output=get("Out", str),
            error=get("Err", str),
            request_cpus=get("RequestCpus", int, 1),
            request_memory=get("RequestMemory", int, DEFAULT_REQUEST_MEMORY),
            request_disk=get("RequestDisk", int, DEFAULT_REQUEST_DISK),
            priority=get("JobPrio", int, 0),
            max_retries=get("MaxRetries", int),
            success_exit_code=get("SuccessExitCode", int, 0),
            proc_id=number,
        )
        _check_ad_numbers(spec)
        current = "UserLog"
        log = get("UserLog", str)
        spec.user_log = None if log is None else abspath(iwd, log)
        spec.requirements = attrs.get(lower.get("requirements", ""))
        spec.retry_until = _ad_retry_until(attrs.get(lower.get("retryuntil", "")))
        current = "Requirements"
        check_spec(spec, AD_NAMES)
        _ad_accounting(spec, get)
        spec.custom = _ad_custom(attrs)
    except ValueError as exc:
        raise SubmitError(f"{where}: {getattr(exc, 'what', current)}: {exc}") from None
    return spec


def _ad_accounting(spec: JobSpec, get: Callable[..., Any]) -> None:
    """AcctGroup and AcctGroupUser (or the older AccountingGroup, `group.user`), and
    ConcurrencyLimits, as the submit commands set them."""
    group, user = get("AcctGroup", str), get("AcctGroupUser", str)
    combined = get("AccountingGroup", str)
    if group is None and combined is not None:
        group, dot, user = combined.rpartition(".")
        if not dot:
            group, user = combined, None
    if group is not None:
        spec.accounting_group = check_group_name("AcctGroup", group)
    if user is not None:
        spec.accounting_group_user = check_group_name("AcctGroupUser", user)
    text = get("ConcurrencyLimits", str)
    if text is not None:
        spec.concurrency_limits = limits.render(limits.parse(text))


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
        return env_words_to_v2(split_args_v2(v2))
    v1 = get("Env", str)
    return "" if v1 is None else env_v1_to_v2(v1)


def _ad_retry_until(expr: str | None) -> str | None:
    """An integer literal RetryUntil means an exit code."""
    if expr is not None and INT.fullmatch(expr.strip()):
        return f"ExitCode == {int(expr)}"
    return expr


def _check_ad_numbers(spec: JobSpec) -> None:
    """The same bounds as the submit commands."""
    if spec.request_cpus < 1:
        raise FieldError("RequestCpus", f"must be at least 1, not {spec.request_cpus}")
    if spec.request_memory < 0:
        raise FieldError("RequestMemory", f"must not be negative, not {spec.request_memory}")
    if spec.request_disk < 0:
        raise FieldError("RequestDisk", f"must not be negative, not {spec.request_disk}")
    if spec.max_retries is not None and spec.max_retries < 0:
        raise FieldError("MaxRetries", f"must not be negative, not {spec.max_retries}")


def _ad_custom(attrs: dict[str, str]) -> dict[str, str]:
    """Every attribute that is not a JobSpec field."""
    custom = {}
    for name, expr in attrs.items():
        if name.lower() in AD_FIELDS:
            continue
        try:
            check_custom_name(name)
        except ValueError as exc:
            raise FieldError(name, str(exc)) from None
        check_value(name, expr, is_string=False)
        custom[name] = expr
    return custom
