"""A job held or removed while its attempt runs: the attempt winds down on its slot until its end
is reported; a release waits for it; the node's agent finds such attempts after a restart, is
notified of them on PostgreSQL, and judges each one (keep, forget, vacate gracefully or fast)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from jobstore.agent.attempts import Attempt, Attempts
from jobstore.agent.watch import grace, judge, restored
from jobstore.core import holds, policy
from jobstore.core.states import Event
from jobstore.db.channels import STOPS
from jobstore.db.engine import upgrade
from jobstore.db.reads import AttemptState
from jobstore.db.store import JobStore
from jobstore.formats import views
from jobstore.testing.factories import claim, claim_request, report, running, submit

REQ = claim_request(slot="slot1@node1", shape="s")


def evict(store: JobStore, job: Any) -> Any:
    """The JOB_EXIT evict of `job`'s attempt (the one it had when it ran)."""
    return report(store, job, Event.EVICT, attrs={"VacateReasonCode": 1010})


def test_hold_of_a_running_job_winds_down_and_a_release_waits_for_its_end(
        store: JobStore) -> None:
    (job_id,) = submit(store)
    job = running(store, REQ, lease=600)
    held = store.actions.admin(job_id, Event.HOLD, "held while it runs")
    assert (held.before, held.after) == ("running", "held")
    row = store.reads.get_job(job_id)
    assert row.winding_down_until is not None and row.winding_down_until > time.time()
    assert store.reads.attempt_states([job_id])[job_id] == AttemptState("held", job.claims, True)

    waiting = store.actions.admin(job_id, Event.RELEASE, "released by the administrator")
    assert waiting.pending and not waiting.changed
    assert "still ending on slot1@node1" in (waiting.reason or "")
    assert store.reads.get_job(job_id).status == "held"  # not idle: another slot could take it
    assert claim(store, REQ) is None
    again = store.actions.admin(job_id, Event.RELEASE, "released by the administrator")
    assert again.pending

    ended = evict(store, job)  # the vacated attempt's JOB_EXIT: the release takes effect
    assert (ended.event, ended.before, ended.after) == ("release", "held", "idle")
    row = store.reads.get_job(job_id)
    assert (row.status, row.winding_down_until, row.release_pending, row.hold_code) == (
        "idle", None, None, None)
    assert [(e.event, e.from_status, e.to_status) for e in store.reads.events(job_id)][-5:] == [
        ("start", "fetched", "running"),
        ("hold", "running", "held"),
        ("release", "held", None),  # pending, recorded once
        ("evict", "held", None),  # stale: recorded, changes nothing
        ("release", "held", "idle"),
    ]
    second = claim(store, REQ)
    assert second is not None and second.claims == job.claims + 1


def test_a_release_without_a_running_attempt_is_at_once(store: JobStore) -> None:
    (job_id,) = submit(store)
    store.actions.admin(job_id, Event.HOLD, "held while idle")
    assert store.reads.get_job(job_id).winding_down_until is None
    out = store.actions.admin(job_id, Event.RELEASE, "released")
    assert (out.changed, out.after, out.pending) == (True, "idle", False)


def test_a_report_that_ends_the_attempt_leaves_nothing_winding_down(store: JobStore) -> None:
    (job_id,) = submit(store, custom={"OnExitHold": "ExitCode == 3"})
    job = running(store, REQ, lease=600)
    attrs = {"ExitCode": 3, "ExitBySignal": False}

    def exit_policy(row: Any) -> policy.ExitVerdict:
        return policy.exit_verdict(row, attrs, views.policy_ad(row, attrs))

    out = report(store, job, Event.EXIT, changes={"exit_code": 3}, attrs=attrs,
                 exit_policy=exit_policy)
    assert out.after == "held"
    row = store.reads.get_job(job_id)
    assert (row.hold_code, row.winding_down_until) == (holds.JOB_POLICY, None)
    assert store.actions.admin(job_id, Event.RELEASE, "released").after == "idle"


def test_a_stale_report_of_an_older_attempt_does_not_end_the_winding_down(
        store: JobStore) -> None:
    (job_id,) = submit(store)
    job = running(store, REQ, lease=600)
    store.actions.admin(job_id, Event.REMOVE, "removed while it runs")
    older = store.reports.report(job_id, Event.EVICT, token=job.token, attempt=job.claims - 1)
    assert older.stale
    assert store.reads.get_job(job_id).winding_down_until is not None
    update = report(store, job, Event.UPDATE)
    assert update.stale  # not an end: still winding down
    assert store.reads.get_job(job_id).winding_down_until is not None
    evict(store, job)
    assert store.reads.get_job(job_id).winding_down_until is None


