"""The attempts this node's slots run, as the agent saw them handed out (or found them in the
job store after a restart): so that it can vacate the slot of one the job store stopped (held,
removed, given to another slot)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from jobstore.formats import classads
from jobstore.formats.jobads import ATTR_ATTEMPT, ATTR_JOB_ID, ATTR_TOKEN, ad_job_id


@dataclass(frozen=True)
class Attempt:
    slot: str
    job_id: int
    attempt: int
    keyword: str | None
    max_vacate_time: int | None = None  # the job's JobMaxVacateTime, when it has one
    name: str = ""  # CLUSTER.PROC, as condor_q numbers the job
    token: str | None = field(default=None, repr=False, compare=False)  # the attempt's secret
    seq: int = field(default=0, compare=False)  # its FETCH_WORK's order here (0: restored)


class Attempts:
    """Thread-safe: the hook workers add and drop, the watcher reads and marks the ones whose
    slot it asked to vacate gracefully."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_job: dict[int, Attempt] = {}
        self._vacating: dict[int, float] = {}  # job id -> when a graceful vacate was asked
        self._seq = 0

    def fetched(self, slot_ad: bytes, job_ad: bytes) -> Attempt | None:
        """Remember the attempt a FETCH_WORK answer (`job_ad`) gave the slot of `slot_ad`."""
        try:
            slot = classads.get_str(classads.parse_ad(classads.decode(slot_ad)), "Name")
            job = classads.parse_ad(classads.decode(job_ad))
        except classads.AdError:
            return None
        job_id, attempt = classads.get_int(job, ATTR_JOB_ID), classads.get_int(job, ATTR_ATTEMPT)
        if not slot or job_id is None or attempt is None:
            return None
        with self._lock:
            self._seq += 1
            seen = Attempt(slot, job_id, attempt, classads.get_str(job, "HookKeyword"),
                           classads.get_int(job, "JobMaxVacateTime"), ad_job_id(job),
                           classads.get_str(job, ATTR_TOKEN), self._seq)
            self._by_job[job_id] = seen
            self._vacating.pop(job_id, None)
        return seen

    def restore(self, found: Iterable[Attempt]) -> int:
        """Add attempts found in the job store (oldest first): the newest one per slot, unless
        this agent already knows one of that job or that slot. How many were added."""
        newest: dict[str, Attempt] = {}
        for a in found:
            newest[a.slot] = a
        added = 0
        with self._lock:
            slots = {a.slot for a in self._by_job.values()}
            for a in newest.values():
                if a.job_id not in self._by_job and a.slot not in slots:
                    self._by_job[a.job_id] = a
                    added += 1
        return added

    def ended(self, stdin: bytes, *, reply_fetch: bool = False, trusted: bool = False,
              ) -> Attempt | None:
        """Forget the attempt of a job whose JOB_EXIT (its job ad) or REPLY_FETCH reject (job ad,
        `-----`, slot ad) came: the attempt it names, and, unless the caller is a service
        account (`trusted`), only with that attempt's token, so that another account's forged
        JOB_EXIT cannot take a job out of the watch. The attempt forgotten, if one was."""
        try:
            text = classads.decode(stdin)
            job = classads.split_reply_fetch(text).job if reply_fetch else classads.parse_ad(text)
            job_id = classads.get_int(job, ATTR_JOB_ID)
            attempt = classads.get_int(job, ATTR_ATTEMPT)
            token = classads.get_str(job, ATTR_TOKEN)
        except classads.AdError:
            return None
        with self._lock:
            known = self._by_job.get(job_id) if job_id is not None else None
            if known is None or known.attempt != attempt:
                return None
            if not trusted and (known.token is None or token is None
                                or not secrets.compare_digest(token, known.token)):
                return None
            self._drop(known.job_id)
            return known

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_job)

    def drop(self, job_id: int) -> None:
        with self._lock:
            self._drop(job_id)

    def _drop(self, job_id: int) -> None:
        self._by_job.pop(job_id, None)
        self._vacating.pop(job_id, None)

    def vacating_since(self, job_id: int) -> float | None:
        with self._lock:
            return self._vacating.get(job_id)

    def vacating(self, job_id: int, since: float) -> None:
        with self._lock:
            if job_id in self._by_job:
                self._vacating[job_id] = since

    def vacating_any(self) -> bool:
        with self._lock:
            return bool(self._vacating)

    def superseded(self, a: Attempt) -> Attempt | None:
        """A later attempt this agent handed the slot of `a` (another job's, or a later one of
        the same job): the slot no longer runs only `a`, and is not vacated for it."""
        with self._lock:
            return next((b for b in self._by_job.values()
                         if b.slot == a.slot and b.seq > a.seq and b.job_id != a.job_id), None)

    def snapshot(self) -> list[Attempt]:
        with self._lock:
            return list(self._by_job.values())
