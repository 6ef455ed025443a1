"""The database seam's conformance suite: what every backend (jobstore.db.backends.base.Backend)
must do alike, run on each backend on its own (SQLite and PostgreSQL), through the backend alone
on a fresh schema; where the databases legitimately differ, each one's documented behaviour."""

from __future__ import annotations

import os
import pwd
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from backends import BOTH_BACKENDS
from sqlalchemy import Connection, Engine, or_, select, text, update

from jobstore.core.claims import ClaimRequest, Offer
from jobstore.core.jobs import JOB_COLUMNS, PLACEHOLDER_MARK, Job, JobSpec, ProcTemplate
from jobstore.core.states import Event, Status
from jobstore.db.backends import (
    MENU,
    READ_JOB,
    READ_JOBS,
    Backend,
    Claim,
    Identity,
    Params,
    Row,
    backend_for,
)
from jobstore.db.backends.base import RowChange
from jobstore.db.engine import make_engine
from jobstore.db.schema import (
    autoclusters,
    clusters,
    concurrency_limits,
    job_events,
    jobs,
    sandbox_chunks,
    sandbox_files,
    submitters,
)
from jobstore.errors import DatabaseError, InvalidInput, RowChanged

NOW = 1_700_000_000.25  # a fixed time: every float the tests write reads back exactly
OWNER = "alice"
QUEUE = "default"
AD = {"Cmd": "/bin/sleep", "Arguments": "60", "Iwd": "/tmp"}
MISSING = 10**9  # a job id no test makes
EVENTS = "jobstore_events"  # the channel of job events (jobstore.db.channels.CHANNEL)
CHUNK = 1 << 20  # bytes per sandbox_chunks row, as the store writes a file
SLOT = Offer(cpus=4, memory=4096, disk=1_000_000)
REQUEST = ClaimRequest(queue=QUEUE, offer=SLOT, slot="slot1@node1", host="node1",
                       keyword="JOBSTORE", claim_lease=600)
MENU_PARAMS: Params = {"queue": QUEUE, "cpus": SLOT.cpus, "memory": SLOT.memory, "disk": SLOT.disk}

pytestmark = BOTH_BACKENDS  # the seam is what every backend must do alike


@pytest.fixture
def schema_engine(db_url: str) -> Iterator[Engine]:
    """The test's database (one connection per transaction, as a hook's store has)."""
    made = make_engine(db_url)
    yield made
    made.dispose()


@pytest.fixture
def backend(schema_engine: Engine) -> Backend:
    return backend_for(schema_engine)


# ---- transactions as the store runs them ---------------------------------------------------


@contextmanager
def opened(backend: Backend, first: str | None = None, params: Mapping[str, Any] | None = None,
           timeout_ms: int | None = 5000) -> Iterator[tuple[Connection, Any]]:
    """One transaction as the store runs one (connect, begin with its first read, the block
    in `transaction`, release): its connection and what `begin` read."""
    conn = backend.connect()
    try:
        first_read = backend.begin(conn, first, params or {}, timeout_ms)
        with backend.transaction(conn):
            yield conn, first_read
    finally:
        backend.release(conn)


@contextmanager
def transaction(backend: Backend, timeout_ms: int | None = 5000) -> Iterator[Connection]:
    """One transaction with no first read."""
    with opened(backend, timeout_ms=timeout_ms) as (conn, _):
        yield conn


def rows_of(backend: Backend, query: Any) -> list[tuple[Any, ...]]:
    """The rows of `query`, read in a transaction of their own (what others see)."""
    with transaction(backend) as conn:
        return [tuple(row) for row in conn.execute(query)]


class Abandoned(Exception):
    """What a test raises to abandon a transaction."""


