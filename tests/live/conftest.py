"""The live tier (`make test-live`): a personal pool of a real HTCondor (a collector and a
startd under condor_master, as root, with the condor account), the project installed on it by
the README's own install lines, and PostgreSQL with peer authentication on a socket of the
tests' own. Skipped, with one line saying how to point it at an install, where HTCondor is not
found."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jobstore.testing.livepool import (
    HOW_TO_POINT,
    LivePool,
    htcondor_prefix,
    install_node,
    wait_for,
)
from jobstore.testing.peerpg import PORT, PeerServer, pg_bin
from jobstore.testing.support import RECORDED_OWNER, RECORDED_UID, ensure_account

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
SUBMITTER = RECORDED_OWNER  # the README's `alice`
PG_URL = "postgresql+psycopg:///jobstore"  # the README's; PGHOST points it at the tests' server

# Two static slots of one core pull the README's keyword (PostgreSQL); one partitionable slot
# of two cores pulls keyword LITE from alice's SQLite file.
SLOTS = """\
NUM_CPUS = 4
MEMORY = 4096
NUM_SLOTS_TYPE_1 = 2
SLOT_TYPE_1 = cpus=1, memory=1024, disk=20%
SLOT_TYPE_1_PARTITIONABLE = FALSE
NUM_SLOTS_TYPE_2 = 1
SLOT_TYPE_2 = cpus=2, memory=2048, disk=40%
SLOT_TYPE_2_PARTITIONABLE = TRUE
"""


# What the live tests measured, printed at the end of the run (never asserted: a timed
# assertion would fail on a busy machine, not on a slow job store).
MEASURED: list[str] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if MEASURED:
        terminalreporter.section("measured on the real startd")
        for line in MEASURED:
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.live)


@dataclass
class Live:
    """The pool, the database server and the installation, with what the tests do to them."""

    pool: LivePool
    server: PeerServer
    venv: Path
    sqlite: Path
    work: Path  # alice's directory for submit files

    def jobstore(self, *args: str, db: str = PG_URL, account: str = SUBMITTER,
                 cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        """The installed `jobstore` command, run as `account` (root: as root)."""
        argv, kwargs = self._command(args, db, account, cwd)
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)

    def start(self, *args: str, db: str = PG_URL, account: str = SUBMITTER,
              log: Path) -> subprocess.Popen[bytes]:
        """The installed `jobstore` command started as `account`, its stderr into `log`."""
        argv, kwargs = self._command(args, db, account, None)
        with open(log, "wb") as err:
            return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, **kwargs)

    def _command(self, args: tuple[str, ...], db: str, account: str,
                 cwd: Path | None) -> tuple[list[str], dict[str, Any]]:
        kwargs: dict[str, Any] = {}
        home = "/root"
        if account != "root":
            user = ensure_account(account)
            kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
            home = user.pw_dir
        kwargs["env"] = {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8",
                         "CONDOR_CONFIG": str(self.pool.config),
                         "PGHOST": str(self.server.socket), "PGPORT": str(PORT)}
        kwargs["cwd"] = str(cwd or self.work)
        return [str(self.venv / "bin" / "jobstore"), "--db", db, *args], kwargs

    def submit(self, text: str, *, db: str = PG_URL, name: str = "job.sub") -> list[str]:
        """Submit `text` as alice from her work directory; the job ids it made."""
        path = self.work / name
        path.write_text(text)
        user = ensure_account(SUBMITTER)
        os.chown(path, user.pw_uid, user.pw_gid)
        done = self.jobstore("submit", name, db=db)
        assert done.returncode == 0, done.stderr
        ids = self.jobstore("q", "-a", "-json", db=db)
        assert ids.returncode == 0, ids.stderr
        cluster = re.search(r"cluster (\d+)", done.stdout)
        assert cluster, done.stdout
        return [j["id"] for j in json.loads(ids.stdout)
                if str(j["cluster_id"]) == cluster.group(1)]

    def job(self, job_id: str, *, db: str = PG_URL) -> dict[str, Any]:
        """The job as `jobstore q -a -json` shows it."""
        done = self.jobstore("q", "-a", "-json", job_id, db=db)
        assert done.returncode == 0, done.stderr
        (ad,) = json.loads(done.stdout)
        return ad

    @staticmethod
    def marker(seconds: int) -> str:
        """`sleep`'s argument for about `seconds` seconds, unique: a job's process is found by
        it."""
        return f"{seconds}.{uuid.uuid4().int % 10**9:09d}"

    def wait_process(self, marker: str, timeout: float = 60) -> list[int]:
        """The pids of the job process `sleep MARKER`, once it runs."""
        return wait_for(f"the job's process `sleep {marker}`",
                        lambda: self.running(f"sleep {marker}"), timeout)

    def wait_gone(self, marker: str, timeout: float = 60) -> None:
        wait_for(f"the job's process `sleep {marker}` ends",
                 lambda: not self.running(f"sleep {marker}"), timeout)

    def running(self, marker: str) -> list[int]:
        """Pids of the processes whose command line holds `marker` (a job's own argument)."""
        done = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
        return [int(p) for p in done.stdout.split()]

    def idle_slots(self) -> int:
        """How many slots the collector shows Unclaimed."""
        return sum(1 for row in self.pool.slots("State") if row[1:] == ["Unclaimed"])

    def wait_status(self, job_id: str, *statuses: str, timeout: float = 60,
                    db: str = PG_URL) -> dict[str, Any]:
        """The job once its status is one of `statuses` (completed, held, ...)."""
        return wait_for(f"job {job_id} {' or '.join(statuses)}",
                        lambda: (lambda j: j if j["status"] in statuses else None)(
                            self.job(job_id, db=db)), timeout, 0.3)


@pytest.fixture(scope="session")
def live() -> Iterator[Live]:
    prefix = htcondor_prefix()
    if prefix is None:
        pytest.skip(HOW_TO_POINT)
    if os.geteuid() != 0 or pg_bin() is None:
        pytest.skip("the live tier runs a pool and a PostgreSQL server as root: run "
                    "`make test-live` as root on a machine with PostgreSQL's server installed")
    alice = ensure_account(SUBMITTER, uid=RECORDED_UID, home=True)
    server = PeerServer(agent="root")
    pool = LivePool(prefix, slots=SLOTS,
                    extra_env={"PGHOST": str(server.socket), "PGPORT": str(PORT)})
    try:
        base = pool.base
        sqlite = base / "alice" / "jobstore.db"
        work = base / "alice"
        work.mkdir(mode=0o755)
        os.chown(work, alice.pw_uid, alice.pw_gid)
        venv = install_node(pool, README, REPO_ROOT, pool.env, f"""\
SLOT_TYPE_2_STARTD_JOB_HOOK_KEYWORD = LITE
LITE_HOOK_FETCH_WORK      = $(JOBSTORE_HOOK_DIR)/fetch_job
LITE_HOOK_REPLY_FETCH     = $(JOBSTORE_HOOK_DIR)/reply_fetch
LITE_HOOK_EVICT_CLAIM     = $(JOBSTORE_HOOK_DIR)/evict_claim
LITE_HOOK_PREPARE_JOB     = $(JOBSTORE_HOOK_DIR)/prepare_job
LITE_HOOK_UPDATE_JOB_INFO = $(JOBSTORE_HOOK_DIR)/update_job_info
LITE_HOOK_JOB_EXIT        = $(JOBSTORE_HOOK_DIR)/job_exit
LITE_JOBSTORE_DATABASE_URL = sqlite:///{sqlite}
PERIODIC_EXPR_INTERVAL = 5
STARTER_UPDATE_INTERVAL = 5
JOBSTORE_LEASE_DURATION = 20
JOBSTORE_CLAIM_LEASE = 20
""")
        live = Live(pool, server, venv, sqlite, work)
        done = live.jobstore("init", db=f"sqlite:///{sqlite}")
        assert done.returncode == 0, done.stderr
        yield live
    finally:
        pool.stop()
        server.stop()
        if os.environ.get("JOBSTORE_LIVE_KEEP"):
            print(f"\nlive pool kept in {pool.base}")
        else:
            pool.remove()


@pytest.fixture(autouse=True)
def _pool_logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """Print the tail of the daemons' logs under a failing live test."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and "live" in request.fixturenames:
        pool: LivePool = request.getfixturevalue("live").pool
        for name in ("StartLog", "JobstoreAgentLog", "MasterLog"):
            print(f"---- {name} (tail) ----\n{pool.log(name)[-3000:]}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo
                              ) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]


__all__ = ["MEASURED", "Live", "PG_URL", "SUBMITTER"]
