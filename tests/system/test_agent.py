"""The per-node agent (`jobstore agent`) and the thin hooks: the agent and every hook run as
separate processes, on SQLite and PostgreSQL; peer-uid checks as other accounts when root."""

from __future__ import annotations

import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import clirun
import psycopg
import pytest
from agentnode import WAIT, Node, node, store  # noqa: F401 - fixtures
from emulatornode import JOB_USERS, SERVICE_ACCOUNT, ensure_home_account
from hookseq import ordinary_owner, run_sequence, slot_ad, submit_jobs

from jobstore.agent.protocol import MAGIC, MAX_REQUEST
from jobstore.core.states import Event
from jobstore.db.store import JobStore
from jobstore.emulator.spawn import hook_preexec
from jobstore.formats import classads
from jobstore.formats.jobads import render_job
from jobstore.node import directnote
from jobstore.node.deferred import MAX_PER_UID, Deferred, Pending
from jobstore.testing.factories import claim, report, submit
from jobstore.testing.support import libpq_url


def _status(store: JobStore, job_id: int) -> str:  # noqa: F811
    return store.reads.get_job(job_id).status


def test_job_life_through_the_agent(node: Node, store: JobStore) -> None:  # noqa: F811
    """Every hook of a job's life answered by the agent (JOBSTORE_HOOK_MODE=agent: no fallback);
    the hot path imports nothing but the standard library; SIGTERM ends it cleanly."""
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    node.start()
    seq = run_sequence(node.hooks, node.env(JOBSTORE_HOOK_MODE="agent"), "slot1@node01")
    assert seq.job_id == job_id
    assert [c.returncode for c in seq.calls] == [0] * 6
    assert not [c for c in seq.calls if c.stderr], [c.stderr for c in seq.calls]
    assert _status(store, job_id) == "completed"
    log = node.log.read_text()
    row = store.reads.get_job(job_id)
    assert f"fetched job {row.cluster_id}.{row.proc_id} " in log  # as condor_q numbers it
    assert "exit running -> completed" in log
    # The hot path: no SQLAlchemy, psycopg, classad2 or htcondor2 in the hook process.
    probe = node.hook("fetch_job", slot_ad("slot2@node01"), JOBSTORE_HOOK_MODE="agent",
                      PYTHONPROFILEIMPORTTIME="1")
    imported = probe.stderr.decode()
    assert "jobstore.agent.client" in imported
    for heavy in ("sqlalchemy", "psycopg", "classad2", "htcondor2", "jobstore.node.handlers"):
        assert heavy not in imported
    assert node.stop() == 0
    assert not os.path.exists(node.socket)
    assert "stopped" in node.log.read_text()


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_fallback_when_no_agent_runs(node: Node, store: JobStore) -> None:  # noqa: F811
    """No socket: the hooks do the work themselves; JOBSTORE_HOOK_MODE=agent says so instead."""
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    refused = node.hook("fetch_job", slot_ad("slot1@node01"), JOBSTORE_HOOK_MODE="agent")
    assert refused.stdout == b"" and b"not available" in refused.stderr
    assert _status(store, job_id) == "idle"
    seq = run_sequence(node.hooks, node.env(), "slot1@node01")
    assert seq.job_id == job_id and _status(store, job_id) == "completed"


def _events_and_transactions(node: Node, job_id: int) -> list[tuple[str, str]]:  # noqa: F811
    """(event, the id of the transaction that wrote it) of job `job_id`, in order."""
    with psycopg.connect(libpq_url(node.db_url)) as conn:
        return [(str(e), str(x)) for e, x in conn.execute(
            "SELECT event, xmin::text FROM job_events WHERE job_id = %s ORDER BY id",
            (job_id,)).fetchall()]


