"""Untrusted expressions cannot stall a node: the probe's 306-byte bomb (six levels of
`A_n = (A_{n+1} =?= A_{n+1})` over a regexp that backtracks) in Requirements, periodic_hold and
on_exit_hold is evaluated by the agent in a worker process it kills at the bound, the job is
held with a reason that says so, and the agent serves everyone else meanwhile."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import clirun
import pytest
from agentnode import Node, node, store  # noqa: F401 - fixtures
from classad2 import ClassAd
from hookseq import slot_ad, submit_jobs

from jobstore.core import holds, policy
from jobstore.core.jobs import JobSpec
from jobstore.db.store import JobStore
from jobstore.errors import TooCostly
from jobstore.node.bounded import Bounded
from jobstore.testing.support import ordinary_owner

LEVELS = {f"A{n}": f"(A{n + 1} =?= A{n + 1})" for n in range(6)}
BOMB = {**LEVELS, "A6": 'regexp("^(a|a)*$", "' + "a" * 28 + 'b")'}
SLOT = ClassAd("[Cpus = 1; Memory = 1024; Disk = 1000000; Requirements = true]")
TERMS = policy.ExitTerms(success_exit_code=0, max_retries=None, retry_until=None)


def _ad(extra: dict[str, str]) -> ClassAd:
    return ClassAd("[" + "; ".join(f"{k} = {v}" for k, v in {**BOMB, **extra}.items()) + "]")


BOUND = 0.75  # seconds of a worker's CPU: each bomb below burns that much


@pytest.fixture
def evaluator():  # type: ignore[no-untyped-def]
    ev = Bounded(timeout=BOUND, workers=2)
    yield ev
    ev.close()


def test_a_bomb_is_cut_off_and_the_next_answer_comes(evaluator: Bounded) -> None:
    assert evaluator.matches(ClassAd("[Requirements = TARGET.Cpus >= 1]"), SLOT) is True
    assert evaluator.matches(ClassAd("[Requirements = TARGET.Cpus >= 2]"), SLOT) is False
    with pytest.raises(TooCostly):
        evaluator.matches(_ad({"Requirements": "A0"}), SLOT)
    assert evaluator.matches(ClassAd("[Requirements = TARGET.Cpus >= 1]"), SLOT) is True
    held = evaluator.periodic_action(_ad({"JobStatus": "2", "PeriodicHold": "A0"}), time.time())
    assert held is not None and (held.kind, held.code) == ("hold", holds.JOB_POLICY_UNDEFINED)
    assert f"periodic policy took more than {BOUND:g} s to evaluate" in held.reason
    held_already = _ad({"JobStatus": "5", "PeriodicRelease": "A0"})
    assert evaluator.periodic_action(held_already, time.time()) is None
    fires = evaluator.periodic_action(ClassAd("[JobStatus = 1; PeriodicHold = true]"), 0.0)
    assert fires is not None and fires.code == holds.JOB_POLICY
    verdict = evaluator.exit_verdict(TERMS, {"ExitCode": 0}, _ad({"OnExitHold": "A0"}))
    assert verdict.hold is not None and verdict.hold.code == holds.JOB_POLICY_UNDEFINED
    ok = evaluator.exit_verdict(TERMS, {"ExitCode": 0}, ClassAd("[OnExitHold = false]"))
    assert ok == policy.ExitVerdict(True, False, None)


def test_an_answer_the_node_was_too_busy_to_compute_in_time_is_no_bomb() -> None:
    """The bound is on the worker's CPU: a worker that got none for longer than the bound (a
    node busy with its jobs; here, stopped) still answers, and is cut off at WALL_FACTOR times
    the bound on the clock."""
    evaluator = Bounded(timeout=0.5, workers=1)
    job = ClassAd("[Requirements = TARGET.Cpus >= 1]")
    try:
        assert evaluator.matches(job, SLOT) is True
        (worker,) = evaluator._idle
        os.kill(worker.proc.pid, signal.SIGSTOP)
        started = time.monotonic()  # before the timer's start: it wakes the worker 1 s after
        threading.Timer(1.0, os.kill, (worker.proc.pid, signal.SIGCONT)).start()
        assert evaluator.matches(job, SLOT) is True
        assert time.monotonic() - started >= 1.0  # past the 0.5 s bound on the clock
        (worker,) = evaluator._idle
        os.kill(worker.proc.pid, signal.SIGSTOP)  # and never again: cut off at 3 x 0.5 s
        started = time.monotonic()
        with pytest.raises(TooCostly):
            evaluator.matches(job, SLOT)
        assert 1.5 <= time.monotonic() - started < 30
        assert evaluator.matches(job, SLOT) is True
    finally:
        evaluator.close()


def test_others_are_answered_while_a_bomb_is_evaluated() -> None:
    evaluator = Bounded(timeout=1.5, workers=2)  # the bomb outlasts twenty answers
    done: list[str] = []

    def bomb() -> None:
        try:
            evaluator.matches(_ad({"Requirements": "A0"}), SLOT)
        except TooCostly:
            done.append("bomb")

    t = threading.Thread(target=bomb)
    t.start()
    time.sleep(0.3)
    try:
        for _ in range(20):
            assert evaluator.matches(ClassAd("[Requirements = TARGET.Cpus >= 1]"), SLOT)
        done.append("others")
        t.join()
    finally:
        evaluator.close()
    assert done == ["others", "bomb"]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_the_agent_holds_a_bomb_and_serves_everyone_else(node: Node, store: JobStore  # noqa: F811
                                                         ) -> None:
    with open(node.config, "a") as fh:
        fh.write("JOBSTORE_AGENT_EXPRESSION_TIMEOUT = 1.5\n")
    owner = ordinary_owner()
    (other,) = submit_jobs(store, 1, owner)
    node.start()
    first = node.hook("fetch_job", slot_ad("slot1@node01"), JOBSTORE_HOOK_MODE="agent").stdout
    assert b"JobstoreJobId = %d" % other in first
    _, (bomb_id,) = store.submissions.submit([JobSpec(cmd="/bin/true", requirements="A0",
                                                      custom=dict(BOMB))],
                                             owner=owner, queue="default", max_attempts=3)
    order: list[str] = []

    def fetch() -> None:
        out = node.hook("fetch_job", slot_ad("slot2@node01"), JOBSTORE_HOOK_MODE="agent")
        assert out.stdout == b"", out.stdout
        order.append("fetch")

    t = threading.Thread(target=fetch)
    t.start()
    time.sleep(0.5)  # the agent is evaluating the bomb for slot2 now
    accepted = node.hook("reply_fetch", first + b"-----\n" + slot_ad("slot1@node01"),
                         ["accept"], JOBSTORE_HOOK_MODE="agent")
    assert accepted.returncode == 0
    order.append("reply_fetch")
    t.join()
    assert order == ["reply_fetch", "fetch"], (store.reads.get_job(bomb_id), node.log.read_text())
    assert store.reads.get_job(other).status == "accepted"
    held = store.reads.get_job(bomb_id)
    assert (held.status, held.hold_code) == ("held", holds.JOB_POLICY_UNDEFINED)
    assert "took more than 1.5 s to evaluate" in (held.reason or "")
    assert node.stop() == 0


def test_a_costly_periodic_policy_holds_its_autocluster(db_url: str, evaluator: Bounded) -> None:
    """The policy pass evaluates in no transaction, holds the job whose periodic_hold took too
    long, and its autocluster's other idle jobs with it; an ordinary job is left alone."""
    from jobstore.db.engine import upgrade

    upgrade(db_url)
    js = JobStore.from_url(db_url)
    asked: list[int] = []

    def periodic(ad: ClassAd, now: float) -> policy.Action | None:
        asked.append(ad["ProcId"])
        return evaluator.periodic_action(ad, now)

    js.maintenance.periodic_policy = periodic
    try:
        bombs = [JobSpec(cmd="/bin/true", proc_id=i, custom={**BOMB, "PeriodicHold": "A0"})
                 for i in range(3)]
        _, bomb_ids = js.submissions.submit(bombs, owner=ordinary_owner(), queue="default",
                                            max_attempts=3)
        _, (plain,) = js.submissions.submit(
            [JobSpec(cmd="/bin/true", custom={"PeriodicHold": "false"})],
            owner=ordinary_owner(), queue="default", max_attempts=3)
        acted = js.maintenance.police()
        assert [o.job_id for o in acted] == [bomb_ids[0]]  # its siblings were held with it
        assert asked == [0, 0]  # and never evaluated: the bomb's proc 0, then the plain job
        for job_id in bomb_ids:
            job = js.reads.get_job(job_id)
            assert (job.status, job.hold_code) == ("held", holds.JOB_POLICY_UNDEFINED)
            assert f"periodic policy took more than {BOUND:g} s" in (job.reason or "")
        assert js.reads.get_job(plain).status == "idle"
    finally:
        js.db.engine.dispose()


