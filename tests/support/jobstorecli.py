"""The jobstore command line on a test's database: `cli` runs a command, `submit` a submit file
(as an ordinary owner when root), and the `db` fixture is a database `jobstore init` made."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import clirun
import pytest

from jobstore.testing.support import ordinary_owner as _owner

JOBSTORE = [sys.executable, "-m", "jobstore.cli"]


def cli(db_url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, **(env or {})}
    full.pop("JOBSTORE_DATABASE_URL", None)
    return clirun.run(
        [*JOBSTORE, "--db", db_url, *args], capture_output=True, text=True, timeout=120, env=full
    )


def submit(db_url: str, path: Path, *extra: str) -> subprocess.CompletedProcess:
    owner = ["--owner", _owner()] if os.geteuid() == 0 else []
    return cli(db_url, "submit", str(path), *owner, *extra)


@pytest.fixture
def db(db_url: str, condor_config: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("CONDOR_CONFIG", str(condor_config))
    assert cli(db_url, "init").returncode == 0
    return db_url
