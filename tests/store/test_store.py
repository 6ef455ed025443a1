"""jobstore.db.store against real databases (SQLite and PostgreSQL): submit, claim, reports,
fencing, lease recovery, admin events, and the claim query's index."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from backends import BOTH_BACKENDS
from bulk import clone

from jobstore.core.policy import ExitVerdict
from jobstore.core.states import Event
from jobstore.db.backends.postgresql.queries import without_begin
from jobstore.db.engine import upgrade
from jobstore.db.rows import event_row
from jobstore.db.schema import clusters, job_events, jobs
from jobstore.db.store import (
    AttemptReport,
    JobStore,
    Offer,
    UnknownJob,
    Verdict,
)
from jobstore.errors import DatabaseError, InvalidInput
from jobstore.testing.factories import (
    claim,
    claim_request,
    claimed,
    job_spec,
    report,
    running,
    submit,
)
from jobstore.testing.support import first, libpq_url

FAR_FUTURE = time.time() + 10 * 365 * 86400
BIG = Offer(cpus=64, memory=1 << 20, disk=1 << 40)


REQ = claim_request(offer=BIG, slot="slot1@node", claim_lease=120)


def assert_event_chain(store: JobStore, job_id: int, expected: list[tuple[str, str, str]]) -> None:
    """The job's state-changing events are exactly `expected` (event, from, to), chained from
    submit to the job's current status; every other event changed nothing (to_status NULL)."""
    evs = store.reads.events(job_id)
    changes = [(e.event, e.from_status, e.to_status) for e in evs if e.to_status]
    assert changes == [("submit", None, "idle"), *expected]
    for prev, cur in zip(changes, changes[1:], strict=False):
        assert cur[1] == prev[2], f"event chain broken at {cur}"
    assert store.reads.get_job(job_id).status == changes[-1][2]


def rows(store: JobStore, table: sa.Table) -> list[dict]:
    with store.db.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(sa.select(table).order_by(table.c.id))]


# ---- submit -----------------------------------------------------------------------------------


@BOTH_BACKENDS
def test_submit_creates_cluster_jobs_and_events(store):
    t0 = time.time()
    cluster, ids = store.submissions.submit(
        [job_spec(0), job_spec(1, priority=5, max_retries=1), job_spec(2)],
        owner="alice",
        queue="q1",
        max_attempts=4,
        submit_file="/home/alice/job.sub",
    )
    (c,) = rows(store, clusters)
    assert c["id"] == cluster
    assert (c["owner"], c["queue"], c["num_procs"], c["submit_file"]) == (
        "alice", "q1", 3, "/home/alice/job.sub"
    )
    found = store.reads.find_jobs(cluster)
    assert [j.id for j in found] == ids and len(set(ids)) == 3
    assert [j.proc_id for j in found] == [0, 1, 2]
    for j in found:
        assert (j.status, j.claims, j.attempts, j.token) == ("idle", 0, 0, None)
        assert j.owner == "alice" and j.queue == "q1"
        assert {k: j.ad[k] for k in ("Cmd", "Iwd")} == {"Cmd": "/bin/true", "Iwd": "/tmp"}
        assert j.submitted_at >= t0 - 1
    assert [j.ad.get("MaxRetries") for j in found] == [None, 1, None]  # the ad, from the spec
    assert [j.max_attempts for j in found] == [4, 2, 4]  # max_retries + 1 wins
    assert found[1].priority == 5
    assert store.reads.find_jobs(cluster, 1) == [found[1]]
    evs = rows(store, job_events)
    got = [(e["job_id"], e["event"], e["from_status"], e["to_status"], e["attempt"]) for e in evs]
    assert got == [(i, "submit", None, "idle", 0) for i in ids]
    assert store.reads.stats() == [("q1", "idle", 3)]


def test_unknown_job(store):
    with pytest.raises(UnknownJob):
        store.reads.get_job(12345)
    with pytest.raises(UnknownJob):
        store.reports.report(12345, Event.ACCEPT, token="x", attempt=1)
    with pytest.raises(UnknownJob):
        store.actions.admin(12345, Event.HOLD)


# ---- claim ------------------------------------------------------------------------------------


@BOTH_BACKENDS
def test_claim_order_is_priority_then_age(store):
    a = submit(store, 3)  # priority 0, ids ascending
    b = submit(store, 2, priority=10)
    c = submit(store, 2, priority=-5)
    d = submit(store, 1, priority=10)
    other = submit(store, 1, priority=100, queue="other")
    got = []
    while (job := claim(store, REQ)) is not None:
        assert job.status == "fetched"
        got.append(job.id)
    assert got == [*b, *d, *a, *c]
    assert store.reads.get_job(other[0]).status == "idle"
    assert claimed(store, REQ, queue="other").id == other[0]


def test_claim_judges_one_job_per_autocluster(store):
    """Jobs that differ only in per-job attributes share an autocluster and one verdict; a
    verdict is remembered per slot shape, and not without one."""
    same = submit(store, 10, args="x")
    other = submit(store, 5, requirements="TARGET.Memory > 1")
    seen: list[int] = []

    def judge(row):  # type: ignore[no-untyped-def]
        seen.append(row.id)
        return Verdict(take=row.id in other)

    assert claimed(store, REQ, shape="s1", judge=judge).id == other[0]
    assert sorted(seen) == [same[0], other[0]]  # each autocluster's first job, once
    assert claimed(store, REQ, shape="s1", judge=judge).id == other[1]
    assert len(seen) == 2  # remembered for this shape
    claim(store, REQ, shape="s2", judge=judge)
    assert len(seen) == 4
    claim(store, REQ, judge=judge)
    assert len(seen) == 6


@pytest.mark.parametrize(
    ("offer", "fits"),
    [
        (Offer(cpus=1, memory=1024, disk=4096), {"small"}),
        (Offer(cpus=2, memory=1024, disk=4096), {"small", "cpus"}),
        (Offer(cpus=1, memory=2048, disk=4096), {"small", "memory"}),
        (Offer(cpus=1, memory=1024, disk=5000), {"small", "disk"}),
        (Offer(cpus=2, memory=2048, disk=5000), {"small", "cpus", "memory", "disk"}),  # equal fits
        (Offer(cpus=1, memory=127, disk=4096), set()),
    ],
)
def test_claim_resource_prefilter(store, offer, fits):
    by_name = {
        "cpus": submit(store, request_cpus=2)[0],
        "memory": submit(store, request_memory=2048)[0],  # MiB
        "disk": submit(store, request_disk=5000)[0],  # KiB
        "small": submit(store)[0],
    }
    judged: set[int] = set()

    def judge(row):  # type: ignore[no-untyped-def]
        judged.add(row.id)
        return Verdict(take=True)

    claimed = set()
    while (job := claim(store, REQ, offer=offer, judge=judge)) is not None:
        claimed.add(job.id)
    assert claimed == judged == {by_name[n] for n in fits}
    for name, job_id in by_name.items():
        assert store.reads.get_job(job_id).status == ("fetched" if name in fits else "idle")


def test_claim_judge_skips(store):
    (first,) = submit(store, requirements="TARGET.Arch == \"ARM\"")
    (second,) = submit(store)
    job = claimed(store, REQ, judge=lambda row: Verdict(take=row.id != first))
    assert job.id == second
    skipped = store.reads.get_job(first)
    assert (skipped.status, skipped.claims, skipped.reason) == ("idle", 0, None)
    assert len(store.reads.events(first)) == 1  # only submit
    assert claim(store, REQ, judge=lambda row: Verdict()) is None


def test_claim_judge_holds(store):
    (first,) = submit(store, requirements="TARGET.Arch == \"ARM\"")
    (second,) = submit(store)

    def judge(row):  # type: ignore[no-untyped-def]
        if row.id == first:
            return Verdict(hold_reason="jobs may not run as root")
        return Verdict(take=True)

    job = claimed(store, REQ, slot="slot3@node", judge=judge)
    assert job.id == second
    held = store.reads.get_job(first)
    assert held.status == "held"
    assert held.reason == "jobs may not run as root"
    assert held.claims == 0 and held.token is None
    ev = store.reads.events(first)[-1]
    assert (ev.event, ev.from_status, ev.to_status) == ("hold", "idle", "held")
    assert ev.reason == "jobs may not run as root" and ev.slot == "slot3@node"
    assert_event_chain(store, first, [("hold", "idle", "held")])
    # a held job is never claimed
    assert claim(store, REQ) is None