def other_writer_waits(backend: Backend, schema_engine: Engine, write: Callable[[Connection], Any],
                       ) -> bool:
    """Whether `write`, in another transaction, must wait for the one open now: on SQLite a
    second writer cannot even begin (BEGIN IMMEDIATE; tried without the schema_engine's long busy
    timeout), on PostgreSQL `write` runs under a short statement timeout."""
    if schema_engine.dialect.name == "sqlite":
        other = sqlite3.connect(str(schema_engine.url.database), timeout=0.05, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute("ROLLBACK")
        except sqlite3.OperationalError as exc:
            assert "locked" in str(exc)
            return True
        finally:
            other.close()
        with transaction(backend) as conn:
            write(conn)
        return False
    try:
        with transaction(backend, timeout_ms=200) as conn:
            write(conn)
    except backend.lost as exc:
        assert "statement timeout" in str(exc)
        return True
    return False


# ---- rows as the store writes them ---------------------------------------------------------


@dataclass(frozen=True)
class Queued:
    """Jobs queued in one cluster and autocluster: the Jobs as written, with their ids."""

    autocluster_id: int
    jobs: list[Job]

    @property
    def ids(self) -> list[int]:
        return [job.id for job in self.jobs]


def new_cluster(backend: Backend, conn: Connection, procs: int = 1, queue: str = QUEUE) -> int:
    [cluster_id] = backend.insert_numbered(conn, clusters, [{
        "owner": OWNER, "queue": queue, "submit_file": None, "num_procs": procs,
        "submitted_at": NOW}], staged=False)
    return cluster_id


def new_autocluster(backend: Backend, conn: Connection, signature: str, job: Job) -> int:
    """The autocluster of jobs like `job` (its id, made if it is new)."""
    mine = (autoclusters.c.owner == job.owner, autoclusters.c.signature == signature)
    backend.insert_missing(conn, autoclusters, {
        "signature": signature, "queue": job.queue, "owner": job.owner,
        "submitter": job.submitter, "request_cpus": job.request_cpus,
        "request_memory": job.request_memory, "request_disk": job.request_disk,
        "requirements": job.requirements, "concurrency_limits": job.concurrency_limits,
        "created_at": NOW}, ["owner", "signature"])
    return int(conn.execute(select(autoclusters.c.id).where(*mine)).scalar_one())


def job_row(job: Job) -> dict[str, Any]:
    """The columns of `job` as a submit inserts them (the id comes from the table)."""
    return {name: getattr(job, name) for name in JOB_COLUMNS if name != "id"}


def queue_jobs(backend: Backend, conn: Connection, count: int = 1, *, signature: str = "sleep",
               queue: str = QUEUE, request_cpus: int = 1, priorities: Sequence[int] = (),
               limits: str | None = None, **changes: Any) -> Queued:
    """`count` jobs of one cluster and autocluster (`priorities`: each one's), idle unless
    `changes` say otherwise."""
    cluster_id = new_cluster(backend, conn, count, queue)
    made = [Job.queued(JobSpec(cmd=AD["Cmd"], args=AD["Arguments"], iwd=AD["Iwd"],
                               request_cpus=request_cpus, concurrency_limits=limits,
                               priority=priorities[proc] if priorities else 0, proc_id=proc),
                       id=0, cluster_id=cluster_id, owner=OWNER, queue=queue, ad=dict(AD),
                       max_attempts=3, now=NOW)
            for proc in range(count)]
    autocluster_id = new_autocluster(backend, conn, signature, made[0])
    made = [job.but(autocluster_id=autocluster_id, **changes) for job in made]
    ids = backend.insert_numbered(conn, jobs, [job_row(job) for job in made], staged=False)
    return Queued(autocluster_id, [job.but(id=i) for i, job in zip(ids, made, strict=True)])


def event_values(job_id: int, event: str, before: str | None, after: str | None, *,
                 attempt: int | None = 0, slot: str | None = None, host: str | None = None,
                 reason: str | None = None, attrs: Mapping[str, Any] | None = None,
                 ) -> dict[str, Any]:
    """A job_events row as a transition writes it."""
    return {"job_id": job_id, "time": NOW, "event": event, "from_status": before,
            "to_status": after, "attempt": attempt, "slot": slot, "host": host,
            "reason": reason, "attrs": dict(attrs) if attrs else None}


EVENT_COLUMNS = ("job_id", "time", "event", "from_status", "to_status", "attempt", "slot",
                 "host", "reason", "attrs")


def events_of(backend: Backend, job_id: int) -> list[dict[str, Any]]:
    """The events of a job, in order, as their rows hold them."""
    query = (select(*(job_events.c[name] for name in EVENT_COLUMNS))
             .where(job_events.c.job_id == job_id).order_by(job_events.c.id))
    return [dict(zip(EVENT_COLUMNS, row, strict=True)) for row in rows_of(backend, query)]


def job_now(backend: Backend, job_id: int) -> Job | None:
    """The job row as others see it now."""
    with transaction(backend) as conn:
        row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
    return None if row is None else Job.from_row(row._mapping)


def claim_of(req: ClaimRequest, token: str) -> Claim:
    """The claim's idle -> fetched as the state machine defines it for `req`."""
    return Claim(values={
        "token": token, "lease_expires_at": NOW + req.claim_lease, "lease_renewed_until": None,
        "slot": req.slot, "host": req.host, "keyword": req.keyword, "fetched_at": NOW,
        "job_pid": None, "reason": None, "status": Status.FETCHED.value, "updated_at": NOW,
    }, event=Event.FETCH.value, from_status=Status.IDLE.value, to_status=Status.FETCHED.value)


class HandOuts:
    """A HandOut that does what the store's does (the row's UPDATE and its fetch event,
    through `record`) and remembers each job it was called with."""

    def __init__(self, backend: Backend, req: ClaimRequest, claim: Claim) -> None:
        self.backend = backend
        self.req = req
        self.claim = claim
        self.calls: list[tuple[Job, dict[str, Any]]] = []

    def __call__(self, conn: Connection, job: Job, extra: Mapping[str, Any]) -> None:
        self.calls.append((job, dict(extra)))
        self.backend.record(
            conn,
            event_values(job.id, self.claim.event, self.claim.from_status,
                         self.claim.to_status, attempt=job.claims + 1, slot=self.req.slot,
                         host=self.req.host),
            RowChange(job.id, job.status, job.claims, {**self.claim.values, **extra}))


# ---- transactions --------------------------------------------------------------------------


def test_a_transaction_commits_at_the_end_of_its_block(backend: Backend) -> None:
    """Both kinds of write (the backend's bulk path and plain SQLAlchemy) are committed."""
    with transaction(backend) as conn:
        cluster_id = new_cluster(backend, conn)
        assert backend.insert_missing(conn, submitters, {"name": OWNER, "updated_at": NOW})
    assert rows_of(backend, select(clusters.c.id)) == [(cluster_id,)]
    assert rows_of(backend, select(submitters.c.name)) == [(OWNER,)]


def test_a_transaction_rolls_back_when_its_block_raises(backend: Backend) -> None:
    with pytest.raises(Abandoned), transaction(backend) as conn:
        new_cluster(backend, conn)
        backend.insert_missing(conn, submitters, {"name": OWNER, "updated_at": NOW})
        raise Abandoned
    assert rows_of(backend, select(clusters.c.id)) == []
    assert rows_of(backend, select(submitters.c.name)) == []


@pytest.mark.parametrize("pool", [False, True], ids=["unpooled", "pooled"])
def test_a_released_connection_serves_the_next_transaction_whatever_the_last_did(
        db_url: str, schema_engine: Engine, pool: bool) -> None:
    """After a failed statement and an abandoned block, released, the next transactions (on a
    pooled schema_engine: on the connection the store keeps) begin clean and commit."""
    pooled = make_engine(db_url, pool=True) if pool else schema_engine
    backend = backend_for(pooled)
    try:
        for cluster_id in (101, 102):
            with transaction(backend) as conn:
                row = {"id": cluster_id, "owner": OWNER, "queue": QUEUE, "submit_file": None,
                       "num_procs": 1, "submitted_at": NOW}
                backend.insert_rows(conn, clusters, [row], staged=False)
            with pytest.raises(backend.lost), transaction(backend) as conn:
                backend.insert_rows(conn, clusters, [row], staged=False)
            with pytest.raises(Abandoned), transaction(backend) as conn:
                new_cluster(backend, conn)
                raise Abandoned
        assert rows_of(backend, select(clusters.c.id).order_by(clusters.c.id)) == [
            (101,), (102,)]
    finally:
        if pool:
            pooled.dispose()


def test_begin_bounds_each_statement_by_the_timeout(backend: Backend,
                                                    schema_engine: Engine) -> None:
    """PostgreSQL cancels a statement that runs past the transaction's timeout; SQLite has no
    statement timeout (its begin opens nothing: the transaction is `transaction`'s)."""
    slow_count = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n"
                  " WHERE i < 100000) SELECT count(*) FROM n")
    if schema_engine.dialect.name == "sqlite":
        conn = backend.connect()
        try:
            assert backend.begin(conn, None, {}, 1) is None
            assert not conn.in_transaction()
            with backend.transaction(conn):
                assert conn.execute(text(slow_count)).scalar_one() == 100000
        finally:
            backend.release(conn)
        return
    with opened(backend, timeout_ms=50) as (conn, first):
        assert first is None
        assert conn.execute(text("SHOW statement_timeout")).scalar_one() == "50ms"
    with pytest.raises(backend.lost) as cancelled, transaction(backend, timeout_ms=50) as conn:
        conn.execute(text("SELECT pg_sleep(2)"))
    assert "statement timeout" in str(cancelled.value)
    with transaction(backend, timeout_ms=None) as conn:
        assert conn.execute(text("SHOW statement_timeout")).scalar_one() == "0"


