"""End to end: the emulated startd and starter run the real hook executables and real jobs."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import clirun
import pytest
from emulatornode import (  # noqa: F401 - node_db: the fixture
    JOB_USERS,
    SERVICE_ACCOUNT,
    AgentProc,
    emulated_node,
    ensure_home_account,
    give_node,
    job_owner,
    node_db,
    running_agent,
    submit_text,
)

from jobstore.core.states import Event
from jobstore.db.engine import upgrade
from jobstore.db.schema import jobs
from jobstore.db.store import JobStore
from jobstore.emulator import Emulator, EmulatorConfig

FIFTY = """\
executable = /bin/sh
arguments = "-c 'sleep 1; exit $(Process)'"
request_memory = 32
queue 50
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["direct", "agent"])
def test_fifty_jobs_on_four_slots_with_evictions(node_db, mode: str) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    store, tmp = node_db
    owner = ensure_home_account(JOB_USERS[0]).pw_name if os.geteuid() == 0 else None
    ids = submit_text(store, tmp, FIFTY, owner)
    evicted: list[int] = []

    def vacate_first_five(_index: int, ad: dict) -> float | None:  # type: ignore[type-arg]
        proc = int(ad["ProcId"])
        if len(evicted) < 5 and proc not in evicted:
            evicted.append(proc)
            return 0.3
        return None

    cfg, condor_config = emulated_node(
        tmp, str(store.db.engine.url.render_as_string(False)), vacate_after=vacate_first_five
    )
    if os.geteuid() == 0:
        give_node(cfg, store, tmp, owner, personal=mode == "direct")
    with ExitStack() as stack:
        if mode == "agent":
            cfg.env.update(stack.enter_context(running_agent(tmp, condor_config, cfg.condor_user)))
        report = Emulator(cfg).run(
            until=lambda: not store.reads.list_jobs(), timeout=900, wait_for_jobs=True
        )

    jobs = {j.id: j for j in store.reads.list_jobs(include_final=True)}
    assert sorted(jobs) == sorted(ids)
    assert all(j.status == "completed" for j in jobs.values()), [
        (j.proc_id, j.status, j.reason)
        for j in jobs.values()
        if j.status != "completed"
    ]
    for job in jobs.values():
        assert job.exit_code == job.proc_id
        assert not job.exit_by_signal
    assert len(evicted) == 5
    by_proc = {j.proc_id: j for j in jobs.values()}
    for proc in evicted:
        assert by_proc[proc].attempts == 1 and by_proc[proc].claims == 2
        kinds = [e.event for e in store.reads.events(by_proc[proc].id) if e.to_status]
        assert "evict" in kinds and kinds[-1] == "exit"
    assert not report.refused_hooks
    assert not [c for c in report.hook_calls if b"Traceback" in (c.stderr or b"")]
    # Every job ran exactly once to completion: one `exit` event per job.
    for job in jobs.values():
        exits = [e for e in store.reads.events(job.id) if e.event == "exit" and e.to_status]
        assert len(exits) == 1


