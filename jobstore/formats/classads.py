"""The wire format between HTCondor and the hooks: old-syntax ClassAds on stdin and stdout."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import classad2
from classad2 import ClassAd, ExprTree, ParserType

from jobstore.errors import AdError

# HTCondor's startd reads at most PIPE_BUFFER_MAX (10240) bytes of FETCH_WORK stdout.
MAX_JOB_AD_BYTES = 10240

_SEPARATOR = "-----"
# The ClaimId line is written without any escaping, so its value can hold bare double quotes:
# no ClassAd parser can read it, hence this regular expression.
_CLAIM_ID_LINE = re.compile(r'^ClaimId = "(.*)"$')
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Bytes that were not UTF-8, as `decode` keeps them (lone surrogates); classad2 cannot take them.
_UNDECODABLE = re.compile("[\udc80-\udcff]")
PRIVATE_ATTRS = frozenset(
    n.lower()
    for n in ("Capability", "ChildClaimIds", "ClaimId", "ClaimIdList", "ClaimIds", "TransferKey")
)


class Expr(str):
    """ClassAd expression text, as opposed to a string value."""


Value = str | int | float | bool | Expr


def decode(raw: bytes) -> str:
    """Decode hook stdin: HTCondor writes bytes, values may not be UTF-8."""
    return raw.decode("utf-8", "surrogateescape")


def parse_ad(text: str) -> ClassAd:
    """Parse one old-syntax ad (`Name = value` lines) as HTCondor writes it for hooks."""
    if "\x00" in text:
        raise AdError("ClassAd contains a NUL byte")
    # A job's values may hold any bytes (HTCondor passes them on as they are): read such a byte
    # as U+FFFD rather than refuse the whole ad and lose the report about the job.
    text = _UNDECODABLE.sub("\ufffd", text)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise AdError("empty ClassAd")
    for ln in lines:
        name, sep, _ = ln.partition("=")
        if not sep or not name.strip():
            raise AdError(f"not a ClassAd line: {_excerpt(ln)}")
    try:  # one ad (no blank line is left): parseNext, which returns it without copying it
        ad = classad2.parseNext("\n".join(lines) + "\n", ParserType.Old)
    except Exception as exc:  # classad2 raises plain exceptions on syntax errors
        raise AdError(f"unparseable ClassAd: {exc}") from None
    if ad is None or len(ad) == 0:
        raise AdError("ClassAd has no attributes")
    return ad


@dataclass(frozen=True)
class ReplyFetchInput:
    """REPLY_FETCH / EVICT_CLAIM stdin: job ad, `-----`, slot ad, and on accept a ClaimId line."""

    job: ClassAd
    slot: ClassAd
    has_claim_id: bool


def split_reply_fetch(text: str) -> ReplyFetchInput:
    """Split the REPLY_FETCH stdin; the ClaimId value (a secret) is dropped, not returned."""
    lines = text.splitlines()
    try:
        sep = lines.index(_SEPARATOR)
    except ValueError:
        raise AdError("no '-----' line between the job ad and the slot ad") from None
    slot_lines = lines[sep + 1 :]
    has_claim_id = bool(slot_lines) and _CLAIM_ID_LINE.match(slot_lines[-1]) is not None
    if has_claim_id:
        slot_lines = slot_lines[:-1]
    job = parse_ad("\n".join(lines[:sep]))
    slot = parse_ad("\n".join(slot_lines))
    return ReplyFetchInput(job=job, slot=slot, has_claim_id=has_claim_id)


def get(ad: ClassAd, name: str, default: object = None) -> object:
    """Evaluate attribute `name` (case-insensitive) of `ad`; undefined or error gives `default`."""
    if name not in ad:
        return default
    try:
        value = ad.eval(name)
    except Exception:
        return default
    if isinstance(value, classad2.Value):
        return default
    return value


def get_str(ad: ClassAd, name: str) -> str | None:
    value = get(ad, name)
    return value if isinstance(value, str) else None


def get_int(ad: ClassAd, name: str) -> int | None:
    value = get(ad, name)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value == value and abs(value) < 2**62:
        return int(value)
    return None


def get_float(ad: ClassAd, name: str) -> float | None:
    value = get(ad, name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def get_bool(ad: ClassAd, name: str) -> bool | None:
    value = get(ad, name)
    return value if isinstance(value, bool) else None


def render_line(name: str, value: Value) -> str:
    """One `Name = value` line that reads back as exactly `value` and nothing else.

    classad2 prints the value; we check what it printed, because old-syntax strings cannot hold
    a newline (nor anything else a line reader splits on) and cannot end in a backslash, and
    classad2 prints those anyway. Short lines are remembered (the jobs of a cluster, and the
    ads a node fetches, repeat most of theirs).
    """
    kind = type(value).__name__
    if kind == "int" and not -(2**63) <= int(value) < 2**63:
        raise AdError(f"{name}: integer out of the ClassAd range")
    plain = kind == "int" or (kind == "str" and VERBATIM.fullmatch(str(value)) is not None)
    if plain and _NAME.match(name) and name.lower() not in PRIVATE_ATTRS:
        # nothing to escape: no need to ask classad2
        return f'{name} = "{value}"\n' if kind == "str" else f"{name} = {value}\n"
    if isinstance(value, str) and len(value) > _CACHED_VALUE:
        return _render_line(name, kind, value)
    return _render_line_cached(name, kind, value)


_CACHED_VALUE = 256  # characters: longer values are rendered every time
# Printable ASCII but `"` and `\`: text that is the same inside a ClassAd string literal (and a
# JSON string), with nothing to escape.
VERBATIM = re.compile(r'[ !#-\[\]-~]*')


def string_literal(text: str) -> str:
    """`text` as a ClassAd string literal (backslashes and double quotes escaped)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _render_line(name: str, kind: str, value: Value) -> str:
    """render_line's work; `kind` keeps an expression and a string of the same text apart."""
    if not _NAME.match(name) or name.lower() in PRIVATE_ATTRS:
        raise AdError(f"invalid attribute name {name!r}")
    ad = ClassAd()
    if isinstance(value, Expr):
        try:
            ad[name] = ExprTree(str(value))
        except Exception:
            raise AdError(f"{name}: invalid ClassAd expression") from None
    else:
        ad[name] = value
    line = ad.printOld()
    # A carriage return, U+0085, U+2028 ... end a line for many readers (Python's splitlines,
    # which the starter hooks use, among them): refuse them like a newline.
    if len(line.splitlines()) != 1 or not line.endswith("\n"):
        raise AdError(f"{name}: value cannot be written on one ClassAd line")
    back = classad2.parseNext(line, ParserType.Old)
    if back is None or list(back.keys()) != [name] or not _same(back, ad, name, value):
        raise AdError(f"{name}: value does not survive the old ClassAd syntax")
    return line