# ---- reading and locking -------------------------------------------------------------------


def test_read_job_reads_the_row_that_begin_opened_with(backend: Backend) -> None:
    """The job as written and, where the first read is unlocked, its version."""
    with transaction(backend) as conn:
        queued = queue_jobs(backend, conn, 2)
    first = queued.jobs[1]
    with opened(backend, READ_JOB, {"job_id": first.id}) as (conn, read):
        job, version = backend.read_job(conn, read, first.id)
    assert job == first
    # a report's first read is unlocked (report_reads) exactly where the row has a version
    assert (version is None) == backend.report_reads[0]
    assert backend.report_reads[-1] is True  # the last read is always locked
    with opened(backend, READ_JOB, {"job_id": MISSING}) as (conn, read):
        assert backend.read_job(conn, read, MISSING) == (None, None)


def test_read_jobs_reads_the_rows_there_are(backend: Backend) -> None:
    with transaction(backend) as conn:
        queued = queue_jobs(backend, conn, 3)
    wanted = [queued.ids[2], MISSING, queued.ids[0]]
    with opened(backend, READ_JOBS, {"job_ids": wanted}) as (conn, read):
        found = backend.read_jobs(conn, read, wanted)
    assert sorted(found) == sorted([queued.ids[0], queued.ids[2]])
    for job_id, (job, version) in found.items():
        assert job == queued.jobs[queued.ids.index(job_id)]
        assert (version is None) == backend.report_reads[0]


