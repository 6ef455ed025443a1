"""What a slot offers, how a candidate job is judged, and what a claim asks for: plain data."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from jobstore.core import holds


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
    hold_code: int = holds.FAILED_TO_ACCESS_USER_ACCOUNT  # with hold_reason: HoldReasonCode


@dataclass(frozen=True)
class ClaimRequest:
    """One fetch: the slot, what it offers, and the negotiator's policy for this claim."""

    queue: str
    offer: Offer
    slot: str
    host: str | None
    keyword: str
    claim_lease: int
    # The slot ad's shape (jobstore.formats.matching.slot_shape): verdicts about autoclusters
    # are remembered per shape; None judges every autocluster afresh.
    shape: str | None = None
    partitionable: bool = False  # a partitionable slot: a job holds its RequestCpus
    weight: float = 1.0  # SLOT_WEIGHT of a static slot: what a job that takes it holds
    fair_share: bool = True
    # A concurrency limit's maximum (jobstore.core.limits.maximum); None: limits not enforced.
    limit: Callable[[str], float] | None = None


class VerdictCache:
    """Verdicts about autoclusters, by (slot shape, autocluster), each kept for `ttl` seconds (a
    slot's START may change with its load or the time), the oldest dropped beyond `size`."""

    def __init__(self, ttl: float = 60.0, size: int = 100_000) -> None:
        self.ttl = ttl
        self.size = size
        self._entries: OrderedDict[tuple[str, int], tuple[float, Verdict]] = OrderedDict()

    def get(self, shape: str | None, autocluster: int, now: float | None = None) -> Verdict | None:
        if shape is None:
            return None
        entry = self._entries.get((shape, autocluster))
        if entry is None:
            return None
        if entry[0] < (time.monotonic() if now is None else now):
            self._entries.pop((shape, autocluster), None)
            return None
        return entry[1]

    def put(
        self, shape: str | None, autocluster: int, verdict: Verdict, now: float | None = None
    ) -> None:
        if shape is None or verdict.hold_reason:
            return
        key = (shape, autocluster)
        self._entries[key] = ((time.monotonic() if now is None else now) + self.ttl, verdict)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
