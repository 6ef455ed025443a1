"""The execute node against its own users, tried with nothing but what a job's user
and another local account can do, against the real agent on PostgreSQL with the least-privilege
database role. Root-only tests skip elsewhere; the fuzz tests run anywhere."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import clirun
import psycopg
import pytest
from agentnode import WAIT, Node, node  # noqa: F401 - fixture
from emulatornode import JOB_USERS, SERVICE_ACCOUNT
from hookseq import slot_ad, submit_jobs
from securenode import (  # noqa: F401 - fixtures
    ENDED,
    FLOOD_USERS,
    accepted_job,
    exit_spooled,
    secure_node,
    spooled,
    store,
    users,
    write_as,
)
from sqlalchemy.engine import make_url

from jobstore.db.store import DatabaseError, JobStore, Offer
from jobstore.node import spool
from jobstore.testing.factories import claim, claim_request, submit
from jobstore.testing.support import libpq_url

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)


# ---- 1. a spooled report is untrusted data --------------------------------------------------


def test_rewritten_report_cannot_change_the_job(
    secure_node: Node, store: JobStore, users: dict[str, pwd.struct_passwd]  # noqa: F811
) -> None:
    """alice's JOB_EXIT, spooled while the agent was away, rewritten by alice in every way a
    genuine report could not be: each version is quarantined, and the job's owner, log path and
    state stay as the job store decided; then her genuine report is applied."""
    nd, alice, bob = secure_node, users[JOB_USERS[0]], users[JOB_USERS[1]]
    assert nd.spool is not None
    nd.start()
    job_id, job = accepted_job(nd, store, alice.pw_name)
    (bobs_job, _) = accepted_job(nd, store, bob.pw_name, "slot2@node01")
    assert nd.stop() == 0
    ended = nd.hook("job_exit", job + ENDED, ["exit"], user=alice)
    assert b"kept in the spool" in ended.stderr
    (genuine,) = spooled(nd)
    assert genuine.stat().st_uid == alice.pw_uid
    record = json.loads(genuine.read_bytes())
    tampered = [
        {**record, "changes": {**record["changes"], "owner": bob.pw_name}},
        {**record, "changes": {"user_log": "/root/owned.log"}},
        {**record, "changes": {"cmd": "/bin/sh", "queue": "other"}},
        {**record, "attrs": {**record["attrs"], "Owner": bob.pw_name, "User": "bob@x"}},
        {**record, "event": "accept"},
        {**record, "event": "release"},
        {**record, "caller_uid": 0},
        {**record, "owner": bob.pw_name},
        {**record, "job_id": bobs_job},  # bob's job: not hers to report on
        {**record, "changes": {"exit_code": "0; DROP TABLE jobs"}},
        {**record, "slot": "x" * 100_000},
    ]
    for i, bad in enumerate(tampered):
        write_as(nd.spool / f"{i:020d}-1-{i:04x}.report", json.dumps(bad).encode(), alice)
    nd.start()
    nd.wait_log("report(s) replayed")
    log = nd.log.read_text()
    assert "1 report(s) replayed, 0 left, 11 quarantined" in log, log
    row = store.reads.get_job(job_id)
    assert row.owner == alice.pw_name and row.user_log is None
    assert row.cmd == "/bin/true" and row.queue == "default"
    assert row.status == "completed"  # the genuine report, after every tampered one
    assert store.reads.get_job(bobs_job).status == "accepted"
    quarantined = sorted(p.name for p in nd.spool.iterdir() if p.name.endswith(".bad"))
    assert len(quarantined) == 11 and spooled(nd) == []
    assert not Path("/root/owned.log").exists()


def test_hook_role_cannot_change_what_submit_decided(secure_node: Node, store: JobStore,  # noqa: F811
                                                     users: dict[str, pwd.struct_passwd]) -> None:  # noqa: F811
    """The agent's own database role may run a job's whole life but not rewrite its owner,
    command, queue or log path, whatever it is told."""
    from hookseq import run_sequence

    nd, alice = secure_node, users[JOB_USERS[0]]
    (job_id,) = submit_jobs(store, 1, alice.pw_name)
    nd.start()
    condor = users[SERVICE_ACCOUNT]
    env = nd.env(JOBSTORE_HOOK_MODE="agent")
    seq = run_sequence(nd.hooks, env, "slot1@node01")
    assert seq.job_id == job_id and store.reads.get_job(job_id).status == "completed", condor
    role_url = libpq_url(make_url(nd.db_url).set(password="hooks-pw")
                         .render_as_string(hide_password=False))
    with psycopg.connect(role_url, autocommit=True) as conn:
        conn.execute("UPDATE jobs SET reason = 'allowed' WHERE id = %s", (job_id,))
        for column, value in (("owner", "bob"), ("cmd", "/bin/sh"), ("queue", "x"),
                              ("user_log", "/root/x"), ("ad", "{}")):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"UPDATE jobs SET {column} = %s WHERE id = %s", (value, job_id))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM job_events")
        # the accountant may update priorities and usage, never a factor an admin set
        conn.execute("UPDATE submitters SET priority = 0.5")
        for statement in ("UPDATE submitters SET factor = 0.001",
                          "UPDATE autoclusters SET owner = 'root'",
                          "DELETE FROM autocluster_limits"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    # the role runs the whole negotiation: two submitters, a concurrency limit, the accountant
    limited = submit_jobs(store, 2, alice.pw_name, concurrency_limits="lic")
    submit_jobs(store, 1, users[JOB_USERS[1]].pw_name)
    role_store = JobStore.from_url(make_url(nd.db_url).set(password="hooks-pw")
                                   .render_as_string(hide_password=False))
    try:
        req = claim_request(offer=Offer(cpus=1, memory=1024, disk=1 << 20), slot="slot9@node01",
                            claim_lease=60, limit=lambda name: 1.0)
        got = [claim(role_store, req) for _ in range(3)]
        assert sum(1 for j in got if j and j.id in limited) == 1
        assert sum(1 for j in got if j) == 2
        assert role_store.negotiator.update_priorities(interval=0) >= 2
        # ... and the jobs' periodic policy pass, with its hold codes
        (policed,) = submit(store, owner=alice.pw_name, queue="other",
                            custom={"PeriodicHold": "true"})
        assert role_store.maintenance.police_due(0) is not None
        held = store.reads.get_job(policed)
        assert (held.status, held.hold_code) == ("held", 3)
        # ... but it may not delete: the history is pruned by the tables' owner
        with pytest.raises(DatabaseError, match="permission denied"):
            role_store.retention.prune(time.time() + 60)
    finally:
        role_store.db.engine.dispose()


# ---- 2. the spool cannot be turned against its reader ---------------------------------------


def test_fifo_symlink_and_junk_do_not_stall_the_replay(
    secure_node: Node, store: JobStore, users: dict[str, pwd.struct_passwd]  # noqa: F811
) -> None:
    """Another user's FIFO, symlink and unsendable record, named to sort first: root's
    `jobstore replay` neither blocks nor follows them, removes what is not a file, quarantines
    the record, and sends the genuine report behind them."""
    nd, alice, carol = secure_node, users[JOB_USERS[0]], users["jscarol"]
    assert nd.spool is not None
    job_id, _ = exit_spooled(nd, store, alice)
    fifo = nd.spool / "00000000000000000001-1-aa.report"
    os.mkfifo(fifo)
    os.chown(fifo, carol.pw_uid, carol.pw_gid)
    link = nd.spool / "00000000000000000002-1-bb.report"
    os.symlink("/etc/shadow", link)
    os.lchown(link, carol.pw_uid, carol.pw_gid)
    write_as(nd.spool / "00000000000000000003-1-cc.report", b'{"keyword": 1}', carol)
    write_as(nd.spool / "00000000000000000004-1-dd.report", b"[" * 100_000, carol)
    write_as(nd.spool / "00000000000000000005-1-ee.report", b" " * 70_000, carol)
    env = dict(nd.env(), JOBSTORE_DATABASE_URL=nd.db_url)
    done = clirun.run([sys.executable, "-m", "jobstore.cli", "replay"], env=env,
                      capture_output=True, timeout=WAIT)
    assert done.returncode == 0, done.stderr
    assert b"1 report(s) sent, 0 left, 5 quarantined" in done.stdout
    assert store.reads.get_job(job_id).status == "completed"
    names = os.listdir(nd.spool)
    assert fifo.name not in names and link.name not in names and not os.path.islink(link)
    assert sum(n.endswith(".bad") for n in names) == 3


def test_spool_made_by_another_user_is_not_used(
    secure_node: Node, store: JobStore, users: dict[str, pwd.struct_passwd]  # noqa: F811
) -> None:
    """carol makes the spool directory first (after a reboot cleared it): alice's hook does not
    write her report there, and the agent moves carol's directory aside and makes its own,
    where reports then wait safely."""
    nd, alice, carol = secure_node, users[JOB_USERS[0]], users["jscarol"]
    nd.start()
    job_id, job = accepted_job(nd, store, alice.pw_name)
    assert nd.stop() == 0
    assert nd.spool is not None
    shutil.rmtree(nd.spool)
    nd.spool.mkdir()
    os.chown(nd.spool, carol.pw_uid, carol.pw_gid)
    os.chmod(nd.spool, 0o777)
    ended = nd.hook("job_exit", job + ENDED, ["exit"], user=alice)
    assert b"not used" in ended.stderr or b"not root" in ended.stderr, ended.stderr
    assert os.listdir(nd.spool) == []  # nothing of alice's reached carol's directory
    nd.start()
    nd.wait_log("moved aside")
    st = nd.spool.lstat()
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == spool.DIR_MODE
    assert [p for p in nd.spool.parent.iterdir() if ".untrusted-" in p.name]
    assert nd.stop() == 0
    again = nd.hook("job_exit", job + ENDED, ["exit"], user=alice)
    assert b"kept in the spool" in again.stderr
    (kept,) = spooled(nd)
    assert kept.stat().st_uid == alice.pw_uid and stat.S_IMODE(kept.stat().st_mode) == 0o600
    nd.start()
    nd.wait_log("1 report(s) replayed")
    assert store.reads.get_job(job_id).status == "completed"


# ---- 3. the hooks trust only the agent ------------------------------------------------------


FAKE_AGENT = textwrap.dedent("""
    import os, socket, sys
    from jobstore.agent.protocol import encode
    path, out = sys.argv[1], sys.argv[2]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    os.chmod(path, 0o666)
    s.listen(1)
    print("ready", flush=True)
    c, _ = s.accept()
    ad = b'JobstoreJobId = 1\\nOwner = "root"\\nUser = "root@localdomain"\\nCmd = "/bin/sh"\\n'
    got = b""
    try:
        c.sendall(encode([b"ok", b"0", ad, b""]))
        c.settimeout(10)
        while True:
            data = c.recv(65536)
            if not data:
                break
            got += data
    except OSError:
        pass
    open(out, "w").write(str(len(got)))
