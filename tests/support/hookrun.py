"""Run the hook executables as HTCondor does: a separate process, stdin closed after writing,
signals blocked, and for REPLY_FETCH, EVICT_CLAIM and UPDATE_JOB_INFO fds 1 and 2 closed."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from jobstore.emulator.spawn import hook_preexec
from jobstore.node.hooktable import BY_CONDOR_NAME, CONDOR_NAMES, OUTPUT_HOOKS
from jobstore.testing.support import hook_env  # noqa: F401 - for the tests

__all__ = ["BY_CONDOR_NAME", "CLOSED_OUTPUT", "HookResult", "hook_env", "run_hook"]
CLOSED_OUTPUT = {ours for ours, condor in CONDOR_NAMES.items() if condor not in OUTPUT_HOOKS}


@dataclass
class HookResult:
    stdout: bytes
    stderr: bytes
    returncode: int


def run_hook(
    hook_dir: Path,
    name: str,
    stdin: bytes,
    *,
    argv: list[str] | None = None,
    env: dict[str, str],
    cwd: Path | None = None,
    timeout: float = 60,
) -> HookResult:
    """Run hook `name` (our name, e.g. "fetch_job") like the startd or starter would."""
    close_output = name in CLOSED_OUTPUT
    proc = subprocess.run(
        [str(hook_dir / name), *(argv or [])],
        input=stdin,
        capture_output=not close_output,
        env=env,
        cwd=cwd,
        timeout=timeout,
        preexec_fn=hook_preexec(close_output),
    )
    return HookResult(proc.stdout or b"", proc.stderr or b"", proc.returncode)
