"""A job's own policy with HTCondor's semantics: periodic_hold/_release/_remove,
allowed_job_duration, allowed_execute_duration, on_exit_hold/_remove; hold codes; the periodic
pass; as unit tests and through the store on SQLite and PostgreSQL."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from classad2 import ClassAd, ExprTree

from jobstore.core import holds, policy
from jobstore.core.claims import Verdict
from jobstore.core.states import Event
from jobstore.db.store import JobStore
from jobstore.formats import views
from jobstore.testing.factories import a_job, claim_request, report, running, submit
from jobstore.testing.support import ordinary_owner

# ---- policy: pure functions ---------------------------------------------------------------


def ad(**attrs: Any) -> ClassAd:
    out = ClassAd()
    for name, value in attrs.items():
        out[name] = ExprTree(value) if isinstance(value, str) else value
    return out


def test_periodic_hold_with_reason_and_subcode() -> None:
    fired = policy.periodic_action(
        ad(JobStatus=2, PeriodicHold="RemoteUserCpu > 10", RemoteUserCpu=11,
           PeriodicHoldReason='strcat("used ", RemoteUserCpu, " s")', PeriodicHoldSubCode="7"),
        now=0)
    assert fired == policy.Action("hold", "used 11 s", holds.JOB_POLICY, 7)
    plain = policy.periodic_action(ad(JobStatus=1, PeriodicHold="JobStatus == 1"), now=0)
    assert plain == policy.Action(
        "hold", "The job attribute PeriodicHold expression 'JobStatus == 1' evaluated to TRUE",
        holds.JOB_POLICY, 0)


@pytest.mark.parametrize("expr", ["undefined", "NoSuchAttr > 3", '"yes"', "error", "0", "false"])
def test_undefined_or_false_never_fires(expr: str) -> None:
    for name in ("PeriodicHold", "PeriodicRemove"):
        assert policy.periodic_action(ad(JobStatus=1, **{name: expr}), now=0) is None
    assert policy.exit_action(ad(ExitCode=0, OnExitHold=expr)) is None


def fired(action: policy.Action | None) -> policy.Action:
    """The action that fired (the test fails where none did)."""
    assert action is not None
    return action


def test_a_number_other_than_zero_fires() -> None:
    removed = fired(policy.periodic_action(ad(JobStatus=1, PeriodicRemove="2"), now=0))
    assert removed.kind == "remove"


def test_order_and_states() -> None:
    both = dict(PeriodicHold="true", PeriodicRemove="true")
    first = fired(policy.periodic_action(ad(JobStatus=1, **both), now=0))
    assert first.kind == "hold"  # hold first
    assert fired(policy.periodic_action(ad(JobStatus=5, **both), now=0)).kind == "remove"  # held
    for done in (3, 4):  # removed, completed: nothing
        assert policy.periodic_action(ad(JobStatus=done, **both), now=0) is None


def test_periodic_release_never_undoes_a_user_hold() -> None:
    rel = dict(JobStatus=5, PeriodicRelease="true")
    assert policy.periodic_action(ad(HoldReasonCode=1, **rel), now=0) is None
    assert fired(policy.periodic_action(ad(HoldReasonCode=3, **rel), now=0)).kind == "release"
    assert policy.periodic_action(ad(JobStatus=1, PeriodicRelease="true"), now=0) is None


def test_allowed_durations_hold_running_jobs() -> None:
    running = dict(JobStatus=2, ShadowBday=1000, JobCurrentStartExecutingDate=1010)
    job = ad(AllowedJobDuration=100, **running)
    assert policy.periodic_action(job, now=1099) is None
    held = fired(policy.periodic_action(job, now=1100))
    assert (held.kind, held.code) == ("hold", holds.JOB_DURATION_EXCEEDED)
    assert held.reason == "The job exceeded allowed job duration of 0:01:40"
    exe = ad(AllowedExecuteDuration=60, **running)
    assert policy.periodic_action(exe, now=1070) is None  # not more than 60 s yet
    assert fired(policy.periodic_action(exe, now=1071)).code == holds.JOB_EXECUTE_EXCEEDED
    idle = ad(JobStatus=1, AllowedJobDuration=1, ShadowBday=0)
    assert policy.periodic_action(idle, now=10**9) is None


def test_on_exit_hold_and_remove() -> None:
    hold = policy.exit_action(ad(ExitCode=3, ExitBySignal=False, OnExitHold="ExitCode != 0",
                                 OnExitHoldReason='"bad exit"', OnExitHoldSubCode=4))
    assert hold == policy.Action("hold", "bad exit", holds.JOB_POLICY, 4)
    again = policy.exit_action(ad(ExitCode=1, OnExitRemove="ExitCode == 0"))
    assert again is not None and again.kind == "requeue"
    assert policy.exit_action(ad(ExitCode=0, OnExitRemove="ExitCode == 0")) is None
    assert policy.exit_action(ad(ExitCode=0)) is None


def test_on_exit_remove_decides_over_max_retries() -> None:
    job = a_job(max_retries=3)
    attrs = {"ExitCode": 1, "ExitBySignal": False}
    assert policy.exit_verdict(job, attrs) == policy.ExitVerdict(False, True)
    keep = ad(ExitCode=1, OnExitRemove="true")
    assert policy.exit_verdict(job, attrs, keep) == policy.ExitVerdict(False, False)
    again = ad(ExitCode=0, OnExitRemove="false")
    assert policy.exit_verdict(a_job(), {"ExitCode": 0}, again).retry


def test_an_exit_without_expressions_of_its_own_is_judged_without_its_ad() -> None:
    """exit_evaluates is false only where the verdict without the policy ad (no evaluation, no
    worker) is the verdict with it."""
    exits: tuple[dict[str, Any], ...] = (
        {"ExitCode": 0, "ExitBySignal": False}, {"ExitCode": 2, "ExitBySignal": False},
        {"ExitCode": 3}, {"ExitBySignal": True, "ExitSignal": 9}, {})
    plain = [a_job(), a_job(max_retries=3), a_job(max_retries=3, retry_until="2"),
             a_job(success_exit_code=3, max_retries=1, retry_until=" -1 "),
             a_job(ad={"Cmd": "/bin/true", "OnExitHoldReason": "no hold without OnExitHold"})]
    for job in plain:
        assert not policy.exit_evaluates(job.ad, job.retry_until)
        for attrs in exits:
            assert policy.exit_verdict(job, attrs) == policy.exit_verdict(
                job, attrs, views.policy_ad(job, attrs))
    for attrs, retry_until in (({"OnExitHold": {"expr": "false"}}, None),
                               ({"onexitremove": {"expr": "true"}}, None),
                               ({}, "ExitCode == 2"), ({}, "--5"), ({}, "\u00b2")):
        assert policy.exit_evaluates(attrs, retry_until)
    for odd in ("--5", "\u00b2"):  # not exit codes: expressions, which never crash the verdict
        job = a_job(max_retries=2, retry_until=odd)
        assert policy.exit_verdict(job, {"ExitCode": 5, "ExitBySignal": False}).retry


# ---- through the store ------------------------------------------------------------------------

REQ = claim_request(shape="s")


def exit_with(store: JobStore, job: Any, code: int) -> Any:
    attrs = {"ExitCode": code, "ExitBySignal": False}

    def exit_policy(row: Any) -> policy.ExitVerdict:
        return policy.exit_verdict(row, attrs, views.policy_ad(row, attrs))

    return report(store, job, Event.EXIT, changes={"exit_code": code}, attrs=attrs,
                  exit_policy=exit_policy)


def test_periodic_pass_removes_holds_and_releases(store: JobStore) -> None:
    (gone,) = submit(store, custom={"PeriodicRemove": "JobStatus == 1"})
    (kept,) = submit(store, custom={"PeriodicRemove": "JobStatus == 2"})
    (plain,) = submit(store)
    assert store.reads.get_job(plain).periodic is None and store.reads.get_job(gone).periodic
    changed = store.maintenance.police()
    assert [(o.job_id, o.after) for o in changed] == [(gone, "removed")]
    job = store.reads.get_job(gone)
    assert job.reason == ("The job attribute PeriodicRemove expression 'JobStatus == 1' "
                          "evaluated to TRUE")
    assert store.reads.get_job(kept).status == store.reads.get_job(plain).status == "idle"
    assert store.maintenance.police() == []
    # a release by policy, but never of a job the user held
    (rel,) = submit(store, custom={"PeriodicRelease": "true"})
    store.actions.admin(rel, Event.HOLD, "by hand")
    assert (store.reads.get_job(rel).hold_code, store.maintenance.police()) == (
        holds.USER_REQUEST, [])
    store.actions.admin(rel, Event.RELEASE)
    assert store.reads.get_job(rel).hold_code is None


def test_periodic_hold_of_a_running_job_at_its_report(store: JobStore) -> None:
    (job_id,) = submit(store, custom={"PeriodicHold": "RemoteUserCpu > 10",
                                      "PeriodicHoldReason": '"cpu"', "PeriodicHoldSubCode": "9"})
    job = running(store, REQ, changes={"remote_user_cpu": 5.0})
    assert job.status == "running"
    out = report(store, job, Event.UPDATE, changes={"remote_user_cpu": 11.0})
    assert out.after == "running"  # the report itself is applied, then the policy acts
    held = store.reads.get_job(job_id)
    assert (held.status, held.reason, held.hold_code, held.hold_subcode, held.num_holds) == (
        "held", "cpu", holds.JOB_POLICY, 9, 1)
    assert held.token is None  # the attempt is over: its JOB_EXIT is only recorded
    late = exit_with(store, job, 0)
    assert late.stale and store.reads.get_job(job_id).status == "held"
    ev = store.reads.events(job_id)[-2]
    assert ev.attrs is not None
    assert (ev.event, ev.to_status, ev.attrs["HoldReasonCode"], ev.attrs["HoldReasonSubCode"]) \
        == ("hold", "held", 3, 9)


def test_allowed_job_duration_in_the_periodic_pass(store: JobStore) -> None:
    (job_id,) = submit(store, custom={"AllowedJobDuration": "100"})
    job = running(store, REQ)
    assert job.fetched_at is not None
    assert store.maintenance.police(now=job.fetched_at + 50) == []
    (out,) = store.maintenance.police(now=job.fetched_at + 100)
    assert (out.job_id, out.after) == (job_id, "held")
    assert store.reads.get_job(job_id).hold_code == holds.JOB_DURATION_EXCEEDED


def test_on_exit_hold_and_on_exit_remove_at_exit(store: JobStore) -> None:
    (held_id,) = submit(store, custom={"OnExitHold": "ExitCode != 0",
                                       "OnExitHoldReason": '"bad exit"', "OnExitHoldSubCode": "4"})
    out = exit_with(store, running(store, REQ), 3)
    held = store.reads.get_job(held_id)
    assert (out.event, held.status, held.reason, held.hold_code, held.hold_subcode) == (
        "hold", "held", "bad exit", holds.JOB_POLICY, 4)
    assert held.exit_code == 3
    (again_id,) = submit(store, custom={"OnExitRemove": "ExitCode == 0"})
    assert exit_with(store, running(store, REQ), 1).after == "idle"
    again = store.reads.get_job(again_id)
    assert again.attempts == 1
    assert exit_with(store, running(store, REQ), 0).after == "completed"


def test_hook_holds_carry_their_codes(store: JobStore) -> None:
    submit(store)
    job = running(store, REQ)
    report(store, job, Event.HOOK_HOLD)
    assert store.reads.get_job(job.id).hold_code == holds.STARTD_HELD_JOB
    (root,) = submit(store, owner="root")
    store.negotiator.claim(REQ, lambda j: Verdict(hold_reason="jobs may not run as root"))
    assert store.reads.get_job(root).hold_code == holds.FAILED_TO_ACCESS_USER_ACCOUNT


def test_one_periodic_pass_per_interval_in_the_pool(store: JobStore) -> None:
    assert store.maintenance.police_due(60, now=900.0) is None  # no job has a periodic expression
    submit(store, custom={"PeriodicRemove": "false"})
    assert store.maintenance.police_due(60, now=1000.0) == []
    assert store.maintenance.police_due(60, now=1030.0) is None  # another node's pass ran 30 s ago
    submit(store, custom={"PeriodicRemove": "true"})
    assert [o.event for o in store.maintenance.police_due(60, now=1061.0) or ()] == ["remove"]


def test_user_log_has_the_hold_codes(store: JobStore) -> None:
    """The 012 event of a policy hold says HoldReasonCode 3 and the expression's subcode."""
    base = Path(tempfile.mkdtemp(prefix="jobstore-policy-"))
    base.chmod(0o777)  # the log is written as the job's owner, who must reach it
    log = base / "job.log"
    submit(store, owner=ordinary_owner(), user_log=str(log),
           custom={"PeriodicHold": "true", "PeriodicHoldSubCode": "12"})
    store.maintenance.police()
    text = log.read_text()
    shutil.rmtree(base)
    assert "012 (" in text and "Code 3 Subcode 12" in text


