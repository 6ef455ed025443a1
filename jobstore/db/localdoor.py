"""The door into the queue where the database has none of its own (a SQLite store, one user's:
its file's owner and root, jobstore.db.engine): this package writes what PostgreSQL's functions
write there (migration 0019), with the same checks of the values where they matter to a reader
(formats.jobads refuses the reserved attributes before anything is stored)."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, bindparam, insert, select, update

from jobstore.core import holds, policy
from jobstore.core.jobs import Job, ProcTemplate
from jobstore.core.states import STATUS_OF, Event, Status, decide
from jobstore.db.backends import ACTED, VACATES, Change, DagSettings, InputFile
from jobstore.db.dagengine import DagEngine
from jobstore.db.negotiator import Negotiator
from jobstore.db.rows import event_row, note_event
from jobstore.db.schema import (
    clusters,
    job_events,
    job_files,
    jobs,
    sandbox_chunks,
    sandbox_files,
    submitters,
    vacate_requests,
)
from jobstore.db.transactions import Transactions
from jobstore.db.transitions import Outcome, Transitions, event_reason, transition_values
from jobstore.db.transitions import winding_down as still_winding_down
from jobstore.errors import InvalidInput, RowChanged
from jobstore.formats.edits import edit_changes

HELD_AT_SUBMIT = "submitted on hold at user's request"  # condor_submit's HoldReason
# What PostgreSQL's door takes as an account and a queue (jobstore_new_cluster)
ACCOUNT = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
QUEUE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,63}")
# An access point's name (JOBSTORE_SCHEDD_NAME: a host name, or name@host as SCHEDD_NAME)
ACCESS_POINT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,254}")
EDITABLE = (Status.IDLE.value, Status.HELD.value)
_WAITING = (Status.IDLE, Status.HELD)
VACATABLE = (Status.ACCEPTED.value, Status.RUNNING.value)  # a job with a starter


def job_row(job: Job) -> dict[str, Any]:
    """The columns of `job` as a submit inserts them (the id comes from the table)."""
    from jobstore.core.jobs import JOB_COLUMNS

    return {name: getattr(job, name) for name in JOB_COLUMNS if name != "id"}


class LocalDoor:
    """jobstore.db.backends.Door written by this package (a SQLite store)."""

    def __init__(self, db: Transactions, transitions: Transitions,
                 negotiator: Negotiator) -> None:
        self.db = db
        self.transitions = transitions
        self.negotiator = negotiator
        self.dags = DagEngine(transitions, self._remove_jobs)

    # ---- submitting ----------------------------------------------------------------------

    def new_cluster(self, conn: Connection, *, owner: str, queue: str,
                    submit_file: str | None, num_procs: int, key: str | None,
                    now: float, home: str | None = None) -> tuple[int, bool]:
        if not ACCOUNT.fullmatch(owner):
            raise InvalidInput(f"{owner!r} is not an account jobs may run as")
        if not QUEUE.fullmatch(queue):
            raise InvalidInput(f"{queue!r} is not a queue name")
        _check_home(home)
        row = {"owner": owner, "queue": queue, "submit_file": submit_file,
               "num_procs": num_procs, "submitted_at": now, "home": home}
        if key is None:
            return int(conn.execute(insert(clusters).values(row)
                                    .returning(clusters.c.id)).scalar_one()), True
        new = self.db.backend.insert_missing(conn, clusters, {**row, "idempotency_key": key},
                                             ["owner", "idempotency_key"])
        found = conn.execute(select(clusters.c.id).where(
            clusters.c.owner == owner, clusters.c.idempotency_key == key)).scalar_one()
        return int(found), new

    def queue_jobs(self, conn: Connection, jobs_: Sequence[Job], held: Sequence[bool],
                   now: float) -> list[int]:
        if not jobs_:
            return []
        groups = self.negotiator.register(conn, jobs_, now)
        rows = [job_row(job.but(autocluster_id=ac,
                                periodic=policy.has_periodic(job.ad) or None))
                for job, ac in zip(jobs_, groups, strict=True)]
        ids = self.db.backend.insert_numbered(conn, jobs, rows, staged=False)
        self.db.backend.insert_rows(conn, job_events, [
            event_row(i, Event.SUBMIT, None, job.status, now, attempt=0)
            for i, job in zip(ids, jobs_, strict=True)], staged=False)
        on_hold = [i for i, hold in zip(ids, held, strict=True) if hold]
        if on_hold:
            conn.execute(update(jobs).where(self.transitions.id_in(on_hold)).values(
                status=Status.HELD.value, reason=HELD_AT_SUBMIT,
                hold_code=holds.SUBMITTED_ON_HOLD, hold_subcode=0, num_holds=1,
                updated_at=now))
            self.db.backend.insert_rows(conn, job_events, [
                event_row(i, Event.HOLD, Status.IDLE, Status.HELD, now, attempt=0,
                          reason=HELD_AT_SUBMIT,
                          attrs={"HoldReasonCode": holds.SUBMITTED_ON_HOLD,
                                 "HoldReasonSubCode": 0}) for i in on_hold], staged=False)
        return ids

    def queue_procs(self, conn: Connection, job: Job, template: ProcTemplate, now: float, *,
                    clusters: list[int] | None, hold: bool) -> list[int]:
        raise InvalidInput("this database does not make a templated cluster's rows itself")

    def store_file(self, conn: Connection, owner: str, sha256: str, size: int) -> bool:
        return self.db.backend.insert_missing(conn, sandbox_files, {
            "owner": owner, "sha256": sha256, "size": size, "created_at": time.time()})

    def store_chunk(self, conn: Connection, owner: str, sha256: str, seq: int,
                    data: bytes) -> None:
        conn.execute(insert(sandbox_chunks).values(owner=owner, sha256=sha256, seq=seq,
                                                   data=data))

    def add_inputs(self, conn: Connection, cluster_id: int, proc_id: int | None,
                   files: Sequence[InputFile]) -> None:
        owner = conn.execute(select(clusters.c.owner).where(clusters.c.id == cluster_id)
                             ).scalar_one()
        sizes = dict(conn.execute(select(sandbox_files.c.sha256, sandbox_files.c.size).where(
            sandbox_files.c.owner == owner,
            sandbox_files.c.sha256.in_([f.sha256 for f in files]))).all())
        now = time.time()
        conn.execute(insert(job_files), [
            {"cluster_id": cluster_id, "proc_id": proc_id, "direction": "in", "name": f.name,
             "owner": owner, "sha256": f.sha256, "size": sizes[f.sha256], "mode": f.mode,
             "attempt": None, "created_at": now} for f in files])

    # ---- acting on jobs ------------------------------------------------------------------

    def act(self, conn: Connection, ids: Sequence[int], event: str, reason: str | None,
            hold: tuple[int, int], *, skip_locked: bool, now: float) -> list[Change]:
        """Each job of `ids` (one writer at a time: nothing to skip or deny), waiting ones
        changed in one UPDATE per kind of change, handed-out ones through the one-job
        transition, which stops their attempt."""
        page = self.db.backend.jobs_of(conn, ids)
        if event in VACATES:
            return self._vacate(conn, sorted(page, key=lambda j: j.id), event, reason, now)
        out = [_change(outcome, ACTED) for outcome in
               self._act_page(conn, sorted(page, key=lambda j: j.id), Event(event), reason,
                              hold, now)]
        return out

    def _act_page(self, conn: Connection, page: list[Job], event: Event, reason: str | None,
                  hold: tuple[int, int], now: float) -> list[Outcome]:
        out: list[Outcome] = []
        groups: dict[tuple[str, tuple[tuple[str, Any], ...]], list[Job]] = {}
        events: list[dict[str, Any]] = []
        every = self.db.listens_to_every_job()
        for job in page:
            before = STATUS_OF[job.status]
            if (before not in _WAITING or still_winding_down(job, now)
                    or job.release_pending):
                out.append(self.transitions.apply(conn, job, event, decide_args={}, now=now,
                                                  reason=reason, record_ignored=False,
                                                  hold=hold))
                continue
            d = decide(event, before, attempts=job.attempts, max_attempts=job.max_attempts)
            why = event_reason(reason, d)
            if d.to_status is None:
                out.append(Outcome(job.id, event, before, before, False, reason=why))
                continue
            values, attrs = transition_values(job, d, now, why, hold=hold)
            groups.setdefault((before.value, tuple(sorted(values.items()))), []).append(job)
            row = event_row(job.id, event, before, d.to_status, now, attempt=job.claims,
                            reason=why, attrs=attrs)
            events.append(row)
            if job.user_log or every:
                note_event(conn, row, job)
            out.append(Outcome(job.id, event, before, d.to_status, True, reason=why))
        for (status, columns), group in groups.items():
            group_ids = [j.id for j in group]
            change = (update(jobs).where(self.transitions.id_in(group_ids),
                                         jobs.c.status == status).values(dict(columns)))
            if conn.execute(change).rowcount != len(group_ids):
                raise RowChanged(f"{len(group_ids)} jobs changed under their {event}")
        self.transitions.insert_events(conn, events)
        return out

    def _vacate(self, conn: Connection, page: list[Job], event: str, reason: str | None,
                now: float) -> list[Change]:
        """condor_vacate_job: a request for the current attempt of each accepted or running
        job (not stopped), recorded as its event; the others left as they were."""
        fast = event == VACATES[1]
        out, events = [], []
        every = self.db.listens_to_every_job()
        for job in page:
            if job.status not in VACATABLE or job.winding_down_until is not None:
                out.append(Change(job.id, event, job.status, None, job.claims, None, None,
                                  False, ACTED))
                continue
            old = conn.execute(select(vacate_requests.c.attempt, vacate_requests.c.fast)
                               .where(vacate_requests.c.job_id == job.id)).first()
            if old is not None and old.attempt == job.claims and (old.fast or not fast):
                out.append(Change(job.id, event, job.status, None, job.claims, None, None,
                                  True, ACTED))  # asked already: nothing new to record
                continue
            self.db.backend.upsert(conn, vacate_requests, [
                {"job_id": job.id, "attempt": job.claims, "fast": fast, "requested_at": now}],
                "job_id", ("attempt", "fast", "requested_at"))
            row = event_row(job.id, event, job.status, None, now, attempt=job.claims,
                            slot=job.slot, host=job.host, reason=reason)
            events.append(row)
            if job.user_log or every:
                note_event(conn, row, job)
            out.append(Change(job.id, event, job.status, None, job.claims, reason, None, True,
                              ACTED))
        self.transitions.insert_events(conn, events)
        return out

    def _remove_jobs(self, conn: Connection, cluster_ids: list[int], now: float,
                     why: str) -> None:
        """The unfinished jobs of DAG nodes removed, as `jobstore rm` would, in `conn`."""
        ids = list(conn.execute(select(jobs.c.id).where(
            jobs.c.cluster_id.in_(cluster_ids), jobs.c.phase != "done")
            .order_by(jobs.c.id)).scalars())
        if ids:
            self.act(conn, ids, Event.REMOVE.value, why, (holds.USER_REQUEST, 0),
                     skip_locked=False, now=now)

    def edit(self, conn: Connection, ids: Sequence[int], name: str, text: str,
             edited: Sequence[Job], *, skip_locked: bool, now: float) -> list[Change]:
        page = sorted(self.db.backend.jobs_of(conn, ids), key=lambda j: j.id)
        waiting = [job for job in page if job.status in EDITABLE]
        out = [Change(job.id, "edit", job.status, None, job.claims, None, None, False, ACTED)
               for job in page if job.status not in EDITABLE]
        if not waiting:
            return out
        changes = [edit_changes(job, name, text) for job in waiting]
        new_jobs = [job.but(**c) for job, c in zip(waiting, changes, strict=True)]
        rows, events = [], []
        every = self.db.listens_to_every_job()
        for job, change, ac in zip(waiting, changes,
                                   self.negotiator.register(conn, new_jobs, now), strict=True):
            new = job.but(**change)
            change.update(autocluster_id=ac, updated_at=now,
                          periodic=policy.has_periodic(new.ad) or None)
            rows.append({"edited_id": job.id, **{f"new_{k}": v for k, v in change.items()}})
            row = event_row(job.id, "edit", job.status, None, now, attempt=job.claims,
                            reason=f"{name} = {text}", attrs={name: text})
            events.append(row)
            if job.user_log or every:
                note_event(conn, row, job)
            out.append(Change(job.id, "edit", job.status, None, job.claims, row["reason"],
                              row["attrs"], True, ACTED))
        columns = {k: bindparam(f"new_{k}", type_=jobs.c[k].type) for k in changes[0]}
        conn.execute(update(jobs).where(jobs.c.id == bindparam("edited_id"))
                     .values(columns), rows)
        self.transitions.insert_events(conn, events)
        return out

    def set_factor(self, conn: Connection, name: str, factor: float) -> bool:
        if not factor >= 1.0:
            raise InvalidInput("a priority factor must be at least 1")
        done = conn.execute(update(submitters).where(submitters.c.name == name)
                            .values(factor=factor))
        return bool(done.rowcount)

    def reset_usage(self, conn: Connection, name: str | None, now: float) -> int:
        from jobstore.core import fairshare

        q = update(submitters).values(usage=0.0, priority=fairshare.MIN_PRIORITY,
                                      first_usage=None, updated_at=now)
        if name is not None:
            q = q.where(submitters.c.name == name)
        return int(conn.execute(q).rowcount)

    # ---- DAGs ----------------------------------------------------------------------------

    def new_dag(self, conn: Connection, *, owner: str, queue: str, path: str,
                batch_name: str | None, max_jobs: int | None, max_idle: int | None,
                attrs: Mapping[str, str], now: float, home: str | None = None) -> int:
        _check_home(home)
        return self.dags.new_dag(conn, owner=owner, queue=queue, path=path,
                                 batch_name=batch_name, max_jobs=max_jobs, max_idle=max_idle,
                                 attrs=attrs, now=now, home=home)

    def dag_nodes(self, conn: Connection, dag_id: int, nodes: Sequence[Mapping[str, Any]],
                  edges: Sequence[tuple[str, str]], categories: Mapping[str, int],
                  now: float) -> dict[str, int]:
        return self.dags.dag_nodes(conn, dag_id, nodes, edges, categories, now)

    def dag_settings(self, conn: Connection, dag_id: int, settings: DagSettings) -> None:
        self.dags.dag_settings(conn, dag_id, settings)

    def start_dag(self, conn: Connection, dag_id: int, now: float) -> list[Change]:
        return self.dags.start_dag(conn, dag_id, now)

    def pause_dag(self, conn: Connection, dag_id: int, held: bool, now: float) -> list[Change]:
        return self.dags.pause_dag(conn, dag_id, held, now)

    def remove_dag(self, conn: Connection, dag_id: int, why: str, now: float) -> list[Change]:
        return self.dags.remove_dag(conn, dag_id, why, now)

    def jobs_ended(self, conn: Connection, job_ids: list[int], now: float, *,
                   nodes: bool = False) -> None:
        self.dags.jobs_ended(conn, job_ids, now, nodes=nodes)

    def node_job_started(self, conn: Connection, job: Job, now: float) -> None:
        self.dags.node_job_started(conn, job, now)

    def script_start(self, conn: Connection, dag_id: int, name: str, kind: str, token: str,
                     now: float) -> bool:
        return self.dags.script_start(conn, dag_id, name, kind, token, now)

    def script_defer(self, conn: Connection, dag_id: int, name: str, kind: str, token: str,
                     until: float) -> bool:
        return self.dags.script_defer(conn, dag_id, name, kind, token, until)

    @staticmethod
    def free_nodes(conn: Connection, keys: Sequence[tuple[int, str]], *,
                   dags_too: bool = False) -> set[tuple[int, str]]:
        return set(keys)  # one writer at a time: nobody else holds a row

    def hold_start(self, conn: Connection, dag_id: int, name: str, token: str,
                   now: float) -> bool:
        return self.dags.hold_start(conn, dag_id, name, token, now)

    def hold_done(self, conn: Connection, dag_id: int, name: str, token: str) -> bool:
        return self.dags.hold_done(conn, dag_id, name, token)

    def dag_script_options(self, conn: Connection, dag_id: int,
                           options: Mapping[str, Any]) -> None:
        self.dags.script_options(conn, dag_id, options)

    def script_done(self, conn: Connection, dag_id: int, name: str, kind: str, token: str,
                    code: int, now: float) -> None:
        self.dags.script_done(conn, dag_id, name, kind, token, code, now)


def _change(outcome: Outcome, kind: str) -> Change:
    """An Outcome as a Change: the event it wrote (None when nothing changed)."""
    changed = outcome.changed
    return Change(outcome.job_id, outcome.event, outcome.before,
                  outcome.after if changed else None, None, outcome.reason, None,
                  outcome.pending, kind)


def _check_home(home: str | None) -> None:
    """InvalidInput for a home that is not the name of an access point (as the door's)."""
    if home is not None and not ACCESS_POINT.fullmatch(home):
        raise InvalidInput(f"{home!r} is not the name of an access point")
