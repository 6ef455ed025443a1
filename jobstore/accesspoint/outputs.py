"""Outputs home: each completed job submitted from this access point (not spooled) has the
outputs its JOB_EXIT sent written into its Iwd, with its remaps, as its owner, once."""

from __future__ import annotations

import logging
import os
import pwd
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from jobstore.accesspoint.service import refusal, serving_account
from jobstore.api.retrieve import write_outputs
from jobstore.core.jobs import Job
from jobstore.db.store import JobStore
from jobstore.errors import ConfigError, DatabaseError
from jobstore.node import config

LOG = logging.getLogger("jobstore.schedd")
LEASE = 300.0  # seconds a service holds a job's delivery before another may take it
RETRY = 60.0  # seconds before a delivery that failed is tried again (then twice as long)
SLACK = 60.0  # a job's finished_at may be this much older than its commit
RESCAN = 3600.0  # seconds between looks at every completed job of this access point


@dataclass
class OutputsHome:
    """Delivers the outputs of the jobs whose home is `name`; as root, every owner's (each
    as herself), else only this account's."""

    store: JobStore
    name: str
    settings: config.Settings
    clock: Callable[[], float] = time.time
    delivered: int = 0
    failed: int = 0
    _since: float = 0.0
    _full_at: float = 0.0
    _owner: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._owner = serving_account()
        if self._owner is not None:
            return
        mine = self.store.db.backend.local_owner()
        if mine is not None:  # whoever may write the file may write any row
            raise ConfigError(f"the job store is {mine}'s SQLite file: serve it as {mine} "
                              "(`jobstore schedd` started as root becomes its owner)")

    def pass_once(self) -> int:
        """Deliver every job due now; returns how many were delivered."""
        start = self.clock()
        full = start >= self._full_at
        since = 0.0 if full else self._since
        done = 0
        while jobs := self.store.deliveries.due(self.name, start, owner=self._owner,
                                                since=since):
            taken = [job for job in _by_turns(jobs) if self.store.deliveries.take(
                job, self.name, self.clock(), LEASE)]
            done += sum(self._deliver(job) for job in taken)
            if not taken:
                break
        self._since = start - SLACK
        if full:
            self._full_at = start + RESCAN
        return done

    def _deliver(self, job: Job) -> bool:
        """Write `job`'s outputs and record how it went; whatever its row holds, never raise
        but a database that is away."""
        reason = refusal(job.owner, self._owner, self.settings)
        written = 0
        try:
            if reason is None:
                written = len(write_outputs(self.store, job))
        except DatabaseError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever a job's ad holds, the next job
            reason = " ".join(str(exc).split()) or type(exc).__name__
        try:
            if reason is None:
                self.store.deliveries.delivered(job.id, written, self.clock())
            else:
                self.store.deliveries.failed(job.id, reason, self.clock(), RETRY)
        except DatabaseError:
            raise
        except Exception as exc:  # noqa: BLE001 - a record that cannot be updated (SQLite)
            LOG.warning("job %s.%s: its delivery cannot be recorded: %s", job.cluster_id,
                        job.proc_id, " ".join(str(exc).split()))
            return False
        if reason is not None:
            self.failed += 1
            LOG.warning("job %s.%s: outputs not written home: %s", job.cluster_id,
                        job.proc_id, reason)
            return False
        self.delivered += 1
        LOG.info("job %s.%s: %d output(s) written home, %.3f s after its JOB_EXIT began",
                 job.cluster_id, job.proc_id, written, self.clock() - (job.finished_at or 0.0))
        return True


def _by_turns(jobs: list[Job]) -> list[Job]:
    """`jobs` (oldest first) taken one owner's at a time in turn: one owner's many jobs keep
    no other owner's waiting behind all of them."""
    queues: dict[str, list[Job]] = {}
    for job in jobs:
        queues.setdefault(job.owner, []).append(job)
    out: list[Job] = []
    while queues:
        for owner in list(queues):
            out.append(queues[owner].pop(0))
            if not queues[owner]:
                del queues[owner]
    return out


def become(owner: str) -> None:
    """Take `owner`'s account for the rest of this process (root only): her groups, gid and
    uid, real and saved too."""
    user = pwd.getpwnam(owner)
    os.initgroups(owner, user.pw_gid)
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
