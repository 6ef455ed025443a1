"""Shared test fixtures: databases (SQLite and a throw-away PostgreSQL database per test),
a minimal HTCondor configuration file and the test fixtures (real HTCondor transcripts)."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from examples import LARGE, SMALL, UNSPECIFIED_LARGE
from hypothesis import settings
from pgpool import DatabasePool
from psycopg import sql
from sqlalchemy.engine import make_url
from testdata import FIXTURES

from jobstore.testing.support import libpq_url, sqlite_copy

# The agents the tests start answer a fetch that finds nothing at once, as hook_env's do; the
# tests of the waiting fetch (test_fetch_wait) set JOBSTORE_FETCH_WAIT themselves.
os.environ.setdefault("_CONDOR_JOBSTORE_FETCH_WAIT", "0")
os.environ.setdefault("_CONDOR_JOBSTORE_AGENT_NUDGE_COMMAND", "false")  # no startd to nudge

# A Hypothesis test that names no number of examples: few in `make test`, more in test-slow.
settings.register_profile("jobstore", max_examples=UNSPECIFIED_LARGE if LARGE else SMALL)
settings.load_profile("jobstore")

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


# The tiers in the order pytest-xdist hands their tests out: the longest first, so that the
# many short ones at the end keep every worker busy until the run ends.
TIER_ORDER = {"system": 0, "store": 1, "unit": 2}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: TIER_ORDER.get(item.path.parent.name, 0))


def pytest_collection_finish(session: pytest.Session) -> None:
    """The modules and tests collected live as long as the run: the collector skips them."""
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Let .ci/run exit with pytest's own status (make turns every failure into 2); with
    pytest-xdist, the controller's (a worker's session is only its share)."""
    status_file = os.environ.get("JOBSTORE_PYTEST_STATUS_FILE")
    if status_file and not hasattr(session.config, "workerinput"):
        Path(status_file).write_text(f"{int(exitstatus)}\n")


@pytest.fixture(scope="session")
def pg_admin_url() -> str:
    """SQLAlchemy URL of a PostgreSQL account allowed to create and drop databases.

    ``JOBSTORE_TEST_DATABASE_URL`` if set, else the local server as ``postgres``. An unreachable
    server fails the tests that need it: it is never skipped silently.
    """
    url = os.environ.get("JOBSTORE_TEST_DATABASE_URL") or DEFAULT_PG_ADMIN_URL
    shown = make_url(url).render_as_string(hide_password=True)
    error = None
    try:
        with psycopg.connect(libpq_url(url), connect_timeout=5, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        error = str(exc).strip()
    if error is not None:
        pytest.fail(
            f"PostgreSQL is not reachable at {shown}: {error}\n"
            "Start it (e.g. `pg_ctlcluster --skip-systemctl-redirect <version> main start`, "
            "or run .ci/run) or point JOBSTORE_TEST_DATABASE_URL at a server where this "
            "account may CREATE DATABASE.",
            pytrace=False,
        )
    return url


def _migrated(request: pytest.FixtureRequest) -> bool:
    """Whether the test's database starts at the newest schema (a copy of a template migrated
    once per test process: its own upgrade() finds it there), as all but a few do."""
    return request.node.get_closest_marker("empty_database") is None


@pytest.fixture(scope="session")
def pg_template(pg_admin_url: str):
    """The name of a PostgreSQL database migrated once for this test process (a template)."""
    from jobstore.db.engine import upgrade

    name = f"jobstore_template_{uuid.uuid4().hex}"
    admin = libpq_url(pg_admin_url)
    with psycopg.connect(admin, connect_timeout=5, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        upgrade(make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False))
        yield name
    finally:
        with psycopg.connect(admin, connect_timeout=5, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture(scope="session")
def pg_pool(pg_admin_url: str, pg_template: str) -> Iterator[DatabasePool]:
    """This test process's migrated databases, used again (pgpool)."""
    pool = DatabasePool(pg_admin_url, pg_template)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database file migrated once for this test process."""
    from jobstore.db.engine import upgrade

    path = tmp_path_factory.mktemp("template") / "jobstore.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture
def pg_url(pg_admin_url: str, request: pytest.FixtureRequest):
    """SQLAlchemy URL of a PostgreSQL database for the test alone: as a copy of the migrated
    template is, emptied for the next test after it (pgpool), or (empty_database) a new empty
    one, dropped after it."""
    if _migrated(request):
        pool: DatabasePool = request.getfixturevalue("pg_pool")
        taken = pool.take()
        try:
            yield pool.url(taken)
        finally:
            pool.give_back(taken)
        return
    name = f"jobstore_test_{uuid.uuid4().hex}"
    admin = libpq_url(pg_admin_url)
    create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    with psycopg.connect(admin, connect_timeout=5, autocommit=True) as conn:
        conn.execute(create)
    try:
        yield make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, connect_timeout=5, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def sqlite_url(tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """SQLAlchemy URL of a new SQLite database file in the test's tmp_path: a copy of the
    migrated template, or (empty_database) none yet."""
    path = tmp_path / "jobstore.db"
    if not _migrated(request):
        return f"sqlite:///{path}"
    return sqlite_copy(f"sqlite:///{request.getfixturevalue('sqlite_template')}", path)


# A test that takes db_url runs on SQLite in `make test` and on PostgreSQL too in `make
# test-slow`; one where PostgreSQL is the point names it (BOTH_BACKENDS, or "postgresql" alone).
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.matrix)]


@pytest.fixture(params=BACKENDS, ids=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """The test's database: SQLite, and PostgreSQL (`-k sqlite` to skip the server)."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def condor_config(tmp_path: Path) -> Iterator[Path]:
    """Path of a minimal HTCondor configuration file (point CONDOR_CONFIG at it), with a
    sandbox root of the test's own (an agent's journal, outbox and input cache are no other
    test's), where job accounts can reach it."""
    log_dir = tmp_path / "log"
    log_dir.mkdir(exist_ok=True)
    sandboxes = Path(tempfile.mkdtemp(prefix="jobstore-test-"))
    os.chmod(sandboxes, 0o755)
    path = tmp_path / "condor_config"
    path.write_text(
        "UID_DOMAIN = localdomain\n"
        "STARTD_JOB_HOOK_KEYWORD = JOBSTORE\n"
        f"LOG = {log_dir}\n"
        f"JOBSTORE_SANDBOX_ROOT = {sandboxes / 'sandboxes'}\n"
    )
    try:
        yield path
    finally:
        shutil.rmtree(sandboxes, ignore_errors=True)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """tests/fixtures: the real-startd transcripts the tests replay (inside the repository)."""
    return FIXTURES


@pytest.fixture(scope="session")
def hook_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The six hook executables, installed with this interpreter as HTCondor would run them."""
    import sys

    from jobstore.agent.hooktemplates import install_hooks

    directory = tmp_path_factory.mktemp("hooks")
    os.chmod(directory, 0o755)
    install_hooks(directory, sys.executable)
    return directory


@pytest.fixture
def store(db_url: str):
    """A migrated, empty job store on SQLite and on PostgreSQL, with a kept connection (as the
    agent's: a new connection per transaction would cost the tests thousands of sessions)."""
    from jobstore.db.engine import upgrade
    from jobstore.db.store import JobStore

    upgrade(db_url)
    s = JobStore.from_url(db_url, pool=True, max_overflow=8)
    yield s
    s.db.engine.dispose()