def test_claim_without_idle_jobs_returns_none(store):
    assert claim(store, REQ) is None
    (job_id,) = submit(store)
    store.actions.admin(job_id, Event.HOLD, "admin")
    assert claim(store, REQ) is None
    store.actions.admin(job_id, Event.RELEASE)
    assert claimed(store, REQ).id == job_id
    assert claim(store, REQ) is None


def test_claim_sets_attempt_token_and_lease(store):
    (job_id,) = submit(store)
    t0 = time.time()
    job = claimed(store, REQ, slot="slot7@node")
    stored = store.reads.get_job(job_id)
    assert job.token == stored.token and len(job.token) == 32
    assert job.claims == stored.claims == 1
    assert stored.attempts == 0
    assert (stored.slot, stored.host, stored.keyword) == ("slot7@node", "node", "JOBSTORE")
    assert t0 + 119 <= stored.lease_expires_at <= time.time() + 121
    ev = store.reads.events(job_id)[-1]
    assert (ev.event, ev.from_status, ev.to_status, ev.attempt, ev.slot) == (
        "fetch", "idle", "fetched", 1, "slot7@node"
    )


# ---- reports ----------------------------------------------------------------------------------


def test_report_with_the_right_token(store):
    (job_id,) = submit(store)
    job = claimed(store, REQ)
    out = report(store, job, Event.ACCEPT, lease=900, slot="slot1@node")
    assert (out.before, out.after, out.changed, out.stale) == ("fetched", "accepted", True, False)
    assert store.reads.get_job(job_id).lease_ends_at > time.time() + 800
    out = report(store, job, Event.START, changes={"job_pid": 4242}, attrs={"JobPid": 4242})
    assert out.after == "running"
    stored = store.reads.get_job(job_id)
    assert stored.job_pid == 4242 and stored.started_at is not None
    out = report(store, job, Event.EXIT, changes={"exit_code": 0, "exit_by_signal": False})
    assert out.after == "completed"
    stored = store.reads.get_job(job_id)
    assert stored.token is None and stored.lease_expires_at is None
    assert stored.finished_at is not None and stored.exit_code == 0
    ev = store.reads.events(job_id)
    assert ev[3].attrs == {"JobPid": 4242}
    assert [(e.event, e.attempt) for e in ev] == [
        ("submit", 0), ("fetch", 1), ("accept", 1), ("start", 1), ("exit", 1)
    ]
    assert_event_chain(store, job_id, [
        ("fetch", "idle", "fetched"), ("accept", "fetched", "accepted"),
        ("start", "accepted", "running"), ("exit", "running", "completed"),
    ])


def test_a_report_committed_late_is_not_dated_before_the_transition_it_follows(store):
    (job_id,) = submit(store)
    job = claimed(store, REQ)
    t = time.time()
    report(store, job, Event.START, now=t + 5)
    report(store, job, Event.EXIT, changes={"exit_code": 0, "exit_by_signal": False}, now=t + 4)
    times = [e.time for e in store.reads.events(job_id)]
    assert times == sorted(times) and times[-1] == t + 5
    assert store.reads.get_job(job_id).finished_at == t + 5


def _count_row_writes(store: JobStore) -> None:
    """A trigger that notes each UPDATE of a jobs row in `row_writes`."""
    with store.db.engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE row_writes (job_id bigint)"))
        if store.db.engine.dialect.name == "sqlite":
            conn.execute(sa.text("CREATE TRIGGER note_write AFTER UPDATE ON jobs BEGIN"
                                 " INSERT INTO row_writes VALUES (NEW.id); END"))
        else:
            conn.execute(sa.text(
                "CREATE FUNCTION note_write() RETURNS trigger LANGUAGE plpgsql AS"
                " $$BEGIN INSERT INTO row_writes VALUES (NEW.id); RETURN NULL; END$$"))
            conn.execute(sa.text("CREATE TRIGGER note_write AFTER UPDATE ON jobs"
                                 " FOR EACH ROW EXECUTE FUNCTION note_write()"))


def _row_writes(store: JobStore) -> int:
    with store.db.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM row_writes")).scalar_one())


def _of(job, event: Event, now: float, **kw: Any) -> tuple[int, AttemptReport]:  # type: ignore[no-untyped-def]
    return job.id, AttemptReport(event, job.token, job.claims, now=now, keyword="JOBSTORE",
                                 slot="slot1@node", **kw)


@contextmanager
def _statements(store: JobStore) -> Iterator[list[str]]:
    """The statements the store's engine runs within (SQLAlchemy's and the driver's)."""
    statements: list[str] = []

    def seen(conn, cursor, statement, *args: Any) -> None:  # type: ignore[no-untyped-def]
        statements.append(statement)

    sa.event.listen(store.db.engine, "before_cursor_execute", seen)
    try:
        yield statements
    finally:
        sa.event.remove(store.db.engine, "before_cursor_execute", seen)


def test_a_jobs_several_reports_in_one_transaction_write_its_row_once(store):
    (job_id,) = submit(store)
    job = claimed(store, REQ)
    _count_row_writes(store)
    t = time.time()
    exited = {"exit_code": 0, "exit_by_signal": False}
    results = store.reports.report_many([
        _of(job, Event.ACCEPT, t, lease=120),
        _of(job, Event.UPDATE, t + 1, lease=900),  # renews the lease only
        _of(job, Event.PREPARE, t + 2, lease=900),  # the job accepted: nothing new
        _of(job, Event.START, t + 3, lease=900, changes={"job_pid": 7}, attrs={"JobPid": 7}),
        _of(job, Event.EXIT, t + 4, changes=exited, attrs={"JobPid": 7, "ExitCode": 0}),
    ])
    assert [(o.before, o.after) for o in results] == [
        ("fetched", "accepted"), ("accepted", "accepted"), ("accepted", "accepted"),
        ("accepted", "running"), ("running", "completed")]
    assert _row_writes(store) == 1
    stored = store.reads.get_job(job_id)
    assert (stored.status, stored.job_pid, stored.exit_code, stored.finished_at) == (
        "completed", 7, 0, t + 4)
    assert stored.started_at == t + 3 and stored.num_starts == 1 and stored.token is None
    assert_event_chain(store, job_id, [
        ("fetch", "idle", "fetched"), ("accept", "fetched", "accepted"),
        ("start", "accepted", "running"), ("exit", "running", "completed"),
    ])
    # the exit's event leaves out the pid its start recorded
    assert [e.attrs for e in store.reads.events(job_id)][-2:] == [{"JobPid": 7}, {"ExitCode": 0}]


def test_prepare_job_of_an_accepted_job_records_nothing_and_of_a_running_one_is_ignored(store):
    (job_id,) = submit(store)
    job = claimed(store, REQ)
    report(store, job, Event.ACCEPT, lease=120)
    assert not report(store, job, Event.PREPARE, lease=900).changed
    report(store, job, Event.START, changes={"job_pid": 7})
    late = report(store, job, Event.PREPARE, lease=900)
    assert (late.after, late.changed) == ("running", False)
    assert [(e.event, e.to_status) for e in store.reads.events(job_id)] == [
        ("submit", "idle"), ("fetch", "fetched"), ("accept", "accepted"),
        ("start", "running"), ("prepare", None)]


