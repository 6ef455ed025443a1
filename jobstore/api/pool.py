"""The pool's slots as the nodes' agents published them: `jobstore status` (condor_status) and
`jobstore q -better-analyze` (how many slots a job matches, and which clause of its
Requirements rules the others out)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from classad2 import ClassAd, ExprTree

from jobstore.db.constraint import matches as constraint_matches
from jobstore.db.store import JobStore
from jobstore.errors import AdError
from jobstore.formats.classads import parse_ad
from jobstore.formats.matching import attribute_true, slot_offer

__all__ = ["slot_ads", "Analysis", "analyze", "requirement_clauses"]


def slot_ads(store: JobStore, constraint: str | None = None) -> Iterator[ClassAd]:
    """The live slots' ads (not expired), by name; those `constraint` is true for."""
    expr = ExprTree(constraint) if constraint else None
    for row in store.slots.live_slots():
        try:
            ad = parse_ad(row.ad)
        except AdError:
            continue
        ad["LastHeardFrom"] = int(row.updated_at)
        if expr is None or constraint_matches(expr, ad):
            yield ad


def requirement_clauses(job: ClassAd) -> list[str]:
    """The top-level `&&` conjuncts of the job's Requirements, as text."""
    if "Requirements" not in job:
        return []
    text = str(job.lookup("Requirements")).strip()
    while text.startswith("(") and next(
            (i for i, c, depth in _unquoted(text) if c == ")" and depth == 0), -1) == len(text) - 1:
        text = text[1:-1].strip()
    out, start = [], 0
    for i, c, depth in _unquoted(text):
        if c == "&" and depth == 0 and text.startswith("&&", i) and i >= start:
            out.append(text[start:i].strip())
            start = i + 2
    out.append(text[start:].strip())
    return [c for c in out if c]


def _unquoted(text: str) -> Iterator[tuple[int, str, int]]:
    """Each character of `text` outside string literals: its index, itself and the bracket
    depth after it."""
    depth, quoted, i = 0, False, 0
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        else:
            depth += (c in "([{") - (c in ")]}")
            yield i, c, depth
        i += 1


@dataclass
class Analysis:
    """condor_q -better-analyze's figures for one job against the known slots."""

    slots: int = 0
    matched: int = 0  # both sides willing and room for the request
    rejected_by_job: int = 0  # the job's Requirements are not true for the slot
    rejected_by_slot: int = 0  # the slot's START / Requirements are not true for the job
    too_small: int = 0  # willing both ways, but the slot has less than the job requests
    clauses: list[tuple[str, int]] = field(default_factory=list)  # clause, slots it matches


def analyze(job: ClassAd, slots: list[ClassAd]) -> Analysis:
    """How the job fares against `slots`."""
    out = Analysis(slots=len(slots))
    clauses = requirement_clauses(job)
    counts = [0] * len(clauses)
    for slot in slots:
        for i, clause in enumerate(clauses):
            if _true(clause, job, slot):
                counts[i] += 1
        if not attribute_true(job, "Requirements", slot):
            out.rejected_by_job += 1
        elif not (attribute_true(slot, "Requirements", job)
                  and attribute_true(slot, "Start", job)):  # a slot without them takes any
            out.rejected_by_slot += 1
        elif not _fits(job, slot):
            out.too_small += 1
        else:
            out.matched += 1
    out.clauses = list(zip(clauses, counts, strict=True))
    return out


def _true(clause: str, job: ClassAd, slot: ClassAd) -> bool:
    try:
        return ExprTree(clause).eval(scope=job, target=slot) is True
    except Exception:
        return False


def _fits(job: ClassAd, slot: ClassAd) -> bool:
    offer = slot_offer(slot)
    if offer is None:
        return False
    want = [job.get(n, 0) for n in ("RequestCpus", "RequestMemory", "RequestDisk")]
    have = [offer.cpus, offer.memory, offer.disk]
    return all(not isinstance(w, int | float) or w <= h for w, h in zip(want, have, strict=True))
