"""The attempts this node's slots run, as the agent saw them handed out: so that it can vacate
the slot of one the job store stopped (held, removed, given to another slot)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from jobstore.formats import classads
from jobstore.formats.jobads import ATTR_ATTEMPT, ATTR_JOB_ID


@dataclass(frozen=True)
class Attempt:
    slot: str
    job_id: int
    attempt: int
    keyword: str | None


class Attempts:
    """Thread-safe: the hook workers add and drop, the watcher reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_job: dict[int, Attempt] = {}

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
        seen = Attempt(slot, job_id, attempt, classads.get_str(job, "HookKeyword"))
        with self._lock:
            self._by_job[job_id] = seen
        return seen

    def ended(self, stdin: bytes, *, reply_fetch: bool = False) -> None:
        """Forget the attempt of a job whose JOB_EXIT (its job ad) or REPLY_FETCH reject (job ad,
        `-----`, slot ad) came."""
        try:
            text = classads.decode(stdin)
            job = classads.split_reply_fetch(text).job if reply_fetch else classads.parse_ad(text)
            job_id = classads.get_int(job, ATTR_JOB_ID)
        except classads.AdError:
            return
        if job_id is not None:
            self.drop(job_id)

    def drop(self, job_id: int) -> None:
        with self._lock:
            self._by_job.pop(job_id, None)

    def snapshot(self) -> list[Attempt]:
        with self._lock:
            return list(self._by_job.values())