def test_a_kept_row_change_is_written_when_no_later_transition_takes_it(store):
    """The job's last report in the batch is stale (it writes only its event): the accept's
    change is still written, before the commit."""
    (job_id,) = submit(store)
    job = claimed(store, REQ)
    _count_row_writes(store)
    t = time.time()
    old = job.but(claims=job.claims - 1)
    results = store.reports.report_many([_of(job, Event.ACCEPT, t, lease=120),
                                         _of(old, Event.EXIT, t + 1)])
    assert [(o.after, o.stale) for o in results] == [("accepted", False), ("accepted", True)]
    assert _row_writes(store) == 1 and store.reads.get_job(job_id).status == "accepted"
    assert [(e.event, e.to_status) for e in store.reads.events(job_id)][-2:] == [
        ("accept", "accepted"), ("exit", None)]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_batch_of_reports_locks_no_row_and_reads_them_as_it_opens(store):
    """The agent's batches (report_many) on PostgreSQL: the rows are read unlocked with
    their versions as the transaction opens, and each written once, after its events."""
    submit(store, 2)
    jobs_ = [claimed(store, REQ), claimed(store, REQ)]
    _count_row_writes(store)
    t = time.time()
    with _statements(store) as statements:
        results = store.reports.report_many([_of(jobs_[1], Event.ACCEPT, t, lease=120),
                                             _of(jobs_[0], Event.ACCEPT, t, lease=120),
                                             _of(jobs_[1], Event.START, t + 1, lease=900)])
    assert [o.after for o in results] == ["accepted", "accepted", "running"]
    assert not [s for s in statements if "FOR UPDATE" in s.upper()], statements
    assert "row_version" in statements[0]  # read in the round trip that opened it
    assert _row_writes(store) == 2
    assert [store.reads.get_job(j.id).status for j in jobs_] == ["accepted", "running"]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_batch_about_one_job_writes_its_row_with_its_last_transition(store):
    """One job's several reports read at a version: every change but the last is kept, and
    the last transition's statement writes the row with all of them (no UPDATE of its own)."""
    (job_id,) = submit(store)
    job = claimed(store, REQ)
    t = time.time()
    with _statements(store) as statements:
        results = store.reports.report_many([_of(job, Event.ACCEPT, t, lease=120),
                                             _of(job, Event.START, t + 1, lease=900,
                                                 changes={"job_pid": 7})])
    assert [o.after for o in results] == ["accepted", "running"]
    assert [s for s in statements if "WITH changed AS" in s] != []
    assert not [s for s in statements if s.lstrip().upper().startswith("UPDATE JOBS")]
    assert not [s for s in statements if "FOR UPDATE" in s.upper()]
    stored = store.reads.get_job(job_id)
    assert (stored.status, stored.job_pid, stored.started_at) == ("running", 7, t + 1)
    assert_event_chain(store, job_id, [
        ("fetch", "idle", "fetched"), ("accept", "fetched", "accepted"),
        ("start", "accepted", "running"),
    ])


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_batch_that_finds_a_row_changed_is_made_again_on_locked_rows(store, monkeypatch):
    """A row another transaction changed between the batch's read and its write: the batch's
    events and writes are rolled back and it is made again under a lock, on the row as the
    other left it (nothing of either lost, no event twice)."""
    (job_id,) = submit(store)
    job = claimed(store, REQ)
    backend, url = store.db.backend, store.db.engine.url.render_as_string(False)
    real, reads = backend.read_jobs, []

    def read_then_changed(conn, opened, job_ids):  # type: ignore[no-untyped-def]
        found = real(conn, opened, job_ids)
        reads.append(job_ids)
        with psycopg.connect(libpq_url(url), autocommit=True) as other:
            other.execute("UPDATE jobs SET priority = 7 WHERE id = %s", (job_id,))
        return found

    monkeypatch.setattr(backend, "read_jobs", read_then_changed)
    t = time.time()
    results = store.reports.report_many([_of(job, Event.ACCEPT, t, lease=120),
                                         _of(job, Event.START, t + 1, lease=900)])
    assert len(reads) == 1  # once unlocked; the second time under locks
    assert [o.after for o in results] == ["accepted", "running"]
    stored = store.reads.get_job(job_id)
    assert (stored.status, stored.priority) == ("running", 7)
    assert_event_chain(store, job_id, [
        ("fetch", "idle", "fetched"), ("accept", "fetched", "accepted"),
        ("start", "accepted", "running"),
    ])


def _done_or_waiting(url: str, thread: Any, timeout: float = 10.0) -> None:
    """Until `thread` has ended or a session of the database waits on a lock."""
    with psycopg.connect(url, autocommit=True) as conn:
        end = time.monotonic() + timeout
        while thread.is_alive() and time.monotonic() < end:
            if first(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname ="
                                  " current_database() AND wait_event_type = 'Lock'")):
                return
            time.sleep(0.05)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_batch_and_an_action_on_the_same_jobs_do_not_deadlock(store, monkeypatch):
    """A batch whose first report of a job changes nothing, and an id-ordered hold of the
    same jobs (which waits for the locks it needs) made while the batch writes: the batch
    locks no row before its writes, which go in the order of the ids, so neither fails; the
    hold is carried out and the batch's reports are decided on the rows as it left them."""
    import threading

    submit(store, 2)
    a, b = sorted([claimed(store, REQ), claimed(store, REQ)], key=lambda j: j.id)
    t = time.time()
    store.reports.report_many([_of(a, Event.ACCEPT, t, lease=900),
                               _of(b, Event.ACCEPT, t, lease=900)])
    url = libpq_url(store.db.engine.url.render_as_string(False))
    failed: list[BaseException] = []

    def hold() -> None:
        try:
            with store.db.transaction() as conn:
                store.door.act(conn, [a.id, b.id], "hold", "admin", (1, 0), skip_locked=False,
                               now=time.time())
        except BaseException as exc:  # noqa: BLE001 - the test's finding
            failed.append(exc)

    holder = threading.Thread(target=hold)
    real = store.transitions.write_kept

    def hold_meanwhile(conn):  # type: ignore[no-untyped-def]
        if holder.ident is None:
            holder.start()
            _done_or_waiting(url, holder)
        return real(conn)

    monkeypatch.setattr(store.transitions, "write_kept", hold_meanwhile)
    try:
        store.reports.report_many([_of(b, Event.UPDATE, t + 1, lease=900),  # nothing new
                                   _of(b, Event.START, t + 2, lease=900),
                                   _of(a, Event.START, t + 2, lease=900)])
    finally:
        holder.join(30)
    assert not failed, failed
    assert {store.reads.get_job(j.id).status for j in (a, b)} == {"held"}


def _stale_check(store, job_id, before_row, out, n_events_before):  # type: ignore[no-untyped-def]
    assert out.stale and not out.changed
    assert out.before == out.after == before_row.status
    assert store.reads.get_job(job_id) == before_row  # nothing changed
    evs = store.reads.events(job_id)
    assert len(evs) == n_events_before + 1
    assert evs[-1].to_status is None
    assert evs[-1].from_status == before_row.status
    assert evs[-1].reason.startswith("stale: ")


@pytest.mark.parametrize("event", [Event.ACCEPT, Event.START, Event.EXIT, Event.HOOK_REMOVE])
def test_report_with_a_wrong_token_is_stale(store, event):
    (job_id,) = submit(store)
    job = claimed(store, REQ)
    before, n = store.reads.get_job(job_id), len(store.reads.events(job_id))
    out = store.reports.report(job_id, event, token="0" * 32, attempt=job.claims,
                               changes={"exit_code": 9, "job_pid": 1})
    _stale_check(store, job_id, before, out, n)
    # no token at all, and the right token with the wrong attempt number: also stale
    out = store.reports.report(job_id, event, token=None, attempt=job.claims)
    _stale_check(store, job_id, before, out, n + 1)
    out = store.reports.report(job_id, event, token=job.token, attempt=job.claims + 1)
    _stale_check(store, job_id, before, out, n + 2)
    # the right token and attempt from a hook of another keyword (another node's settings)
    out = store.reports.report(job_id, event, token=job.token, attempt=job.claims,
                               keyword=f"NOT{job.keyword}")
    _stale_check(store, job_id, before, out, n + 3)


def test_report_from_an_old_attempt_is_stale(store):
    (job_id,) = submit(store)
    old = claimed(store, REQ)
    assert report(store, old, Event.REJECT).after == "idle"
    new = claimed(store, REQ)
    assert new.claims == 2 and new.token != old.token
    before, n = store.reads.get_job(job_id), len(store.reads.events(job_id))
    for event in (Event.ACCEPT, Event.PREPARE, Event.EXIT, Event.EVICT):
        out = report(store, old, event, changes={"exit_code": 3})
        _stale_check(store, job_id, before, out, n)
        n += 1
    assert store.reads.events(job_id)[-1].attempt == 1
    assert report(store, new, Event.ACCEPT).after == "accepted"


def test_reject_does_not_count_an_attempt(store):
    (job_id,) = submit(store, max_attempts=1)
    for n in (1, 2, 3):
        job = claimed(store, REQ)
        assert job.claims == n
        out = report(store, job, Event.REJECT if n % 2 else Event.CLAIM_EVICTED)
        assert out.after == "idle"
        stored = store.reads.get_job(job_id)
        assert (stored.attempts, stored.token, stored.lease_expires_at) == (0, None, None)
    # whereas an evict does count, and with max_attempts=1 the job fails
    job = claimed(store, REQ)
    out = report(store, job, Event.EVICT)
    assert out.after == "failed"
    assert store.reads.get_job(job_id).attempts == 1


