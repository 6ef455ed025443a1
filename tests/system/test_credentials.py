"""Keeping the database password out of world-readable configuration:
JOBSTORE_DATABASE_PASSWORD_FILE, <KW>_JOBSTORE_DATABASE_PASSWORD_FILE, PGPASSFILE and a
PostgreSQL service file, each proven on a private PostgreSQL cluster that demands a password
(scram-sha-256) from a role created by the test. An unreadable password file is one clear line,
never a traceback, never the password."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import clirun
import pytest
import sqlalchemy as sa
from hookrun import hook_env, run_hook
from hookseq import ordinary_owner, submit_jobs
from privatepg import PrivateCluster, fresh_cluster
from testdata import TRANSCRIPTS

from jobstore.db.engine import upgrade
from jobstore.db.store import JobStore

ROLE = "jobstore_cred"
PASSWORD = "Pw-cred-3141-secret"
DATABASE = "jobstore_cred"
SLOT = TRANSCRIPTS / "01-normal-job" / "01-FETCH_WORK.stdin"


@pytest.fixture(scope="module")
def scram_pg():
    """A private cluster: `postgres` trusted, every other role must give its password."""
    with fresh_cluster("jobstore-cred-pg-") as cluster:
        (cluster.data / "pg_hba.conf").write_text(
            "local all all trust\n"
            "host all postgres 127.0.0.1/32 trust\n"
            "host all all 127.0.0.1/32 scram-sha-256\n"
        )
        cluster.start()
        admin = sa.create_engine(cluster.url(), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'"))
            conn.execute(sa.text(f"CREATE DATABASE {DATABASE} OWNER {ROLE}"))
        admin.dispose()
        upgrade(no_password_url(cluster).replace(f"{ROLE}@", f"{ROLE}:{PASSWORD}@"))
        yield cluster


def no_password_url(cluster: PrivateCluster) -> str:
    return f"postgresql+psycopg://{ROLE}@127.0.0.1:{cluster.port}/{DATABASE}"


def secret_file(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def write_config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "condor_config"
    path.write_text("UID_DOMAIN = localdomain\nSTARTD_JOB_HOOK_KEYWORD = JOBSTORE\n" + extra)
    return path


def cli(config_file: Path, *args: str, env: dict[str, str] | None = None):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "JOBSTORE_"))}
    full.update(CONDOR_CONFIG=str(config_file), **(env or {}))
    return clirun.run([sys.executable, "-m", "jobstore.cli", *args], capture_output=True,
                      text=True, timeout=60, env=full)


def assert_one_clean_line(stderr: str) -> None:
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert "Traceback" not in stderr and PASSWORD not in stderr, stderr


def test_server_demands_the_password(scram_pg: PrivateCluster, tmp_path: Path) -> None:
    """Without any password the role is refused: the tests below prove the password is used."""
    r = cli(write_config(tmp_path), "--db", no_password_url(scram_pg), "q", "--json")
    assert r.returncode == 1 and "password" in r.stderr
    assert_one_clean_line(r.stderr)


def test_password_file(scram_pg: PrivateCluster, tmp_path: Path) -> None:
    pw = secret_file(tmp_path / "pw", PASSWORD + "\n")
    conf = write_config(tmp_path, f"JOBSTORE_DATABASE_URL = {no_password_url(scram_pg)}\n"
                                  f"JOBSTORE_DATABASE_PASSWORD_FILE = {pw}\n")
    r = cli(conf, "q", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == []
    secret_file(pw, "wrong-password\n")
    r = cli(conf, "q", "--json")
    assert r.returncode == 1 and "password authentication failed" in r.stderr
    assert_one_clean_line(r.stderr)
    assert "wrong-password" not in r.stderr


def test_per_keyword_password_file_in_the_hooks(scram_pg: PrivateCluster, tmp_path: Path,
                                                hook_dir: Path) -> None:
    """fetch_job of a slot (slot2) with keyword GPU uses GPU_JOBSTORE_DATABASE_PASSWORD_FILE (the
    general one holds a wrong password) and hands out a job."""
    good = secret_file(tmp_path / "gpu-pw", PASSWORD + "\n")
    bad = secret_file(tmp_path / "pw", "not-it\n")
    url = no_password_url(scram_pg)
    conf = write_config(tmp_path, f"SLOT2_JOB_HOOK_KEYWORD = GPU\n"
                                  f"JOBSTORE_DATABASE_URL = {url}\n"
                                  f"JOBSTORE_DATABASE_PASSWORD_FILE = {bad}\n"
                                  f"GPU_JOBSTORE_DATABASE_PASSWORD_FILE = {good}\n")
    store = JobStore.from_url(scram_pg.url(DATABASE))
    try:
        (job_id,) = submit_jobs(store, 1, ordinary_owner())
    finally:
        store.db.engine.dispose()
    env = hook_env(url, conf)
    del env["JOBSTORE_DATABASE_URL"]
    r = run_hook(hook_dir, "fetch_job", SLOT.read_bytes(), env=env)
    assert f"JobstoreJobId = {job_id}".encode() in r.stdout, r.stderr
    # the general keyword reads the wrong password: one line, nothing printed
    conf.write_text(conf.read_text().replace("SLOT2_JOB_HOOK_KEYWORD = GPU\n", ""))
    r = run_hook(hook_dir, "fetch_job", SLOT.read_bytes(), env=env)
    assert r.stdout == b"" and b"password authentication failed" in r.stderr
    assert_one_clean_line(r.stderr.decode())


def test_pgpassfile(scram_pg: PrivateCluster, tmp_path: Path) -> None:
    passfile = secret_file(tmp_path / "pgpass",
                           f"127.0.0.1:{scram_pg.port}:{DATABASE}:{ROLE}:{PASSWORD}\n")
    r = cli(write_config(tmp_path), "--db", no_password_url(scram_pg), "q", "--json",
            env={"PGPASSFILE": str(passfile)})
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("url", ["postgresql+psycopg:///?service=jobstore",
                                 "postgresql:///?service=jobstore"])
def test_service_file(scram_pg: PrivateCluster, tmp_path: Path, hook_dir: Path,
                      url: str) -> None:
    """Host, port, database and role from a service file, the password from a passfile: the
    URL in the configuration names only the service."""
    service = tmp_path / "pg_service.conf"
    service.write_text(f"[jobstore]\nhost=127.0.0.1\nport={scram_pg.port}\ndbname={DATABASE}\n"
                       f"user={ROLE}\n")
    passfile = secret_file(tmp_path / "pgpass", f"*:*:*:{ROLE}:{PASSWORD}\n")
    env: dict[str, Any] = {"PGSERVICEFILE": str(service), "PGPASSFILE": str(passfile)}
    conf = write_config(tmp_path, f"JOBSTORE_DATABASE_URL = {url}\n")
    r = cli(conf, "q", "--json", env=env)
    assert r.returncode == 0, r.stderr
    hook = hook_env(url, conf, **env)
    r = run_hook(hook_dir, "fetch_job", SLOT.read_bytes(), env=hook)
    assert r.stderr == b"" and r.returncode == 0


@pytest.mark.parametrize("problem", ["missing", "directory", "unreadable"])
def test_unreadable_password_file(scram_pg: PrivateCluster, tmp_path: Path, hook_dir: Path,
                                  problem: str) -> None:
    """The CLI and fetch_job say which file they could not read, in one line; "unreadable" is
    a job user (nobody) facing the service account's mode-0600 file."""
    base = Path(tempfile.mkdtemp(prefix="jobstore-cred-"))
    os.chmod(base, 0o755)
    try:
        pw = base / "pw"
        if problem == "directory":
            pw.mkdir()
        elif problem == "unreadable":
            secret_file(pw, PASSWORD + "\n")
        conf = write_config(base, f"JOBSTORE_DATABASE_URL = {no_password_url(scram_pg)}\n"
                                  f"JOBSTORE_DATABASE_PASSWORD_FILE = {pw}\n")
        os.chmod(conf, 0o644)
        user = "nobody" if problem == "unreadable" else None
        r = cli_as(conf, user, "q", "--json")
        assert r.returncode == 1
        assert_one_clean_line(r.stderr)
        assert "password file" in r.stderr and str(pw) in r.stderr, r.stderr
        if user is None:
            hook = run_hook(hook_dir, "fetch_job", SLOT.read_bytes(),
                            env=hook_env(no_password_url(scram_pg), conf))
            assert hook.stdout == b"" and b"password file" in hook.stderr, hook
            assert_one_clean_line(hook.stderr.decode())
    finally:
        shutil.rmtree(base, ignore_errors=True)


def cli_as(config_file: Path, user: str | None, *args: str):
    """`cli`, as `user` when given (runuser), so that file permissions apply."""
    if user is None:
        return cli(config_file, *args)
    full = {"PATH": "/usr/bin:/bin", "CONDOR_CONFIG": str(config_file), "HOME": "/tmp"}
    command = ["/usr/sbin/runuser", "-u", user, "--", sys.executable, "-m", "jobstore.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60,
                          env=full)