def test_reap_gives_up_waiting_and_carries_out_the_pending_release(store: JobStore) -> None:
    (job_id,) = submit(store)
    running(store, REQ, lease=600)
    store.actions.admin(job_id, Event.HOLD, "held")
    assert store.actions.admin(job_id, Event.RELEASE, "released").pending
    deadline = store.reads.get_job(job_id).winding_down_until
    assert deadline is not None
    assert not [o for o in store.maintenance.reap(now=deadline - 1) if o.job_id == job_id]
    (out,) = [o for o in store.maintenance.reap(now=deadline + 1) if o.job_id == job_id]
    assert (out.event, out.after) == ("release", "idle")
    assert "did not report its end in time" in (out.reason or "")


def test_attempts_on_a_node_after_a_restart(store: JobStore) -> None:
    ids = submit(store, 4)
    other = claim_request(slot="slot1@node2", shape="s")
    a = running(store, REQ, lease=600)
    b = running(store, claim_request(slot="slot2@node1", shape="s"), lease=600)
    c = running(store, other, lease=600)
    store.actions.admin(a.id, Event.REMOVE, "removed while the agent was down")
    found = store.reads.attempts_on(["node1"])
    assert [(n.job_id, n.slot, n.attempt) for n in found] == [
        (a.id, "slot1@node1", a.claims), (b.id, "slot2@node1", b.claims)]
    assert {n.job_id for n in store.reads.attempts_on(["node2"])} == {c.id}
    evict(store, a)
    assert [n.job_id for n in store.reads.attempts_on(["node1"])] == [b.id]
    assert store.reads.attempts_on([]) == []
    assert set(ids) >= {a.id, b.id, c.id}


def test_a_hold_of_a_handed_out_job_notifies_the_agents(pg_url: str) -> None:
    upgrade(pg_url)
    store = JobStore.from_url(pg_url)
    listener = store.db.listener(STOPS, connect_timeout=5)
    try:
        listener.open()
        assert listener.probe()
        idle, _ = submit(store, 2)
        store.actions.admin(idle, Event.HOLD, "idle: nothing runs")
        assert listener.wait(0.3) == []
        job = running(store, REQ, lease=600)
        store.actions.admin(job.id, Event.HOLD, "held while it runs")
        assert listener.wait(5) == [str(job.id)]
    finally:
        listener.close()
        store.db.engine.dispose()


# ---- the agent's side: pure --------------------------------------------------------------------

A = Attempt("slot1@n", 7, 2, "JOBSTORE", max_vacate_time=30)


@pytest.mark.parametrize(("state", "since", "now", "action"), [
    (None, None, 0, "fast"),  # the job is gone
    (AttemptState("running", 3, False), None, 0, "fast"),  # another attempt is current
    (AttemptState("idle", 2, False), None, 0, "fast"),  # its lease ran out
    (AttemptState("running", 2, False), None, 0, "keep"),
    (AttemptState("fetched", 2, False), None, 0, "keep"),
    (AttemptState("removed", 2, True), None, 0, "graceful"),
    (AttemptState("held", 2, True), None, 0, "graceful"),
    (AttemptState("held", 2, True), 100.0, 131.0, "keep"),  # within grace + margin
    (AttemptState("held", 2, True), 100.0, 132.0, "fast"),  # 30 s grace + 2 s margin
    (AttemptState("held", 2, False), None, 0, "forget"),  # its end was reported elsewhere
    (AttemptState("completed", 2, False), None, 0, "forget"),
])
def test_judge(state: AttemptState | None, since: float | None, now: float,
               action: str) -> None:
    assert judge(A, state, since, now, max_vacate_time=600, margin=2).action == action


def test_grace_is_the_smaller_of_the_jobs_and_the_machines() -> None:
    assert grace(A, 600) == 30
    assert grace(A, 10) == 10
    assert grace(Attempt("s", 1, 1, None), 600) == 600


def test_restore_keeps_the_newest_attempt_per_slot_and_what_the_agent_knows() -> None:
    from jobstore.db.reads import NodeAttempt

    attempts = Attempts()
    attempts.restore([Attempt("slot3@n", 1, 1, None)])
    found = [
        NodeAttempt(10, "slot1@n", 1, None, 1.0, {"JobMaxVacateTime": 5}),
        NodeAttempt(11, "slot1@n", 1, None, 2.0, {}),  # newer on the same slot: it wins
        NodeAttempt(12, "slot3@n", 1, None, 3.0, {}),  # the agent knows that slot's attempt
    ]
    added = attempts.restore(restored(found))
    assert added == 1
    assert sorted((a.slot, a.job_id) for a in attempts.snapshot()) == [
        ("slot1@n", 11), ("slot3@n", 1)]
    assert restored(found)[0].max_vacate_time == 5