def test_evict_requeues_and_counts(store):
    (job_id,) = submit(store, max_attempts=2)
    job = claimed(store, REQ)
    report(store, job, Event.START)
    out = report(store, job, Event.EVICT)
    assert out.after == "idle"
    stored = store.reads.get_job(job_id)
    assert stored.attempts == 1 and "attempt 1 of 2 used" in stored.reason
    job = claimed(store, REQ)
    assert job.reason is None and store.reads.get_job(job_id).reason is None
    assert report(store, job, Event.EVICT).after == "failed"
    failed = store.reads.get_job(job_id)
    assert failed.attempts == 2 and "all 2 attempts used" in failed.reason
    assert failed.finished_at is not None


def test_an_attempts_events_name_its_slot_once_and_are_read_with_it(store):
    """The events of an attempt on its slot store the slot and host only where they differ
    from the attempt's fetch; every reader still gets them, for the latest attempt (from the
    row) and for an earlier one (from its fetch event); an event from another slot, and a stale
    report, are read as they came."""
    (job_id,) = submit(store, max_attempts=3)
    first_try = claimed(store, REQ, slot="slot1@node")
    report(store, first_try, Event.ACCEPT, slot="slot1@node", host="node")
    report(store, first_try, Event.START, slot="slot1@node")
    report(store, first_try, Event.EVICT, slot="slot1@node")
    second = claimed(store, REQ, slot="slot2@node")
    report(store, second, Event.ACCEPT, slot="slot2@node", host="node")
    report(store, first_try, Event.UPDATE)  # stale, naming no slot: read as it came
    report(store, second, Event.START, slot="slot3@node", host="node")  # not where it was
    report(store, second, Event.EXIT, slot="slot3@node")  # handed out: kept as they came
    stored = [(r["event"], r["slot"], r["host"]) for r in rows(store, job_events)]
    assert stored == [
        ("submit", None, None),
        ("fetch", "slot1@node", "node"), ("accept", None, None), ("start", None, None),
        ("evict", None, None),
        ("fetch", "slot2@node", "node"), ("accept", None, None), ("update", None, None),
        ("start", "slot3@node", "node"), ("exit", "slot3@node", None),
    ]
    read = [(e.event, e.slot, e.host) for e in store.reads.events(job_id)]
    assert read == [
        ("submit", None, None),
        ("fetch", "slot1@node", "node"), ("accept", "slot1@node", "node"),
        ("start", "slot1@node", "node"), ("evict", "slot1@node", "node"),
        ("fetch", "slot2@node", "node"), ("accept", "slot2@node", "node"),
        ("update", None, None), ("start", "slot3@node", "node"), ("exit", "slot3@node", None),
    ]
    fed = [(f.event.event, f.event.slot, f.event.host) for f in store.reads.event_feed(0)]
    assert fed == read


def test_exit_policy_through_the_store(store):
    (job_id,) = submit(store, max_attempts=2)
    retry = lambda row: ExitVerdict(False, True)  # noqa: E731
    job = claimed(store, REQ)
    assert report(store, job, Event.EXIT, exit_policy=retry).after == "idle"
    job = claimed(store, REQ)
    assert report(store, job, Event.EXIT, exit_policy=retry).after == "failed"
    (other,) = submit(store, max_attempts=2)
    job = claimed(store, REQ)
    out = report(store, job, Event.EXIT, exit_policy=lambda row: ExitVerdict(False, False))
    assert out.after == "completed"
    assert store.reads.get_job(other).attempts == 0


def test_second_job_exit_is_harmless(store):
    (job_id,) = submit(store)
    job = claimed(store, REQ)
    report(store, job, Event.START)
    assert report(store, job, Event.EXIT, changes={"exit_code": 0}).after == "completed"
    before, n = store.reads.get_job(job_id), len(store.reads.events(job_id))
    out = report(store, job, Event.EXIT, changes={"exit_code": 1})
    _stale_check(store, job_id, before, out, n)
    out = report(store, job, Event.EVICT)
    _stale_check(store, job_id, before, out, n + 1)
    assert store.reads.get_job(job_id).exit_code == 0


def test_accept_after_prepare_or_start_is_harmless(store):
    (job_id,) = submit(store)
    job = claimed(store, REQ)
    assert report(store, job, Event.PREPARE, lease=900).after == "accepted"
    lease = store.reads.get_job(job_id).lease_expires_at
    out = report(store, job, Event.ACCEPT, lease=120)  # the late REPLY_FETCH accept
    assert (out.before, out.after, out.changed, out.stale) == ("accepted", "accepted", False, False)
    assert store.reads.get_job(job_id).lease_expires_at == lease  # the short lease did not win
    assert report(store, job, Event.START, lease=900).after == "running"
    before = store.reads.get_job(job_id)
    out = report(store, job, Event.ACCEPT, lease=120)
    assert (out.after, out.changed) == ("running", False)
    assert store.reads.get_job(job_id) == before
    ignored = [e for e in store.reads.events(job_id) if e.to_status is None]
    assert [(e.event, e.from_status) for e in ignored] == [
        ("accept", "accepted"), ("accept", "running")
    ]
    assert report(store, job, Event.EXIT).after == "completed"
    assert_event_chain(store, job_id, [
        ("fetch", "idle", "fetched"), ("prepare", "fetched", "accepted"),
        ("start", "accepted", "running"), ("exit", "running", "completed"),
    ])


# ---- lease expiry -----------------------------------------------------------------------------


def test_reap_requeues_expired_leases_then_fails(store):
    (job_id,) = submit(store, max_attempts=2)
    (untouched,) = submit(store)
    first = claimed(store, REQ)
    assert store.maintenance.reap() == []  # lease not yet expired
    out = store.maintenance.reap(now=FAR_FUTURE)
    assert [(o.job_id, o.before, o.after) for o in out] == [(job_id, "fetched", "idle")]
    stored = store.reads.get_job(job_id)
    assert (stored.status, stored.attempts, stored.token) == ("idle", 1, None)
    assert "lease of attempt 1 expired" in stored.reason
    # the old attempt's late report is stale
    assert report(store, first, Event.ACCEPT).stale
    second = claimed(store, REQ)
    assert second.id == job_id and second.claims == 2
    report(store, second, Event.START)
    out = store.maintenance.reap(now=FAR_FUTURE)
    assert [(o.before, o.after) for o in out] == [("running", "failed")]
    failed = store.reads.get_job(job_id)
    assert failed.attempts == 2 and "all 2 attempts used" in failed.reason
    assert store.maintenance.reap(now=FAR_FUTURE) == []
    assert store.reads.get_job(untouched).status == "idle"
    assert_event_chain(store, job_id, [
        ("fetch", "idle", "fetched"), ("lease_expired", "fetched", "idle"),
        ("fetch", "idle", "fetched"), ("start", "fetched", "running"),
        ("lease_expired", "running", "failed"),
    ])


def test_reap_due_recovers_leases_once_per_interval_in_the_pool(store):
    """The agents' pass (a job whose startd died comes back though no slot fetches): whoever
    asks first within an interval reaps; the others are told it is not due."""
    (job_id,) = submit(store)
    claim(store, REQ)
    out = store.maintenance.reap_due(10, now=FAR_FUTURE)
    assert [(o.job_id, o.before, o.after) for o in out] == [(job_id, "fetched", "idle")]
    claim(store, REQ)
    assert store.maintenance.reap_due(10, now=FAR_FUTURE + 5) is None
    out = store.maintenance.reap_due(10, now=FAR_FUTURE + 11)
    assert [(o.job_id, o.before, o.after) for o in out] == [(job_id, "fetched", "idle")]


def test_reap_due_takes_no_pass_when_nothing_ran_out(store):
    """An idle pool's agents write nothing: with no lease run out, no pass is taken (and the
    first one that has something to do runs at once)."""
    (job_id,) = submit(store)
    assert store.maintenance.reap_due(10, now=FAR_FUTURE) is None
    with store.db.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM passes")).scalar() == 0
    claim(store, REQ)
    assert store.maintenance.reap_due(10) is None  # its lease has not run out
    out = store.maintenance.reap_due(10, now=FAR_FUTURE)
    assert [(o.job_id, o.after) for o in out] == [(job_id, "idle")]


def test_reap_respects_renewed_leases(store):
    (job_id,) = submit(store)
    job = claimed(store, REQ)
    now = time.time()
    report(store, job, Event.START, lease=900)
    assert store.maintenance.reap(now=now + 300) == []  # the 120 s claim lease was renewed to 900 s
    assert [o.after for o in store.maintenance.reap(now=now + 1000)] == ["idle"]


# ---- admin ------------------------------------------------------------------------------------


