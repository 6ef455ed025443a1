"""The `jobstore` executable and its account's command server (jobstore.cli.front): a served
command does what the command does in its own process, and nothing crosses an account."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobstore.cli import front
from jobstore.testing.support import ensure_account, sqlite_copy

EXECUTABLE = Path(sys.executable).with_name("jobstore")
USER = "jscmdserver"


@pytest.fixture
def account() -> pwd.struct_passwd:
    """An ordinary account to run the commands as (root never uses a command server)."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.getuid())
    return ensure_account(USER)


class Shell:
    """Commands run as `account`, with their own runtime directory and SQLite job store."""

    def __init__(self, account: pwd.struct_passwd, base: Path) -> None:
        self.account = account
        self.base = base
        self.runtime = base / "runtime"
        self.work = base / "work"
        for path in (base, self.runtime, self.work):
            path.mkdir(exist_ok=True)
            os.chown(path, account.pw_uid, account.pw_gid)
        self.runtime.chmod(0o700)
        self.db = f"sqlite:///{base / 'work' / 'jobs.db'}"
        self.env = {"PATH": "/usr/bin:/bin", "HOME": str(self.work), "LANG": "C.UTF-8",
                    "XDG_RUNTIME_DIR": str(self.runtime)}

    def run(self, *args: str, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
        """`jobstore --db DB ARGS` as the account; stderr shows the client's own imports."""
        root = os.geteuid() == 0
        return subprocess.run(
            [sys.executable, "-X", "importtime", str(EXECUTABLE), "--db", self.db, *args],
            capture_output=True, text=True, timeout=120, cwd=cwd or self.work,
            env={**self.env, **(env or {})}, user=self.account.pw_uid if root else None,
            group=self.account.pw_gid if root else None, extra_groups=[] if root else None)

    def socket_dir(self) -> Path:
        return self.runtime / "jobstore"

    def servers(self) -> list[int]:
        """The pids of the command servers of this shell's runtime directory."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"jobstore.cli.commandserver" in cmdline and any(
                    arg.startswith(os.fsencode(self.socket_dir())) for arg in cmdline):
                found.append(int(entry.name))
        return found

    def wait_for_server(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if list(self.socket_dir().glob("cmd-*.sock")):
                return
            time.sleep(0.05)
        raise AssertionError("no command server came up")

    def stop(self) -> None:
        for pid in self.servers():
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


@pytest.fixture
def shell(account: pwd.struct_passwd, sqlite_template: Path) -> Iterator[Shell]:
    top = Path(tempfile.mkdtemp(prefix="jobstore-cmd-"))  # pytest's tmp_path is root's only
    top.chmod(0o755)
    s = Shell(account, top / "cmd")
    sqlite_copy(f"sqlite:///{sqlite_template}", s.work / "jobs.db")  # what `jobstore init` makes
    os.chown(s.work / "jobs.db", account.pw_uid, account.pw_gid)
    try:
        yield s
    finally:
        s.stop()
        shutil.rmtree(top, ignore_errors=True)


def loaded_commands(done: subprocess.CompletedProcess) -> bool:
    """Whether the process itself imported the commands (not served)."""
    return "jobstore.cli.commands" in done.stderr


def errors(done: subprocess.CompletedProcess) -> str:
    return "\n".join(line for line in done.stderr.splitlines()
                     if not line.startswith("import time:"))


def test_a_served_command_does_what_the_command_does(shell: Shell) -> None:
    first = shell.run("q")
    assert first.returncode == 0, errors(first)
    assert loaded_commands(first)
    shell.wait_for_server()
    sub = shell.work / "sub" / "job.sub"
    sub.parent.mkdir()
    sub.write_text("executable = /bin/true\narguments = $ENV(ANSWER)\nqueue 2\n")
    os.chown(sub.parent, shell.account.pw_uid, shell.account.pw_gid)

    served = shell.run("submit", "job.sub", cwd=sub.parent, env={"ANSWER": "42"})
    assert served.returncode == 0, errors(served)
    assert not loaded_commands(served)  # the server's child ran it
    assert served.stdout == "2 job(s) submitted to cluster 1.\n"
    listed = shell.run("q", "-af", "Args", "Iwd")
    assert not loaded_commands(listed)
    assert listed.stdout.split("\n")[:2] == [f"42 {sub.parent}"] * 2  # its env, its cwd

    failed = shell.run("submit", "missing.sub")
    assert failed.returncode == 1
    assert errors(failed) == "jobstore: missing.sub: no such file"
    assert not loaded_commands(failed)

    off = shell.run("q", "-af", "Args", env={"JOBSTORE_COMMAND_SERVER": "false"})
    assert loaded_commands(off) and off.stdout.split() == ["42", "42"]


def test_a_server_whose_package_changed_steps_aside(shell: Shell) -> None:
    assert shell.run("q").returncode == 0
    shell.wait_for_server()
    (old,) = shell.servers()
    module = Path(front.__file__).with_name("queue.py")
    stamp = module.stat()
    try:
        os.utime(module, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1_000_000_000))
        done = shell.run("q")
        assert done.returncode == 0, errors(done)
        assert loaded_commands(done)  # ran here, not by the stale server
    finally:
        os.utime(module, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    deadline = time.monotonic() + 30
    while old in shell.servers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert old not in shell.servers()


def test_no_server_in_a_directory_others_can_use(shell: Shell) -> None:
    shell.socket_dir().mkdir(mode=0o755)
    os.chown(shell.socket_dir(), shell.account.pw_uid, shell.account.pw_gid)
    shell.socket_dir().chmod(0o755)
    for _ in range(2):
        done = shell.run("q")
        assert done.returncode == 0, errors(done)
        assert loaded_commands(done)
    assert shell.servers() == []


def test_a_socket_another_account_serves_is_never_used(shell: Shell) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to serve a socket as another account")
    assert shell.run("q").returncode == 0
    shell.wait_for_server()
    shell.stop()
    (path,) = shell.socket_dir().glob("cmd-*.sock")
    path.unlink()
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        impostor.bind(str(path))
        shutil.chown(path, shell.account.pw_uid, shell.account.pw_gid)
        impostor.listen(8)
        impostor.settimeout(0.2)
        done = shell.run("q")
        assert done.returncode == 0, errors(done)
        assert loaded_commands(done)
        try:
            conn, _ = impostor.accept()
        except TimeoutError:
            return
        with conn:
            conn.settimeout(0.5)
            assert conn.recv(1 << 16) == b""  # connected, saw root, sent nothing
    finally:
        impostor.close()


def test_the_group_options_are_read_past() -> None:
    assert front.served_command(["--db", "x", "-k", "KW", "submit", "a.sub"]) == "submit"
    assert front.served_command(["--db=x", "-kKW", "q", "-l"]) == "q"
    assert front.served_command(["agent"]) is None
    assert front.served_command(["--help"]) is None
    assert front.served_command([]) is None