""")


def test_hook_does_not_trust_a_socket_another_user_serves(
    secure_node: Node, users: dict[str, pwd.struct_passwd]  # noqa: F811
) -> None:
    nd, condor, carol = secure_node, users[SERVICE_ACCOUNT], users["jscarol"]
    path = f"/tmp/jobstore-fake-{uuid.uuid4().hex[:8]}.sock"
    out = nd.base / "fake-received"
    out.touch()
    os.chmod(out, 0o666)
    fake = subprocess.Popen([sys.executable, "-c", FAKE_AGENT, path, str(out)],
                            stdout=subprocess.PIPE, user=carol.pw_uid, group=carol.pw_gid,
                            extra_groups=[], env={"PYTHONPATH": str(Path(__file__).parents[2])})
    try:
        assert fake.stdout is not None and fake.stdout.readline() == b"ready\n"
        got = nd.hook("fetch_job", slot_ad("slot1@node01"), user=condor,
                        JOBSTORE_AGENT_SOCKET=path, JOBSTORE_HOOK_MODE="agent")
        assert got.stdout == b""
        assert f"served by uid {carol.pw_uid}".encode() in got.stderr
        fake.wait(WAIT)
        assert out.read_text() == "0"  # not one byte of the slot ad was sent to carol
    finally:
        fake.kill()
        fake.wait()
        if os.path.exists(path):
            os.unlink(path)


# ---- 4. condor's hooks are served first -----------------------------------------------------


FLOOD = Path(__file__).resolve().parents[1] / "support" / "agent_flood.py"


def test_other_users_cannot_crowd_out_the_startd(
    secure_node: Node, store: JobStore, users: dict[str, pwd.struct_passwd]  # noqa: F811
) -> None:
    """Four ordinary users hold 40 idle connections each and one sends 16 requests of 4 MB:
    condor's FETCH_WORK is still served (no "busy", no fallback), and the agent's log says
    so in a few lines, not one per refused connection."""
    nd, condor = secure_node, users[SERVICE_ACCOUNT]
    with open(nd.config, "a") as fh:
        fh.write("JOBSTORE_AGENT_READ_TIMEOUT = 30\n")
    (job_id,) = submit_jobs(store, 1, users[JOB_USERS[0]].pw_name)
    nd.start()
    floods = []
    try:
        for i, name in enumerate(FLOOD_USERS):
            u = users[name]
            floods.append(subprocess.Popen(
                [sys.executable, str(FLOOD), nd.socket, "40", "16" if i == 0 else "0", "1"],
                stdout=subprocess.PIPE, user=u.pw_uid, group=u.pw_gid, extra_groups=[],
                env={"PYTHONPATH": str(Path(__file__).parents[2])}))
        for p in floods:
            assert p.stdout is not None and p.stdout.readline() == b"flooding\n"
        got = nd.hook("fetch_job", slot_ad("slot1@node01"), user=condor,
                        JOBSTORE_HOOK_MODE="agent")
        assert b"JobstoreJobId = %d" % job_id in got.stdout, got.stderr
        assert got.stderr == b""
    finally:
        for p in floods:
            p.kill()
            p.wait()
    log = nd.log.read_text()
    busy = [ln for ln in log.splitlines() if "too many connections" in ln]
    assert 1 <= len(busy) <= len(FLOOD_USERS), busy
    assert nd.agent is not None and nd.agent.poll() is None


# ---- 5. the hook log works for every account ------------------------------------------------


def test_job_users_calls_reach_the_hook_log(
    secure_node: Node, store: JobStore, users: dict[str, pwd.struct_passwd]  # noqa: F811
) -> None:
    """condor's hook log is 0644: the agent writes the lines of the calls it serves, alice's
    starter hooks included, marked with the caller's uid."""
    nd, alice = secure_node, users[JOB_USERS[0]]
    nd.start()
    job_id, job = accepted_job(nd, store, alice.pw_name)
    done = nd.hook("job_exit", job + ENDED, ["exit"], user=alice, JOBSTORE_HOOK_MODE="agent")
    assert done.returncode == 0 and done.stderr == b""
    text = (nd.base / "log" / "JobstoreHookLog").read_text()
    mine = [ln for ln in text.splitlines() if f"(agent, uid {alice.pw_uid})" in ln]
    row = store.reads.get_job(job_id)
    name = f"job {row.cluster_id}.{row.proc_id} "  # as condor_q numbers it
    assert any(name in ln and "exit" in ln for ln in mine), text
    assert "hooks-pw" not in text and "JobstoreToken" not in text
    condor_lines = [ln for ln in text.splitlines() if "fetched job" in ln]
    assert condor_lines, text

