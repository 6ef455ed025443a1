"""The door into the queue on PostgreSQL: every write of a submitter is one call of the
database's own functions (migration 0019), which take the owner from the session and check
every value they store; the DAGs are carried forward by the database's engine, whoever ends a
node's job. This module only sends what the package made and reads back what they did."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection

from jobstore.core import policy
from jobstore.core.autoclusters import signature
from jobstore.core.jobs import Job, ProcTemplate
from jobstore.db.backends.base import VACATES, Change, DagSettings, InputFile
from jobstore.db.backends.postgresql import driver
from jobstore.db.backends.postgresql.queries import QUERIES
from jobstore.db.jsontext import json_text
from jobstore.db.rows import event_row, note_event
from jobstore.db.schema import jobs

CHUNK = 10_000  # procs of a templated submit per call
# The statements (queries.sql): each calls one function of the door
NEW_CLUSTER = QUERIES["door_new_cluster"].sql
QUEUE_JOBS = QUERIES["door_queue_jobs"].sql
QUEUE_PROCS = QUERIES["door_queue_procs"].sql
STORE_FILE = QUERIES["door_store_file"].sql
STORE_CHUNK = QUERIES["door_store_chunk"].sql
ADD_INPUTS = QUERIES["door_add_inputs"].sql
ACT = QUERIES["door_act"].sql
EDIT = QUERIES["door_edit"].sql
VACATE = QUERIES["door_vacate"].sql
SET_FACTOR = QUERIES["door_set_factor"].sql
RESET_USAGE = QUERIES["door_reset_usage"].sql
NEW_DAG = QUERIES["door_new_dag"].sql
DAG_NODES = QUERIES["door_dag_nodes"].sql
DAG_SETTINGS = QUERIES["door_dag_settings"].sql
START_DAG = QUERIES["door_start_dag"].sql
PAUSE_DAG = QUERIES["door_pause_dag"].sql
REMOVE_DAG = QUERIES["door_remove_dag"].sql
DAG_JOBS_ENDED = QUERIES["dag_jobs_ended"].sql
DAG_NODE_STARTED = QUERIES["dag_node_started"].sql
DAG_SCRIPT_START = QUERIES["dag_script_start"].sql
DAG_SCRIPT_DEFER = QUERIES["dag_script_defer"].sql
DAG_HOLD_START = QUERIES["dag_hold_start"].sql
DAG_NODES_FREE = QUERIES["dag_nodes_free"].sql
DAG_HOLD_DONE = QUERIES["dag_hold_done"].sql
DAG_SCRIPT_OPTIONS = QUERIES["door_dag_script_options"].sql
DAG_SCRIPT_DONE = QUERIES["dag_script_done"].sql
NOTED_JOBS = QUERIES["noted_jobs"].sql.format(
    columns=", ".join(c.name for c in jobs.c if c.name not in ("token", "phase")))


def job_json(job: Job, held: bool = False) -> dict[str, Any]:
    """A job as the door's functions take it."""
    return {
        "cluster_id": job.cluster_id, "proc_id": job.proc_id, "priority": job.priority,
        "ad": job.ad, "cmd": job.cmd, "request_cpus": job.request_cpus,
        "request_memory": job.request_memory, "request_disk": job.request_disk,
        "requirements": job.requirements, "max_attempts": job.max_attempts,
        "success_exit_code": job.success_exit_code, "retry_until": job.retry_until,
        "max_retries": job.max_retries, "user_log": job.user_log, "submitter": job.submitter,
        "concurrency_limits": job.concurrency_limits,
        "periodic": policy.has_periodic(job.ad or {}), "signature": signature(job),
        "hold": held,
    }


