"""The day-to-day guide (docs/usage.md) as a newcomer runs it: every command line of its block
is one the `jobstore` command takes, and runs or fails with one line (a job it names may
not exist here); the htcondor2 example is run by tests/store/test_schedd.py."""

from __future__ import annotations

import os
import re
import shlex
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import clirun
import pytest

USAGE = Path(__file__).resolve().parents[2] / "docs" / "usage.md"
LONG_RUNNING = {"watch", "agent", "schedd", "demo", "emulate"}  # checked with --help


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", USAGE.read_text(), re.S)


def _command_lines(block: str) -> list[str]:
    out = []
    for line in block.splitlines():
        text = re.sub(r"\s+#.*$", "", line).strip()
        out += [c.strip() for c in text.split(" ; ") if c.strip().startswith("jobstore ")]
    return out


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_every_day_to_day_command_runs(tmp_path: Path, condor_config: Path) -> None:
    (block,) = [b for b in _blocks("sh") if "jobstore submit job.sub" in b]
    commands = _command_lines(block)
    assert len(commands) > 30
    (tmp_path / "job.sub").write_text("executable = /bin/true\nqueue 2\n")
    (tmp_path / "diamond.dag").write_text("JOB A job.sub\nJOB B job.sub\nPARENT A CHILD B\n")
    db = f"sqlite:///{tmp_path / 'jobstore.db'}"
    env = {**{k: v for k, v in os.environ.items() if k != "JOBSTORE_DATABASE_URL"},
           "CONDOR_CONFIG": str(condor_config), "JOBSTORE_SPOOL": str(tmp_path / "spool")}
    base = [*clirun.JOBSTORE_CLI, "--db", db]
    assert clirun.run([*base, "init"], env=env, capture_output=True).returncode == 0
    owner = ["--owner", "nobody"] if os.geteuid() == 0 else []
    clirun.run([*base, "submit", "job.sub", *owner], cwd=tmp_path, env=env,
                   capture_output=True)

    def run(command: str) -> tuple[str, int, str] | None:
        argv = shlex.split(command)[1:]
        if argv[0] in LONG_RUNNING:
            argv = [argv[0], "--help"]
        r = clirun.run([*base, *argv], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=120)
        err = r.stderr.strip()
        if (r.returncode not in (0, 1) or "Traceback" in err or "Usage:" in err
                or "No such option" in err or len(err.splitlines()) > 1):
            return command, r.returncode, err[-300:]
        return None

    with ThreadPoolExecutor(4) as pool:  # each its own process, as a newcomer's shell runs it
        failures = [f for f in pool.map(run, commands) if f is not None]
    assert not failures, "\n".join(map(repr, failures))