def test_a_row_change_hits_the_row_only_while_it_is_as_read(
        backend: Backend, schema_engine: Engine) -> None:
    """update_row with the version read_job gave changes the row while nobody changed it, and
    raises RowChanged once another transaction did (so does `record` with that version);
    without a version it checks the row's status and attempt. A backend whose read is locked
    has no version: nothing can change the row."""
    with transaction(backend) as conn:
        kept, changed = queue_jobs(backend, conn, 2).jobs

    def reprioritise(job: Job, priority: int, version: str | None) -> RowChange:
        return RowChange(job.id, job.status, job.claims, {"priority": priority}, version)

    with opened(backend, READ_JOB, {"job_id": kept.id}) as (conn, read):
        _, version = backend.read_job(conn, read, kept.id)
        backend.update_row(conn, reprioritise(kept, 5, version))
    assert job_now(backend, kept.id) == kept.but(priority=5)
    with transaction(backend) as conn:  # None: the row is locked, nothing to check
        backend.update_row(conn, reprioritise(kept, 6, None))
    with transaction(backend) as conn:
        for wrong in (kept.but(status=Status.HELD), kept.but(claims=kept.claims + 1)):
            with pytest.raises(RowChanged):
                backend.update_row(conn, reprioritise(wrong, 9, None))
    assert job_now(backend, kept.id) == kept.but(priority=6)

    with opened(backend, READ_JOB, {"job_id": changed.id}) as (conn, read):
        _, version = backend.read_job(conn, read, changed.id)
        if version is None:
            with pytest.raises(InvalidInput):
                backend.update_row(conn, reprioritise(changed, 8, "1"))
            assert other_writer_waits(backend, schema_engine, lambda other: other.execute(
                update(jobs).where(jobs.c.id == changed.id).values(priority=7)))
            return
        with transaction(backend) as other:
            assert other.execute(update(jobs).where(jobs.c.id == changed.id)
                                 .values(priority=7)).rowcount == 1
        with pytest.raises(RowChanged):
            backend.update_row(conn, reprioritise(changed, 8, version))
        with pytest.raises(RowChanged):
            backend.record(conn, event_values(changed.id, Event.HOLD.value, "idle", "held"),
                           RowChange(changed.id, "idle", 0, {"status": "held"}, version))
    assert job_now(backend, changed.id) == changed.but(priority=7)
    assert events_of(backend, changed.id) == []


def test_lock_job_locks_the_row_until_the_transaction_ends(backend: Backend,
                                                           schema_engine: Engine) -> None:
    with transaction(backend) as conn:
        queued = queue_jobs(backend, conn, 1)
    job = queued.jobs[0]

    def lock_it(conn: Connection) -> None:
        assert backend.lock_job(conn, job.id) == job

    with transaction(backend) as conn:
        assert backend.lock_job(conn, job.id) == job
        assert backend.lock_job(conn, MISSING) is None
        assert other_writer_waits(backend, schema_engine, lock_it)
    assert not other_writer_waits(backend, schema_engine, lock_it)


def test_jobs_of_reads_the_rows_named(backend: Backend) -> None:
    with transaction(backend) as conn:
        queued = queue_jobs(backend, conn, 3)
        found = backend.jobs_of(conn, [queued.ids[1], MISSING, queued.ids[2]])
        assert backend.jobs_of(conn, []) == []
    assert sorted(found, key=lambda job: job.id) == queued.jobs[1:]


def test_id_in_selects_exactly_the_rows_of_a_long_list(backend: Backend) -> None:
    with transaction(backend) as conn:
        ids = queue_jobs(backend, conn, 300).ids
    chosen = ids[::3]
    listed = [*range(MISSING, MISSING + 5000), *reversed(chosen)]  # thousands, most absent
    with transaction(backend) as conn:
        found = conn.execute(select(jobs.c.id).where(backend.id_in(jobs.c.id, listed)))
        assert sorted(found.scalars()) == chosen
        assert conn.execute(select(jobs.c.id).where(backend.id_in(jobs.c.id, []))).all() == []
        two = or_(backend.id_in(jobs.c.id, chosen[:2]), backend.id_in(jobs.c.id, chosen[-1:]))
        assert sorted(conn.execute(select(jobs.c.id).where(two)).scalars()) == [
            *chosen[:2], chosen[-1]]
        changed = conn.execute(update(jobs).where(backend.id_in(jobs.c.id, listed))
                               .values(priority=9))
        assert changed.rowcount == len(chosen)
    assert rows_of(backend, select(jobs.c.id).where(jobs.c.priority == 9)
                   .order_by(jobs.c.id)) == [(i,) for i in chosen]


# ---- the negotiator ------------------------------------------------------------------------


def test_the_menu_lists_the_autoclusters_with_idle_jobs_that_fit_the_slot(
        backend: Backend) -> None:
    """Each one with its first job in claim order (priority, then id); not an autocluster
    whose jobs are larger than the slot, held, or in another queue."""
    with transaction(backend) as conn:
        fits = queue_jobs(backend, conn, 3, priorities=[0, 5, 5])
        limited = queue_jobs(backend, conn, signature="limited", limits="license:2")
        queue_jobs(backend, conn, signature="large", request_cpus=SLOT.cpus + 1)
        queue_jobs(backend, conn, signature="held", status=Status.HELD.value, reason="held",
                   hold_code=15, hold_subcode=0, num_holds=1)
        queue_jobs(backend, conn, signature="elsewhere", queue="other")
    with opened(backend, MENU, MENU_PARAMS) as (conn, read):
        menu = sorted(tuple(row) for row in backend.menu(conn, read, MENU_PARAMS))
    assert limited.jobs[0].concurrency_limits == "license:2"
    assert menu == sorted([
        (fits.autocluster_id, OWNER, None, fits.ids[1], 5),
        (limited.autocluster_id, OWNER, "license:2", limited.ids[0], 0),
    ])