def _wait_status(store: JobStore, job_id: int, status: str) -> None:  # noqa: F811
    deadline = time.monotonic() + WAIT
    while _status(store, job_id) != status:
        assert time.monotonic() < deadline, _status(store, job_id)
        time.sleep(0.05)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_reports_no_hook_waits_for_go_in_with_the_attempts_next_one(
        node: Node, store: JobStore) -> None:  # noqa: F811
    """REPLY_FETCH's accept and the first update go in with PREPARE_JOB (which, the job
    accepted, records nothing), the update that saw the job start with JOB_EXIT: a life of
    three transactions, every transition recorded in order."""
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    node.start(_CONDOR_JOBSTORE_AGENT_REPORT_DELAY="30")
    seq = run_sequence(node.hooks, node.env(), "slot1@node01")
    assert seq.job_id == job_id and _status(store, job_id) == "completed"
    written = [(e, x) for e, x in _events_and_transactions(node, job_id) if e != "submit"]
    assert [e for e, _ in written] == ["fetch", "accept", "start", "exit"]
    fetch, accept, start, exit_ = (x for _, x in written)
    assert start == exit_ and len({fetch, accept, exit_}) == 3
    assert node.stop() == 0


def test_reports_kept_back_survive_the_agents_death_and_go_in_at_its_stop(
        node: Node, store: JobStore) -> None:  # noqa: F811
    """An accept kept back is in the spool: an agent killed with it leaves it to the next
    agent's replay; an agent that stops applies what it kept back before it exits."""
    first, second = submit_jobs(store, 2, ordinary_owner())
    for job_id, slot, how in ((first, "slot1@node01", signal.SIGKILL),
                              (second, "slot2@node01", signal.SIGTERM)):
        node.start(_CONDOR_JOBSTORE_AGENT_REPORT_DELAY="30")
        sad = slot_ad(slot)
        fetched = node.hook("fetch_job", sad)
        job = fetched.stdout
        assert b"JobstoreJobId = %d" % job_id in job, (
            fetched, store.reads.get_job(job_id), node.log.read_text())
        node.hook("reply_fetch", job + b"-----\n" + sad, ["accept"])
        assert _status(store, job_id) == "fetched"  # kept back
        code = node.stop(how)
        if how == signal.SIGTERM:
            assert code == 0 and _status(store, job_id) == "accepted"
        else:
            assert _status(store, job_id) == "fetched"
            node.start(_CONDOR_JOBSTORE_AGENT_REPORT_DELAY="30")  # replays the spool at start
            _wait_status(store, job_id, "accepted")
            assert node.stop() == 0


def test_a_refused_report_leaves_the_reports_kept_back_for_that_attempt(
        node: Node, store: JobStore, accounts: tuple[pwd.struct_passwd, ...]) -> None:  # noqa: F811
    """A starter hook of an account with no name, or of another user, about alice's attempt:
    refused, and alice's accept kept back for that attempt still goes in."""
    _, alice, bob = accounts
    (job_id,) = submit_jobs(store, 1, alice.pw_name)
    node.start(_CONDOR_JOBSTORE_AGENT_REPORT_DELAY="30")
    sad = slot_ad("slot1@node01")
    job = node.hook("fetch_job", sad).stdout
    node.hook("reply_fetch", job + b"-----\n" + sad, ["accept"])
    # 54321 is in no passwd entry: refused before anything is taken, the accept still kept;
    # bob is refused after it, in the transaction that applied alice's accept
    for uid, gid, then in ((54321, 54321, "fetched"), (bob.pw_uid, bob.pw_gid, "accepted")):
        refused = subprocess.run(
            [str(node.hooks / "prepare_job")], input=job, capture_output=True,
            env=node.env(JOBSTORE_HOOK_MODE="agent"), timeout=WAIT,
            preexec_fn=hook_preexec(False), user=uid, group=gid, extra_groups=[])
        assert b"prepare_job" in refused.stderr, refused.stderr
        assert _status(store, job_id) == then
    assert node.stop() == 0
    assert [e.event for e in store.reads.events(job_id)][-2:] == ["fetch", "accept"]