# ---- PREPARE_JOB finds what keeps the job from starting ---------------------------------------


@pytest.mark.slow  # (make test's time: runs with make test-slow)
@pytest.mark.parametrize(
    ("spec", "code", "sub", "words"),
    [
        (dict(cmd="/no/such/executable"), holds.FAILED_TO_CREATE_PROCESS, 2,
         "Failed to execute '/no/such/executable': (errno=2: 'No such file or directory')"),
        (dict(cmd="/etc/passwd"), holds.FAILED_TO_CREATE_PROCESS, 13,
         "Failed to execute '/etc/passwd': (errno=13: 'Permission denied')"),
        (dict(iwd="/no/such/dir"), holds.IWD_ERROR, 2,
         "Failed to enter the job's initial directory '/no/such/dir'"),
        (dict(input="missing.txt"), holds.UNABLE_TO_OPEN_INPUT, 2,
         "Failed to open '/tmp/missing.txt' as standard input"),
    ],
)
def test_prepare_job_holds_a_job_that_cannot_start(
    db_url: str, hook_dir: Path, condor_config: Path, spec: dict, code: int, sub: int,
    words: str,
) -> None:
    """The real hooks: PREPARE_JOB (as the job's user, before the exec) finds the problem, holds
    the job with HTCondor's HoldReasonCode and errno, and tells the starter not to run it; the
    JOB_EXIT evict that follows changes nothing."""
    from hookrun import hook_env
    from hookseq import run_sequence

    from jobstore.db.engine import upgrade
    from jobstore.testing.support import ordinary_owner

    upgrade(db_url)
    store = JobStore.from_url(db_url)
    try:
        (job_id,) = submit(store, owner=ordinary_owner(), **spec)
        seq = run_sequence(hook_dir, hook_env(db_url, condor_config), "slot1@node01")
        assert seq.job_id == job_id
        prepared = next(c for c in seq.calls if c.hook == "prepare_job")
        assert prepared.returncode == 1 and b"HookStatusCode = 301" in prepared.stdout
        assert seq.calls[-1].hook == "job_exit" and seq.calls[-1].argv == ["evict"]
        job = store.reads.get_job(job_id)
        assert (job.status, job.hold_code, job.hold_subcode) == ("held", code, sub)
        assert job.reason is not None
        assert job.reason.startswith("Error from ") and words in job.reason
        assert job.attempts == 0  # a hold, not a failed attempt
    finally:
        store.db.engine.dispose()


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_launch_check_can_be_turned_off_and_leaves_other_jobs_alone(
    db_url: str, hook_dir: Path, condor_config: Path
) -> None:
    """JOBSTORE_CHECK_LAUNCH = false (a wrapper or container brings the executable): the job
    starts as before. An ad that is not a job store job is never refused."""
    from hookrun import hook_env, run_hook
    from hookseq import run_sequence

    from jobstore.db.engine import upgrade
    from jobstore.testing.support import ordinary_owner

    upgrade(db_url)
    with condor_config.open("a") as fh:
        fh.write("JOBSTORE_CHECK_LAUNCH = false\n")
    env = hook_env(db_url, condor_config)
    store = JobStore.from_url(db_url)
    try:
        (job_id,) = submit(store, owner=ordinary_owner(), cmd="/no/such/executable")
        seq = run_sequence(hook_dir, env, "slot1@node01")
        assert seq.job_id == job_id
        assert next(c for c in seq.calls if c.hook == "prepare_job").returncode == 0
        assert store.reads.get_job(job_id).status == "completed"
    finally:
        store.db.engine.dispose()
    other = b'Cmd = "/no/such/executable"\nIwd = "/tmp"\nClusterId = 5\nProcId = 0\n'
    res = run_hook(hook_dir, "prepare_job", other, env=hook_env(db_url, condor_config))
    assert res.returncode == 0 and b"HookStatusCode" not in res.stdout


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_expression_worker_the_node_cannot_start_holds_no_job(
        store: JobStore, fixtures_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No worker process to judge a job with (the node's process limit, say) is the node's
    trouble: the fetch hands out nothing, says why, and the job stays idle, not held."""
    from jobstore.errors import WorkerUnavailable
    from jobstore.node import bounded, config, handlers
    from jobstore.node.hookcall import HookRequest
    from jobstore.node.services import NodeServices

    def no_process(*args: Any, **kwargs: Any) -> Any:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    (job_id,) = submit(store, owner=ordinary_owner())
    services = NodeServices()
    services.use_evaluator(bounded.Bounded(timeout=5, workers=1))
    monkeypatch.setattr(bounded.subprocess, "Popen", no_process)
    monkeypatch.setattr(config, "slot_keyword", lambda name, type_id: "JOBSTORE")
    url = store.db.engine.url.render_as_string(hide_password=False)
    slot = (fixtures_dir / "htcondor-transcripts/01-normal-job/01-FETCH_WORK.stdin").read_bytes()
    try:
        response = handlers.handle(HookRequest(
            hook="fetch_job", argv=[], stdin=slot, node=services,
            settings=lambda keyword: config.Settings(keyword="JOBSTORE", database_url=url)))
    finally:
        services.drop_stores()
    assert not response.stdout
    assert response.error is not None and "expression worker cannot be started" in str(
        response.error), response
    assert store.reads.get_job(job_id).status == "idle"
    with pytest.raises(WorkerUnavailable):
        bounded.Bounded(timeout=5, workers=1).matches(ClassAd("[Requirements = true]"),
                                                      ClassAd("[Cpus = 1]"))