def test_take_hands_out_each_idle_job_once_in_claim_order(backend: Backend,
                                                          schema_engine: Engine) -> None:
    """The first idle job of the first autocluster listed that has one (autoclusters without
    any passed over, more than one claim statement's worth on PostgreSQL), with its fetch
    event; when none is left, None. A backend that takes row by row calls `hand_out`."""
    with transaction(backend) as conn:
        queued = queue_jobs(backend, conn, 2, priorities=[0, 3])
    listed = [*range(MISSING, MISSING + 70), queued.autocluster_id]
    claim = claim_of(REQUEST, "t" * 32)
    hand_out = HandOuts(backend, REQUEST, claim)
    taken = []
    for _ in range(3):
        with transaction(backend) as conn:
            taken.append(backend.take(conn, REQUEST, listed, claim, NOW, hand_out))
    second, first = queued.jobs
    assert taken == [first.but(**claim.values, claims=1, slot_weight=1.0),
                     second.but(**claim.values, claims=1, slot_weight=1.0), None]
    for job in taken[:2]:
        assert job is not None
        assert job_now(backend, job.id) == job
        assert events_of(backend, job.id) == [event_values(
            job.id, "fetch", "idle", "fetched", attempt=1, slot=REQUEST.slot,
            host=REQUEST.host)]
    expected_calls = [(first, {"claims": 1, "slot_weight": 1.0}),
                      (second, {"claims": 1, "slot_weight": 1.0})]
    # SQLite takes row by row through hand_out; PostgreSQL hands out in its claim statement
    assert hand_out.calls == (expected_calls if schema_engine.dialect.name == "sqlite" else [])


def test_take_passes_over_a_job_another_transaction_holds(backend: Backend,
                                                         schema_engine: Engine) -> None:
    """PostgreSQL skips a locked row; on SQLite no other transaction can hold one while a
    claim runs (one writer at a time)."""
    with transaction(backend) as conn:
        queued = queue_jobs(backend, conn, 2, priorities=[3, 0])
    claim = claim_of(REQUEST, "u" * 32)
    taken: list[Job | None] = []

    def take(conn: Connection) -> None:
        taken.append(backend.take(conn, REQUEST, [queued.autocluster_id], claim, NOW,
                                  HandOuts(backend, REQUEST, claim)))

    with transaction(backend) as conn:
        assert backend.lock_job(conn, queued.ids[0]) == queued.jobs[0]
        if schema_engine.dialect.name == "sqlite":
            assert other_writer_waits(backend, schema_engine, take)
            assert taken == []
            return
        with transaction(backend, timeout_ms=2000) as other:
            take(other)
    assert taken == [queued.jobs[1].but(**claim.values, claims=1, slot_weight=1.0)]


def test_lock_limits_serialises_the_claims_of_jobs_that_use_a_limit(
        backend: Backend, schema_engine: Engine) -> None:
    """Until the transaction ends, no other claim may lock the same limits (on SQLite, no
    other writer begins); other limits are free on PostgreSQL."""
    with transaction(backend) as conn:
        for name in ("license", "other"):
            assert backend.insert_missing(conn, concurrency_limits, {"name": name})
    with transaction(backend) as conn:
        backend.lock_limits(conn, ["license"])
        assert other_writer_waits(backend, schema_engine,
                                  lambda other: backend.lock_limits(other, ["license"]))
        others_wait = other_writer_waits(backend, schema_engine,
                                         lambda other: backend.lock_limits(other, ["other"]))
        assert others_wait == (schema_engine.dialect.name == "sqlite")
    assert not other_writer_waits(backend, schema_engine,
                                  lambda other: backend.lock_limits(other, ["license"]))


# ---- writing -------------------------------------------------------------------------------


def test_record_appends_the_event_after_an_update_that_hits_the_row(backend: Backend) -> None:
    """The row changed and its event appended; a change that finds the row in another status
    or attempt raises RowChanged and appends nothing; with no change, only the event."""
    with transaction(backend) as conn:
        job = queue_jobs(backend, conn, 1).jobs[0]
    hold = {"status": "held", "reason": "why", "hold_code": 1, "hold_subcode": 0,
            "num_holds": 1, "updated_at": NOW + 1}
    held = event_values(job.id, "hold", "idle", "held", reason="why",
                        attrs={"HoldReasonCode": 1, "HoldReasonSubCode": 0})
    with transaction(backend) as conn:
        backend.record(conn, held, RowChange(job.id, "idle", 0, hold))
    assert job_now(backend, job.id) == job.but(**hold)
    assert events_of(backend, job.id) == [held]

    for status, claims in (("idle", 0), ("held", 1)):  # the row is held, attempt 0
        with pytest.raises(RowChanged), transaction(backend) as conn:
            backend.record(conn, held, RowChange(job.id, status, claims, hold))
    noted = event_values(job.id, "update", None, None, attrs={"note": [1, "two"]})
    with transaction(backend) as conn:
        backend.record(conn, noted, None)
    assert job_now(backend, job.id) == job.but(**hold)
    assert events_of(backend, job.id) == [held, noted]


