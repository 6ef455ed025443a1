"""`jobstore submit` and the other commands reject bad files and arguments with one clear line and
a non-zero exit, and change nothing: one table over every command."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import clirun
import pytest
import sqlalchemy as sa
from hookseq import ordinary_owner

from jobstore.db.schema import clusters, job_events, jobs

BAD_FILES: dict[str, str | bytes] = {
    "bad.sub": "executable = /bin/true\nrequest_memory = lots\nqueue\n",
    "noqueue.sub": "executable = /bin/true\n",
    "reserved.sub": 'executable = /bin/true\n+Owner = "root"\nqueue\n',
    "binary.sub": b"executable = /bin/tr\xffue\nqueue\n",
    "empty.sub": "",
}
# (arguments, a word the message must contain); FILE and DIR are replaced by paths.
BAD = [
    (["submit", "DIR/bad.sub"], "request_memory"),
    (["submit", "DIR/noqueue.sub"], "queue"),
    (["submit", "DIR/reserved.sub"], "Owner"),
    (["submit", "DIR/binary.sub"], "UTF-8"),
    (["submit", "DIR/empty.sub"], "queue"),
    (["submit", "DIR/missing.sub"], "no such file"),
    (["submit", "DIR"], "directory"),
    (["submit"], "FILE"),
    (["submit", "DIR/ok.sub", "--owner", "root"], "root"),
    (["submit", "DIR/ok.sub", "--owner", "daemon"], "system account"),
    (["q", "1.x"], "bad job id"),
    (["q", "--bogus"], "--bogus"),
    (["q", "77.0"], "77.0"),
    (["history", "--bogus"], "--bogus"),
    (["events"], "JOB"),
    (["events", "1.2.3"], "bad job id"),
    (["events", "99"], "99"),
    (["hold"], "JOB"),
    (["hold", "abc"], "no unfinished jobs of abc"),  # a user, as condor_hold reads it
    (["hold", "a/b"], "bad job id or user name"),
    (["hold", "99.0"], "99.0"),
    (["release", "1.0"], "cannot release"),
    (["rm", "-1"], "-1"),
    (["rm", "99"], "99"),
    (["stats", "extra"], "extra"),
    (["reap", "extra"], "extra"),
    (["prune", "--older-than", "soon"], "not a duration"),
    (["prune", "--batch", "0"], "--batch"),
    (["metrics", "extra"], "extra"),
    (["nosuchcommand"], "nosuchcommand"),
    (["--db", "mysql://u:Sekr1t@h/x", "q"], "unsupported"),
    (["--db", "not a url", "q"], "URL"),
    # what a new user hit: a path for a URL, a directory that cannot exist
    (["--db", "/tmp/jobstore-x.db", "q"], "sqlite:////tmp/jobstore-x.db"),
    (["--db", "sqlite:////nonexistent/dir/x.db", "q"], "jobstore init"),
    (["--db", "sqlite:////proc/x/y.db", "init"], "cannot create the directory"),
]


def run(db_url: str, config_file: Path, args: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBSTORE_")}
    env["CONDOR_CONFIG"] = str(config_file)
    head = [] if "--db" in args else ["--db", db_url]
    return clirun.run([sys.executable, "-m", "jobstore.cli", *head, *args],
                      capture_output=True, text=True, timeout=60, env=env)


def counts(db_url: str) -> tuple[int, ...]:
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            return tuple(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                         for t in (clusters, jobs, job_events))
    finally:
        engine.dispose()


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_bad_invocations(sqlite_url: str, condor_config: Path, tmp_path: Path) -> None:
    """Every row: exit status != 0, exactly one line on stderr, no traceback, nothing changed."""
    for name, text in BAD_FILES.items():
        (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    (tmp_path / "ok.sub").write_text("executable = /bin/true\nqueue\n")
    assert run(sqlite_url, condor_config, ["init"]).returncode == 0
    ok = run(sqlite_url, condor_config, ["submit", str(tmp_path / "ok.sub"),
                                         "--owner", ordinary_owner()])
    assert ok.returncode == 0, ok.stderr
    before = counts(sqlite_url)
    failures = []

    def one(args: list[str], word: str) -> None:
        argv = [a.replace("DIR", str(tmp_path)) for a in args]
        r = run(sqlite_url, condor_config, argv)
        lines = r.stderr.strip().splitlines()
        if (r.returncode == 0 or len(lines) != 1 or "Traceback" in r.stderr
                or "Sekr1t" in r.stderr or word.lower() not in r.stderr.lower()
                or r.stdout.strip()):
            failures.append((args, r.returncode, r.stderr, r.stdout))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda row: one(*row), BAD))
    assert counts(sqlite_url) == before
    assert not failures, "\n".join(map(repr, failures))


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_reading_before_init_creates_nothing_and_says_init(condor_config: Path,
                                                          tmp_path: Path) -> None:
    """`jobstore q` (and the other reading commands) on a job store that does not exist yet:
    one line that says to run `jobstore init`, and no database file left behind; a database
    without the schema says the same."""
    path = tmp_path / "new" / "jobstore.db"
    url = f"sqlite:///{path}"
    for args in (["q"], ["history"], ["stats"], ["userprio"], ["metrics"], ["prune"]):
        r = run(url, condor_config, args)
        assert r.returncode == 1 and "jobstore init" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not path.exists() and not path.parent.exists()
    path.parent.mkdir()
    sa.create_engine(url).dispose()
    path.touch()  # an empty file: no schema
    r = run(url, condor_config, ["q"])
    assert r.returncode == 1 and "no such table" in r.stderr and "jobstore init" in r.stderr
    assert run(url, condor_config, ["init"]).returncode == 0
    assert run(url, condor_config, ["q"]).returncode == 0


def test_demo_as_root_with_an_unreachable_interpreter_stops_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make demo` as root in a clone under /root (mode 700): the job account could not run the
    hooks' interpreter; the demo says so in one line, with the fix, before doing anything."""
    import importlib

    import click

    demo = importlib.import_module("jobstore.cli.demo")  # the module, not its click command

    private = tmp_path / "home"
    (private / "clone" / ".venv" / "bin").mkdir(parents=True)
    private.chmod(0o700)
    monkeypatch.setattr(sys, "executable", str(private / "clone" / ".venv" / "bin" / "python"))
    with pytest.raises(click.ClickException) as err:
        demo._check_interpreter("alice")
    message = err.value.message
    assert f"{private} is not searchable" in message and "VENV=" in message
    assert "\n" not in message
    monkeypatch.setattr(sys, "executable", "/usr/bin/python3")
    demo._check_interpreter("alice")  # reachable: no complaint
