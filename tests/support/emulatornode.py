"""An emulated node for the end-to-end tests: the emulated startd and starter run the real hook
executables and real jobs (jobstore.emulator), with its accounts, its job store (`node_db`), the
node's configuration (`emulated_node`), submitting to it (`submit_text`) and its agent
(`running_agent`, `AgentProc`)."""

from __future__ import annotations

import atexit
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
from typing import Any

import clirun
import pytest

from jobstore.agent.hooktemplates import install_hooks
from jobstore.api.submission import submit_path
from jobstore.cli.demo import write_node_config
from jobstore.db.engine import upgrade
from jobstore.db.store import JobStore
from jobstore.emulator import Emulator, EmulatorConfig
from jobstore.node import config
from jobstore.node.sandboxroot import ensure_root
from jobstore.testing.support import ensure_account, own_node_dirs, sqlite_copy

SERVICE_ACCOUNT = "jscondor"
JOB_USERS = ("jsalice", "jsbob")


def ensure_home_account(name: str) -> pwd.struct_passwd:
    return ensure_account(name, home=True)


def emulated_node(tmp: Path, db_url: str, **overrides) -> tuple[EmulatorConfig, Path]:  # type: ignore[no-untyped-def]
    hooks = install_hooks(tmp / "hooks", sys.executable)
    condor_config = write_node_config(tmp, db_url)
    atexit.register(shutil.rmtree, own_node_dirs(condor_config), True)
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


def submit_text(store: JobStore, tmp: Path, text: str, owner: str | None = None) -> list[int]:
    sub = tmp / "submit"
    sub.mkdir(exist_ok=True)
    path = sub / "jobs.sub"
    path.write_text(text)
    if owner:
        os.chown(sub, pwd.getpwnam(owner).pw_uid, pwd.getpwnam(owner).pw_gid)
    settings = config.load_settings("JOBSTORE", store.db.engine.url.render_as_string(False))
    _, ids = submit_path(store, path, settings, owner=owner)
    return ids


@pytest.fixture(params=["sqlite", "postgresql"])
def node_db(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A node directory every account can traverse (pytest's tmp_path is not: its parent is
    mode 700), with the job store on SQLite in it or on a fresh PostgreSQL database."""
    base = Path(tempfile.mkdtemp(prefix="jobstore-e2e-"))
    os.chmod(base, 0o755)
    if request.param == "sqlite":
        db_url = sqlite_copy(request.getfixturevalue("sqlite_url"), base / "jobstore.db")
    else:
        db_url = request.getfixturevalue("pg_url")
    upgrade(db_url)
    monkeypatch.setenv("CONDOR_CONFIG", str(write_node_config(base, db_url)))
    store = JobStore.from_url(db_url)
    yield store, base
    store.db.engine.dispose()
    shutil.rmtree(base, ignore_errors=True)


class AgentProc:
    """`jobstore agent -f` on a socket in `tmp`, logging to `tmp/agent.log` (appended to, so
    that a restart keeps what the first one said)."""

    def __init__(self, tmp: Path, condor_config: Path) -> None:
        self.sock, self.log, self.condor_config = str(tmp / "agent.sock"), tmp / "agent.log", \
            condor_config
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        said = self.log.read_text() if self.log.exists() else ""
        with open(self.log, "ab") as out:
            self.proc = clirun.popen(
                [sys.executable, "-m", "jobstore.cli", "agent", "-f", "--socket", self.sock],
                env={**os.environ, "CONDOR_CONFIG": str(self.condor_config)},
                stdout=out,
                stderr=out,
            )
        deadline = time.monotonic() + 60
        while self.log.read_text().count("listening on") <= said.count("listening on"):
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(60) == 0, self.log.read_text()
        self.proc = None


@contextmanager
def running_agent(tmp: Path, condor_config: Path, startd_user: str | None,
                  fallback: bool = False) -> Iterator[dict[str, str]]:
    """`jobstore agent` on a socket in `tmp`; yields the hook environment that uses it (only
    it, unless `fallback`: then the hooks work directly while it is down)."""
    if startd_user:
        with open(condor_config, "a") as fh:
            fh.write(f"JOBSTORE_AGENT_STARTD_USERS = {startd_user}\n")
    agent = AgentProc(tmp, condor_config)
    agent.start()
    try:
        # JOBSTORE_HOOK_MODE=agent: no fallback, so every call below went through the agent
        yield {"JOBSTORE_AGENT_SOCKET": agent.sock,
               **({} if fallback else {"JOBSTORE_HOOK_MODE": "agent"})}
    finally:
        if agent.proc is not None:
            agent.stop()



def give_node(cfg: EmulatorConfig, store: JobStore, tmp: Path, owner: str | None, *,
               personal: bool) -> None:
    """As root: the startd's hooks run as the service account, in a node directory open to it
    and to the jobs' owner. A SQLite store is one user's: with no agent (`personal`) the node
    is its jobs' owner's own, as `jobstore demo`'s, and every hook runs as her."""
    os.chmod(tmp, 0o777)
    if store.db.engine.dialect.name == "sqlite" and personal and owner:
        user = pwd.getpwnam(owner)
        os.chown(str(store.db.engine.url.database), user.pw_uid, user.pw_gid)
        cfg.condor_user = owner
        return
    cfg.condor_user = ensure_home_account(SERVICE_ACCOUNT).pw_name


def job_owner() -> str | None:
    return ensure_home_account(JOB_USERS[0]).pw_name if os.geteuid() == 0 else None


def run_node(store: JobStore, tmp: Path, owner: str | None, mode: str, until_status: set[str],
             env: dict[str, str] | None = None, slots: int = 1, **node: Any) -> Emulator:
    """An emulated node with `slots` slots on `store` (the hooks through an agent, or in
    `direct` mode), its sandboxes under `tmp`/sandboxes, run until every job's status is in
    `until_status`."""
    cfg, condor_config = emulated_node(tmp, str(store.db.engine.url.render_as_string(False)),
                                       static_slots=slots, cpus=slots, **node)
    cfg.env.update(env or {})
    root = tmp / "sandboxes"
    with open(condor_config, "a") as fh:
        fh.write(f"JOBSTORE_SANDBOX_ROOT = {root}\n")
    if os.geteuid() == 0:
        give_node(cfg, store, tmp, owner, personal=mode == "direct")
    if mode == "direct":
        ensure_root(str(root))  # what the agent, or the admin, makes
    emulator = Emulator(cfg)
    with ExitStack() as stack:
        if mode == "agent":
            cfg.env.update(stack.enter_context(running_agent(tmp, condor_config, cfg.condor_user)))
        emulator.run(until=lambda: all(j.status in until_status
                                       for j in store.reads.list_jobs(include_final=True)),
                     timeout=120, wait_for_jobs=True)
    return emulator