def test_reports_of_one_account_kept_back_are_bounded() -> None:
    kept = Deferred(30.0)
    key = ("JOBSTORE", 1, 1)
    taken = [kept.may_keep(key, Event.UPDATE, False, 1001) for _ in range(MAX_PER_UID + 5)]
    for _ in range(MAX_PER_UID):
        kept.keep(Pending(key, None, None, None, 1001))  # type: ignore[arg-type]
    assert all(taken)
    assert not kept.may_keep(key, Event.UPDATE, False, 1001)
    assert kept.may_keep(key, Event.UPDATE, False, 1002)  # another account's are not
    assert len(kept.take(key)) == MAX_PER_UID
    assert kept.may_keep(key, Event.UPDATE, False, 1001)


def test_a_hook_that_finds_no_agent_where_the_node_names_one_says_so_once(
        node: Node, store: JobStore) -> None:  # noqa: F811
    hook_log = node.base / "log" / "JobstoreHookLog"
    submit_jobs(store, 2, ordinary_owner())
    for _ in range(2):
        done = node.hook("fetch_job", slot_ad("slot1@node01"), JOBSTORE_HOOK_LOG=str(hook_log))
        assert b"JobstoreJobId" in done.stdout  # direct mode did the work
    said = [line for line in hook_log.read_text().splitlines() if "no jobstore agent" in line]
    assert len(said) == 1, hook_log.read_text()
    assert f"no jobstore agent at {node.socket} (nothing listens there)" in said[0]
    noted = directnote.last(str(hook_log))
    assert noted is not None and abs(noted[0] - time.time()) < 600
    assert noted[1].startswith(f"fetch_job: no jobstore agent at {node.socket}")