def test_insert_events_appends_every_event_in_order(backend: Backend) -> None:
    with transaction(backend) as conn:
        first, second = queue_jobs(backend, conn, 2).ids
    page = [event_values(second, "hold", "idle", "held", reason="page",
                         attrs={"HoldReasonCode": 1}),
            event_values(first, "hold", "idle", "held", reason="page"),
            event_values(second, "remove", "held", "removed", attempt=None)]
    with transaction(backend) as conn:
        backend.insert_events(conn, page)
    assert events_of(backend, first) == [page[1]]
    assert events_of(backend, second) == [page[0], page[2]]


def test_insert_missing_inserts_once_per_key(backend: Backend) -> None:
    """True, then False for the same key (the table's primary key, or the `keys` named),
    leaving the first row as it was."""
    with transaction(backend) as conn:
        assert backend.insert_missing(conn, submitters, {"name": OWNER, "updated_at": NOW})
        assert not backend.insert_missing(conn, submitters, {"name": OWNER,
                                                             "updated_at": NOW + 1})
        job = queue_jobs(backend, conn, 1, signature="sig").jobs[0]
        bigger: Row = {"signature": "sig", "queue": QUEUE, "owner": OWNER, "submitter": OWNER,
                  "request_cpus": 64, "request_memory": 1, "request_disk": 1,
                  "created_at": NOW}
        assert not backend.insert_missing(conn, autoclusters, bigger, ["owner", "signature"])
        assert backend.insert_missing(conn, autoclusters, {**bigger, "owner": "bob"},
                                      ["owner", "signature"])
    assert rows_of(backend, select(submitters.c.name, submitters.c.updated_at)) == [
        (OWNER, NOW)]
    assert rows_of(backend, select(autoclusters.c.owner, autoclusters.c.request_cpus)
                   .order_by(autoclusters.c.owner)) == [(OWNER, job.request_cpus), ("bob", 64)]


def test_upsert_inserts_then_updates_only_the_named_columns(backend: Backend) -> None:
    def submitter(name: str, factor: float, priority: float, at: float) -> dict[str, Any]:
        return {"name": name, "factor": factor, "priority": priority, "updated_at": at}

    with transaction(backend) as conn:
        backend.upsert(conn, submitters, [submitter(OWNER, 1.0, 0.5, NOW),
                                          submitter("bob", 2.0, 0.5, NOW)], "name", ["factor"])
    with transaction(backend) as conn:
        backend.upsert(conn, submitters, [submitter(OWNER, 10.0, 99.0, NOW + 1),
                                          submitter("carol", 3.0, 7.0, NOW + 1)],
                       "name", ["factor"])
    assert rows_of(backend, select(submitters.c.name, submitters.c.factor,
                                   submitters.c.priority, submitters.c.updated_at)
                   .order_by(submitters.c.name)) == [
        (OWNER, 10.0, 0.5, NOW), ("bob", 2.0, 0.5, NOW), ("carol", 3.0, 7.0, NOW + 1)]


def test_insert_numbered_returns_the_new_ids_in_order(backend: Backend) -> None:
    """Each row's id, in the order of the rows, staged or not; later rows get higher ids."""
    def cluster(name: str) -> dict[str, Any]:
        return {"owner": OWNER, "queue": QUEUE, "submit_file": name, "num_procs": 1,
                "submitted_at": NOW}

    with transaction(backend) as conn:
        plain = backend.insert_numbered(conn, clusters, [cluster(n) for n in "cab"],
                                        staged=False)
        staged = backend.insert_numbered(conn, clusters, [cluster(n) for n in "ed"],
                                         staged=True)
        made = queue_jobs(backend, conn, 1).jobs[0]
        procs = [3, 0, 4, 1, 2]
        cluster_id = new_cluster(backend, conn, len(procs))
        job_ids = backend.insert_numbered(conn, jobs, [
            job_row(made.but(cluster_id=cluster_id, proc_id=p)) for p in procs], staged=False)
    ids = [*plain, *staged]
    assert ids == sorted(set(ids))
    assert rows_of(backend, select(clusters.c.id, clusters.c.submit_file)
                   .where(clusters.c.id.in_(ids)).order_by(clusters.c.id)) == list(
        zip(ids, "cabed", strict=True))
    assert job_ids == sorted(set(job_ids)) and job_ids[0] > made.id
    assert rows_of(backend, select(jobs.c.proc_id).where(jobs.c.id.in_(job_ids))
                   .order_by(jobs.c.id)) == [(p,) for p in procs]


