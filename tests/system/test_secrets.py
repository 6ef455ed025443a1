"""Secrets never reach logs, stdout, events or error messages.

A job's whole life runs through the hook executables with a database URL that holds a password
and a password file that holds another, with the real ClaimId of a recorded REPLY_FETCH, then the
failure paths (database down, bad configuration). Neither password nor the secret part of the
ClaimId may appear in hook output, the hook log, the spool, the job_events table, or what the
`jobstore` commands print."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import clirun
import pytest
import sqlalchemy as sa
from hookrun import hook_env, run_hook
from hookseq import ordinary_owner
from sqlalchemy.engine import make_url
from testdata import TRANSCRIPTS

from jobstore.db.engine import upgrade
from jobstore.db.schema import job_events

T = TRANSCRIPTS
URL_PASSWORD = "Url-pw-7781-secret"
FILE_PASSWORD = "File-pw-9923-secret"


def claim_line() -> bytes:
    """The ClaimId line of a real REPLY_FETCH (the startd appends it on accept)."""
    rec = (T / "01-normal-job/02-REPLY_FETCH.stdin").read_bytes().rstrip(b"\n")
    line = rec.rsplit(b"\n", 1)[-1]
    assert line.startswith(b'ClaimId = "')
    return line + b"\n"


def claim_secret() -> bytes:
    """The ClaimId's secret: what follows its last '#' (after the session info in [...])."""
    value = claim_line()[len(b'ClaimId = "'):].rstrip(b'"\n')
    secret = value.rsplit(b"#", 1)[1].rsplit(b"]", 1)[1]
    assert len(secret) >= 32
    return secret


def with_password(url: str, password: str) -> str:
    return make_url(url).set(password=password).render_as_string(hide_password=False)


