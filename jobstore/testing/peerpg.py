"""A PostgreSQL server of the tests' own, with peer authentication on its own unix socket: each
OS account connects as the role of its own name and as nothing else (root also as the agent's
role and as `postgres`), so that what a role may do is what its OS account may do, as an admin
sets a shared pool up (SECURITY.md). Started as the `postgres` account from initdb into a
temporary directory; needs root."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

PORT = 5432  # the socket's name only: the server listens on no TCP address


def pg_bin() -> Path | None:
    """The directory of PostgreSQL's server programs (Debian's layout), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


class PeerServer:
    """A running server: `url(role)` is how role `role` (the OS account of that name, or root
    for `agent` and `postgres`) reaches database `database`."""

    def __init__(self, agent: str, database: str = "jobstore") -> None:
        binaries = pg_bin()
        if binaries is None or os.geteuid() != 0:
            raise RuntimeError("a peer-authenticated PostgreSQL needs root and initdb")
        self.bin = binaries
        self.agent = agent
        self.database = database
        self.postgres = pwd.getpwnam("postgres")
        self.base = Path(tempfile.mkdtemp(prefix="jobstore-peerpg-"))
        self.data = self.base / "data"
        self.socket = self.base / "socket"
        os.chmod(self.base, 0o755)
        self.socket.mkdir(mode=0o755)
        for path in (self.base, self.socket):
            os.chown(path, self.postgres.pw_uid, self.postgres.pw_gid)
        self._as_postgres([str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                           "-A", "peer", "--no-sync"])
        (self.data / "pg_hba.conf").write_text("local all all peer map=accounts\n")
        (self.data / "pg_ident.conf").write_text(
            f"accounts root postgres\naccounts root {agent}\naccounts /^(.*)$ \\1\n")
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"listen_addresses = ''\nunix_socket_directories = '{self.socket}'\n"
                       f"port = {PORT}\nfsync = off\nmax_connections = 60\n")
        self._as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-l",
                           str(self.base / "server.log"), "start"])

    def url(self, role: str, database: str | None = None) -> str:
        """The SQLAlchemy URL of `role` on the unix socket (peer: the OS account must match)."""
        return (f"postgresql+psycopg://{role}@/{database or self.database}"
                f"?host={self.socket}&port={PORT}")

    def libpq(self, role: str, database: str | None = None) -> str:
        """The libpq connection string of `role` (psycopg.connect)."""
        return (f"host={self.socket} port={PORT} user={role} "
                f"dbname={database or self.database}")

    def stop(self) -> None:
        try:
            self._as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m",
                               "immediate", "stop"])
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def _as_postgres(self, argv: list[str]) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                              user=self.postgres.pw_uid, group=self.postgres.pw_gid,
                              extra_groups=[], cwd="/", env={"PATH": "/usr/bin:/bin",
                                                             "LANG": "C.UTF-8"})
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:1])}: {done.stderr.strip()[-400:]}")


__all__ = ["PORT", "PeerServer", "pg_bin"]
