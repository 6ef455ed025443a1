"""A private PostgreSQL cluster that the tests may stop (`PrivateCluster`, the module-scoped
`private_pg` fixture; as root, with the server binaries under /usr/lib/postgresql: `pg_bin`)."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa


def pg_bin() -> Path | None:
    base = Path("/usr/lib/postgresql")
    versions = sorted((p for p in base.glob("*") if (p / "bin" / "initdb").exists()),
                      key=lambda p: int(p.name) if p.name.isdigit() else 0)
    return versions[-1] / "bin" if versions else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateCluster:
    def __init__(self, bindir: Path, base: Path) -> None:
        self.bindir, self.base, self.data = bindir, base, base / "data"
        self.port = _free_port()

    def _run(self, *args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def init(self) -> None:
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-A", "trust", "-U",
                  "postgres")

    def start(self) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l",
                  str(self.base / "server.log"), "-o",
                  f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1", "-w", "start")

    def stop(self) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        engine = sa.create_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        finally:
            engine.dispose()
        return self.url(name)


def cluster_bindir() -> Path:
    """The server binaries a private cluster runs from; skips the test when it cannot run one."""
    if os.geteuid() != 0:
        pytest.skip("a private PostgreSQL cluster needs root (initdb runs as `postgres`)")
    bindir = pg_bin()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries under /usr/lib/postgresql")
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no `postgres` account to run a private cluster as")
    return bindir


@contextmanager
def fresh_cluster(prefix: str) -> Iterator[PrivateCluster]:
    """An initialised private cluster in a new directory (its caller starts it); stopped and
    removed afterwards. Skips the test when no cluster can be had (cluster_bindir)."""
    bindir = cluster_bindir()
    base = Path(tempfile.mkdtemp(prefix=prefix))
    pg = pwd.getpwnam("postgres")
    os.chown(base, pg.pw_uid, pg.pw_gid)
    os.chmod(base, 0o755)
    cluster = PrivateCluster(bindir, base)
    try:
        cluster.init()
        yield cluster
    finally:
        try:
            cluster.stop()
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def private_pg():
    with fresh_cluster("jobstore-faults-pg-") as cluster:
        cluster.start()
        yield cluster
