"""What a slot offers and how a candidate job is judged: plain data, no database."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Offer:
    """What a slot can give a job: CPUs, memory in MiB, disk in KiB."""

    cpus: int
    memory: int
    disk: int


@dataclass(frozen=True)
class Verdict:
    """A candidate job judged for a slot: take it, skip it, or put it on hold with a reason."""

    take: bool = False
    hold_reason: str | None = None


@dataclass(frozen=True)
class ClaimRequest:
    queue: str
    offer: Offer
    slot: str
    host: str | None
    keyword: str
    claim_lease: int
    scan_limit: int = 200
    batch: int = 16