@BOTH_BACKENDS
def test_admin_hold_release_rm(store):
    a, b = submit(store, 2)
    out = store.actions.admin(a, Event.HOLD, "wait for input")
    assert (out.before, out.after, out.changed) == ("idle", "held", True)
    assert store.reads.get_job(a).reason == "wait for input"
    assert store.actions.admin(a, Event.HOLD).changed is False  # already held
    assert store.actions.admin(a, Event.RELEASE).after == "idle"
    assert store.actions.admin(a, Event.RELEASE).changed is False
    assert store.actions.admin(a, Event.REMOVE).after == "removed"
    removed = store.reads.get_job(a)
    assert removed.finished_at is not None
    n = len(store.reads.events(a))
    for event in (Event.HOLD, Event.RELEASE, Event.REMOVE):
        assert store.actions.admin(a, event).changed is False
    assert len(store.reads.events(a)) == n  # refused admin events are not recorded
    assert_event_chain(store, a, [
        ("hold", "idle", "held"), ("release", "held", "idle"), ("remove", "idle", "removed"),
    ])
    # hold of a running job voids its attempt: the starter's reports become stale
    job = claimed(store, REQ)
    assert job.id == b
    report(store, job, Event.START)
    assert store.actions.admin(b, Event.HOLD, "admin hold").after == "held"
    held = store.reads.get_job(b)
    assert (held.token, held.lease_expires_at, held.attempts) == (None, None, 0)
    assert report(store, job, Event.EXIT).stale
    assert store.actions.admin(b, Event.REMOVE).after == "removed"
    assert store.reads.list_jobs() == []
    assert {j.id for j in store.reads.list_jobs(final_only=True)} == {a, b}


@BOTH_BACKENDS
def test_every_state_change_has_exactly_one_event(store):
    """A busy mixed history: for every job, the state-changing events chain without gaps and
    their count equals the number of changes the store reported."""
    ids = submit(store, 6, max_attempts=2)
    changed = dict.fromkeys(ids, 1)  # the submit

    def note(out):  # type: ignore[no-untyped-def]
        if out.changed:
            changed[out.job_id] += 1
        return out

    jobs_ = {}
    while (job := claim(store, REQ)) is not None:
        changed[job.id] += 1
        jobs_[job.id] = job
    j = [jobs_[i] for i in ids]
    note(report(store, j[0], Event.ACCEPT))
    note(report(store, j[0], Event.ACCEPT))
    note(report(store, j[0], Event.UPDATE))
    note(report(store, j[0], Event.START))
    note(report(store, j[0], Event.UPDATE))
    note(report(store, j[0], Event.EXIT))
    note(report(store, j[0], Event.EXIT))
    note(report(store, j[1], Event.REJECT))
    note(report(store, j[1], Event.ACCEPT))
    note(report(store, j[2], Event.HOOK_HOLD))
    note(store.actions.admin(ids[2], Event.RELEASE))
    note(report(store, j[3], Event.HOOK_REMOVE))
    note(store.actions.admin(ids[3], Event.RELEASE))
    note(report(store, j[4], Event.START))
    for out in store.maintenance.reap(now=FAR_FUTURE):
        note(out)
    note(store.actions.admin(ids[5], Event.REMOVE))
    for job_id in ids:
        evs = store.reads.events(job_id)
        chain = [e for e in evs if e.to_status is not None]
        assert len(chain) == changed[job_id]
        assert chain[0].event == "submit" and chain[0].from_status is None
        for prev, cur in zip(chain, chain[1:], strict=False):
            assert cur.from_status == prev.to_status
        assert chain[-1].to_status == store.reads.get_job(job_id).status
    assert [store.reads.get_job(i).status for i in ids] == [
        "completed", "idle", "idle", "removed", "idle", "removed"
    ]


# ---- the claim's queries use the partial claim index ------------------------------------------


def _capture_claim_statements(store: JobStore) -> list[tuple[str, Any]]:
    captured: list[tuple[str, Any]] = []

    def listener(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        # the skip scan of idle autoclusters, and the claim itself (PostgreSQL's one statement,
        # SQLite's SELECT of an autocluster's first job)
        if "autocluster_id" in statement and "ORDER BY" in statement:
            captured.append((without_begin(statement), parameters))

    sa.event.listen(store.db.engine, "before_cursor_execute", listener)
    try:
        job = claimed(store, REQ, offer=Offer(cpus=1, memory=1024, disk=4096))
    finally:
        sa.event.remove(store.db.engine, "before_cursor_execute", listener)
    assert job is not None and job.status == "fetched"
    return captured


def _analyze(store: JobStore) -> None:
    """The planner's statistics of the jobs as they are now, as autovacuum would have them (not
    whatever the database's last test left)."""
    with store.db.engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE jobs")


@BOTH_BACKENDS
def test_claim_queries_use_the_claim_index(store):
    """Behind 20,000 idle and 20,000 completed jobs, both claim statements walk ix_jobs_claim
    and never sort."""
    pg = store.db.engine.dialect.name == "postgresql"
    (first,) = submit(store, priority=3)
    clone(store, first, 20_000 if pg else 5_000, priority="i % 7")
    clone(store, first, 20_000 if pg else 5_000, status="completed")
    _analyze(store)
    captured = _capture_claim_statements(store)
    assert len(captured) == 2
    with store.db.engine.connect() as conn:
        for statement, params in captured:
            if pg:
                plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, params).scalar()
                text = json.dumps(plan)
                assert '"Index Name": "ix_jobs_claim"' in text, text
                assert '"Node Type": "Sort"' not in text, text  # the index gives the order
                assert '"Node Type": "Seq Scan"' not in text.split('"Relation Name": "jobs"')[0]
            else:
                plan = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, params).fetchall()
                text = " | ".join(str(row[-1]) for row in plan)
                assert "ix_jobs_claim" in text, text
                assert "TEMP B-TREE" not in text, text  # the index gives the order


def _scans(plan: Any) -> list[tuple[str, str | None]]:
    """(node type, index) of every scan of jobs in an EXPLAIN (FORMAT JSON) plan."""
    found, todo = [], [plan[0]["Plan"]]
    while todo:
        node = todo.pop()
        if node.get("Relation Name") == "jobs":
            found.append((node["Node Type"], node.get("Index Name")))
        todo.extend(node.get("Plans", []))
    return found


def test_status_queries_use_the_phase_indexes(pg_url: str) -> None:
    """The reaper, condor_q by status, fair share and retention name a job's phase as the
    partial indexes do, so each finds its rows among 20,000 idle and 20,000 finished jobs
    through an index of jobs, never a scan of the whole table."""
    upgrade(pg_url)
    store = JobStore.from_url(pg_url)
    (first,) = submit(store)
    clone(store, first, 20_000, status="completed")
    clone(store, first, 20_000)
    _analyze(store)
    for _ in range(5):
        claim(store, REQ)
    captured: list[tuple[str, Any]] = []

    def listener(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        statement = without_begin(statement)
        if "jobs" in statement and statement.lstrip().upper().startswith(("SELECT", "WITH")):
            captured.append((statement, parameters))

    sa.event.listen(store.db.engine, "before_cursor_execute", listener)
    try:
        store.maintenance.reap(now=time.time())
        store.reads.list_jobs(statuses=["running", "accepted"])
        store.reads.list_jobs(final_only=True, limit=10)
        store.negotiator.usage_table()
        store.retention.prune(time.time() - 86400, dry_run=True)
    finally:
        sa.event.remove(store.db.engine, "before_cursor_execute", listener)
    assert len(captured) >= 5
    with store.db.engine.connect() as conn:
        for statement, params in captured:
            plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, params).scalar()
            scans = _scans(plan)
            assert scans and all(kind != "Seq Scan" for kind, _ in scans), (statement, scans)
    store.db.engine.dispose()