# ---- values no reader can take, and what kills libclassad ----------------------------------

DEEP = "+".join(["1"] * 60_000)  # the probe's: overflows libclassad's stack as it prints


def _planted(js: JobStore, owner: str, **custom: str) -> int:
    """A job whose ad got a value past the database's checks (a row of old, or written by the
    store's owner with them off): what no reader may crash on."""
    from sqlalchemy import text

    from jobstore.db.schema import jobs

    _, (job_id,) = js.submissions.submit([JobSpec(cmd="/bin/true")], owner=owner, queue="default",
                                         max_attempts=3)
    with js.db.engine.begin() as conn:
        ad = conn.execute(jobs.select().where(jobs.c.id == job_id)).one().ad
        if conn.dialect.name == "postgresql":
            conn.execute(text("SET LOCAL jobstore.checked = 'on'"))
        conn.execute(jobs.update().where(jobs.c.id == job_id).values(
            ad={**ad, **{k: {"expr": v} for k, v in custom.items()}}))
    return job_id


@pytest.mark.parametrize("db_url", ["postgresql", "sqlite"], indirect=True)
def test_a_stored_value_no_reader_takes_holds_its_job_and_crashes_nothing(
        node: Node, store: JobStore) -> None:  # noqa: F811
    """The probe's 60,000-term expression, planted past the database's checks: the agent
    never hands it to libclassad (it holds the job, saying why) and serves the next job;
    `jobstore q -l` shows the job."""
    import sys

    owner = ordinary_owner()
    bomb = _planted(store, owner, Requirements=DEEP)
    (other,) = submit_jobs(store, 1, owner)
    node.start()
    fetched = node.hook("fetch_job", slot_ad("slot1@node01"), JOBSTORE_HOOK_MODE="agent")
    assert b"JobstoreJobId = %d" % other in fetched.stdout, (fetched, node.log.read_text())
    held = store.reads.get_job(bomb)
    assert (held.status, held.hold_code) == ("held", holds.JOB_POLICY_UNDEFINED), held.reason
    assert "cannot be read" in (held.reason or "") and "Requirements" in (held.reason or "")
    q = clirun.run([sys.executable, "-m", "jobstore.cli", "--db", node.db_url, "q", "-l"],
                   capture_output=True, text=True, timeout=60,
                   env=node.env(PATH="/usr/bin:/bin"))
    assert q.returncode == 0 and f"ClusterId = {held.cluster_id}" in q.stdout, q.stderr
    assert node.stop() == 0


