"""Submitting: a cluster of jobs (or a DAG's nodes' jobs) made from their specs and queued
through the door (backends.Door), SUBMIT_BATCH at a time, or as one template the database
makes every proc's row from; their input files stored with them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

from sqlalchemy import Connection, select

from jobstore.core.jobs import InputFile, Job, JobSpec, NodeJobs, ProcTemplate, Templated
from jobstore.core.states import Event, Status
from jobstore.db.backends import Door
from jobstore.db.channels import CHANNEL
from jobstore.db.reads import public_jobs
from jobstore.db.rows import event_row, note_event
from jobstore.db.sandbox import FileSource, SandboxFiles
from jobstore.db.schema import jobs
from jobstore.db.transactions import Transactions
from jobstore.errors import InvalidInput
from jobstore.formats.jobads import submitted_ad

SUBMIT_BATCH = 1000  # jobs per call of the door
HELD_AT_SUBMIT = "submitted on hold at user's request"  # condor_submit's HoldReason
Check = Callable[[Job], None]


class Submissions:
    """Queue clusters of jobs through the door."""

    def __init__(self, db: Transactions, door: Door, files: SandboxFiles) -> None:
        self.db = db
        self.door = door
        self.files = files

    def submit(self, specs: Sequence[JobSpec], *, owner: str, queue: str, max_attempts: int,
               submit_file: str | None = None, now: float | None = None,
               connection: Connection | None = None, idempotency_key: str | None = None,
               check: Check | None = None, home: str | None = None) -> tuple[int, list[int]]:
        """Insert one cluster of jobs, each with its `submit` event and its autocluster.
        Returns (cluster, job ids). Raises AdError when a spec's attributes cannot be stored (a
        reserved +Attr), ValueError for bad concurrency limits or accounting group names.

        With `connection` (the caller's, inside its own transaction on this database) the jobs
        are queued in that transaction: they commit or roll back with the caller's rows. With
        `idempotency_key`, a submit whose key was used before queues nothing and returns that
        cluster and its jobs. `check` is called on every job before it is inserted; what it
        raises rolls the whole submit back. The specs are read once, in order, SUBMIT_BATCH at
        a time (a lazy sequence, submit.expansion.SubmitSpecs, is never held whole). `home`:
        the access point whose `jobstore schedd` writes the outputs into each job's Iwd and
        its event log (None: spooled, the outputs wait in the store for transfer-data, and
        the process that commits each transition appends it to the log)."""
        now = now or time.time()
        with self.db.transaction(connection) as conn:
            cluster_id, new = self.door.new_cluster(
                conn, owner=owner, queue=queue, submit_file=submit_file, num_procs=len(specs),
                key=idempotency_key, now=now, home=home)
            if not new:  # queued before (or by a concurrent submit) with this key
                return cluster_id, list(conn.execute(
                    select(jobs.c.id).where(jobs.c.cluster_id == cluster_id)
                    .order_by(jobs.c.proc_id)).scalars())
            template = self._template(specs)
            ids: list[int] = []
            if template is not None:
                ids = self._queue_template(conn, template, [cluster_id], owner=owner,
                                           queue=queue, max_attempts=max_attempts, now=now,
                                           check=check)
            pending: Iterator[JobSpec] = iter(specs if template is None else ())
            shared: tuple[InputFile, ...] | None = None  # proc 0's inputs, stored for all
            while batch := list(islice(pending, SUBMIT_BATCH)):
                queued = [Job.queued(spec, id=0, cluster_id=cluster_id, owner=owner,
                                     queue=queue, ad=submitted_ad(spec),
                                     max_attempts=max_attempts, now=now) for spec in batch]
                if check is not None:
                    for job in queued:
                        check(job)
                queued = [_logged_at(job, home) for job in queued]
                ids.extend(self._queue(conn, queued, [spec.hold for spec in batch], now))
                for spec in batch:
                    if shared is None:
                        shared = spec.inputs
                    if spec.inputs and (spec.proc_id == 0 or spec.inputs != shared):
                        self._store_inputs(conn, cluster_id,
                                           None if spec.inputs == shared else spec.proc_id,
                                           owner, spec.inputs)
                    elif bool(spec.inputs) != bool(shared):
                        raise InvalidInput(f"proc {spec.proc_id} has "
                                           f"{'no ' if shared else ''}input files where proc 0 "
                                           f"has {'some' if shared else 'none'}: give every "
                                           "proc of a cluster its own or none")
            if ids:  # one wake-up for the followers (jobstore watch), not one per job
                self.db.backend.notify(conn, f"cluster:{cluster_id}", CHANNEL)
        return cluster_id, ids

    def submit_nodes(self, conn: Connection, groups: Sequence[NodeJobs],
                     clusters_of: Mapping[str, int], *, owner: str, queue: str,
                     max_attempts: int, now: float, check: Check | None,
                     home: str | None = None) -> None:
        """The jobs of a DAG's nodes, waiting, into their clusters (`clusters_of`, made with
        the DAG's nodes), in the DAG's transaction: a group's template made into rows by the
        database where it can, the others SUBMIT_BATCH jobs at a time. With `home`, their
        access point writes their event logs (UserLog in the ad alone), as `submit`'s."""
        for group in groups:
            template = self._node_template(group)
            if template is not None:
                self._queue_template(conn, template, [clusters_of[n] for n in group.names],
                                     owner=owner, queue=queue, max_attempts=max_attempts,
                                     now=now, check=check, status=Status.WAITING)
                continue
            batch: list[Job] = []
            for name, specs in zip(group.names, group.specs, strict=True):
                cluster_id = clusters_of[name]
                for spec in specs:
                    job = Job.queued(spec, id=0, cluster_id=cluster_id, owner=owner,
                                     queue=queue, ad=submitted_ad(spec),
                                     max_attempts=max_attempts, now=now,
                                     status=Status.WAITING.value)
                    if check is not None:
                        check(job)
                    batch.append(_logged_at(job, home))
                self._store_node_inputs(conn, cluster_id, owner, specs)
                if len(batch) >= SUBMIT_BATCH:
                    self._queue(conn, batch, [False] * len(batch), now)
                    batch = []
            if batch:
                self._queue(conn, batch, [False] * len(batch), now)

    def _queue(self, conn: Connection, batch: list[Job], held: list[bool],
               now: float) -> list[int]:
        """Queue `batch` through the door; keep its events for the commit listeners (the user
        log: the jobs that have one, or every job)."""
        ids = self.door.queue_jobs(conn, batch, held, now)
        every = self.db.listens_to_every_job()
        noted = [job_id for job_id, job in zip(ids, batch, strict=True) if every or job.user_log]
        if not noted:  # a bulk submit keeps no record per job otherwise
            return ids
        rows = {r.id: Job.from_row(r._mapping) for r in conn.execute(
            public_jobs().where(jobs.c.id.in_(noted)))}  # as the door queued them
        for job_id, job, hold in zip(ids, batch, held, strict=True):
            mine = rows.get(job_id)
            if mine is not None:
                note_event(conn, event_row(job_id, Event.SUBMIT, None, job.status, now,
                                           attempt=0), mine.but(status=job.status))
                if hold:
                    note_event(conn, event_row(
                        job_id, Event.HOLD, Status.IDLE, Status.HELD, now, attempt=0,
                        reason=HELD_AT_SUBMIT, attrs=_HOLD_ATTRS), mine)
        return ids

    def _store_inputs(self, conn: Connection, cluster_id: int, proc_id: int | None,
                      owner: str, inputs: Sequence[InputFile]) -> None:
        self.files.store_inputs(conn, cluster_id=cluster_id, proc_id=proc_id, owner=owner,
                                sources=[FileSource(f.name, f.source, f.mode) for f in inputs])

    def _store_node_inputs(self, conn: Connection, cluster_id: int, owner: str,
                           specs: Sequence[JobSpec]) -> None:
        """A node's inputs: the cluster's when its procs share them, else each proc's."""
        shared = all(spec.inputs == specs[0].inputs for spec in specs)
        for spec in specs[:1] if shared else specs:
            if spec.inputs:
                self._store_inputs(conn, cluster_id, None if shared else spec.proc_id, owner,
                                   spec.inputs)

    def _template(self, specs: Sequence[JobSpec]) -> ProcTemplate | None:
        """The specs as one ProcTemplate when the database can make their rows (the backend
        can; no commit listener needs a record per job: no user log, nobody listening to every
        job)."""
        if (not self.db.backend.makes_rows_on_server or not isinstance(specs, Templated)
                or self.db.listens_to_every_job()):
            return None
        template = specs.template()
        if template is None or template.spec.user_log or template.spec.inputs:
            return None
        return template

    def _node_template(self, group: NodeJobs) -> ProcTemplate | None:
        """A group's template, when the database can make its nodes' rows (as _template)."""
        template = group.template
        if (not self.db.backend.makes_rows_on_server or template is None
                or self.db.listens_to_every_job()):
            return None
        return None if template.spec.user_log or template.spec.inputs else template

    def _queue_template(self, conn: Connection, template: ProcTemplate, clusters: list[int],
                        *, owner: str, queue: str, max_attempts: int, now: float,
                        check: Check | None, status: Status = Status.IDLE) -> list[int]:
        """Queue the procs of `template` (the database makes their rows); `check` sees proc
        0 and a proc with every placeholder at its longest. `clusters`: the cluster, or each
        proc's own (a DAG's nodes: each a proc 0)."""

        def queued(spec: JobSpec) -> Job:
            return Job.queued(spec, id=0, cluster_id=clusters[0], owner=owner, queue=queue,
                              ad=submitted_ad(spec), max_attempts=max_attempts, now=now,
                              status=status.value)

        if check is not None:
            check(queued(template.spec_of(0)))
            check(queued(template.widest()))
        return self.door.queue_procs(conn, queued(template.spec), template, now,
                                     clusters=clusters if len(clusters) > 1 or status ==
                                     Status.WAITING else None, hold=template.spec.hold)


_HOLD_ATTRS: dict[str, Any] = {"HoldReasonCode": 15, "HoldReasonSubCode": 0}


def _logged_at(job: Job, home: str | None) -> Job:
    """`job` as it is queued: with a `home`, its access point writes its event log (the path
    stays in its ad, UserLog), so no committing process is given it (`user_log`)."""
    return job if home is None else job.but(user_log=None)


__all__ = ["HELD_AT_SUBMIT", "SUBMIT_BATCH", "Submissions"]