class PgDoor:
    """jobstore.db.backends.Door on PostgreSQL."""

    def __init__(self, every: Callable[[], bool]) -> None:
        self.every = every  # does a commit listener want the events of every job?

    # ---- submitting ----------------------------------------------------------------------

    def new_cluster(self, conn: Connection, *, owner: str, queue: str,
                    submit_file: str | None, num_procs: int, key: str | None,
                    now: float, home: str | None = None) -> tuple[int, bool]:
        row = _one(driver.execute(conn, NEW_CLUSTER, {
            "owner": owner, "queue": queue, "submit_file": submit_file,
            "num_procs": num_procs, "key": key, "now": now, "home": home}))
        return int(row[0]), bool(row[1])

    def queue_jobs(self, conn: Connection, jobs: Sequence[Job], held: Sequence[bool],
                   now: float) -> list[int]:
        if not jobs:
            return []
        sent = [job_json(job, hold) for job, hold in zip(jobs, held, strict=True)]
        rows = driver.execute(conn, QUEUE_JOBS, {
            "cluster": jobs[0].cluster_id, "jobs": json_text(sent), "now": now}).fetchall()
        return [int(r[0]) for r in rows]

    def queue_procs(self, conn: Connection, job: Job, template: ProcTemplate, now: float, *,
                    clusters: list[int] | None, hold: bool) -> list[int]:
        sent = json_text(job_json(job, hold))
        ids: list[int] = []
        for first in range(0, template.procs, CHUNK):
            last = min(first + CHUNK, template.procs) - 1
            top, bottom = first // template.per_item, last // template.per_item
            items = {p: column[top:bottom + 1] for p, column in template.items.items()}
            chunk = None if clusters is None else clusters[first:last + 1]
            rows = driver.execute(conn, QUEUE_PROCS, {
                "cluster": job.cluster_id if chunk is None else chunk[0], "clusters": chunk,
                "job": sent, "per_item": template.per_item,
                "counters": json_text(template.counters), "items": json_text(items),
                "first": first, "last": last, "now": now}).fetchall()
            ids.extend(int(r[0]) for r in rows)
        return ids

    def store_file(self, conn: Connection, owner: str, sha256: str, size: int) -> bool:
        return bool(_one(driver.execute(conn, STORE_FILE, {
            "owner": owner, "sha256": sha256, "size": size}))[0])

    def store_chunk(self, conn: Connection, owner: str, sha256: str, seq: int,
                    data: bytes) -> None:
        driver.execute(conn, STORE_CHUNK, {"owner": owner, "sha256": sha256, "seq": seq,
                                           "data": data}).fetchall()

    def add_inputs(self, conn: Connection, cluster_id: int, proc_id: int | None,
                   files: Sequence[InputFile]) -> None:
        driver.execute(conn, ADD_INPUTS, {
            "cluster": cluster_id, "proc": proc_id,
            "files": json_text([{"name": f.name, "sha256": f.sha256, "mode": f.mode}
                                for f in files])}).fetchall()

    # ---- acting on jobs ------------------------------------------------------------------

    def act(self, conn: Connection, ids: Sequence[int], event: str, reason: str | None,
            hold: tuple[int, int], *, skip_locked: bool, now: float) -> list[Change]:
        if event in VACATES:
            return self._changes(conn, VACATE, {
                "ids": list(ids), "fast": event == VACATES[1], "reason": reason,
                "skip_locked": skip_locked, "now": now})
        return self._changes(conn, ACT, {
            "ids": list(ids), "event": event, "reason": reason, "code": hold[0],
            "subcode": hold[1], "skip_locked": skip_locked, "now": now})

    def edit(self, conn: Connection, ids: Sequence[int], name: str, text: str,
             edited: Sequence[Job], *, skip_locked: bool, now: float) -> list[Change]:
        by_id = {job.id: signature(job) for job in edited}
        # a job the caller could not make (not waiting when read) keeps a signature of none
        signatures = [by_id.get(i, "0" * 64) for i in ids]
        return self._changes(conn, EDIT, {
            "ids": list(ids), "name": name, "text": text, "signatures": signatures,
            "skip_locked": skip_locked, "now": now})

    def set_factor(self, conn: Connection, name: str, factor: float) -> bool:
        return bool(_one(driver.execute(conn, SET_FACTOR, {"name": name, "factor": factor}))[0])

    def reset_usage(self, conn: Connection, name: str | None, now: float) -> int:
        return int(_one(driver.execute(conn, RESET_USAGE, {"name": name, "now": now}))[0])

    # ---- DAGs ----------------------------------------------------------------------------

    def new_dag(self, conn: Connection, *, owner: str, queue: str, path: str,
                batch_name: str | None, max_jobs: int | None, max_idle: int | None,
                attrs: Mapping[str, str], now: float, home: str | None = None) -> int:
        return int(_one(driver.execute(conn, NEW_DAG, {
            "owner": owner, "queue": queue, "path": path, "batch_name": batch_name,
            "max_jobs": max_jobs, "max_idle": max_idle,
            "attrs": json_text(dict(attrs)) if attrs else None, "now": now, "home": home}))[0])

    def dag_nodes(self, conn: Connection, dag_id: int, nodes: Sequence[Mapping[str, Any]],
                  edges: Sequence[tuple[str, str]], categories: Mapping[str, int],
                  now: float) -> dict[str, int]:
        rows = driver.execute(conn, DAG_NODES, {
            "dag": dag_id, "nodes": json_text(list(nodes)),
            "edges": json_text([{"parent": p, "child": c} for p, c in edges]),
            "categories": json_text([{"name": n, "maxjobs": m} for n, m in categories.items()]),
            "now": now}).fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    def dag_settings(self, conn: Connection, dag_id: int, settings: DagSettings) -> None:
        driver.execute(conn, DAG_SETTINGS, {
            "dag": dag_id, "status_file": settings.status_file, "every": settings.status_every,
            "max_pre": settings.max_pre, "max_post": settings.max_post})

    def start_dag(self, conn: Connection, dag_id: int, now: float) -> list[Change]:
        return self._changes(conn, START_DAG, {"dag": dag_id, "now": now})

    def pause_dag(self, conn: Connection, dag_id: int, held: bool, now: float) -> list[Change]:
        return self._changes(conn, PAUSE_DAG, {"dag": dag_id, "held": held, "now": now})

    def remove_dag(self, conn: Connection, dag_id: int, why: str, now: float) -> list[Change]:
        return self._changes(conn, REMOVE_DAG, {"dag": dag_id, "why": why, "now": now})

    def jobs_ended(self, conn: Connection, job_ids: list[int], now: float, *,
                   nodes: bool = False) -> None:
        self._changes(conn, DAG_JOBS_ENDED, {"ids": list(job_ids), "now": now})

    def node_job_started(self, conn: Connection, job: Job, now: float) -> None:
        dag_id = _dag_of(job)
        if dag_id is not None:
            self._changes(conn, DAG_NODE_STARTED, {"dag": dag_id, "now": now})

    def script_start(self, conn: Connection, dag_id: int, name: str, kind: str, token: str,
                     now: float) -> bool:
        row = driver.execute(conn, DAG_SCRIPT_START, {
            "dag": dag_id, "name": name, "kind": kind, "token": token, "now": now}).fetchone()
        return bool(row and row[0])

    def script_defer(self, conn: Connection, dag_id: int, name: str, kind: str, token: str,
                     until: float) -> bool:
        row = driver.execute(conn, DAG_SCRIPT_DEFER, {
            "dag": dag_id, "name": name, "kind": kind, "token": token, "until": until}).fetchone()
        return bool(row and row[0])

    def free_nodes(self, conn: Connection, keys: Sequence[tuple[int, str]], *,
                   dags_too: bool = False) -> set[tuple[int, str]]:
        rows = driver.execute(conn, DAG_NODES_FREE, {
            "dags": [d for d, _ in keys], "names": [n for _, n in keys],
            "dags_too": dags_too}).fetchall()
        return {(int(r[0]), str(r[1])) for r in rows}

    def hold_start(self, conn: Connection, dag_id: int, name: str, token: str,
                   now: float) -> bool:
        row = driver.execute(conn, DAG_HOLD_START, {
            "dag": dag_id, "name": name, "token": token, "now": now}).fetchone()
        return bool(row and row[0])

    def hold_done(self, conn: Connection, dag_id: int, name: str, token: str) -> bool:
        row = driver.execute(conn, DAG_HOLD_DONE, {
            "dag": dag_id, "name": name, "token": token}).fetchone()
        return bool(row and row[0])

    def dag_script_options(self, conn: Connection, dag_id: int,
                           options: Mapping[str, Any]) -> None:
        driver.execute(conn, DAG_SCRIPT_OPTIONS, {"dag": dag_id, "options": json_text(options)})

    def script_done(self, conn: Connection, dag_id: int, name: str, kind: str, token: str,
                    code: int, now: float) -> None:
        self._changes(conn, DAG_SCRIPT_DONE, {"dag": dag_id, "name": name, "kind": kind,
                                              "token": token, "code": code, "now": now})

    # ---- what a function did -------------------------------------------------------------

    def _changes(self, conn: Connection, sql: str, params: Mapping[str, Any]) -> list[Change]:
        """Call a function that returns jobstore_change rows; note the events it wrote for
        the commit listeners (the user log: the jobs that have one, or every job)."""
        out = [Change(int(r[0]) if r[0] is not None else 0, r[1], r[2], r[3], r[4], r[5],
                      _attrs(r[6]), bool(r[7]), r[8])
               for r in driver.execute(conn, sql, params).fetchall()]
        written = [c for c in out if c.job_id and (c.to_status is not None or c.pending)
                   and c.kind in ("acted", "moved")]
        if written and conn.info.get("jobstore_pending_events") is not None:
            every = self.every()
            found = {j.id: j for j in _noted_jobs(conn, [c.job_id for c in written], every)}
            for c in written:
                job = found.get(c.job_id)
                if job is not None:
                    note_event(conn, event_row(c.job_id, c.event, c.from_status, c.to_status,
                                               params.get("now") or 0.0, attempt=c.attempt,
                                               reason=c.reason, attrs=c.attrs), job)
        return out


def _one(cursor: Any) -> Any:
    """The one row a function's call returns."""
    row = cursor.fetchone()
    if row is None:
        raise AssertionError("a function of the door returned no row")
    return row


def _noted_jobs(conn: Connection, ids: list[int], every: bool) -> list[Job]:
    """The jobs among `ids` whose events a commit listener wants (those with a user log, or
    every one), read without their attempt's token."""
    return [row.job() for row in driver.every(conn, NOTED_JOBS, {"ids": ids, "every": every})]


def _attrs(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    return value if isinstance(value, dict) else json.loads(value)


def _dag_of(job: Job) -> int | None:
    """The DAGManJobId a DAG node's job carries in its ad."""
    value = (job.ad or {}).get("DAGManJobId")
    text = value.get("expr") if isinstance(value, dict) else value
    return int(str(text)) if str(text).isdigit() else None


__all__ = ["CHUNK", "PgDoor", "job_json"]