def test_agent_check_says_which_mode_the_hooks_are_in(node: Node) -> None:  # noqa: F811
    with open(node.config, "a") as fh:
        fh.write(f"JOBSTORE_HOOK_FETCH_WORK = {node.hooks}/fetch_job\n")

    def check() -> subprocess.CompletedProcess:
        return clirun.run([sys.executable, "-m", "jobstore.cli", "agent", "--check"],
                          env=dict(node.env(), PATH=os.environ.get("PATH", "/usr/bin")),
                          capture_output=True, text=True, timeout=WAIT)

    before = check()
    assert before.returncode == 1, before.stdout + before.stderr
    assert (f"JOBSTORE: hooks {node.hooks}/fetch_job look for the agent at "
            "/run/jobstore/agent.sock (the hooks' default): direct mode") in before.stdout
    assert f"the agent listens at {node.socket}: set STARTD_ENVIRONMENT" in before.stdout
    with open(node.config, "a") as fh:
        fh.write(f'STARTD_ENVIRONMENT = "JOBSTORE_AGENT_SOCKET={node.socket} A=1"\n')
    node.start()
    after = check()
    assert after.returncode == 0, after.stdout + after.stderr
    assert (f"JOBSTORE: hooks {node.hooks}/fetch_job look for the agent at {node.socket} "
            "(STARTD_ENVIRONMENT): agent mode") in after.stdout


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_agent_killed_mid_run_loses_nothing(node: Node, store: JobStore) -> None:  # noqa: F811
    """Fetched and accepted through the agent; the agent is SIGKILLed; the starter hooks fall
    back to direct mode and the job completes exactly once."""
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    node.start()
    fetched = node.hook("fetch_job", slot_ad("slot1@node01"))
    assert b"JobstoreJobId = %d" % job_id in fetched.stdout
    job = fetched.stdout
    node.hook("reply_fetch", job + b"-----\n" + slot_ad("slot1@node01"), ["accept"])
    assert _status(store, job_id) == "accepted"
    assert node.agent is not None
    node.agent.kill()
    node.agent.wait()
    node.agent = None
    assert os.path.exists(node.socket)  # left behind: connection refused, so direct mode
    assert node.hook("prepare_job", job).returncode == 0
    done = node.hook("job_exit", job + b"ExitCode = 0\nExitBySignal = false\n", ["exit"])
    assert done.returncode == 0 and done.stderr == b""
    assert _status(store, job_id) == "completed"
    exits = [e for e in store.reads.events(job_id) if e.event == "exit" and e.to_status]
    assert len(exits) == 1
    node.start()  # a stale socket file does not stop a new agent
    assert node.stop(signal.SIGQUIT) == 0


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_hostile_clients_do_not_block_a_good_one(node: Node, store: JobStore) -> None:  # noqa: F811
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    node.start()

    def raw(data: bytes) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(WAIT)
        s.connect(node.socket)
        s.sendall(data)
        return s

    slow = raw(MAGIC + (1000).to_bytes(4, "big") + b"\0\0")  # announces 1000 bytes, sends 2
    garbage = raw(b"GET / HTTP/1.0\r\n\r\n")
    oversize = raw(MAGIC + (MAX_REQUEST + 1).to_bytes(4, "big"))
    good = node.hook("fetch_job", slot_ad("slot1@node01"), JOBSTORE_HOOK_MODE="agent")
    assert b"JobstoreJobId = %d" % job_id in good.stdout, good.stderr
    for s in (garbage, oversize):
        answer = s.recv(4096)
        assert answer.startswith(MAGIC) and b"refused" in answer and b"bad request" in answer
        s.close()
    assert slow.recv(4096) == b""  # dropped after JOBSTORE_AGENT_READ_TIMEOUT
    slow.close()
    assert node.agent is not None and node.agent.poll() is None
    assert "bad request refused" in node.log.read_text()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_sighup_reloads_the_configuration(node: Node, store: JobStore) -> None:  # noqa: F811
    """The agent reads each keyword's settings once, and again on SIGHUP: a changed file
    changes nothing until then."""
    (job_id,) = submit_jobs(store, 1, ordinary_owner(), queue="gpu")
    node.start()
    assert node.hook("fetch_job", slot_ad("slot1@node01")).stdout == b""
    with open(node.config, "a") as fh:
        fh.write("JOBSTORE_QUEUE = gpu\n")
    unread = node.hook("fetch_job", slot_ad("slot1@node01"), JOBSTORE_HOOK_MODE="agent")
    assert unread.stdout == b"" and store.reads.get_job(job_id).status == "idle"
    mark = len(node.log.read_text())
    assert node.agent is not None
    node.agent.send_signal(signal.SIGHUP)
    node.wait_log("configuration reloaded", mark)
    fetched = node.hook("fetch_job", slot_ad("slot1@node01"), JOBSTORE_HOOK_MODE="agent")
    assert b"JobstoreJobId = %d" % job_id in fetched.stdout
    assert node.stop() == 0


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_one_database_connection_per_node(node: Node, store: JobStore) -> None:  # noqa: F811
    """Eight slots fetch at once through the agent; afterwards it holds one pooled connection
    (besides the connection its watch LISTENs on)."""
    ids = submit_jobs(store, 8, ordinary_owner())
    node.start()
    env = node.env(JOBSTORE_HOOK_MODE="agent")
    procs = [subprocess.Popen([str(node.hooks / "fetch_job")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
             for _ in ids]
    outs = [p.communicate(slot_ad(f"slot{i}@node01"), timeout=WAIT)
            for i, p in enumerate(procs, 1)]
    assert sum(b"JobstoreJobId" in out for out, _ in outs) == 8
    name = store.db.engine.url.database
    with psycopg.connect(libpq_url(node.db_url), autocommit=True) as conn:
        held = [q for (q,) in conn.execute(
            "SELECT query FROM pg_stat_activity WHERE datname = %s AND pid <> "
            "pg_backend_pid() AND backend_type = 'client backend'", (name,))]
    listening = [q for q in held if q.startswith("LISTEN")]
    assert len(held) - len(listening) == 1 and len(listening) <= 1, held
    assert node.stop() == 0


# ---- as root: other accounts ---------------------------------------------------------------


@pytest.fixture
def accounts() -> tuple[pwd.struct_passwd, pwd.struct_passwd, pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create accounts and drop privileges")
    return (ensure_home_account(SERVICE_ACCOUNT), ensure_home_account(JOB_USERS[0]),
            ensure_home_account(JOB_USERS[1]))


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_peer_uid_decides_who_may_call(
    node: Node, store: JobStore, accounts: tuple[pwd.struct_passwd, ...]  # noqa: F811
) -> None:
    condor, alice, bob = accounts
    with open(node.config, "a") as fh:
        fh.write(f"JOBSTORE_AGENT_STARTD_USERS = {condor.pw_name}\n")
    (job_id,) = submit_jobs(store, 1, alice.pw_name)
    node.start()
    sad = slot_ad("slot1@node01")
    denied = node.hook("fetch_job", sad, user=bob)
    assert denied.stdout == b"" and b"not a condor service account" in denied.stderr
    assert _status(store, job_id) == "idle"
    job = node.hook("fetch_job", sad, user=condor).stdout
    assert b"JobstoreJobId = %d" % job_id in job
    node.hook("reply_fetch", job + b"-----\n" + sad, ["accept"], user=condor)
    ended = job + b"ExitCode = 0\nExitBySignal = false\n"
    other = node.hook("job_exit", ended, ["exit"], user=bob)
    assert b"may not report on job" in other.stderr and _status(store, job_id) == "accepted"
    own = node.hook("job_exit", ended, ["exit"], user=alice)
    assert own.returncode == 0 and own.stderr == b"", own.stderr
    assert _status(store, job_id) == "completed"


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_job_user_without_credentials_spools_for_the_agent(
    node: Node, store: JobStore, accounts: tuple[pwd.struct_passwd, ...]  # noqa: F811
) -> None:
    """The password file is the service's only: with the agent down, a starter hook run as the
    job's user keeps its report in the spool (one line), and the agent sends it at start."""
    _, alice, _ = accounts
    secret = node.base / "db-password"
    secret.write_text("not-for-job-users\n")
    os.chmod(secret, 0o600)
    with open(node.config, "a") as fh:
        fh.write(f"JOBSTORE_DATABASE_PASSWORD_FILE = {secret}\n")
    (job_id,) = submit_jobs(store, 1, alice.pw_name)
    node.start()
    sad = slot_ad("slot1@node01")
    job = node.hook("fetch_job", sad).stdout
    node.hook("reply_fetch", job + b"-----\n" + sad, ["accept"])
    assert node.stop() == 0
    ended = node.hook("job_exit", job + b"ExitCode = 0\nExitBySignal = false\n", ["exit"],
                      user=alice)
    lines = ended.stderr.decode().splitlines()
    assert ended.returncode == 0 and len(lines) == 1 and "kept in the spool" in lines[0]
    assert "not-for-job-users" not in ended.stderr.decode()
    assert _status(store, job_id) == "accepted"
    node.start()
    node.wait_log("1 report(s) replayed")
    assert _status(store, job_id) == "completed"


def test_agent_fetches_share_slots_and_respect_limits(
    node: Node, store: JobStore, accounts: tuple[pwd.struct_passwd, ...]  # noqa: F811
) -> None:
    """Through the agent (one store, verdicts remembered): two owners who queued in turn hold
    slots in turn, and a limit from the configuration caps the jobs that name it."""
    alice, bob = accounts[1].pw_name, accounts[2].pw_name
    with open(node.config, "a") as fh:
        fh.write("LIC_LIMIT = 2\n")
    first = submit_jobs(store, 4, alice)
    second = submit_jobs(store, 4, bob)
    limited = submit_jobs(store, 4, alice, concurrency_limits="lic")
    node.start()
    env: dict[str, Any] = {"JOBSTORE_HOOK_MODE": "agent"}
    got: list[int] = []
    for n in range(11):
        out = node.hook("fetch_job", slot_ad(f"slot{n}@node01"), **env)
        assert out.returncode == 0 and not out.stderr, out.stderr
        if out.stdout:
            ad = classads.parse_ad(classads.decode(out.stdout))
            got.append(classads.get_int(ad, "JobstoreJobId") or 0)
    owners = [store.reads.get_job(i).owner for i in got]
    assert owners[:8] == [alice, bob] * 4 or owners[:8] == [bob, alice] * 4, owners
    assert len(got) == 10  # the 11th slot finds only limited jobs, the limit full
    assert len(set(got) & set(limited)) == 2
    assert set(first) | set(second) <= set(got)
    assert node.stop() == 0


def test_agent_runs_the_periodic_policy_pass(node: Node, store: JobStore) -> None:  # noqa: F811
    """A job whose periodic_remove fires is removed by the agent's periodic pass, with no hook
    call and no `jobstore reap` (PERIODIC_EXPR_INTERVAL = 1 here)."""
    with open(node.config, "a") as fh:
        fh.write("PERIODIC_EXPR_INTERVAL = 1\n")
    (job_id,) = submit(store, owner=ordinary_owner(),
                       custom={"PeriodicRemove": "JobStatus == 1"})
    node.start()
    row = store.reads.get_job(job_id)
    node.wait_log(f"job {row.cluster_id}.{row.proc_id}: periodic policy: remove idle -> removed")
    assert _status(store, job_id) == "removed"
    assert node.stop() == 0


def test_agent_prunes_the_history(node: Node, store: JobStore) -> None:  # noqa: F811
    """With JOBSTORE_HISTORY_RETENTION = 1, the agent removes a job removed over a second ago,
    with its events, and keeps the idle one."""
    with open(node.config, "a") as fh:
        fh.write("JOBSTORE_HISTORY_RETENTION = 1s\nJOBSTORE_PRUNE_INTERVAL = 10\n")
    gone, idle = submit(store, 2, owner=ordinary_owner())
    store.actions.admin(gone, Event.REMOVE, "old news")
    time.sleep(1.1)
    node.start()
    node.wait_log("history of JOBSTORE pruned: 1 job(s) finished over 1s ago, 2 event(s),"
                  " 0 cluster(s)")
    assert [j.id for j in store.reads.list_jobs(include_final=True)] == [idle]
    assert store.reads.events(gone) == []
    assert node.stop() == 0


@pytest.mark.parametrize("mode", ["agent", "direct"])
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # the job's user reaches it
def test_a_held_running_job_is_ended_by_its_next_update(
    node: Node, store: JobStore, accounts: tuple[pwd.struct_passwd, ...], mode: str  # noqa: F811
) -> None:
    """`jobstore hold` (or rm) of a running job: the next UPDATE_JOB_INFO of its attempt, run as
    the job's user, ends the job's process group; the job stays held with its reason."""
    alice = accounts[1]
    (job_id,) = submit_jobs(store, 1, alice.pw_name)
    job = claim(store)
    assert job is not None
    sleeper = subprocess.Popen(["sleep", "300"], user=alice.pw_uid, group=alice.pw_gid,
                               extra_groups=[], start_new_session=True)
    try:
        report(store, job, Event.START, changes={"job_pid": sleeper.pid})
        store.actions.admin(job_id, Event.HOLD, "held by hand")
        ad = render_job(job, keyword="JOBSTORE", uid_domain="localdomain",
                        job_lease_duration=2400).encode()
        ad += f'JobPid = {sleeper.pid}\nJobState = "Running"\n'.encode()
        if mode == "agent":
            node.start()
        out = node.hook("update_job_info", ad, user=alice, JOBSTORE_HOOK_MODE=mode)
        assert out.returncode == 0
        assert sleeper.wait(10) == -signal.SIGTERM
        got = store.reads.get_job(job_id)
        assert (got.status, got.reason, got.hold_code) == ("held", "held by hand", 1)
        assert (store.reads.events(job_id)[-1].reason or "").startswith("stale:")
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
    if mode == "agent":
        assert node.stop() == 0
