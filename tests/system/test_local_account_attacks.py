"""Smaller findings of a hostile local account's probe, each tried as that account did: a hook
name that forges log lines, a spool flood of records about another store, a refused JOB_EXIT
that took a job out of the agent's watch, idle connections to the metrics port, install-hooks
into another account's directory, a password file others can read, a job owned by a service
account, a SQLite store used by another account."""

from __future__ import annotations

import json
import os
import pwd
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path

import clirun
import pytest
from agentnode import WAIT, Node, node  # noqa: F401 - fixture
from emulatornode import JOB_USERS, SERVICE_ACCOUNT
from hookseq import slot_ad
from metricsread import free_port, samples
from securenode import (  # noqa: F401 - fixtures
    ENDED,
    accepted_job,
    exit_spooled,
    secure_node,
    store,
    users,
    write_as,
)

from jobstore.agent.hooktemplates import install_hooks
from jobstore.agent.metrics import METRICS_THREADS, AgentMetrics
from jobstore.agent.protocol import encode
from jobstore.core.jobs import JobSpec
from jobstore.db.engine import make_engine
from jobstore.db.store import JobStore
from jobstore.errors import DatabaseError
from jobstore.node import config
from jobstore.node.accounts import owner_refusal
from jobstore.testing.support import ensure_account

ON_POSTGRESQL = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)


def _as(user: pwd.struct_passwd, fn, *args):  # type: ignore[no-untyped-def]
    """Run `fn(*args)` in a child process as `user` (a forked child: its own uid)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            fn(*args)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _send_raw(path: str, items: list[bytes]) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(WAIT)
    s.connect(path)
    s.sendall(encode(items))
    try:
        s.recv(4096)
    except OSError:
        pass
    s.close()


@ON_POSTGRESQL
def test_a_hook_name_is_checked_before_anything_logs_it(
        secure_node: Node, users: dict[str, pwd.struct_passwd]) -> None:  # noqa: F811
    nd, carol = secure_node, users["jscarol"]
    nd.start()
    log = nd.log
    before = len(log.read_text(errors="replace"))

    def flood() -> None:
        _send_raw(nd.socket, [b"fetch_job\n2026-01-01 00:00:00 INFO FORGED by carol", b"", b""])
        for _ in range(300):
            _send_raw(nd.socket, [b"x" * 65_000, b"", b""])

    _as(carol, flood)
    nd.hook("fetch_job", b'Name = "slot1@n"\n', JOBSTORE_HOOK_MODE="agent")  # still serving
    time.sleep(0.5)
    text = log.read_text(errors="replace")[before:]
    assert not any(line.startswith("2026-01-01") or "FORGED" in line
                   for line in text.splitlines())
    assert "x" * 100 not in text
    assert len(text) < 20_000, len(text)  # 301 refusals: a line or two, throttled
    assert nd.stop() == 0


@ON_POSTGRESQL
def test_foreign_spool_records_do_not_block_a_genuine_one(
        secure_node: Node, store: JobStore, users: dict[str, pwd.struct_passwd],  # noqa: F811
) -> None:
    nd, alice, carol = secure_node, users[JOB_USERS[0]], users["jscarol"]
    assert nd.spool is not None
    job_id, genuine = exit_spooled(nd, store, alice)
    record = json.loads(genuine.read_bytes())
    record["store"] = "0" * len(str(record.get("store", "x")))  # another job store
    data = json.dumps(record).encode()
    for i in range(1_000):  # sorted before the genuine one; more than a replay looked at
        write_as(nd.spool / f"{i:020d}-1-ff.report", data, carol)
    env = dict(nd.env(), JOBSTORE_DATABASE_URL=nd.db_url)
    done = clirun.run([sys.executable, "-m", "jobstore.cli", "replay"], env=env,
                      capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert store.reads.get_job(job_id).status == "completed"
    assert b"1 report(s) sent, 0 left, 1000 quarantined" in done.stdout
    assert done.stderr.count(b"quarantined") <= 22, done.stderr[-500:]  # 20 lines and a count


@ON_POSTGRESQL
def test_a_refused_job_exit_changes_nothing(
        secure_node: Node, store: JobStore, users: dict[str, pwd.struct_passwd],  # noqa: F811
) -> None:
    """carol sends alice's JOB_EXIT (with its token) as her own: refused, and the agent still
    follows alice's attempt."""
    nd, alice, carol = secure_node, users[JOB_USERS[0]], users["jscarol"]
    port = free_port()
    with open(nd.config, "a") as fh:
        fh.write(f"JOBSTORE_AGENT_METRICS_PORT = {port}\n")
    nd.start()
    job_id, job = accepted_job(nd, store, alice.pw_name)

    def watched() -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            return samples(answer.read().decode())[("jobstore_agent_attempts_watched", ())]

    assert watched() == 1
    forged = nd.hook("job_exit", job + ENDED, ["exit"], user=carol, JOBSTORE_HOOK_MODE="agent")
    assert b"not its owner" in forged.stderr or forged.returncode == 0
    assert store.reads.get_job(job_id).status == "accepted"
    assert watched() == 1
    done = nd.hook("job_exit", job + ENDED, ["exit"], user=alice, JOBSTORE_HOOK_MODE="agent")
    assert done.returncode == 0
    assert store.reads.get_job(job_id).status == "completed"
    assert watched() == 0
    assert nd.stop() == 0


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_idle_connections_start_no_thread_each(tmp_path: Path) -> None:
    metrics = AgentMetrics(lambda: [], lambda: 0)
    port = free_port()
    metrics.serve("127.0.0.1", port)
    idle = []
    try:
        base = threading.active_count()
        for _ in range(100):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            idle.append(s)
        time.sleep(0.5)
        assert threading.active_count() - base <= METRICS_THREADS
        for s in idle:
            s.close()
        idle.clear()
        deadline = time.monotonic() + 15
        while True:  # the idle ones time out; the port answers again
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as a:
                    assert b"jobstore_hook_calls" in a.read()
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.5)
    finally:
        for s in idle:
            s.close()
        metrics.close()


