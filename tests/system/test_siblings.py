"""JOB_EXIT waits for its starter's UPDATE_JOB_INFO hooks (jobstore.node.siblings): processes
spawned as a starter spawns its hooks, the test being the starter."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import jobstore


def _hooks(tmp_path: Path) -> Path:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    update = hooks / "update_job_info"
    update.write_text(f"#!/bin/sh\nsleep 0.5\ndate +%s.%N > {tmp_path / 'update.ended'}\n")
    update.chmod(0o755)
    exit_hook = hooks / "job_exit"
    root = str(Path(jobstore.__path__[0]).parent)
    exit_hook.write_text(
        f"#!{sys.executable}\nimport sys, time\nsys.path.insert(0, {root!r})\n"
        "from jobstore.node import siblings\n"
        "siblings.wait_for('update_job_info')\n"
        "print(f'{time.time():.6f}')\n")
    exit_hook.chmod(0o755)
    return hooks


def test_job_exit_ends_after_the_update_hook_its_starter_started(tmp_path: Path) -> None:
    hooks = _hooks(tmp_path)
    update = subprocess.Popen([str(hooks / "update_job_info")])
    try:
        done = subprocess.run([str(hooks / "job_exit")], capture_output=True, text=True,
                              timeout=30)
    finally:
        update.wait(30)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) >= float((tmp_path / "update.ended").read_text())


def test_another_starters_update_hook_is_not_waited_for(tmp_path: Path) -> None:
    hooks = _hooks(tmp_path)
    other = subprocess.Popen(["/bin/sh", "-c", f"{hooks / 'update_job_info'}; true"])
    try:  # a grandchild of this process, not a sibling of the job_exit below
        time.sleep(0.1)
        done = subprocess.run([str(hooks / "job_exit")], capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 0, done.stderr
        assert not (tmp_path / "update.ended").exists()
    finally:
        other.wait(30)


def test_a_hook_of_another_slot_with_the_same_parent_is_not_waited_for(tmp_path: Path) -> None:
    """Where one process starts every slot's hooks (the emulator), a sibling is a hook of the
    same starter: the same _CONDOR_SCRATCH_DIR."""
    hooks = _hooks(tmp_path)
    other = subprocess.Popen([str(hooks / "update_job_info")],
                             env={"_CONDOR_SCRATCH_DIR": str(tmp_path / "slot2")})
    try:
        time.sleep(0.1)
        done = subprocess.run([str(hooks / "job_exit")], capture_output=True, text=True,
                              timeout=30, env={"_CONDOR_SCRATCH_DIR": str(tmp_path / "slot1")})
        assert done.returncode == 0, done.stderr
        assert not (tmp_path / "update.ended").exists()
    finally:
        other.wait(30)
    same = subprocess.Popen([str(hooks / "update_job_info")],
                            env={"_CONDOR_SCRATCH_DIR": str(tmp_path / "slot1")})
    try:
        done = subprocess.run([str(hooks / "job_exit")], capture_output=True, text=True,
                              timeout=30, env={"_CONDOR_SCRATCH_DIR": str(tmp_path / "slot1")})
    finally:
        same.wait(30)
    assert float(done.stdout) >= float((tmp_path / "update.ended").read_text())
