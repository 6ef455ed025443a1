"""An access point for the end-to-end tests: a submit directory of the tutorial's `cat` jobs
(`submit_dir`), submitting it (`submit_in`), the `jobstore schedd` command (`schedd_cmd`), and
the waits on what it writes."""

from __future__ import annotations

import os
import pwd
import sys
import time
from pathlib import Path
from typing import Any

import htcondor2

from jobstore.api.submission import submit_path
from jobstore.db.store import JobStore
from jobstore.node import config

JOBSTORE = [sys.executable, "-m", "jobstore.cli"]
CAT = """executable = /bin/cat
transfer_executable = false
arguments = in.txt
should_transfer_files = YES
transfer_input_files = in.txt
output = cat-$(ProcId).out
error = logs/cat-$(ProcId).err
request_memory = 32
{extra}queue 2
"""


def submit_dir(tmp: Path, name: str, owner: str | None, extra: str = "") -> Path:
    """A directory of `owner`'s with the `cat` jobs' submit file (`extra` lines before queue)
    and their input."""
    sub = tmp / name
    (sub / "logs").mkdir(parents=True)
    (sub / "in.txt").write_text(f"hello from {name}\n")
    (sub / "jobs.sub").write_text(CAT.format(extra=extra))
    if owner:
        user = pwd.getpwnam(owner)
        for path in (sub, sub / "logs"):
            os.chown(path, user.pw_uid, user.pw_gid)
    return sub


def submit_in(store: JobStore, sub: Path, owner: str | None, *,
              spool: bool = False) -> list[int]:
    """Submit `sub`'s jobs as `owner`: their ids."""
    settings = config.load_settings("JOBSTORE", store.db.engine.url.render_as_string(False))
    return submit_path(store, sub / "jobs.sub", settings, owner=owner, spool=spool)[1]


def schedd_cmd(store: JobStore, *args: str) -> list[str]:
    """The command that runs `jobstore schedd` on `store`."""
    return [*JOBSTORE, "--db", store.db.engine.url.render_as_string(False), "schedd", *args]


def hers(store: JobStore, owner: str | None) -> None:
    """A SQLite store in the node's directory, which every account may write (for the
    journal), is the owner's (root's service becomes her); a PostgreSQL one stays the
    database's."""
    if owner and store.db.engine.dialect.name == "sqlite":
        user = pwd.getpwnam(owner)
        database = Path(str(store.db.engine.url.database))
        os.chown(database, user.pw_uid, user.pw_gid)
        os.chmod(database.parent, 0o777)


def wait_for(paths: list[Path], timeout: float = 30.0) -> None:
    """Until every one of `paths` exists (AssertionError naming those that do not)."""
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, [p for p in paths if not p.exists()]
        time.sleep(0.1)


def wait_for_events(log: Path, ends: dict[int, set[Any]], timeout: float = 60.0,
                    ) -> list[htcondor2.JobEvent]:
    """The events of the job event log `log` (htcondor2.JobEventLog) once each proc in
    `ends` has one of its types of event."""
    deadline = time.monotonic() + timeout
    while True:
        events = list(htcondor2.JobEventLog(str(log)).events(0)) if log.exists() else []
        missing = {p for p, types in ends.items()
                   if not any(e.proc == p and e.type in types for e in events)}
        if not missing:
            return events
        assert time.monotonic() < deadline, (missing, [(e.proc, e.type) for e in events])
        time.sleep(0.2)