def test_install_hooks_never_writes_through_a_planted_symlink(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the directory of another account")
    mallory = ensure_account("jscarol", home=True)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, mallory.pw_uid, mallory.pw_gid)
    with pytest.raises(ValueError, match="belongs to uid"):
        install_hooks(theirs)
    assert os.listdir(theirs) == []
    mine = tmp_path / "mine"
    mine.mkdir()
    secret = tmp_path / "root-only"
    secret.write_text("root's\n")
    os.chmod(secret, 0o600)
    (mine / "fetch_job").symlink_to(secret)
    install_hooks(mine)
    assert secret.read_text() == "root's\n"
    assert not (mine / "fetch_job").is_symlink()
    link = tmp_path / "link"
    link.symlink_to(mine)
    with pytest.raises(ValueError, match="not a directory"):
        install_hooks(link)


def _configured(monkeypatch, path: Path, text: str) -> None:  # type: ignore[no-untyped-def]
    import htcondor2

    path.write_text(text)
    monkeypatch.setenv("CONDOR_CONFIG", str(path))
    htcondor2.reload_config()


@pytest.fixture(autouse=True)
def _config_restored():  # type: ignore[no-untyped-def]
    yield
    import htcondor2

    htcondor2.reload_config()


def test_a_password_file_others_can_read_is_refused(tmp_path: Path, monkeypatch) -> None:
    pw = tmp_path / "pw"
    pw.write_text("secret\n")
    _configured(monkeypatch, tmp_path / "condor_config",
                "JOBSTORE_DATABASE_URL = postgresql://u@127.0.0.1/db\n"
                f"JOBSTORE_DATABASE_PASSWORD_FILE = {pw}\n")
    monkeypatch.delenv("JOBSTORE_DATABASE_URL", raising=False)
    pw.chmod(0o644)
    with pytest.raises(config.ConfigError, match="mode 0644: others than its owner"):
        config.database_url()
    pw.chmod(0o600)
    assert ":secret@" in config.database_url()


