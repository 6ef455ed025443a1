"""A personal HTCondor pool on loopback for the live tests: a collector and a startd under
`condor_master`, started as root with the `condor` account, in a directory of its own. Found
from `HTCONDOR_PREFIX`, else from `condor_master` on PATH."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

HOW_TO_POINT = ("no HTCondor found: set HTCONDOR_PREFIX to an installation (the directory "
                "holding sbin/condor_master, e.g. /opt/condor after `tar -xJf "
                "condor-*.tar.xz -C /opt`) or put condor_master on PATH")


def htcondor_prefix() -> Path | None:
    """Where HTCondor is installed (the directory above `sbin/condor_master`), or None."""
    given = os.environ.get("HTCONDOR_PREFIX")
    if given:
        return Path(given) if (Path(given) / "sbin" / "condor_master").exists() else None
    found = shutil.which("condor_master")
    return Path(found).resolve().parent.parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_condor_account() -> pwd.struct_passwd:
    """The `condor` service account (a system account, as HTCondor's packages make it)."""
    try:
        return pwd.getpwnam("condor")
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", "condor"], capture_output=True)
        return pwd.getpwnam("condor")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float,
             every: float = 0.2) -> T:
    """`probe()`'s first true answer within `timeout` seconds, else AssertionError naming
    `what`."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(every)


def install_lines(readme: Path) -> list[str]:
    """The README's install block ("Installing on an execute node"), line by line."""
    text = readme.read_text()
    section = text[text.index("## Installing on an execute node"):]
    (block,) = re.findall(r"```sh\n(.*?)```", section[:section.index("\n## ", 5)], re.S)
    return [line for line in block.splitlines() if line.strip()]


def run_install(readme: Path, repo: Path, pool: LivePool, env: dict[str, str]) -> Path:
    """Run the README's install lines with sh as written, with this pool's directories put in
    for /opt/jobstore, /usr/libexec/jobstore, /etc/condor/config.d and the checkout; the
    virtualenv made. `env` reaches the database (PGHOST)."""
    venv = pool.base / "opt-jobstore"
    where = {"/opt/jobstore": str(venv), "/path/to/htcondor-jobstore": str(repo),
             "/usr/libexec/jobstore": str(pool.base / "libexec-jobstore"),
             "/etc/condor/config.d": str(pool.config_dir)}
    pattern = re.compile("|".join(re.escape(k) for k in where))
    script = "set -e\n" + "\n".join(pattern.sub(lambda m: where[m.group(0)], line)
                                    for line in install_lines(readme)) + "\n"
    done = subprocess.run(["sh", "-x", "-c", script], capture_output=True, text=True,
                          env={**pool.env, **env}, cwd=str(pool.base), timeout=600)
    if done.returncode != 0:
        raise AssertionError(f"the README's install failed:\n{done.stderr[-3000:]}")
    return venv


def install_node(pool: LivePool, readme: Path, repo: Path, env: dict[str, str],
                 config: str = "") -> Path:
    """A node as the README makes it: the installation's paths (node_paths) and `config` read
    after the shipped drop-ins, the pool started, the README's install lines run, and the
    agent serving the startd's fetches; the virtualenv."""
    (pool.config_dir / "90-live.conf").write_text(node_paths(pool) + config)
    pool.start()
    venv = run_install(readme, repo, pool, env)
    wait_for("the agent serves the startd's fetches",
             lambda: "the startd fetches" in pool.log("JobstoreAgentLog"), 90, 0.5)
    return venv


def node_paths(pool: LivePool) -> str:
    """Configuration that puts the installation's paths (the README's are /opt/jobstore and
    /usr/libexec/jobstore) and the agent's files in the pool's directory: read after the
    shipped drop-ins."""
    base = pool.base
    return (f"JOBSTORE_AGENT = {base}/opt-jobstore/bin/jobstore\n"
            f"JOBSTORE_HOOK_DIR = {base}/libexec-jobstore\n"
            f"JOBSTORE_SPOOL = {base}/spool\n"
            f"JOBSTORE_SANDBOX_ROOT = {base}/sandboxes\n"
            f"JOBSTORE_AGENT_SOCKET = {base}/run/agent.sock\n")