def test_a_report_applies_to_the_row_as_it_is_when_it_changed_meanwhile(pg_url: str) -> None:
    """On PostgreSQL a report reads the job row without a lock and writes it only if it is still
    the version it read. Here another session changes the row between the exit report's read
    and its write (inside the exit policy's evaluation, without waiting for any lock): the
    report is applied once, to the changed row, whose change it keeps."""
    upgrade(pg_url)
    store = JobStore.from_url(pg_url)
    other = sa.create_engine(pg_url)
    try:
        (job_id,) = submit(store)
        job = claimed(store, REQ)
        t0 = time.time()
        report(store, job, Event.START, changes={"job_pid": 7}, now=t0)
        calls: list[int] = []

        def policy_meanwhile(row):  # type: ignore[no-untyped-def]
            calls.append(row.id)
            if len(calls) == 1:
                with other.begin() as conn:
                    conn.exec_driver_sql("SET LOCAL lock_timeout = '2s'")
                    conn.execute(sa.update(jobs).where(jobs.c.id == job_id)
                                 .values(wall_clock=1000.0))
            return ExitVerdict(True, False)

        out = report(store, job, Event.EXIT, changes={"exit_code": 0}, now=t0 + 10,
                     exit_policy=policy_meanwhile)
        assert (out.changed, out.after) == (True, "completed")
        assert len(calls) == 2  # read again, and judged again, after the change
        stored = store.reads.get_job(job_id)
        assert stored.status == "completed" and stored.exit_code == 0
        assert stored.wall_clock == pytest.approx(1010.0)  # the other session's 1000 s kept
        exits = [e for e in store.reads.events(job_id) if e.event == "exit"]
        assert [(e.from_status, e.to_status) for e in exits] == [("running", "completed")]
    finally:
        other.dispose()
        store.db.engine.dispose()


def test_fresh_store_from_url(db_url):
    upgrade(db_url)
    s = JobStore.from_url(db_url)
    try:
        assert s.reads.stats() == [] and s.reads.events() == [] and claim(s) is None
    finally:
        s.db.engine.dispose()


def test_a_connection_lost_mid_transaction_is_a_database_error(
    pg_url: str, pg_admin_url: str
) -> None:
    """The server ends the session inside a transaction (a restart, pg_terminate_backend): the
    caller gets the store's DatabaseError, never SQLAlchemy's PendingRollbackError."""
    import psycopg

    from jobstore.errors import DatabaseError
    from jobstore.testing.support import libpq_url

    upgrade(pg_url)
    store = JobStore.from_url(pg_url)
    try:
        with (pytest.raises(DatabaseError, match="terminating connection"),
              store.db.transaction() as conn):
            pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
            with psycopg.connect(libpq_url(pg_admin_url), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            conn.execute(sa.text("SELECT 1"))
        assert store.reads.stats() == []  # and the store works again at once
    finally:
        store.db.engine.dispose()


def test_a_pooled_connection_the_server_dropped_is_replaced_once(pg_url: str) -> None:
    """The agent's pooled store after its connection was killed (a restart, an idle timeout):
    the next call still succeeds, without a ping before every checkout; a server that is
    really away is one DatabaseError."""
    upgrade(pg_url)
    store = JobStore.from_url(pg_url, pool=True, connect_timeout=2)
    try:
        (job_id,) = submit(store)
        with psycopg.connect(libpq_url(pg_url), autocommit=True) as admin:
            for round_ in range(3):
                (pid,) = _backends(admin)  # the store's kept connection
                assert first(admin.execute("SELECT pg_terminate_backend(%s)", (pid,)))
                # the backend is gone before the store's next statement
                assert _until(lambda: not _backends(admin))  # noqa: B023
                assert store.reads.get_job(job_id).status == ("idle", "held")[round_ % 2]
                outcome = store.actions.admin(job_id,
                                              Event.HOLD if round_ % 2 == 0 else Event.RELEASE)
                assert outcome.changed
                assert _backends(admin) not in ([], [pid])
    finally:
        store.db.engine.dispose()
    from jobstore.errors import DatabaseError

    away = JobStore.from_url(pg_url.replace("5432", "1"), pool=True, connect_timeout=1)
    with pytest.raises(DatabaseError):
        away.reads.get_job(job_id)


def test_the_listen_probe_survives_a_pooled_connection_the_server_dropped(pg_url: str) -> None:
    """After a restart the agent's pooled connection is dead: the LISTEN probe's notification
    goes through the store's transaction, which replaces it, so the probe still succeeds (and
    the agent does not fall back to polling for a minute)."""
    import psycopg

    from jobstore.db.channels import STOPS
    from jobstore.testing.support import libpq_url

    upgrade(pg_url)
    store = JobStore.from_url(pg_url, pool=True, connect_timeout=2)
    listener = store.db.listener(STOPS, connect_timeout=2)
    try:
        with store.db.engine.connect() as conn:
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with psycopg.connect(libpq_url(pg_url), autocommit=True) as admin:
            assert first(admin.execute("SELECT pg_terminate_backend(%s)", (pid,)))
            while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s",
                                (pid,)).fetchone():
                time.sleep(0.01)
        listener.open()
        assert listener.probe()
    finally:
        listener.close()
        store.db.engine.dispose()


def test_a_report_within_its_lease_keeps_it_and_updates_the_row_in_place(pg_url: str) -> None:
    """New usage moments after the lease was renewed (within its last tenth): the lease stays,
    so no indexed column changes and PostgreSQL makes a HOT update (no index entries); later,
    the lease is renewed, still in place (lease_renewed_until, which no index names)."""
    import psycopg

    from jobstore.testing.support import libpq_url

    upgrade(pg_url)
    store = JobStore.from_url(pg_url)
    try:
        (job_id,) = submit(store)
        job = running(store, lease=600)  # START with job_pid 42, lease 600
        lease = store.reads.get_job(job_id).lease_expires_at

        def hot_updates() -> int:
            with psycopg.connect(libpq_url(pg_url), autocommit=True) as conn:
                return int(first(conn.execute("SELECT n_tup_hot_upd FROM pg_stat_user_tables"
                                             " WHERE relname = 'jobs'")))

        def settled() -> int:  # a backend's counters reach the view when it ends (NullPool)
            seen, deadline = hot_updates(), time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.2)
                if (now_seen := hot_updates()) == seen:
                    return seen
                seen = now_seen
            return seen

        before = settled()
        out = report(store, job, Event.START, changes={"job_pid": 42, "remote_user_cpu": 3.0},
                     lease=600)
        assert out.changed and store.reads.get_job(job_id).lease_expires_at == lease
        assert store.reads.get_job(job_id).remote_user_cpu == 3.0
        assert settled() == before + 1
        later = time.time() + 100  # 500 s of 600 left: renewed
        report(store, job, Event.START, changes={"job_pid": 42, "remote_user_cpu": 4.0},
               lease=600, now=later)
        renewed = store.reads.get_job(job_id)
        assert renewed.lease_ends_at == pytest.approx(later + 600)
        assert renewed.lease_expires_at == lease
        assert settled() == before + 2
    finally:
        store.db.engine.dispose()


def test_one_lost_periodic_update_never_lets_the_lease_run_out(store: JobStore) -> None:
    """LEASE_DURATION 900 s, UPDATE_JOB_INFO every 300 s (STARTER_UPDATE_INTERVAL) with
    nothing new, some of them lost: whenever an update arrives, the lease has not run out, and
    the reaper, running just before it, leaves the job alone."""
    (job_id,) = submit(store)
    job = running(store, lease=600)  # START with job_pid 42, lease 600
    t0 = time.time()
    for k in (0, 1, 3, 4, 6, 7):  # updates 2 and 5 are lost
        at = t0 + 300 * k
        assert (store.reads.get_job(job_id).lease_ends_at or 0) > at, k
        assert store.maintenance.reap(now=at) == [], k
        report(store, job, Event.START, changes={"job_pid": 42}, lease=900, now=at)
    assert store.reads.get_job(job_id).status == "running"


def test_the_reaper_indexes_a_renewed_lease_and_expires_only_a_lease_run_out(
    store: JobStore,
) -> None:
    """A lease renewed in place (lease_renewed_until) outlives the expiry the reaper's index
    holds: the reaper then moves that expiry up, with no event; once the renewal has run out
    too, the lease expires."""
    (job_id,) = submit(store)
    job = running(store, lease=600)  # START with job_pid 42, lease 600
    first = store.reads.get_job(job_id).lease_expires_at
    assert first is not None
    at = first - 100
    report(store, job, Event.START, changes={"job_pid": 42, "remote_user_cpu": 1.0}, lease=600,
           now=at)
    assert store.reads.get_job(job_id).lease_expires_at == first
    events = len(store.reads.events(job_id))
    assert store.maintenance.reap(now=first + 1) == []
    stored = store.reads.get_job(job_id)
    assert (stored.status, stored.lease_expires_at) == ("running", pytest.approx(at + 600))
    assert len(store.reads.events(job_id)) == events
    (out,) = store.maintenance.reap(now=at + 601)
    assert (out.event, out.before, out.after) == ("lease_expired", "running", "idle")
    stored = store.reads.get_job(job_id)
    assert (stored.lease_expires_at, stored.lease_renewed_until, stored.token) == (None,) * 3