def test_insert_rows_inserts_every_row_staged_or_not(backend: Backend) -> None:
    with transaction(backend) as conn:
        job_id = queue_jobs(backend, conn, 1).ids[0]
    rows = [event_values(job_id, "update", None, None, attempt=n, attrs={"n": n} if n else None)
            for n in range(4)]
    with transaction(backend) as conn:
        backend.insert_rows(conn, job_events, rows[:2], staged=False)
        backend.insert_rows(conn, job_events, rows[2:], staged=True)
    assert events_of(backend, job_id) == rows


def test_file_stream_returns_a_files_chunks_in_order(backend: Backend) -> None:
    """Only the chunks asked for, as bytes, whatever order they were written in; only the
    owner's file of that hash."""
    chunks = [b"a" * CHUNK, b"b" * CHUNK, b"tail"]
    sha = "0" * 64
    with transaction(backend) as conn:
        backend.insert_rows(conn, sandbox_files, [{
            "owner": OWNER, "sha256": sha, "size": sum(map(len, chunks)),
            "created_at": NOW}], staged=False)
        backend.insert_rows(conn, sandbox_chunks, [
            {"owner": OWNER, "sha256": sha, "seq": seq, "data": chunks[seq]}
            for seq in (2, 0, 1)], staged=False)
    with transaction(backend) as conn:
        whole = list(backend.file_stream(conn, OWNER, sha, 0, 2))
        tail = list(backend.file_stream(conn, OWNER, sha, 1, 5))
        others = list(backend.file_stream(conn, "bob", sha, 0, 2))
    assert all(type(chunk) is bytes for chunk in whole)
    assert whole == chunks
    assert tail == chunks[1:]
    assert others == []


def test_insert_procs_makes_a_templated_clusters_rows_where_the_backend_can(
        backend: Backend) -> None:
    """makes_rows_on_server: each proc's row from one with placeholders, with its submit
    event; elsewhere InvalidInput."""
    placeholder = f"{PLACEHOLDER_MARK}_process"
    spec = JobSpec(cmd=AD["Cmd"], args=placeholder)
    template = ProcTemplate(spec=spec, procs=3, per_item=3,
                            counters={placeholder: "proc"}, items={})
    with transaction(backend) as conn:
        cluster_id = new_cluster(backend, conn, 3)
        job = Job.queued(spec, id=0, cluster_id=cluster_id, owner=OWNER, queue=QUEUE,
                         ad={"Cmd": AD["Cmd"], "Arguments": placeholder}, max_attempts=3,
                         now=NOW)
        if not backend.makes_rows_on_server:
            with pytest.raises(InvalidInput):
                backend.insert_procs(conn, job, template, NOW, events_after=False,
                                     clusters=None)
            return
        ids = backend.insert_procs(conn, job, template, NOW, events_after=False,
                                   clusters=None)
    assert len(ids) == 3 and ids == sorted(ids)
    made = [job_now(backend, i) for i in ids]
    assert [(j.proc_id, j.ad) for j in made if j is not None] == [
        (p, {"Cmd": AD["Cmd"], "Arguments": str(p)}) for p in range(3)]
    for i in ids:
        assert events_of(backend, i) == [event_values(i, "submit", None, "idle")]


# ---- errors --------------------------------------------------------------------------------


def test_error_is_one_line_naming_the_database_without_its_password(
        backend: Backend, schema_engine: Engine) -> None:
    """Of a statement SQLAlchemy ran and of one the backend's own path ran alike."""
    url = schema_engine.url.set(password="s3cret-pw")
    failures = []
    with pytest.raises(backend.lost) as missing, transaction(backend) as conn:
        conn.execute(text("SELECT * FROM no_such_table"))
    failures.append(missing.value)
    row: Row = {"id": 7, "owner": OWNER, "queue": QUEUE, "submit_file": None, "num_procs": 1,
           "submitted_at": NOW}
    with transaction(backend) as conn:
        backend.insert_rows(conn, clusters, [row], staged=False)
    with pytest.raises(backend.lost) as twice, transaction(backend) as conn:
        backend.insert_rows(conn, clusters, [row], staged=False)
    failures.append(twice.value)
    errors = [backend.error(exc, url) for exc in failures]
    for error in errors:
        assert isinstance(error, DatabaseError)
        message = str(error)
        assert "\n" not in message and "s3cret-pw" not in message
        assert message.startswith("database ") and str(schema_engine.url.database) in message
    assert "no_such_table" in str(errors[0]) and "not a job store yet" in str(errors[0])
    assert "unique" in str(errors[1]).lower()