@pytest.mark.parametrize("stage", ["fetched", "accepted", "running"])
@pytest.mark.parametrize("event", [Event.HOLD, Event.REMOVE])
def test_every_handed_out_stage_winds_down(store: JobStore, stage: str, event: Event) -> None:
    """A hold or rm of a fetched, accepted or running job leaves its attempt winding down
    on its slot (the agent finds it), until the attempt's end is reported."""
    (job_id,) = submit(store)
    job = claim(store, REQ)
    assert job is not None
    if stage != "fetched":
        report(store, job, Event.ACCEPT)
    if stage == "running":
        report(store, job, Event.START, changes={"job_pid": 42})
    assert store.reads.get_job(job_id).status == stage
    out = store.actions.admin(job_id, event, "stopped")
    assert out.after == ("held" if event == Event.HOLD else "removed")
    assert [n.job_id for n in store.reads.attempts_on(["node1"])] == [job_id]
    end = Event.REJECT if stage != "running" else Event.EVICT
    report(store, job, end)
    assert store.reads.get_job(job_id).winding_down_until is None
    assert store.reads.attempts_on(["node1"]) == []


def _ad(job_id: int, attempt: int, token: str | None, **extra: str) -> bytes:
    lines = [f"JobstoreJobId = {job_id}", f"JobstoreAttempt = {attempt}", "ClusterId = 3",
             "ProcId = 0", 'HookKeyword = "JOBSTORE"', *(f"{k} = {v}" for k, v in extra.items())]
    if token is not None:
        lines.append(f'JobstoreToken = "{token}"')
    return ("\n".join(lines) + "\n").encode()


def test_only_the_attempts_own_job_exit_takes_it_out_of_the_watch() -> None:
    """A JOB_EXIT through the agent ends the watch over an attempt only when it names that
    attempt and, from an ordinary account, carries its token: another account's forged
    JOB_EXIT (or an older attempt's) leaves the job watched, so that an rm still reaches it."""
    attempts = Attempts()
    seen = attempts.fetched(b'Name = "slot1@n"\n', _ad(7, 2, "a" * 32))
    assert seen is not None and seen.name == "3.0" and "a" * 32 not in repr(seen)
    attempts.ended(_ad(7, 2, "b" * 32))  # forged: not its token
    attempts.ended(_ad(7, 2, None))  # no token at all
    attempts.ended(_ad(7, 1, "a" * 32))  # an older attempt's
    assert [a.job_id for a in attempts.snapshot()] == [7]
    attempts.ended(_ad(7, 2, "a" * 32))  # its own
    assert attempts.snapshot() == []
    attempts.fetched(b'Name = "slot1@n"\n', _ad(8, 1, "c" * 32))
    attempts.ended(_ad(8, 1, None), trusted=True)  # condor's reject, say
    assert attempts.snapshot() == []


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_the_databases_checks_of_a_changed_row_refuse_it_after_its_update(
        store: JobStore) -> None:
    """The checks of a changed job row (migrations 0012, 0019; after the UPDATE since 0020:
    no row lock first) still refuse a row they would not have: a winding-down attempt of a job
    that is not handed out, an ad with a value no ClassAd holds. Nothing changes."""
    import psycopg
    import sqlalchemy as sa

    from jobstore.testing.support import libpq_url

    (job_id,) = submit(store)
    before = store.reads.get_job(job_id)
    url = libpq_url(store.db.engine.url.render_as_string(False))
    for statement, why in (
            ("UPDATE jobs SET winding_down_until = 1 WHERE id = %s", "winds down"),
            ("UPDATE jobs SET ad = (ad::jsonb || '{\"Foo\": [1]}')::json WHERE id = %s",
             "Foo: not a value"),
    ):
        with psycopg.connect(url) as conn, pytest.raises(psycopg.Error, match=why):
            conn.execute(statement, (job_id,))
    assert store.reads.get_job(job_id) == before
    with store.db.engine.connect() as conn:
        kinds: dict[str, int] = dict(conn.execute(sa.text(
            "SELECT tgname, tgtype & 2 FROM pg_trigger WHERE tgrelid = 'jobs'::regclass"
            " AND tgname IN ('jobstore_check_changed_job', 'jobstore_winding_down')")).all())
    assert kinds == {"jobstore_check_changed_job": 0, "jobstore_winding_down": 0}  # AFTER