class Life:
    """Runs hooks and commands, keeping every byte they print."""

    def __init__(self, hook_dir: Path, tmp_path: Path, url: str) -> None:
        self.hook_dir, self.tmp = hook_dir, tmp_path
        self.log = tmp_path / "hooks.log"
        self.spool = tmp_path / "spool"
        self.outputs: list[bytes] = []
        self.slot = (T / "01-normal-job/01-FETCH_WORK.stdin").read_bytes()
        self.url = url

    def config(self, extra: str = "") -> Path:
        path = self.tmp / "condor_config"
        path.write_text("UID_DOMAIN = localdomain\nSTARTD_JOB_HOOK_KEYWORD = JOBSTORE\n"
                        f"JOBSTORE_DATABASE_URL = {self.url}\n"
                        f"JOBSTORE_HOOK_LOG = {self.log}\nJOBSTORE_SPOOL = {self.spool}\n"
                        + extra)
        return path

    def hook(self, name: str, stdin: bytes, argv: list[str] | None = None,
             config: Path | None = None) -> bytes:
        env = hook_env(self.url, config or self.config())
        del env["JOBSTORE_DATABASE_URL"]  # from the configuration, with the password file
        env["JOBSTORE_SPOOL"] = str(self.spool)
        r = run_hook(self.hook_dir, name, stdin, argv=argv, env=env)
        self.outputs += [r.stdout, r.stderr]
        assert b"Traceback" not in r.stderr
        return r.stdout

    def cli(self, *args: str, config: Path | None = None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBSTORE_")}
        env["CONDOR_CONFIG"] = str(config or self.config())
        r = clirun.run([sys.executable, "-m", "jobstore.cli", *args], capture_output=True,
                       timeout=60, env=env)
        self.outputs += [r.stdout, r.stderr]
        assert b"Traceback" not in r.stderr
        return r

    def whole_life(self, config: Path) -> bytes:
        """FETCH_WORK .. JOB_EXIT as the startd and starter call them; returns the job ad."""
        job = self.hook("fetch_job", self.slot, config=config)
        assert b"JobstoreToken" in job
        self.hook("reply_fetch", job + b"-----\n" + self.slot + claim_line(), ["accept"], config)
        self.hook("update_job_info", job + b'JobState = "Idle"\n', config=config)
        assert self.hook("prepare_job", job, config=config) == b""
        running = job + b"JobPid = 4242\nJobStartDate = 1795323700\n"
        self.hook("update_job_info", running + b'JobState = "Running"\n', config=config)
        self.hook("job_exit", running + b"ExitCode = 0\nExitBySignal = false\n", ["exit"], config)
        return job


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_secrets_never_shown(pg_url: str, hook_dir: Path, tmp_path: Path) -> None:
    secrets = [URL_PASSWORD.encode(), FILE_PASSWORD.encode(), claim_secret()]
    life = Life(hook_dir, tmp_path, with_password(pg_url, URL_PASSWORD))
    upgrade(pg_url)
    pwfile = tmp_path / "db-password"
    pwfile.write_text(FILE_PASSWORD + "\n")
    pwfile.chmod(0o600)
    good = life.config(f"JOBSTORE_DATABASE_PASSWORD_FILE = {pwfile}\n")
    sub = tmp_path / "job.sub"
    sub.write_text("executable = /bin/true\nqueue 2\n")
    assert life.cli("submit", str(sub), "--owner", ordinary_owner(), config=good).returncode == 0

    # 1. a whole life, on a working database (URL password replaced by the file's)
    job = life.whole_life(good)
    # 2. the database goes away mid-life: every report is spooled, each hook says so
    second = life.hook("fetch_job", life.slot, config=good)
    assert b"JobstoreToken" in second
    life.url = with_password("postgresql+psycopg://jobstore@127.0.0.1:1/jobstore", URL_PASSWORD)
    down = life.config(f"JOBSTORE_DATABASE_PASSWORD_FILE = {pwfile}\n")
    life.hook("reply_fetch", second + b"-----\n" + life.slot + claim_line(), ["accept"], down)
    life.hook("prepare_job", second, config=down)
    life.hook("job_exit", second + b"ExitCode = 1\n", ["exit"], down)
    life.hook("fetch_job", life.slot, config=down)
    spooled = [p.read_bytes() for p in life.spool.rglob("*") if p.is_file()]
    assert spooled, "the reports were not spooled"
    assert life.cli("q", config=down).returncode == 1
    # 3. bad configuration: an unreadable password file, a bad setting
    for extra in (f"JOBSTORE_DATABASE_PASSWORD_FILE = {tmp_path / 'nope'}\n",
                  "JOBSTORE_CONNECT_TIMEOUT = soon\n"):
        bad = life.config(extra)
        life.hook("fetch_job", life.slot, config=bad)
        life.hook("reply_fetch", job + b"-----\n" + life.slot + claim_line(), ["accept"], bad)
        assert life.cli("q", config=bad).returncode == 1
    # what the admin commands show, on the working database
    life.url = with_password(pg_url, URL_PASSWORD)
    good = life.config(f"JOBSTORE_DATABASE_PASSWORD_FILE = {pwfile}\n")
    shown = []
    for args in (("q", "-l", "-a"), ("q", "--json", "-a"), ("events", "1.0"),
                 ("events", "1.0", "--json"), ("events", "1.1", "--json"),
                 ("history", "--json"), ("history", "-l"), ("stats",), ("init",)):
        r = life.cli(*args, config=good)
        assert r.returncode == 0, (args, r.stderr)
        shown.append(r.stdout + r.stderr)
    assert b'"completed"' in shown[5]
    token = job.split(b'JobstoreToken = "', 1)[1].split(b'"', 1)[0]
    for text in shown:  # the attempt token is a secret for the admin commands too
        assert token not in text, text[:300]
    engine = sa.create_engine(pg_url)
    with engine.connect() as conn:
        events = [repr(tuple(r)).encode() for r in conn.execute(sa.select(job_events))]
    engine.dispose()
    assert any(b"accept" in e for e in events), "the accept report never reached the database"
    logged = life.log.read_bytes()
    assert b"database" in logged  # the failures were logged ...
    places = {"hook and command output": life.outputs, "hook log": [logged],
              "spool": spooled, "job_events": events}
    for where, texts in places.items():
        for secret in secrets:
            for text in texts:
                assert secret not in text, f"{secret!r} in {where}: {text[:300]!r}"


def test_no_secret_in_a_repr() -> None:
    """A job's attempt token, a report's and the database URL (its password) are left out of
    the reprs that logs, tracebacks and debuggers show."""
    from jobstore.core.states import Event
    from jobstore.node.config import Settings
    from jobstore.node.reports import Report
    from jobstore.testing.factories import a_job

    token, password = "tok-3f1e0c9a", "pw-8d2b7e41"
    shown = [
        repr(a_job(token=token)),
        repr(Settings(keyword="JOBSTORE", database_url=with_password(
            "postgresql+psycopg://jobstore@db.example.org/jobstore", password))),
        repr(Report(keyword="JOBSTORE", job_id=1, event=Event.EXIT, token=token, attempt=1,
                    store="x", time=0.0)),
    ]
    for text in shown:
        assert token not in text and password not in text
    assert "JOBSTORE" in shown[1] and "job_id=1" in shown[2]
