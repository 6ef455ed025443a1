"""End to end: the emulated startd and starter run the real hook executables and real jobs."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from jobstore.agent.hooktemplates import install_hooks
from jobstore.api.submission import submit_path
from jobstore.cli.demo import write_node_config
from jobstore.core.states import Event
from jobstore.db.engine import upgrade
from jobstore.db.store import JobStore
from jobstore.emulator import Emulator, EmulatorConfig
from jobstore.node import config
from jobstore.testing.support import ensure_account

SERVICE_ACCOUNT = "jscondor"
JOB_USERS = ("jsalice", "jsbob")


def _ensure_account(name: str) -> pwd.struct_passwd:
    return ensure_account(name, home=True)


def _node(tmp: Path, db_url: str, **overrides) -> tuple[EmulatorConfig, Path]:  # type: ignore[no-untyped-def]
    hooks = install_hooks(tmp / "hooks", sys.executable)
    condor_config = write_node_config(tmp, db_url)
    cfg = EmulatorConfig(
        hooks=hooks,
        work_dir=str(tmp / "node"),
        keyword="JOBSTORE",
        static_slots=4,
        cpus=4,
        memory=4096,
        initial_update_interval=0.5,
        update_interval=2.0,
        min_rearm=0.2,
        fetch_work_delay='ifThenElse(State == "Claimed" && Activity == "Idle",0,1)',
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": "/",
            "CONDOR_CONFIG": str(condor_config),
            "JOBSTORE_DATABASE_URL": db_url,
        },
    )
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg, condor_config


def _submit(store: JobStore, tmp: Path, text: str, owner: str | None = None) -> list[int]:
    sub = tmp / "submit"
    sub.mkdir(exist_ok=True)
    path = sub / "jobs.sub"
    path.write_text(text)
    if owner:
        os.chown(sub, pwd.getpwnam(owner).pw_uid, pwd.getpwnam(owner).pw_gid)
    settings = config.load_settings("JOBSTORE", store.engine.url.render_as_string(False))
    _, ids = submit_path(store, path, settings, owner=owner)
    return ids


FIFTY = """\
executable = /bin/sh
arguments = "-c 'sleep 1; exit $(Process)'"
request_memory = 32
queue 50
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def node_db(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A node directory every account can traverse (pytest's tmp_path is not: its parent is
    mode 700), with the job store on SQLite in it or on a fresh PostgreSQL database."""
    base = Path(tempfile.mkdtemp(prefix="jobstore-e2e-"))
    os.chmod(base, 0o755)
    if request.param == "sqlite":
        db_url = f"sqlite:///{base / 'jobstore.db'}"
    else:
        db_url = request.getfixturevalue("pg_url")
    upgrade(db_url)
    monkeypatch.setenv("CONDOR_CONFIG", str(write_node_config(base, db_url)))
    store = JobStore.from_url(db_url)
    yield store, base
    store.engine.dispose()
    shutil.rmtree(base, ignore_errors=True)


@contextmanager
def _agent(tmp: Path, condor_config: Path, startd_user: str | None) -> Iterator[dict[str, str]]:
    """`jobstore agent` on a socket in `tmp`; yields the hook environment that uses it only."""
    sock = str(tmp / "agent.sock")
    if startd_user:
        with open(condor_config, "a") as fh:
            fh.write(f"JOBSTORE_AGENT_STARTD_USERS = {startd_user}\n")
    log = tmp / "agent.log"
    with open(log, "wb") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "jobstore.cli", "agent", "-f", "--socket", sock],
            env={**os.environ, "CONDOR_CONFIG": str(condor_config)},
            stdout=out,
            stderr=out,
        )
    try:
        deadline = time.monotonic() + 60
        while "listening on" not in log.read_text():
            assert agent.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        # JOBSTORE_HOOK_MODE=agent: no fallback, so every call below went through the agent
        yield {"JOBSTORE_AGENT_SOCKET": sock, "JOBSTORE_HOOK_MODE": "agent"}
    finally:
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(60) == 0, log.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["direct", "agent"])
def test_fifty_jobs_on_four_slots_with_evictions(node_db, mode: str) -> None:  # type: ignore[no-untyped-def]
    store, tmp = node_db
    owner = _ensure_account(JOB_USERS[0]).pw_name if os.geteuid() == 0 else None
    ids = _submit(store, tmp, FIFTY, owner)
    evicted: list[int] = []

    def vacate_first_five(_index: int, ad: dict) -> float | None:  # type: ignore[type-arg]
        proc = int(ad["ProcId"])
        if len(evicted) < 5 and proc not in evicted:
            evicted.append(proc)
            return 0.3
        return None

    cfg, condor_config = _node(
        tmp, str(store.engine.url.render_as_string(False)), vacate_after=vacate_first_five
    )
    if os.geteuid() == 0:
        cfg.condor_user = _ensure_account(SERVICE_ACCOUNT).pw_name
        for path in (tmp, tmp / "jobstore.db"):
            if path.exists():
                os.chmod(path, 0o777 if path.is_dir() else 0o666)
    with ExitStack() as stack:
        if mode == "agent":
            cfg.env.update(stack.enter_context(_agent(tmp, condor_config, cfg.condor_user)))
        report = Emulator(cfg).run(
            until=lambda: not store.list_jobs(), timeout=300, wait_for_jobs=True
        )

    jobs = {j.id: j for j in store.list_jobs(include_final=True)}
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
        kinds = [e.event for e in store.events(by_proc[proc].id) if e.to_status]
        assert "evict" in kinds and kinds[-1] == "exit"
    assert not report.refused_hooks
    assert not [c for c in report.hook_calls if b"Traceback" in (c.stderr or b"")]
    # Every job ran exactly once to completion: one `exit` event per job.
    for job in jobs.values():
        exits = [e for e in store.events(job.id) if e.event == "exit" and e.to_status]
        assert len(exits) == 1


def test_starter_hooks_run_as_job_owner(node_db) -> None:  # type: ignore[no-untyped-def]
    """As root: startd hooks as the service account, starter hooks and the job as the owner."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create accounts and drop privileges")
    store, tmp = node_db
    owner = _ensure_account(JOB_USERS[1])
    _submit(
        store,
        tmp,
        "executable = /usr/bin/id\narguments = -un\noutput = who.out\nqueue\n",
        owner.pw_name,
    )
    cfg, _ = _node(
        tmp,
        str(store.engine.url.render_as_string(False)),
        condor_user=_ensure_account(SERVICE_ACCOUNT).pw_name,
    )
    for path in (tmp, tmp / "jobstore.db"):
        if path.exists():
            os.chmod(path, 0o777 if path.is_dir() else 0o666)
    Emulator(cfg).run(until=lambda: not store.list_jobs(), timeout=60, wait_for_jobs=True)
    (job,) = store.list_jobs(include_final=True)
    assert job.status == "completed", job.reason
    assert (tmp / "submit" / "who.out").read_text().strip() == owner.pw_name


