"""The runner of a DAG node script with SCRIPT DEBUG: the script's output and error appended to
the debug file after DAGMan's line, the run ended when the script ends (not when the pipes a
child of it keeps open close), the script's exit or signal kept, and nothing of the service's
memory left open to the owner."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from jobstore.accesspoint import scriptrunner


def _run(tmp: Path, body: str, streams: str = "ALL", timeout: float = 20.0) -> tuple[dict, float]:
    script = tmp / "s.sh"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    runs = tmp / "runs"
    runs.mkdir(exist_ok=True)
    token = os.urandom(16).hex()
    debug = scriptrunner.Debug("debug.log", streams, "A", "POST")
    started = time.monotonic()
    pid = scriptrunner.start(runs, token, -1, -1, str(tmp), [str(script), "x"], debug)
    os.waitpid(pid, 0)
    result = runs / f"{token}.json"
    while not result.exists():
        assert time.monotonic() - started < timeout, "the run never ended"
        time.sleep(0.05)
    return json.loads(result.read_text()), time.monotonic() - started


def test_the_output_follows_dagmans_line_and_the_exit_is_the_scripts(tmp_path: Path) -> None:
    result, _ = _run(tmp_path, "echo out; echo err >&2; exit 3")
    assert result["code"] == 3
    first, *rest = (tmp_path / "debug.log").read_text().splitlines()
    assert first.startswith("*** Node=A Type=POST ExitCode=3 Completion=")
    assert first.endswith(f"Cmd='{tmp_path / 's.sh'} x'")
    assert rest == ["out", "err"]
    _run(tmp_path, "echo again; echo hidden >&2", streams="STDOUT")
    assert (tmp_path / "debug.log").read_text().splitlines()[-1] == "again"  # appended


def test_the_run_ends_with_the_script_not_with_its_childs_pipes(tmp_path: Path) -> None:
    """A hostile review's script: a child in the background keeps the pipes for 30 s."""
    result, took = _run(tmp_path, "echo before; (sleep 30 &); exit 0")
    assert result["code"] == 0 and took < 10
    assert (tmp_path / "debug.log").read_text().splitlines()[1:] == ["before"]


def test_a_signal_is_the_scripts_end_too(tmp_path: Path) -> None:
    result, _ = _run(tmp_path, "kill -TERM $$")
    assert result["code"] == -signal.SIGTERM
    assert "Signal=" in (tmp_path / "debug.log").read_text()


def test_a_debug_file_that_cannot_be_written_changes_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "debug.log").symlink_to("/etc/passwd")  # never followed
    result, _ = _run(tmp_path, "echo out; exit 0")
    assert result["code"] == 0
    assert "out" not in Path("/etc/passwd").read_text()