# PostgreSQL only: a SQLite job store is one user's, and refuses the hooks of other accounts
# (test_identity.py::test_sqlite_is_one_users_store)
@pytest.mark.slow  # (make test's time: runs with make test-slow)
@pytest.mark.parametrize("node_db", ["postgresql"], indirect=True)
def test_starter_hooks_run_as_job_owner(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """As root: startd hooks as the service account, starter hooks and the job as the owner."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create accounts and drop privileges")
    store, tmp = node_db
    owner = ensure_home_account(JOB_USERS[1])
    submit_text(
        store,
        tmp,
        "executable = /usr/bin/id\narguments = -un\noutput = who.out\nqueue\n",
        owner.pw_name,
    )
    cfg, _ = emulated_node(
        tmp,
        str(store.db.engine.url.render_as_string(False)),
        condor_user=ensure_home_account(SERVICE_ACCOUNT).pw_name,
    )
    for path in (tmp, tmp / "jobstore.db"):
        if path.exists():
            os.chmod(path, 0o777 if path.is_dir() else 0o666)
    Emulator(cfg).run(until=lambda: not store.reads.list_jobs(), timeout=60, wait_for_jobs=True)
    (job,) = store.reads.list_jobs(include_final=True)
    assert job.status == "completed", job.reason
    assert (tmp / "submit" / "who.out").read_text().strip() == owner.pw_name


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_demo_command_runs() -> None:
    """The README's first command: `jobstore demo` runs its jobs to completion."""
    proc = clirun.run(
        [sys.executable, "-m", "jobstore.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            k: v
            for k, v in os.environ.items()
            if k not in ("CONDOR_CONFIG", "JOBSTORE_DATABASE_URL")
        },
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "6 of 6 jobs completed" in proc.stdout
    assert "6 of 6 jobs done, 0 running" in proc.stdout  # the progress line
    # the hint is a command that runs from here (`jobstore` is not on PATH)
    events = next(ln for ln in proc.stdout.splitlines() if ln.startswith("Events:"))
    assert f"{sys.executable} -m jobstore.cli --db sqlite:///" in events
    out_dir = Path(proc.stdout.split("Job output: ")[1].split("/out.N")[0])
    try:
        assert (out_dir / "out.5").read_text().startswith("job 5 ran")
    finally:
        shutil.rmtree(out_dir.parent, ignore_errors=True)


def _vacating_node(store: JobStore, tmp: Path, host: str = "node01.example.org",
                   **overrides: Any) -> tuple[EmulatorConfig, Path]:
    """A one-slot node whose agent vacates slots through the emulator's control directory
    (JOBSTORE_AGENT_VACATE_COMMAND, with condor_vacate's -graceful/-fast), looks every second,
    and knows the node's name (NETWORK_HOSTNAME, so FULL_HOSTNAME is the slots' Machine)."""
    control = tmp / "control"
    control.mkdir()
    script = tmp / "vacate.sh"
    # written whole, then renamed: the emulator may look while it is being written
    script.write_text(f'#!/bin/sh\nprintf %s "$1" > "{control}/.vacate-$2"'
                      f' && mv "{control}/.vacate-$2" "{control}/vacate-$2"\n')
    script.chmod(0o755)
    cfg, condor_config = emulated_node(tmp, str(store.db.engine.url.render_as_string(False)),
                                       static_slots=1, cpus=1, control_dir=str(control),
                                       host=host, **overrides)
    with open(condor_config, "a") as fh:
        fh.write(f"JOBSTORE_AGENT_VACATE_COMMAND = {script}\nJOBSTORE_AGENT_WATCH_INTERVAL = 1\n"
                 f"NETWORK_HOSTNAME = {host}\n")
    if os.geteuid() == 0:
        give_node(cfg, store, tmp, None, personal=False)
    return cfg, condor_config


def test_rm_of_a_running_job_vacates_its_slot_through_the_agent(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """The agent learns that a running job was removed (JOBSTORE_AGENT_WATCH_INTERVAL) and asks
    the startd to vacate its slot gracefully (here the emulator, through
    JOBSTORE_AGENT_VACATE_COMMAND): the job's process ends long before its `sleep 600` would,
    the job stays removed, and the slot fetches the next job, which completes."""
    store, tmp = node_db
    owner = job_owner()
    (long_job,) = submit_text(store, tmp, "executable = /bin/sleep\narguments = 600\nqueue\n",
                              owner)
    (next_job,) = submit_text(store, tmp, "executable = /bin/true\nqueue\n", owner)
    # the starter's one update says the job runs; no later one (whose answer would stop the
    # job from its hook) races the agent's vacate
    cfg, condor_config = _vacating_node(store, tmp, update_interval=600.0)
    removed: list[bool] = []

    def until() -> bool:
        if not removed and store.reads.get_job(long_job).status == "running":
            store.actions.admin(long_job, Event.REMOVE, "removed while it runs")
            removed.append(True)
        return store.reads.get_job(next_job).status == "completed"

    with ExitStack() as stack:
        cfg.env.update(stack.enter_context(running_agent(tmp, condor_config, cfg.condor_user)))
        Emulator(cfg).run(until=until, timeout=120, wait_for_jobs=False)
    assert removed, "the long job never ran"
    job = store.reads.get_job(long_job)
    assert (job.status, job.reason, job.winding_down_until) == (
        "removed", "removed while it runs", None)
    assert store.reads.get_job(next_job).status == "completed"
    after = [e for e in store.reads.events(long_job) if e.event in ("exit", "evict")]
    assert after and all(e.to_status is None for e in after)  # recorded, changed nothing
    assert after[0].attrs.get("VacateReasonCode") == 1010  # the vacate, not the shutdown
    assert after[0].attrs.get("ExitSignal") == signal.SIGTERM  # graceful: its KillSig
    # one slot name form in the history, the startd's and the starter's hooks alike
    assert {e.slot for e in store.reads.events(long_job) if e.slot} == {"slot1@node01.example.org"}
    assert "vacated (graceful)" in (tmp / "agent.log").read_text()


STUBBORN = """\
#!/bin/sh
# The first attempt ignores SIGTERM and sleeps; a later one succeeds at once.
if [ -e first.ran ]; then exit 0; fi
touch first.ran
trap '' TERM
exec sleep 600
"""


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_hold_then_release_of_a_running_job_waits_for_its_end(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """condor_hold then condor_release of a running job that ignores its KillSig: the agent
    vacates gracefully, the job keeps its hold until the attempt ends (the startd's hard kill
    after job_max_vacate_time), the release made meanwhile takes effect then, and only then
    does the job run again (attempt 2, which completes): never two attempts at once."""
    store, tmp = node_db
    owner = job_owner()
    script = tmp / "submit" / "stubborn.sh"
    script.parent.mkdir(exist_ok=True)
    script.write_text(STUBBORN)
    script.chmod(0o755)
    (job_id,) = submit_text(store, tmp, f"executable = {script}\ninitialdir = {script.parent}\n"
                        "job_max_vacate_time = 2\nkill_sig = SIGTERM\nqueue\n", owner)
    cfg, condor_config = _vacating_node(store, tmp)
    acted: list[Any] = []

    def until() -> bool:
        if not acted and store.reads.get_job(job_id).status == "running":
            acted.append(store.actions.admin(job_id, Event.HOLD, "held while it runs"))
            acted.append(store.actions.admin(job_id, Event.RELEASE, "released at once"))
        return store.reads.get_job(job_id).status == "completed"

    with ExitStack() as stack:
        cfg.env.update(stack.enter_context(running_agent(tmp, condor_config, cfg.condor_user)))
        Emulator(cfg).run(until=until, timeout=120, wait_for_jobs=False)
    assert [(o.after, o.pending) for o in acted] == [("held", False), ("held", True)]
    seen = [(e.event, e.from_status, e.to_status, e.attempt) for e in store.reads.events(job_id)]
    held = seen.index(("hold", "running", "held", 1))
    assert seen[held + 1] == ("release", "held", None, 1)  # pending
    ended = next(i for i, e in enumerate(seen) if e[0] == "evict")
    assert held < ended and seen[ended][2] is None  # the hard kill's JOB_EXIT, stale
    assert seen[ended + 1] == ("release", "held", "idle", 1)
    assert seen.index(("fetch", "idle", "fetched", 2)) > ended + 1
    assert ("exit", "running", "completed", 2) in seen or (
        "exit", "accepted", "completed", 2) in seen
    evict = store.reads.events(job_id)[ended]
    assert evict.attrs.get("ExitSignal") == signal.SIGKILL  # SIGTERM was ignored


ONCE_LONG = """\
#!/bin/sh
# The first attempt sleeps; a later one succeeds at once.
if [ -e first.ran ]; then exit 0; fi
touch first.ran
exec sleep 600
"""


@pytest.mark.slow  # (make test's time: runs with make test-slow)
@pytest.mark.parametrize("fast", [False, True])
def test_a_vacated_job_goes_back_to_idle_and_runs_again(node_db, fast: bool) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """condor_vacate_job [-fast] of a running job: the agent vacates its slot (gracefully: the
    job gets its KillSig; -fast: killed), the attempt's JOB_EXIT evict sends the job back to
    idle, and it runs again (attempt 2, which completes)."""
    store, tmp = node_db
    owner = job_owner()
    script = tmp / "submit" / "once_long.sh"
    script.parent.mkdir(exist_ok=True)
    script.write_text(ONCE_LONG)
    script.chmod(0o755)
    (job_id,) = submit_text(store, tmp, f"executable = {script}\ninitialdir = {script.parent}\n"
                        "queue\n", owner)
    cfg, condor_config = _vacating_node(store, tmp, update_interval=600.0)
    event = Event.VACATE_FAST if fast else Event.VACATE
    acted: list[Any] = []

    def until() -> bool:
        if not acted and store.reads.get_job(job_id).status == "running":
            acted.append(store.actions.act_where(jobs.c.id == job_id, event, "vacated"))
        return store.reads.get_job(job_id).status == "completed"

    with ExitStack() as stack:
        cfg.env.update(stack.enter_context(running_agent(tmp, condor_config, cfg.condor_user)))
        Emulator(cfg).run(until=until, timeout=120, wait_for_jobs=False)
    assert acted and acted[0].success == 1
    seen = [(e.event, e.from_status, e.to_status, e.attempt) for e in store.reads.events(job_id)]
    asked = seen.index((event.value, "running", None, 1))
    evicted = seen.index(("evict", "running", "idle", 1))
    assert asked < evicted < seen.index(("fetch", "idle", "fetched", 2))
    assert store.reads.get_job(job_id).status == "completed"
    evict = store.reads.events(job_id)[evicted]
    assert evict.attrs.get("ExitSignal") == (signal.SIGKILL if fast else signal.SIGTERM)
    how = "fast" if fast else "graceful"
    said = f"is vacated{' fast' if fast else ''} by its owner: slot slot1@node01.example.org"
    assert f"{said} vacated ({how})" in (tmp / "agent.log").read_text()


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_agent_restart_while_a_removal_is_pending(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """A running job is removed while the node's agent is down (the hooks work directly
    meanwhile): the agent that starts next finds the attempt in the job store (its node's
    FULL_HOSTNAME) and vacates the slot, so that the job ends and the slot runs the next one."""
    store, tmp = node_db
    owner = job_owner()
    (long_job,) = submit_text(store, tmp, "executable = /bin/sleep\narguments = 600\nqueue\n",
                              owner)
    (next_job,) = submit_text(store, tmp, "executable = /bin/true\nqueue\n", owner)
    # no UPDATE_JOB_INFO after the first: only the agent can end the job here
    cfg, condor_config = _vacating_node(store, tmp, update_interval=600.0)
    if cfg.condor_user:
        with open(condor_config, "a") as fh:
            fh.write(f"JOBSTORE_AGENT_STARTD_USERS = {cfg.condor_user}\n")
    agent = AgentProc(tmp, condor_config)
    cfg.env["JOBSTORE_AGENT_SOCKET"] = agent.sock
    restarted: list[bool] = []

    def until() -> bool:
        if not restarted and store.reads.get_job(long_job).status == "running":
            agent.stop()
            store.actions.admin(long_job, Event.REMOVE, "removed while the agent was down")
            agent.start()
            restarted.append(True)
        return store.reads.get_job(next_job).status == "completed"

    agent.start()
    try:
        Emulator(cfg).run(until=until, timeout=120, wait_for_jobs=False)
    finally:
        if agent.proc is not None:
            agent.stop()
    assert restarted, "the long job never ran"
    assert store.reads.get_job(long_job).status == "removed"
    log = agent.log.read_text()
    assert "1 attempt(s) of this node found in the job store" in log
    row = store.reads.get_job(long_job)
    assert (f"job {row.cluster_id}.{row.proc_id} attempt 1 is removed: "
            "slot slot1@node01.example.org vacated") in log


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_a_job_held_by_policy_on_one_node_never_runs_on_another(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """Two nodes with their agents fetch from one job store. A job whose periodic_hold fires
    while it runs (the agent's periodic pass, PERIODIC_EXPR_INTERVAL 1 s) is held with
    HoldReasonCode 3, its slot is vacated, and neither node ever fetches it again while the
    other jobs run on both."""
    store, base = node_db
    owner = job_owner()
    (held_job,) = submit_text(
        store, base, "executable = /bin/sleep\narguments = 600\n"
        "periodic_hold = time() - JobCurrentStartDate > 1\nqueue\n", owner)
    quick = submit_text(store, base, "executable = /bin/sleep\narguments = 1\nqueue 6\n", owner)
    nodes = []
    for name in ("a", "b"):
        tmp = base / f"node-{name}"
        tmp.mkdir()
        os.chmod(tmp, 0o777)
        cfg, condor_config = _vacating_node(store, tmp, host=f"node-{name}.example.org")
        with open(condor_config, "a") as fh:
            fh.write("PERIODIC_EXPR_INTERVAL = 1\n")
        nodes.append((tmp, cfg, condor_config))
    done = threading.Event()

    def until() -> bool:
        job = store.reads.get_job(held_job)
        finished = all(store.reads.get_job(j).status == "completed" for j in quick)
        if finished and job.status == "held" and job.winding_down_until is None:
            done.set()
        return done.is_set()

    with ExitStack() as stack:
        for tmp, cfg, condor_config in nodes:
            cfg.env.update(stack.enter_context(running_agent(tmp, condor_config, cfg.condor_user)))
        other = threading.Thread(target=Emulator(nodes[1][1]).run,
                                 kwargs={"until": done.is_set, "timeout": 120,
                                         "wait_for_jobs": False})
        other.start()
        try:
            Emulator(nodes[0][1]).run(until=until, timeout=120, wait_for_jobs=False)
        finally:
            done.set()
            other.join()
    job = store.reads.get_job(held_job)
    assert (job.status, job.hold_code) == ("held", 3), job.reason
    fetches = [e for e in store.reads.events(held_job) if e.event == "fetch"]
    assert len(fetches) == 1
    # its process ended: the vacate's evict, or an exit by the signal its UPDATE_JOB_INFO sent
    assert any(e.event in ("evict", "exit") and e.attempt == 1 and e.to_status is None
               for e in store.reads.events(held_job))
    hosts = {e.host for j in quick for e in store.reads.events(j) if e.event == "fetch"}
    assert hosts == {"node-a.example.org", "node-b.example.org"}


def test_the_agent_hears_of_a_removal_on_postgresql_without_polling(
        pg_url: str) -> None:
    """On PostgreSQL the agent LISTENs for stopped attempts: with a watch interval of 60 s
    (and its safety poll at 30 s), a removal still reaches the slot within the 25 s this test
    allows, so it came by notification."""
    upgrade(pg_url)
    store = JobStore.from_url(pg_url)
    base = Path(tempfile.mkdtemp(prefix="jobstore-e2e-"))
    os.chmod(base, 0o755)
    try:
        owner = job_owner()
        (long_job,) = submit_text(store, base, "executable = /bin/sleep\narguments = 600\nqueue\n",
                              owner)
        (next_job,) = submit_text(store, base, "executable = /bin/true\nqueue\n", owner)
        # no UPDATE_JOB_INFO after the first: only the agent can end the job here
        cfg, condor_config = _vacating_node(store, base, update_interval=600.0)
        with open(condor_config, "a") as fh:
            fh.write("JOBSTORE_AGENT_WATCH_INTERVAL = 60\n")
        removed: list[float] = []

        def until() -> bool:
            if not removed and store.reads.get_job(long_job).status == "running":
                store.actions.admin(long_job, Event.REMOVE, "removed while it runs")
                removed.append(time.monotonic())
            return store.reads.get_job(next_job).status == "completed"

        with ExitStack() as stack:
            cfg.env.update(stack.enter_context(running_agent(base, condor_config, cfg.condor_user)))
            Emulator(cfg).run(until=until, timeout=25, wait_for_jobs=False)
        assert removed, "the long job never ran"
        assert store.reads.get_job(next_job).status == "completed"
        log = (base / "agent.log").read_text()
        assert "listening for stopped attempts" in log
        assert "vacated (graceful)" in log
    finally:
        store.db.engine.dispose()
        shutil.rmtree(base, ignore_errors=True)