def test_a_repeated_update_that_changes_nothing_writes_nothing(store: JobStore) -> None:
    """UPDATE_JOB_INFO of a running job with the same values moments after its lease was
    renewed: no row version and no event; new usage is written with its event; a lease renewed
    longer ago (past a tenth of its length) is renewed in the row, without an event."""
    (job_id,) = submit(store)
    job = running(store, lease=600)  # START with job_pid 42, lease 600
    events = len(store.reads.events(job_id))
    now = time.time()

    def update(at: float, **changes: Any) -> Any:
        return report(store, job, Event.START, changes={"job_pid": 42, **changes}, lease=600,
                      now=at)

    same = update(now + 10)
    assert (same.changed, same.after, same.reason) == (False, "running", "nothing new")
    assert len(store.reads.events(job_id)) == events
    assert store.reads.get_job(job_id).updated_at < now + 10
    used = update(now + 20, remote_user_cpu=5.0)
    assert used.changed and len(store.reads.events(job_id)) == events + 1
    assert update(now + 30, remote_user_cpu=5.0).reason == "nothing new"
    renewed = update(now + 400, remote_user_cpu=5.0)  # 200 s of 600 left: renew
    assert (renewed.changed, renewed.reason) == (False, "lease renewed")
    stored = store.reads.get_job(job_id)
    assert stored.lease_ends_at == pytest.approx(now + 1000)
    assert stored.updated_at == pytest.approx(now + 400)
    assert len(store.reads.events(job_id)) == events + 1  # nothing happened to the job


# ---- PostgreSQL's hot path runs on psycopg (jobstore.db.backends.postgresql.driver) ---------


