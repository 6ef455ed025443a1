"""The old-ClassAd wire format as the startd and starter write and read it (protocol 3.1-3.4)."""

from __future__ import annotations

from typing import Literal

import classad2

PRIVATE_ATTRS = frozenset(
    {"capability", "childclaimids", "claimid", "claimidlist", "claimids", "transferkey"}
)


def is_private(name: str) -> bool:
    """True for attributes sPrintAd leaves out (compared case-insensitively)."""
    low = name.lower()
    return low in PRIVATE_ATTRS or low.startswith("_condor_priv")


def value_text(ad: classad2.ClassAd, name: str) -> str:
    """The old-syntax text of one attribute's expression."""
    single = classad2.ClassAd()
    single[name] = ad.lookup(name)
    line = single.printOld().rstrip("\n")
    return line.partition(" = ")[2]


def sprint_ad(ad: classad2.ClassAd) -> str:
    """Serialise like sPrintAd: `Name = value` lines sorted by name in byte order."""
    names = sorted((k for k in ad if not is_private(k)), key=lambda n: n.encode())
    return "".join(f"{name} = {value_text(ad, name)}\n" for name in names)


def parse_value(text: str) -> classad2.ExprTree | None:
    """Parse an old-syntax value (text after a complete expression is ignored)."""
    try:
        parsed = classad2.parseOne(f"V = {text}", classad2.ParserType.Old)
        return parsed.lookup("V")
    except Exception:
        return None


def insert_line(ad: classad2.ClassAd, line: str) -> bool:
    """ClassAd::Insert(const char*): `name = value`; False when the line is refused."""
    name, sep, value = line.partition("=")
    name = name.rstrip(" ")
    if not sep or not name or name.startswith("'"):
        return False
    expr = parse_value(value.lstrip(" "))
    if expr is None:
        return False
    try:
        ad[name] = expr
    except Exception:
        return False
    return True


def decode(data: bytes) -> str:
    return data.decode("utf-8", "replace")


FetchKind = Literal["none", "invalid", "job"]


def parse_fetch_output(data: bytes) -> tuple[FetchKind, classad2.ClassAd | None]:
    """FETCH_WORK stdout as the startd reads it (3.2)."""
    if not data:
        return "none", None
    ad = classad2.ClassAd()
    for raw in decode(data).split("\n"):
        line = raw.strip()
        if line and not insert_line(ad, line):
            return "invalid", None
    return "job", ad


def parse_prepare_output(data: bytes) -> classad2.ClassAd:
    """PREPARE_JOB stdout as the starter reads it (3.3): a bad line ends the parse."""
    ad = classad2.ClassAd()
    for raw in decode(data).split("\n"):
        line = raw.strip()
        if line and not insert_line(ad, line):
            break
    return ad


def parse_job_ad(text: str) -> classad2.ClassAd:
    """The starter reading the job ad from the startd (3.4): bad lines are ignored."""
    ad = classad2.ClassAd()
    for raw in text.split("\n"):
        line = raw.strip()
        if line and not line.startswith("#"):
            insert_line(ad, line)
    return ad


def copy_ad(ad: classad2.ClassAd) -> classad2.ClassAd:
    out = classad2.ClassAd()
    for name in ad:
        out[name] = ad.lookup(name)
    return out


def eval_attr(ad: classad2.ClassAd, name: str, target: classad2.ClassAd | None = None) -> object:
    """Evaluate attribute `name` with MY = ad and TARGET = target; None if absent."""
    if name not in ad:
        return None
    try:
        return ad.lookup(name).eval(ad, target)
    except Exception:
        return None


def eval_expr(text: str, my: classad2.ClassAd, target: classad2.ClassAd | None = None) -> object:
    try:
        return classad2.ExprTree(text).eval(my, target)
    except Exception:
        return None


def as_number(value: object) -> float | None:
    """A ClassAd int/real result as a float; None for anything else (undefined, error, ...)."""
    if type(value) in (int, float):
        return float(value)  # type: ignore[arg-type]
    return None


def to_dict(ad: classad2.ClassAd) -> dict[str, object]:
    """Evaluated attribute values (expressions that do not evaluate stay as text)."""
    out: dict[str, object] = {}
    for name in ad:
        value = eval_attr(ad, name)
        if type(value) in (bool, int, float, str):
            out[name] = value
        else:
            out[name] = value_text(ad, name)
    return out