def test_demo_command_runs() -> None:
    """The README's first command: `jobstore demo` runs its jobs to completion."""
    proc = subprocess.run(
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
    out_dir = Path(proc.stdout.split("Job output: ")[1].split("/out.N")[0])
    try:
        assert (out_dir / "out.5").read_text().startswith("job 5 ran")
    finally:
        shutil.rmtree(out_dir.parent, ignore_errors=True)


def test_rm_of_a_running_job_vacates_its_slot_through_the_agent(node_db) -> None:  # type: ignore[no-untyped-def]
    """The agent learns that a running job was removed (JOBSTORE_AGENT_WATCH_INTERVAL) and asks
    the startd to vacate its slot (here the emulator, through JOBSTORE_AGENT_VACATE_COMMAND):
    the job's process ends long before its `sleep 600` would, the job stays removed, and the
    slot fetches the next job, which completes."""
    store, tmp = node_db
    owner = _ensure_account(JOB_USERS[0]).pw_name if os.geteuid() == 0 else None
    (long_job,) = _submit(store, tmp, "executable = /bin/sleep\narguments = 600\nqueue\n", owner)
    (next_job,) = _submit(store, tmp, "executable = /bin/true\nqueue\n", owner)
    control = tmp / "control"
    control.mkdir()
    script = tmp / "vacate.sh"
    script.write_text(f'#!/bin/sh\ntouch "{control}/vacate-$1"\n')
    script.chmod(0o755)
    cfg, condor_config = _node(tmp, str(store.engine.url.render_as_string(False)),
                               static_slots=1, cpus=1, control_dir=str(control))
    with open(condor_config, "a") as fh:
        fh.write(f"JOBSTORE_AGENT_VACATE_COMMAND = {script}\nJOBSTORE_AGENT_WATCH_INTERVAL = 1\n")
    if os.geteuid() == 0:
        cfg.condor_user = _ensure_account(SERVICE_ACCOUNT).pw_name
        for path in (tmp, tmp / "jobstore.db"):
            if path.exists():
                os.chmod(path, 0o777 if path.is_dir() else 0o666)
    removed: list[bool] = []

    def until() -> bool:
        if not removed and store.get_job(long_job).status == "running":
            store.admin(long_job, Event.REMOVE, "removed while it runs")
            removed.append(True)
        return store.get_job(next_job).status == "completed"

    with ExitStack() as stack:
        cfg.env.update(stack.enter_context(_agent(tmp, condor_config, cfg.condor_user)))
        Emulator(cfg).run(until=until, timeout=120, wait_for_jobs=False)
    assert removed, "the long job never ran"
    job = store.get_job(long_job)
    assert (job.status, job.reason) == ("removed", "removed while it runs")
    assert store.get_job(next_job).status == "completed"
    after = [e for e in store.events(long_job) if e.event in ("exit", "evict")]
    assert after and all(e.to_status is None for e in after)  # recorded, changed nothing
    assert after[0].attrs.get("VacateReasonCode") == 1010  # the vacate, not the shutdown
    assert "vacated slot" in (tmp / "agent.log").read_text()