def test_error_of_a_value_the_databases_own_checks_refuse(backend: Backend,
                                                          schema_engine: Engine) -> None:
    """PostgreSQL checks every job row it stores (InvalidInput naming the job) and every
    file's chunks (InvalidInput with the trigger's reason); a SQLite store has no checks of its
    own (its package door checks before it writes)."""
    with transaction(backend) as conn:
        job = queue_jobs(backend, conn, 1).jobs[0]
    nameless = job_row(job.but(proc_id=1, cmd=""))
    if schema_engine.dialect.name == "sqlite":
        with transaction(backend) as conn:
            [job_id] = backend.insert_numbered(conn, jobs, [nameless], staged=False)
        assert job_now(backend, job_id) == job.but(id=job_id, proc_id=1, cmd="")
        return
    with pytest.raises(backend.lost) as refused, transaction(backend) as conn:
        backend.insert_numbered(conn, jobs, [nameless], staged=False)
    error = backend.error(refused.value, schema_engine.url)
    assert isinstance(error, InvalidInput)
    assert str(error) == f"job {job.cluster_id}.1: no executable"
    with pytest.raises(backend.lost) as refused, transaction(backend) as conn:
        backend.insert_rows(conn, sandbox_files, [{
            "owner": OWNER, "sha256": "1" * 64, "size": 3, "created_at": NOW}], staged=False)
        backend.insert_rows(conn, sandbox_chunks, [{
            "owner": OWNER, "sha256": "1" * 64, "seq": 0, "data": b"four"}], staged=False)
    error = backend.error(refused.value, schema_engine.url)
    assert isinstance(error, InvalidInput)
    assert str(error) == "a chunk beyond the size of its file"


# ---- what a backend declares ---------------------------------------------------------------


def test_can_listen_is_true_to_what_the_backend_announces(backend: Backend) -> None:
    """A listener receives what committed transactions notify (record's and insert_events'
    too), never a rolled-back one's; where it cannot listen, notify does nothing and there is
    no listener."""
    with transaction(backend) as conn:
        job_id = queue_jobs(backend, conn, 1).ids[0]
    if not backend.can_listen:
        with transaction(backend) as conn:
            backend.notify(conn, "nobody", EVENTS)
        with pytest.raises(InvalidInput):
            backend.listener(EVENTS, 5, lambda: transaction(backend))
        return
    listener = backend.listener(EVENTS, 5, lambda: transaction(backend))
    listener.open()
    try:
        with pytest.raises(Abandoned), transaction(backend) as conn:
            backend.notify(conn, "rolled back", EVENTS)
            raise Abandoned
        with transaction(backend) as conn:
            backend.notify(conn, "committed", EVENTS)
        assert listener.wait(2.0) == ["committed"]
        with transaction(backend) as conn:
            backend.record(conn, event_values(job_id, "update", None, None), None)
        assert listener.wait(2.0) == [str(job_id)]
        with transaction(backend) as conn:
            backend.insert_events(conn, [event_values(job_id, "update", None, None)])
        assert listener.wait(2.0) == ["page"]
        assert listener.probe(2.0)
    finally:
        listener.close()


def test_identity_is_the_files_owner_or_the_sessions_role(backend: Backend,
                                                          schema_engine: Engine) -> None:
    """SQLite: every session is the invoking account, trusted, and there are no roles and no
    door of the database's own; PostgreSQL: the session's role decides (the migrating role owns
    the store), with its roles and the database's door. The store's owner reads tokens."""
    with transaction(backend) as conn:
        session = backend.session_identity(conn)
        assert backend.reads_tokens(conn)
    local = backend.local_identity()
    if schema_engine.dialect.name == "sqlite":
        account = pwd.getpwuid(os.getuid()).pw_name
        assert local == session == Identity(account, trusted=True, super_user=True)
        with pytest.raises(InvalidInput):
            backend.roles()
        assert backend.door(lambda: False) is None
        return
    assert local is None
    assert session == Identity(str(schema_engine.url.username), trusted=True, super_user=True)
    granted = backend.roles().hook_statements("select")
    assert granted and all('"select"' in statement for statement in granted[:1])
    assert backend.door(lambda: False) is not None


def test_snapshot_bounds_and_xact_horizon_follow_ids_that_commit_out_of_order(
        backend: Backend) -> None:
    """None where ids become visible in order; else a transaction still open is not below a
    new snapshot's xmin, and is below its xmax once it has ended; later ones have higher ids
    (the server's other databases' transactions move the bounds too)."""
    with transaction(backend) as conn:
        bounds = backend.snapshot_bounds(conn)
        horizon = backend.xact_horizon(conn)
    if not backend.ids_commit_out_of_order:
        assert bounds is None and horizon is None
        return
    assert isinstance(bounds, tuple) and isinstance(horizon, int)
    with transaction(backend) as writer:
        writing = backend.xact_horizon(writer)
        assert isinstance(writing, int) and writing > horizon
        new_cluster(backend, writer)
        with transaction(backend) as reader:
            during = backend.snapshot_bounds(reader)
        assert during is not None and during[0] <= writing
    with transaction(backend) as reader:
        after = backend.snapshot_bounds(reader)
        later = backend.xact_horizon(reader)
    assert after is not None and after[1] > writing
    assert isinstance(later, int) and later > writing


def test_rows_estimate_is_the_planners_or_none(backend: Backend, schema_engine: Engine) -> None:
    with transaction(backend) as conn:
        queue_jobs(backend, conn, 5)
    with transaction(backend) as conn:
        if schema_engine.dialect.name == "postgresql":
            conn.execute(text("ANALYZE jobs"))
    with transaction(backend) as conn:
        estimate = backend.rows_estimate(conn)
    assert estimate == (None if schema_engine.dialect.name == "sqlite" else 5)