def test_a_service_account_never_owns_a_job(tmp_path: Path, monkeypatch) -> None:
    conf = tmp_path / "condor_config"
    _configured(monkeypatch, conf, f"JOBSTORE_AGENT_STARTD_USERS = {SERVICE_ACCOUNT}, condor\n")
    settings = config.load_settings(None, "sqlite:////nonexistent")
    for name in (SERVICE_ACCOUNT, "condor", "root"):
        assert owner_refusal(name, settings) is not None
    assert "service account" in (owner_refusal(SERVICE_ACCOUNT, settings) or "")
    assert owner_refusal(JOB_USERS[0], settings) is None
    _configured(monkeypatch, conf, "")
    assert owner_refusal("condor", config.load_settings(None, "sqlite:////x")) is not None


@ON_POSTGRESQL
def test_a_job_of_a_service_account_is_refused_at_submit_and_held_at_fetch(
        node: Node, tmp_path: Path) -> None:  # noqa: F811
    with open(node.config, "a") as fh:
        fh.write(f"JOBSTORE_AGENT_STARTD_USERS = {SERVICE_ACCOUNT}\n")
    sub = tmp_path / "job.sub"
    sub.write_text("executable = /bin/true\nqueue\n")
    env = dict(node.env(), JOBSTORE_DATABASE_URL=node.db_url)
    r = clirun.run([sys.executable, "-m", "jobstore.cli", "submit", str(sub), "--owner",
                        SERVICE_ACCOUNT], env=env, capture_output=True, text=True, timeout=60)
    if os.geteuid() == 0:  # (elsewhere only root may name another owner at all)
        assert r.returncode == 1
        assert r.stderr.strip() == (f"jobstore: account {SERVICE_ACCOUNT} is a service account"
                                    " (JOBSTORE_AGENT_STARTD_USERS): jobs may not run as it")
    js = JobStore.from_url(node.db_url)
    try:
        assert js.reads.list_jobs() == []
        # queued by the store's owner, who is not checked: the fetch refuses it all the same
        _, (job_id,) = js.submissions.submit([JobSpec(cmd="/bin/true")], owner=SERVICE_ACCOUNT,
                                    queue="default", max_attempts=3)
        out = node.hook("fetch_job", slot_ad("slot1@node01"))
        assert out.stdout == b""
        job = js.reads.get_job(job_id)
        assert job.status == "held" and "is a service account" in (job.reason or "")
    finally:
        js.db.engine.dispose()


def test_a_sqlite_store_is_one_users(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: a store file of another account")
    alice = ensure_account(JOB_USERS[0], home=True)
    bob = ensure_account(JOB_USERS[1], home=True)
    home = Path(alice.pw_dir) / f"store-{os.getpid()}"
    home.mkdir(exist_ok=True)
    os.chown(home, alice.pw_uid, alice.pw_gid)
    os.chmod(home, 0o777)
    db = home / "jobstore.db"
    url = f"sqlite:///{db}"
    from jobstore.db.engine import upgrade

    upgrade(url)
    os.chown(db, alice.pw_uid, alice.pw_gid)
    os.chmod(db, 0o666)  # even a file others may write
    make_engine(url).dispose()  # root may
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "JOBSTORE_"))}
    for user, code in ((bob, 1), (alice, 0)):
        r = clirun.run([sys.executable, "-m", "jobstore.cli", "--db", url, "q"], env=env,
                       capture_output=True, text=True, timeout=60, user=user.pw_uid,
                       group=user.pw_gid, extra_groups=[], cwd="/")
        assert r.returncode == code, r.stderr
    assert r.stderr == ""
    r = clirun.run([sys.executable, "-m", "jobstore.cli", "--db", url, "q"], env=env,
                   capture_output=True, text=True, timeout=60, user=bob.pw_uid,
                   group=bob.pw_gid, extra_groups=[], cwd="/")
    assert r.stderr.strip() == (f"jobstore: the SQLite job store {db} belongs to {alice.pw_name}:"
                                " a SQLite job store is one user's (its owner's and root's); use"
                                " PostgreSQL, where each submitter has her own role, for a shared"
                                " queue")

    def bobs_submit() -> None:
        try:
            JobStore.from_url(url).submissions.submit([JobSpec(cmd="/bin/true")], owner=bob.pw_name,
                                                      queue="q", max_attempts=1)
        except DatabaseError as exc:
            assert "belongs to" in str(exc)
            return
        raise AssertionError("bob's submit reached alice's store")

    _as(bob, bobs_submit)
    assert JobStore.from_url(url).reads.list_jobs(include_final=True) == []