class LivePool:
    """One personal pool. `config_dir` is its LOCAL_CONFIG_DIR (the drop-ins under test);
    `env` the environment its tools and its master run with."""

    def __init__(self, prefix: Path, *, slots: str, extra_env: dict[str, str] | None = None
                 ) -> None:
        self.prefix = prefix
        self.condor = ensure_condor_account()
        self.base = Path(tempfile.mkdtemp(prefix="jobstore-live-"))
        os.chmod(self.base, 0o755)
        self.local = self.base / "pool"
        self.config_dir = self.local / "config.d"
        self.log_dir = self.local / "log"
        for sub in ("", "log", "spool", "execute", "lock", "run", "config.d"):
            path = self.local / sub
            path.mkdir(exist_ok=True)
            os.chown(path, self.condor.pw_uid, self.condor.pw_gid)
            path.chmod(0o755)
        (self.local / "cred_dir").mkdir(mode=0o700)
        self.config_dir.chmod(0o755)
        os.chown(self.config_dir, 0, 0)
        self.port = free_port()
        self.config = self.base / "condor_config"
        self.config.write_text(self._config(slots))
        self.config.chmod(0o644)
        (self.base / "run").mkdir(mode=0o755)
        (self.base / "sandboxes").mkdir(mode=0o755)
        self.env = {
            "PATH": f"{prefix}/bin:{prefix}/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "LANG": "C.UTF-8", "CONDOR_CONFIG": str(self.config),
            **(extra_env or {}),
        }
        self.master: subprocess.Popen | None = None

    def _config(self, slots: str) -> str:
        return f"""\
RELEASE_DIR = {self.prefix}
BIN = $(RELEASE_DIR)/bin
SBIN = $(RELEASE_DIR)/sbin
LIB = $(RELEASE_DIR)/lib
LIBEXEC = $(RELEASE_DIR)/libexec
LOCAL_DIR = {self.local}
LOG = $(LOCAL_DIR)/log
SPOOL = $(LOCAL_DIR)/spool
EXECUTE = $(LOCAL_DIR)/execute
LOCK = $(LOCAL_DIR)/lock
RUN = $(LOCAL_DIR)/run
CRED_STORE_DIR = $(LOCAL_DIR)/cred_dir
LOCAL_CONFIG_DIR = {self.config_dir}
CONDOR_IDS = {self.condor.pw_uid}.{self.condor.pw_gid}
CONDOR_HOST = 127.0.0.1
COLLECTOR_HOST = $(CONDOR_HOST):{self.port}
NETWORK_INTERFACE = 127.0.0.1
BIND_ALL_INTERFACES = false
USE_SHARED_PORT = false
DAEMON_LIST = MASTER, COLLECTOR, STARTD
UID_DOMAIN = localdomain
FILESYSTEM_DOMAIN = localdomain
MAIL = /bin/true
SEC_DEFAULT_AUTHENTICATION_METHODS = FS, CLAIMTOBE
SEC_CLIENT_AUTHENTICATION_METHODS = FS, CLAIMTOBE
ALLOW_READ = *
ALLOW_WRITE = *
ALLOW_DAEMON = *
ALLOW_ADMINISTRATOR = *
ALLOW_NEGOTIATOR = *
ALLOW_CONFIG = *
START = TRUE
SUSPEND = FALSE
PREEMPT = FALSE
KILL = FALSE
RunBenchmarks = false
USE_PID_NAMESPACES = false
BASE_CGROUP =
STARTD_DEBUG = D_FULLDEBUG D_JOB
MASTER_DEBUG = D_FULLDEBUG
{slots}
"""

    def start(self) -> None:
        """condor_master in the foreground of a child process, until the collector answers."""
        self.master = subprocess.Popen(
            [str(self.prefix / "sbin" / "condor_master"), "-f"], env=self.env, cwd="/",
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for("the collector answers", lambda: self.tool(
            "condor_status", "-collector", "-af", "Name").returncode == 0, 60, 0.5)

    def stop(self) -> None:
        """condor_off -master, then the master's process itself."""
        if self.master is None:
            return
        self.tool("condor_off", "-master", timeout=30)
        try:
            self.master.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.master.pid, signal.SIGKILL)
            self.master.wait(10)
        self.master = None

    def remove(self) -> None:
        """The pool's directory, and what still runs from it (a submitter's command server)."""
        subprocess.run(["pkill", "-f", f"^{self.base}/"], check=False)
        shutil.rmtree(self.base, ignore_errors=True)

    def tool(self, name: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """One of HTCondor's tools (bin/ or sbin/), as root, against this pool."""
        where = self.prefix / "bin" / name
        if not where.exists():
            where = self.prefix / "sbin" / name
        return subprocess.run([str(where), *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def slots(self, *attrs: str) -> list[list[str]]:
        """The startd's slot ads as `condor_status -af Name *attrs` rows."""
        done = self.tool("condor_status", "-af", "Name", *attrs)
        return [line.split(" ") for line in done.stdout.splitlines() if line.strip()]

    def log(self, name: str) -> str:
        """One of the daemons' logs (e.g. StartLog, JobstoreAgentLog), or ''."""
        path = self.log_dir / name
        return path.read_text(errors="replace") if path.exists() else ""

    def child_pid(self, pattern: str) -> int | None:
        """The pid of the master's child whose command line holds `pattern` (condor_startd,
        jobstore agent), or None."""
        if self.master is None:
            return None
        done = subprocess.run(["pgrep", "-f", "-P", str(self.master.pid), pattern],
                              capture_output=True, text=True)
        pids = [int(p) for p in done.stdout.split()]
        return pids[0] if pids else None


__all__ = ["HOW_TO_POINT", "LivePool", "ensure_condor_account", "free_port", "htcondor_prefix",
           "install_lines", "install_node", "node_paths", "run_install", "wait_for"]