def test_a_claim_and_a_report_are_two_round_trips_and_a_commit_each(pg_url: str) -> None:
    """On PostgreSQL the round trip that opens a transaction (BEGIN and its timeout in one simple
    query; psycopg, in autocommit mode meanwhile, sends no BEGIN of its own) also reads what the
    transaction starts from: the claim's menu, a report's job row (without a lock). Then one
    statement writes (row, event and notification) and one commit ends it. SQLAlchemy's
    listeners see the statements the driver module runs, with their parameters."""
    upgrade(pg_url)
    store = JobStore.from_url(pg_url, pool=True)
    try:
        submit(store, 2)
        claim(store, REQ, shape="small")  # the autocluster's verdict is remembered from here on
        seen: list[str] = []
        commits: list[bool] = []
        token: list[str | None] = []

        def listener(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
            seen.append(" ".join(statement.split()))
            assert not token or token[0] not in str(parameters)  # compared in Python only
            assert getattr(conn.connection.dbapi_connection, "autocommit", False)

        sa.event.listen(store.db.engine, "before_cursor_execute", listener)
        sa.event.listen(store.db.engine, "commit", lambda _conn: commits.append(True))
        job = claimed(store, REQ, shape="small")
        token.append(job.token)
        out = report(store, job, Event.EXIT, changes={"exit_code": 0})
        assert out.after == "completed"
        begin = "BEGIN; SELECT set_config('statement_timeout', %(milliseconds)s, true);"
        assert [st.startswith(begin) for st in seen] == [True, False, True, False], seen
        assert [st[len(begin):].split()[:2] if st.startswith(begin) else st.split()[:2]
                for st in seen] == [["WITH", "RECURSIVE"], ["WITH", "cand"],
                                    ["SELECT", "jobs.*,"], ["WITH", "changed"]]
        assert commits == [True, True]
        (fetch, exit_) = [e for e in store.reads.events(job.id) if e.event in ("fetch", "exit")]
        assert (exit_.from_status, exit_.to_status, exit_.attempt) == ("fetched", "completed", 1)
        stored = store.reads.get_job(job.id)
        assert stored.exit_code == 0 and stored.token is None
    finally:
        store.db.engine.dispose()


def test_the_opening_round_trip_quotes_what_it_binds(pg_url: str) -> None:
    """The opening round trip binds its parameters on the client, as literals: a queue named
    like SQL is a name, matched as one, and injects nothing (no submit makes such a queue:
    the database refuses the name)."""
    upgrade(pg_url)
    store = JobStore.from_url(pg_url, pool=True)
    try:
        queue = "o'brien'; DELETE FROM jobs; --"
        with pytest.raises(InvalidInput, match="not a queue name"):
            submit(store, queue=queue)
        (job_id,) = submit(store, queue="o.brien")
        (other,) = submit(store)
        assert claim(store, REQ, queue="o") is None
        assert claim(store, REQ, queue=queue) is None
        job = claim(store, REQ, queue="o.brien")
        assert job is not None and job.id == job_id
        assert store.reads.get_job(other).status == "idle"
    finally:
        store.db.engine.dispose()


def test_a_column_a_migration_adds_does_not_confuse_the_hot_path(pg_url: str) -> None:
    """The hot path reads rows by the result's own column names, remembered per statement and
    number of columns: a column added to jobs while a store runs (a newer migration) is read
    past, by the same process, in the claim and in the reports."""
    upgrade(pg_url)
    store = JobStore.from_url(pg_url, pool=True)
    try:
        submit(store, 2)
        first = claimed(store, REQ)
        report(store, first, Event.EXIT)
        with store.db.engine.begin() as conn:
            conn.execute(sa.text("ALTER TABLE jobs ADD COLUMN site_note text DEFAULT 'x'"))
        second = claim(store, REQ)
        assert second is not None and second.id != first.id and second.status == "fetched"
        assert report(store, second, Event.EXIT).after == "completed"
    finally:
        store.db.engine.dispose()


def test_a_claim_is_one_transition_on_both_databases(pg_url: str, sqlite_url: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """idle -> fetched is defined once (Transitions.fetch_transition): PostgreSQL's
    one-statement claim and SQLite's row-by-row one write the same row and the same event."""
    monkeypatch.setattr(time, "time", lambda: 1_000_000.0)
    monkeypatch.setattr("secrets.token_hex", lambda n: "t" * (2 * n))
    seen = []
    for url in (pg_url, sqlite_url):
        upgrade(url)
        store = JobStore.from_url(url)
        try:
            submit(store, 2)
            job = claim(store, REQ)
            assert job is not None
            row = {k: v for k, v in rows(store, jobs)[0].items() if k != "phase"}
            event = store.reads.events(job.id)[-1]
            seen.append((row, (event.event, event.from_status, event.to_status, event.attempt,
                               event.slot, event.host, event.time), job))
        finally:
            store.db.engine.dispose()
    (pg_row, pg_event, pg_job), (lite_row, lite_event, lite_job) = seen
    assert pg_row == lite_row and pg_row["status"] == "fetched" and pg_row["token"] == "t" * 32
    assert pg_event == lite_event == ("fetch", "idle", "fetched", 1, "slot1@node", "node",
                                      1_000_000.0)
    assert pg_job == lite_job  # the job the claim returns is the row as written
    assert {k: getattr(pg_job, k) for k in pg_row} == pg_row


def test_a_transition_sets_only_columns_of_jobs() -> None:
    from jobstore.db.backends.postgresql import _transition_sql

    assert "status = %(set_status)s" in _transition_sql(("status", "updated_at"))
    with pytest.raises(ValueError, match="not columns of jobs"):
        _transition_sql(("status", "status = 'done'; --"))
    with pytest.raises(ValueError, match="JSON"):
        _transition_sql(("status", "ad"))


def test_a_claims_statement_takes_only_the_state_machines_names() -> None:
    from jobstore.db.backends.postgresql import _claim_sql

    sql = _claim_sql(("status", "token"), "fetch", "idle", "fetched")
    assert "SET status = 'fetched', token = %(token)s" in sql
    with pytest.raises(ValueError, match="not a status or event name"):
        _claim_sql(("status", "token"), "fetch", "idle'; DROP TABLE jobs; --", "fetched")
    with pytest.raises(ValueError, match="sets the job's status"):
        _claim_sql(("token",), "fetch", "idle", "fetched")


def _fail_after_an_event(store: JobStore, job_id: int) -> None:
    """A store transaction that writes an event of `job_id` and then fails: nothing is kept."""
    with pytest.raises(RuntimeError, match="after the event"), store.db.transaction() as conn:
        store.transitions.record(conn, event_row(job_id, "note", "idle", None, time.time(),
                                                 reason="never kept"))
        raise RuntimeError("after the event")
    assert [e.event for e in store.reads.events(job_id)] == ["submit"]


def test_a_hot_transaction_that_fails_writes_nothing(pg_url: str) -> None:
    """A transaction whose statements ran on psycopg and then failed is rolled back (with
    SQLAlchemy's rollback listeners called) and its pooled connection serves the next one."""
    upgrade(pg_url)
    store = JobStore.from_url(pg_url, pool=True)
    try:
        (job_id,) = submit(store)
        rollbacks: list[bool] = []
        sa.event.listen(store.db.engine, "rollback", lambda _conn: rollbacks.append(True))
        _fail_after_an_event(store, job_id)
        assert rollbacks == [True]
        job = claim(store, REQ)
        assert job is not None and report(store, job, Event.EXIT).after == "completed"
    finally:
        store.db.engine.dispose()


@contextmanager
def _holding(pg_url: str, lock: str, *params: Any) -> Iterator[None]:
    """Another session holding the locks `lock` takes until the block ends. Without the store's
    timeout the server ends that session after 20 s: a test then fails, it does not hang."""
    with psycopg.connect(libpq_url(pg_url)) as holder:
        holder.execute("SET idle_in_transaction_session_timeout = '20s'")
        holder.execute(lock, params or None)
        try:
            yield
        finally:
            holder.rollback()


def test_a_transaction_is_bounded_by_its_statement_timeout(pg_url: str) -> None:
    """The timeout the first statement sets bounds the transaction's statements: a report
    waiting for a row another transaction holds gives up with a DatabaseError instead of
    hanging; the timeout ends with its transaction, and the pooled connection serves on."""
    upgrade(pg_url)
    store = JobStore.from_url(pg_url, pool=True, statement_timeout_ms=300)
    try:
        submit(store)
        job = claimed(store, REQ)
        with (_holding(pg_url, "SELECT id FROM jobs WHERE id = %s FOR UPDATE", job.id),
              pytest.raises(DatabaseError, match="statement timeout")):
            report(store, job, Event.EXIT)
        with store.db.engine.connect() as conn:  # the pool's one connection, the report's
            assert conn.execute(sa.text("SHOW statement_timeout")).scalar() == "0"
        assert report(store, job, Event.EXIT).after == "completed"
    finally:
        store.db.engine.dispose()


def test_the_opening_read_is_bounded_by_the_timeout_before_it(pg_url: str) -> None:
    """The read in the round trip that opens a transaction comes after the timeout's set_config
    in the same simple query, and is bounded by it: a claim and a report stuck behind a lock on
    the whole jobs table (a migration's, say) give up with a DatabaseError."""
    upgrade(pg_url)
    store = JobStore.from_url(pg_url, pool=True, statement_timeout_ms=300)
    try:
        submit(store, 2)
        job = claimed(store, REQ)
        with _holding(pg_url, "LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"):
            with pytest.raises(DatabaseError, match="statement timeout"):
                claim(store, REQ)
            with pytest.raises(DatabaseError, match="statement timeout"):
                report(store, job, Event.EXIT)
        assert report(store, job, Event.EXIT).after == "completed"
        assert claim(store, REQ) is not None
    finally:
        store.db.engine.dispose()


def test_a_pooled_connection_goes_back_as_sqlalchemy_left_it(pg_url: str) -> None:
    """After the store's transactions on a pooled connection (psycopg in autocommit mode while
    they ran; the kept connection lent, so they take the pool's), a caller's own transaction on
    that connection is one transaction again: what it queued with connection= rolls back with
    it."""
    upgrade(pg_url)
    store = JobStore.from_url(pg_url, pool=True)
    try:
        with store.db.transaction():  # lends the kept connection: what follows takes the pool's one
            submit(store)
            report(store, claimed(store, REQ), Event.EXIT)
        with store.db.engine.connect() as conn, conn.begin() as tx:
            store.submissions.submit([job_spec()], owner="alice", queue="default", max_attempts=1,
                                     connection=conn)
            tx.rollback()
        assert len(rows(store, jobs)) == 1
    finally:
        store.db.engine.dispose()


def test_an_autocommit_engine_stays_one_and_its_store_keeps_transactions(pg_url: str) -> None:
    """A store on a caller's engine made with isolation_level="AUTOCOMMIT": the store's own
    transactions are still transactions (its BEGIN is explicit), on the kept connection and on
    a pooled one, and the pooled connection goes back in the engine's autocommit mode."""
    upgrade(pg_url)
    store = JobStore(sa.create_engine(pg_url, isolation_level="AUTOCOMMIT", pool_size=1,
                                      max_overflow=0))
    try:
        (job_id,) = submit(store)
        _fail_after_an_event(store, job_id)  # on the kept connection
        with store.db.transaction():
            _fail_after_an_event(store, job_id)  # on the pool's
        with store.db.engine.connect() as conn:
            assert getattr(conn.connection.dbapi_connection, "autocommit", False)
    finally:
        store.db.engine.dispose()


def _backends(admin: psycopg.Connection[Any]) -> list[int]:
    """The pids of the other sessions on the admin session's database."""
    return [pid for (pid,) in admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND backend_type = 'client backend'")]


def _until(check: Any, seconds: float = 10.0) -> Any:
    deadline = time.monotonic() + seconds
    while not (found := check()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


def test_a_pooled_store_keeps_one_connection_out_of_its_pool(pg_url: str) -> None:
    """A store on a pooled engine keeps one connection between its transactions (no pool
    checkout per claim or report): every call runs on the same server session, the engine's
    pool of one is still free for the caller, a transaction inside a transaction of its thread
    takes a pooled one (closed after use: the kept connection stands for a pool of one) instead
    of waiting for itself, and Engine.dispose() closes the kept one."""
    upgrade(pg_url)
    store = JobStore(sa.create_engine(pg_url, pool_size=1, max_overflow=0, pool_timeout=1))
    with psycopg.connect(libpq_url(pg_url), autocommit=True) as admin:
        try:
            (job_id, _) = submit(store, 2)
            kept = _backends(admin)
            assert len(kept) == 1
            report(store, claimed(store, REQ), Event.EXIT)
            assert store.reads.get_job(job_id).status == "completed"
            assert _backends(admin) == kept
            with store.db.engine.connect() as conn:  # the pool's capacity is untouched
                pooled = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            assert pooled not in kept and len(_backends(admin)) == 2
            with store.db.transaction():
                job = claim(store, REQ)
                assert job is not None and report(store, job, Event.EXIT).after == "completed"
            # the server ends a closed session's backend a moment after the client closed it
            assert _until(lambda: _backends(admin) == kept)
            store.db.engine.dispose()
            assert _until(lambda: not _backends(admin)), "the kept connection is still open"
            assert store.reads.get_job(job_id).status == "completed"  # a new one after dispose
            assert len(_backends(admin)) == 1 and _backends(admin) != kept
        finally:
            store.db.engine.dispose()


@pytest.mark.parametrize("overflow", [0, 1])
def test_while_its_connection_is_lent_a_store_waits_or_takes_the_overflow(
        pg_url: str, overflow: int) -> None:
    """make_engine's pool of one (the agent's: one connection per node): while another thread's
    transaction has the kept connection, a call waits for it; with an overflow it takes one
    more connection, closed after use, so that only the kept one stays open."""
    import threading

    from jobstore.db.engine import make_engine

    upgrade(pg_url)
    store = JobStore(make_engine(pg_url, pool=True, max_overflow=overflow))
    holding, release, done = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        with store.db.transaction():
            holding.set()
            release.wait(20)

    def read() -> None:
        store.reads.get_job(job_id)
        done.set()

    with psycopg.connect(libpq_url(pg_url), autocommit=True) as admin:
        try:
            (job_id,) = submit(store)
            holder = threading.Thread(target=hold)
            holder.start()
            assert holding.wait(10)
            reader = threading.Thread(target=read)
            reader.start()
            if overflow:
                assert done.wait(10)
                # the overflow one was closed after use (its backend ends a moment later)
                assert _until(lambda: len(_backends(admin)) == 1)
            else:
                assert not done.wait(0.3)  # it waits for the kept connection
            release.set()
            holder.join(10)
            reader.join(10)
            assert done.is_set() and _until(lambda: len(_backends(admin)) == 1)
        finally:
            release.set()
            store.db.engine.dispose()


def test_a_postgresql_store_needs_psycopg() -> None:
    """make_engine always picks psycopg; an engine made otherwise is refused at once, in one
    line, not at its first claim."""
    engine = sa.create_mock_engine("postgresql+pg8000://", lambda *_a, **_k: None)
    with pytest.raises(ValueError, match=r"needs psycopg \(postgresql\+psycopg://\), not pg8000"):
        JobStore(engine)  # type: ignore[arg-type]  # the wrong engine, on purpose
