"""A node for the agent's tests: a directory every account can traverse with the hooks, the
configuration, the spool and the agent's socket (`Node`, the `node` fixture), and the job store
it uses (the `store` fixture)."""

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import clirun
import pytest
from hookrun import hook_env

from jobstore.agent.hooktemplates import install_hooks
from jobstore.db.engine import upgrade
from jobstore.db.store import JobStore
from jobstore.emulator.spawn import hook_preexec
from jobstore.node import spool
from jobstore.testing.support import sqlite_copy

WAIT = 60.0  # generous bound for the agent to come up or go down; never a speed assertion


@dataclass
class Node:
    """A node directory every account can traverse: hooks, config, spool, the agent's socket."""

    base: Path
    db_url: str
    config: Path
    socket: str
    hooks: Path
    log: Path
    agent: subprocess.Popen | None = None
    spool: Path | None = None  # default: base/spool

    def env(self, **extra: str) -> dict[str, str]:
        spool_dir = self.spool or self.base / "spool"
        env: dict[str, Any] = {
            "JOBSTORE_AGENT_SOCKET": self.socket, "JOBSTORE_SPOOL": str(spool_dir), **extra}
        return hook_env(self.db_url, self.config, **env)

    def start(self, **extra: str) -> None:
        self.log.write_text("")
        env = dict(self.env(**extra), PATH=os.environ.get("PATH", "/usr/bin:/bin"))
        with open(self.log, "ab") as err:
            self.agent = clirun.popen(
                [sys.executable, "-m", "jobstore.cli", "agent", "--socket", self.socket],
                env=env, stdout=err, stderr=err, signals_blocked=True,
            )
        self.wait_log("listening on")

    def wait_log(self, text: str, after: int = 0) -> None:
        end = time.monotonic() + WAIT
        while text not in self.log.read_text()[after:]:
            assert self.agent is None or self.agent.poll() is None, self.log.read_text()
            assert time.monotonic() < end, f"no {text!r} in agent log: {self.log.read_text()}"
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.agent is not None
        self.agent.send_signal(sig)
        code = self.agent.wait(WAIT)
        self.agent = None
        return code

    def hook(self, name: str, stdin: bytes, argv: list[str] | None = None,
             user: pwd.struct_passwd | None = None, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.hooks / name), *(argv or [])], input=stdin, capture_output=True,
            env=self.env(**env), timeout=WAIT, preexec_fn=hook_preexec(False),
            user=user.pw_uid if user else None, group=user.pw_gid if user else None,
            extra_groups=[] if user else None,
        )


@pytest.fixture
def node(db_url: str) -> Iterator[Node]:
    base = Path(tempfile.mkdtemp(prefix="jobstore-agent-"))
    os.chmod(base, 0o755)
    if db_url.startswith("sqlite"):
        db_url = sqlite_copy(db_url, base / "jobstore.db")
    upgrade(db_url)
    (base / "log").mkdir()
    config = base / "condor_config"
    config.write_text(
        "UID_DOMAIN = localdomain\nSTARTD_JOB_HOOK_KEYWORD = JOBSTORE\n"
        f"LOG = {base / 'log'}\nJOBSTORE_AGENT_READ_TIMEOUT = 1\n"
        # the node's own: its agent's journal, outbox and input cache are no other test's
        f"JOBSTORE_SANDBOX_ROOT = {base / 'sandboxes'}\n"
    )
    spool.ensure_dir(base / "spool")
    hooks = base / "hooks"
    install_hooks(hooks, sys.executable)
    n = Node(base, db_url, config, str(base / "agent.sock"), hooks, base / "agent.log")
    try:
        yield n
    finally:
        if n.agent is not None:
            n.agent.kill()
            n.agent.wait()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def store(node: Node) -> Iterator[JobStore]:
    s = JobStore.from_url(node.db_url)
    yield s
    s.db.engine.dispose()