def _planted_raw(js: JobStore, owner: str, raw: str) -> int:
    """A job whose ad's `Foo` is the JSON text `raw`, past the database's checks."""
    from sqlalchemy import text

    from jobstore.db.schema import jobs

    _, (job_id,) = js.submissions.submit([JobSpec(cmd="/bin/true")], owner=owner, queue="default",
                                         max_attempts=3)
    with js.db.engine.begin() as conn:
        ad = conn.execute(jobs.select().where(jobs.c.id == job_id)).one().ad
        whole = json.dumps(ad)[:-1] + ', "Foo": ' + raw + "}"
        if conn.dialect.name == "postgresql":
            conn.execute(text("SET LOCAL jobstore.checked = 'on'"))
            conn.execute(text("UPDATE jobs SET ad = CAST(:ad AS json) WHERE id = :id"),
                         {"ad": whole, "id": job_id})
        else:
            conn.execute(text("UPDATE jobs SET ad = :ad WHERE id = :id"),
                         {"ad": whole, "id": job_id})
    return job_id


@pytest.mark.parametrize("db_url", ["postgresql", "sqlite"], indirect=True)
def test_a_stored_value_of_no_ads_shape_holds_its_job_and_fails_no_reader(
        node: Node, store: JobStore) -> None:  # noqa: F811
    """The probe's shapes, planted past the database's checks (an object that is no
    expression, an integer no ClassAd holds, an array, JSON nested deeper than Python's
    decoder goes): each job is held saying why, the next job is fetched, and condor_q, -l and
    condor_rm work for everyone."""
    import sys

    owner = ordinary_owner()
    bad = [_planted_raw(store, owner, raw) for raw in (
        '{"bar": 1}', "1000000000000000000000000000000", '[1, {"x": 2}]',
        "[" * 5000 + "]" * 5000)]
    (other,) = submit_jobs(store, 1, owner)
    node.start()
    fetched = node.hook("fetch_job", slot_ad("slot1@node01"), JOBSTORE_HOOK_MODE="agent")
    assert b"JobstoreJobId = %d" % other in fetched.stdout, (fetched, node.log.read_text())
    for job_id in bad:
        held = store.reads.get_job(job_id)
        assert (held.status, held.hold_code) == ("held", holds.JOB_POLICY_UNDEFINED), held
        assert "cannot be read" in (held.reason or ""), held.reason
    env = node.env(PATH="/usr/bin:/bin")
    cluster = store.reads.get_job(bad[-1]).cluster_id
    for args in (["q"], ["q", "-l"], ["history"], ["rm", str(cluster)]):
        done = clirun.run([sys.executable, "-m", "jobstore.cli", "--db", node.db_url, *args],
                          capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (args, done.stderr)
    assert node.stop() == 0


def test_a_stored_account_or_keyword_never_reaches_the_startd(
        node: Node, store: JobStore) -> None:  # noqa: F811
    """`OsUser`, `User`, `Owner` and `HookKeyword` planted in a job's stored ad past the
    database's checks: the agent hands the job out with its owner's account and the slot's
    keyword, whatever the row says."""
    from jobstore.formats.classads import parse_ad

    owner = ordinary_owner()
    job_id = _planted(store, owner, OsUser='"condor"', User='"root@example.org"',
                      Owner='"root"', HookKeyword='"EVIL"')
    node.start()
    fetched = node.hook("fetch_job", slot_ad("slot1@node01"), JOBSTORE_HOOK_MODE="agent")
    assert fetched.stdout, (fetched, store.reads.get_job(job_id), node.log.read_text())
    ad = parse_ad(fetched.stdout.decode())
    assert ad.get("JobstoreJobId") == job_id, (fetched, node.log.read_text())
    assert "OsUser" not in ad and ad.get("Owner") == owner
    assert str(ad.get("User")).startswith(f"{owner}@") and ad.get("HookKeyword") != "EVIL"
    assert node.stop() == 0


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_job_the_agent_died_reading_twice_is_held(node: Node, store: JobStore) -> None:  # noqa: F811
    """What a crash of libclassad leaves (a fault the agent's faulthandler writes down, the job
    its threads were reading in the journal) counts at the next start, once per crash however
    many threads read the job; the second time, the job is held with the reason, and nothing
    reads it again. A SIGKILL from outside counts for nothing."""
    from jobstore.node.sandboxroot import INFLIGHT

    root = node.base / "sandboxes"  # the node's own (test_agent.node)
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    journal = root / INFLIGHT / "reading"
    mark = f"JOBSTORE {job_id}".encode().ljust(95) + b"\n"
    # held at the second fault: had the SIGKILL counted, or a crash counted twice, the first
    for how, then in ((signal.SIGKILL, "idle"), (signal.SIGSEGV, "idle"),
                      (signal.SIGSEGV, "held")):
        node.start()
        assert node.stop(how) == -how
        assert ((root / INFLIGHT / "fault").stat().st_size > 0) == (how == signal.SIGSEGV)
        journal.write_bytes(mark * 2)  # two threads were reading it
        node.start()
        assert node.stop() == 0
        job = store.reads.get_job(job_id)
        assert job.status == then, (how, job, node.log.read_text())
    assert "died 2 times while it read this job's ad" in (job.reason or "")
    assert job.hold_code == holds.JOB_POLICY_UNDEFINED


_OVERFLOW = """
import sys, threading
from pathlib import Path
from classad2 import ClassAd
from jobstore.node.inflight import InFlight
journal = InFlight(Path(sys.argv[1]))
journal.crashed()
def read():
    with journal.reading("JOBSTORE", 7):
        ad = ClassAd("[A = " + "1+" * 5000 + "1]")
        str(ad)
threading.stack_size(256 * 1024)  # small enough for libclassad's recursion to overflow it
thread = threading.Thread(target=read)
thread.start()
thread.join()
"""


def test_a_stack_overflow_in_libclassad_in_a_reading_thread_counts(tmp_path: Path) -> None:
    """libclassad overflowing the C stack of the thread that reads a job (not the thread that
    started the journal): the fault is written down, and two of them hold the job."""
    import subprocess
    import sys

    from jobstore.node.inflight import InFlight

    journal = tmp_path / "inflight"
    journal.mkdir(mode=0o700)
    for _ in range(2):
        died = subprocess.run([sys.executable, "-c", _OVERFLOW, str(journal)],
                              capture_output=True, timeout=60)
        assert died.returncode == -signal.SIGSEGV, died.stderr[-2000:]
        assert (journal / "fault").stat().st_size > 0
    assert InFlight(journal).crashed() == [("JOBSTORE", 7)]


@pytest.mark.parametrize("odd", ["directory", "symlink", "fifo"])
def test_anything_but_a_file_where_the_fault_goes_is_replaced(tmp_path: Path, odd: str) -> None:
    """A directory, a symlink or a FIFO where the fault record goes: the start neither hangs
    nor fails, counts nothing from it, and writes its own record there."""
    from jobstore.node.inflight import InFlight

    fault = tmp_path / "fault"
    if odd == "directory":
        fault.mkdir()
        (fault / "x").write_text("not a record")
    elif odd == "symlink":
        (tmp_path / "elsewhere").write_text("a fault")
        fault.symlink_to(tmp_path / "elsewhere")
    else:
        os.mkfifo(fault)
    (tmp_path / "reading").write_bytes(b"JOBSTORE 7".ljust(95) + b"\n")
    (tmp_path / "crashed.json").write_text('{"JOBSTORE 7": 1}')
    journal = InFlight(tmp_path)
    try:
        assert journal.crashed() == []
        assert fault.is_file() and not fault.is_symlink()
        assert json.loads((tmp_path / "crashed.json").read_text()) == {"JOBSTORE 7": 1}
    finally:
        journal.clear()


def test_an_expression_that_kills_its_worker_twice_holds_the_job(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that dies evaluating an expression is replaced and asked once more; dead again,
    the expression holds its job (periodic policy) and fails its match, with the reason."""
    from jobstore.node import bounded
    from jobstore.node.evalworker import READY

    monkeypatch.setattr(bounded, "_START", (
        "import os, sys; sys.stdout.buffer.write(" + repr(READY) + "); sys.stdout.flush();"
        " sys.stdin.buffer.read(4); os._exit(139)  # {root}"))
    ev = Bounded(timeout=5, workers=1)
    try:
        action = ev.periodic_action(ClassAd("[JobStatus = 2; PeriodicHold = true]"), time.time())
        assert action is not None and action.code == holds.JOB_POLICY_UNDEFINED
        assert "made the job store's expression worker die twice" in action.reason
        with pytest.raises(TooCostly):
            ev.matches(ClassAd("[Requirements = true]"), SLOT)
    finally:
        ev.close()
