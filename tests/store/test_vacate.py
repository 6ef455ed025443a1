"""condor_vacate_job: a running job's owner asks for its attempt to be vacated; the request is
recorded (an event, no transition), the node's agent sees it and vacates the slot (gracefully,
or fast), and the job goes back to idle as its JOB_EXIT evict reports. Only the owner or a
queue super user may ask, and only through the door."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from rolepool import BOB, Pool, pool, submitted  # noqa: F401 - the pool fixture

from jobstore.agent.attempts import Attempt
from jobstore.agent.watch import judge
from jobstore.api.schedd import JobAction, Schedd
from jobstore.core.states import Event
from jobstore.db.engine import upgrade
from jobstore.db.reads import AttemptState
from jobstore.db.store import JobStore
from jobstore.errors import InvalidInput
from jobstore.formats import views
from jobstore.testing.factories import claim, claim_request, report, running, submit
from jobstore.testing.support import libpq_url

REQ = claim_request(slot="slot1@node1", shape="s")


def _vacate(store: JobStore, job_id: int, fast: bool = False) -> Any:
    event = Event.VACATE_FAST if fast else Event.VACATE
    return store.actions.act_where(store_ids(job_id), event, "vacated by test")


def store_ids(*ids: int) -> Any:
    from jobstore.db.schema import jobs

    return jobs.c.id.in_(list(ids))


def test_a_vacated_job_goes_back_to_idle_when_its_attempt_is_evicted(store: JobStore) -> None:
    (job_id,) = submit(store)
    job = running(store, REQ, lease=600)
    totals = _vacate(store, job_id)
    assert (totals.success, totals.bad_status) == (1, 0)
    assert totals.outcomes[0].pending and not totals.outcomes[0].changed
    row = store.reads.get_job(job_id)
    assert (row.status, row.winding_down_until) == ("running", None)  # still its slot's
    assert store.reads.attempt_states([job_id])[job_id].vacate == "graceful"
    assert [(e.event, e.from_status, e.to_status, e.reason)
            for e in store.reads.events(job_id)][-1] == (
        "vacate", "running", None, "vacated by test")

    again = _vacate(store, job_id)  # asked twice: the same request
    assert again.success == 1
    assert store.reads.attempt_states([job_id])[job_id].vacate == "graceful"
    assert _vacate(store, job_id, fast=True).success == 1  # -fast after: fast
    assert store.reads.attempt_states([job_id])[job_id].vacate == "fast"
    _vacate(store, job_id)  # a graceful request after a fast one leaves it fast
    assert store.reads.attempt_states([job_id])[job_id].vacate == "fast"

    ended = report(store, job, Event.EVICT, attrs={"VacateReasonCode": 1010})
    assert (ended.before, ended.after) == ("running", "idle")
    second = claim(store, REQ)
    assert second is not None and second.claims == job.claims + 1
    state = store.reads.attempt_states([job_id])[job_id]
    assert state.vacate is None  # the request was the first attempt's


def test_only_an_accepted_or_running_job_is_vacated(store: JobStore) -> None:
    fetched, held, idle = submit(store, 3)
    job = claim(store, REQ)
    assert job is not None and job.id == fetched  # REPLY_FETCH has not accepted it yet
    other = claim(store, REQ, slot="slot2@node1")
    assert other is not None and other.id == held
    report(store, other, Event.START, changes={"job_pid": 42})
    store.actions.admin(held, Event.HOLD, "held while it runs")  # its attempt is stopping
    totals = store.actions.act_where(store_ids(fetched, held, idle), Event.VACATE, "why")
    assert (totals.success, totals.bad_status) == (0, 3)
    assert store.reads.attempt_states([fetched, held, idle]) == {
        fetched: AttemptState("fetched", 1, False), held: AttemptState("held", 1, True),
        idle: AttemptState("idle", 0, False)}
    assert not [e for i in (fetched, held, idle) for e in store.reads.events(i)
                if e.event.startswith("vacate")]


def test_the_htcondor2_actions_count_as_a_schedd_counts(store: JobStore) -> None:
    running_id, idle_id = submit(store, 2)
    running(store, REQ, lease=600)
    names = [views.job_id(store.reads.get_job(i)) for i in (running_id, idle_id)]
    schedd = Schedd(store=store)
    ad = schedd.act(JobAction.Vacate, names)
    assert (ad["TotalSuccess"], ad["TotalBadStatus"]) == (1, 1)
    cluster, proc = names[0].split(".")
    ad = schedd.act(JobAction.VacateFast, f"ClusterId == {cluster} && ProcId == {proc}")
    assert ad["TotalSuccess"] == 1
    assert store.reads.attempt_states([running_id])[running_id].vacate == "fast"


def test_the_agent_vacates_gracefully_then_fast_or_fast_at_once() -> None:
    a = Attempt("slot1@n", 7, 2, "JOBSTORE", max_vacate_time=30)
    graceful = AttemptState("running", 2, False, "graceful")
    assert judge(a, graceful, None, 0, max_vacate_time=600, margin=2).action == "graceful"
    assert judge(a, graceful, 100.0, 131.0, max_vacate_time=600, margin=2).action == "keep"
    assert judge(a, graceful, 100.0, 132.0, max_vacate_time=600, margin=2).action == "fast"
    fast = AttemptState("accepted", 2, False, "fast")
    assert judge(a, fast, None, 0, max_vacate_time=600, margin=2).action == "fast"
    # a request for an older attempt reads as none (the join is on the current attempt)
    assert judge(a, AttemptState("running", 2, False), None, 0, 600, 2).action == "keep"


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_vacate_notifies_the_agents(db_url: str) -> None:
    from jobstore.db.channels import STOPS

    upgrade(db_url)
    store = JobStore.from_url(db_url)
    listener = store.db.listener(STOPS, connect_timeout=5)
    try:
        listener.open()
        assert listener.probe()
        (job_id,) = submit(store)
        running(store, REQ, lease=600)
        _vacate(store, job_id)
        assert listener.wait(5) == [str(job_id)]
    finally:
        listener.close()
        store.db.engine.dispose()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_only_the_owner_or_a_super_user_vacates_and_only_through_the_door(
        pool: Pool) -> None:  # noqa: F811
    bob_job = submitted(pool, "bob")
    agent, alice, bob, sup = (pool.store(p) for p in ("agent", "alice", "bob", "super"))
    try:
        job = claim(agent, claim_request(claim_lease=120, shape="s"))
        assert job is not None and job.id == bob_job
        report(agent, job, Event.START, changes={"job_pid": 42}, lease=120)
        theirs = alice.actions.act_where(store_ids(bob_job), Event.VACATE_FAST, "mine now")
        assert (theirs.denied, theirs.success) == (1, 0)
        assert agent.reads.attempt_states([bob_job])[bob_job].vacate is None
        for part in ("alice", "agent"):  # raw SQL: no role but the owner's writes the table
            with psycopg.connect(libpq_url(pool.url(part)), autocommit=True) as conn:
                for sql in (f"INSERT INTO vacate_requests VALUES ({bob_job}, {job.claims}, "
                            "true, 0)",
                            f"UPDATE vacate_requests SET fast = true WHERE job_id = {bob_job}"):
                    with pytest.raises(psycopg.errors.InsufficientPrivilege):
                        conn.execute(sql)
        assert agent.reads.attempt_states([bob_job])[bob_job].vacate is None
        with pytest.raises(InvalidInput, match="printable"):  # nothing for a terminal to obey
            bob.actions.act_where(store_ids(bob_job), Event.VACATE, "\x1b]0;pwned\x07")
        assert bob.actions.act_where(store_ids(bob_job), Event.VACATE, "mine").success == 1
        assert agent.reads.attempt_states([bob_job])[bob_job].vacate == "graceful"
        assert sup.actions.act_where(store_ids(bob_job), Event.VACATE_FAST, "the admin's"
                                     ).success == 1
        assert agent.reads.attempt_states([bob_job])[bob_job].vacate == "fast"
        assert agent.reads.get_job(bob_job).owner == BOB
    finally:
        for s in (agent, alice, bob, sup):
            s.db.engine.dispose()


def _ad(job: Any) -> bytes:
    return (f'JobstoreJobId = {job.id}\nJobstoreAttempt = {job.claims}\nClusterId = '
            f'{job.cluster_id}\nProcId = {job.proc_id}\nHookKeyword = "JOBSTORE"\n'
            f'JobstoreToken = "{job.token}"\n').encode()


def test_a_slot_given_to_another_job_is_not_vacated_for_an_older_attempt(
        store: JobStore) -> None:
    """A hostile review's attack: her job's JOB_EXIT is refused (she edited its token), so
    its attempt stays in the agent's watch while the startd gives the slot to another's job;
    her `vacate -fast` of her own stale job must not make the agent kill the other job. The
    slot is vacated only for the attempt it was given last; a fast vacate the startd did not
    take is tried again."""
    from types import SimpleNamespace

    from jobstore.agent.attempts import Attempts
    from jobstore.agent.watch import FAST_TRIES, AttemptWatch
    from jobstore.node import config

    hers, theirs = submit(store, 2)
    attempts = Attempts()
    first = running(store, REQ, lease=600)
    attempts.fetched(b'Name = "slot1@node1"\n', _ad(first))
    second = running(store, REQ, lease=600)  # the same slot, her JOB_EXIT never taken
    assert (first.id, second.id) == (hers, theirs)
    attempts.fetched(b'Name = "slot1@node1"\n', _ad(second))
    took = [False]
    vacated: list[tuple[int, bool]] = []

    def vacate(a: Attempt, fast: bool, _why: str) -> bool:
        vacated.append((a.job_id, fast))
        return took[0]

    settings = config.load_settings(None, store.db.engine.url.render_as_string(False))
    agent = SimpleNamespace(max_vacate_time=600.0, watch_interval=2.0)
    watch = AttemptWatch(attempts, vacate, lambda: agent,  # type: ignore[arg-type,return-value]
                         SimpleNamespace(store_for=lambda _s: store))  # type: ignore[arg-type]
    _vacate(store, hers, fast=True)
    watch.check({settings.keyword: settings})
    assert vacated == []
    assert [a.job_id for a in attempts.snapshot()] == [theirs]
    _vacate(store, theirs, fast=True)
    for _ in range(FAST_TRIES):  # the startd did not take it: tried at each check
        watch.check({settings.keyword: settings})
    assert vacated == [(theirs, True)] * FAST_TRIES
    assert attempts.snapshot() == []  # then given up


def test_asking_again_records_nothing_new(store: JobStore) -> None:
    """A second request for the same attempt (or a graceful one after a fast one) is no new
    event: a hostile review flooded the events and the agents' notifications with them."""
    (job_id,) = submit(store)
    running(store, REQ, lease=600)
    for fast in (False, False, True, True, False):
        assert _vacate(store, job_id, fast=fast).success == 1
    asked = [e.event for e in store.reads.events(job_id) if e.event.startswith("vacate")]
    assert asked == ["vacate", "vacate_fast"]


def test_what_a_terminal_would_obey_is_shown_as_question_marks(store: JobStore) -> None:
    """A reason stored where the door does not look (her own SQLite file, an older row) is
    printed by `jobstore events` and `jobstore watch` without its escape sequences."""
    from jobstore.formats import views

    table = views.format_table(["REASON"], [["\x1b]0;pwned\x07 \x1b[2J\u202eok\u2028"]])
    assert table.splitlines()[1] == "?]0;pwned? ?[2J?ok?"
    line = views.watch_line({"time": None, "event": "vacate", "job": "1.0",
                             "from_status": "running", "to_status": None, "slot": None,
                             "reason": "a\x1b[31mb"})
    assert line == "1.0  vacate  running -> (unchanged)  a?[31mb"