_render_line_cached = functools.lru_cache(maxsize=4096)(_render_line)


def _same(back: ClassAd, ad: ClassAd, name: str, value: Value) -> bool:
    if isinstance(value, Expr):
        return str(back.lookup(name)) == str(ad.lookup(name))
    got = back.eval(name)
    return type(got) is type(value) and got == value


def render_ad(attrs: dict[str, Value]) -> str:
    """Render a job ad for FETCH_WORK stdout; raises AdError if it cannot be sent safely."""
    text = "".join(render_line(n, v) for n, v in attrs.items())
    if len(text.encode("utf-8", "surrogateescape")) > MAX_JOB_AD_BYTES:
        raise AdError(f"job ad is larger than {MAX_JOB_AD_BYTES} bytes")
    return text


def sprint_ad(ad: ClassAd) -> str:
    """HTCondor's sPrintAd form: sorted `Name = value` lines, private attributes left out."""
    out = []
    for name in sorted(ad.keys()):
        if name.lower() in PRIVATE_ATTRS or name.lower().startswith("_condor_priv"):
            continue
        single = ClassAd()
        single[name] = ad.lookup(name)
        out.append(single.printOld())
    return "".join(out)


def expr_text(ad: ClassAd, name: str) -> str | None:
    """The unevaluated expression text of an attribute, or None."""
    if name not in ad:
        return None
    return str(ad.lookup(name))


def _excerpt(line: str, limit: int = 60) -> str:
    line = line.encode("ascii", "backslashreplace").decode("ascii")
    return line if len(line) <= limit else line[:limit] + "..."
