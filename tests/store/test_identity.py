"""Who may do what, decided by the database: a job's owner is the account of the role
that submitted it, only she or a queue super user may act on it, a portal submits only for the
accounts its rule allows, userprio changes need the admin role. Real PostgreSQL roles made per
test; as root, the CLI runs as separate OS accounts too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import clirun
import psycopg
import pytest
from rolepool import ALICE, BOB, CAROL, SPEC, Pool, pool, submitted  # noqa: F401 - the pool fixture
from sqlalchemy import select, update
from sqlalchemy.engine import make_url

from jobstore.core.states import Event
from jobstore.db.engine import upgrade
from jobstore.db.eventcursors import EventCursor
from jobstore.db.schema import clusters, job_events, jobs
from jobstore.db.store import JobStore, SlotRow
from jobstore.errors import NotOwner, Refused
from jobstore.testing.factories import claim, claim_request, report
from jobstore.testing.support import ensure_account, libpq_url

pytestmark = pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)

JOBSTORE = [sys.executable, "-m", "jobstore.cli"]
REQ = claim_request(claim_lease=120, shape="s")  # the agent's fetch


@pytest.fixture
def owner(pool: Pool) -> Iterator[JobStore]:  # noqa: F811
    s = JobStore.from_url(pool.owner_url)
    yield s
    s.db.engine.dispose()


def _snapshot(store: JobStore) -> tuple[list[tuple], list[tuple], int]:
    """Every cluster, every job's owner, command, ad and status, and the number of events."""
    with store.db.engine.connect() as conn:
        cl = [tuple(r) for r in conn.execute(select(clusters.c.id, clusters.c.owner)
                                             .order_by(clusters.c.id))]
        jb = [tuple(r) for r in conn.execute(select(jobs.c.id, jobs.c.owner, jobs.c.cmd,
                                                    jobs.c.ad, jobs.c.status)
                                             .order_by(jobs.c.id))]
        ev = len(conn.execute(select(job_events.c.id)).all())
    return cl, jb, ev


def _cli(pool: Pool, part: str, *args: str, account: str | None = None  # noqa: F811
         ) -> subprocess.CompletedProcess:
    """`jobstore` with `part`'s role; as root, run as the OS account `account` as well."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "JOBSTORE_"))}
    kwargs: dict = {}
    if account is not None and os.geteuid() == 0:
        user = ensure_account(account, home=True)
        kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": [],
                  "cwd": user.pw_dir}
        env["HOME"] = user.pw_dir
    return clirun.run([*JOBSTORE, "--db", pool.url(part), *args], capture_output=True,
                      text=True, timeout=120, env=env, **kwargs)


def _users_file(account: str, tmp_path: Path, name: str, text: str) -> Path:
    """A file of `account`'s, in her home as root (tmp_path elsewhere)."""
    if os.geteuid() != 0:
        path = tmp_path / name
        path.write_text(text)
        return path
    user = ensure_account(account, home=True)
    path = Path(user.pw_dir) / name
    path.write_text(text)
    os.chown(path, user.pw_uid, user.pw_gid)
    return path


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_the_owner_is_the_account_the_database_says(pool: Pool, owner: JobStore) -> None:  # noqa: F811
    alice = pool.store("alice")
    try:
        assert alice.db.identity().account == ALICE and not alice.db.identity().super_user
        from jobstore.api.schedd import Schedd

        result = Schedd(store=alice).submit({"executable": "/bin/true"})
        assert result.clusterad()["Owner"] == ALICE
        (job,) = owner.reads.list_jobs()
        assert job.owner == ALICE and job.cluster_id == result.cluster()
    finally:
        alice.db.engine.dispose()


def test_owner_spoofing_is_refused_by_every_route(pool: Pool, owner: JobStore,  # noqa: F811
                                                  tmp_path: Path) -> None:
    from jobstore.api.schedd import Schedd

    bob_job = submitted(pool, "bob")
    before = _snapshot(owner)
    alice = pool.store("alice")
    try:
        with pytest.raises(Refused, match=f"may not submit jobs as {BOB}"):
            alice.submissions.submit(SPEC, owner=BOB, queue="default", max_attempts=3)
        with pytest.raises(Refused, match=f"{ALICE} may not submit jobs as {BOB}"):
            Schedd(store=alice, owner=BOB).submit({"executable": "/bin/true"})
        # a key is its owner's: bob's cluster under "k1" is never hers, nor hers his
        bob = pool.store("bob")
        bobs = bob.submissions.submit(SPEC, owner=BOB, queue="default", max_attempts=3,
                                      idempotency_key="k1")
        bob.db.engine.dispose()
        hers = alice.submissions.submit(SPEC, owner=ALICE, queue="default", max_attempts=3,
                                        idempotency_key="k1")
        assert hers[0] != bobs[0] and owner.reads.get_job(hers[1][0]).owner == ALICE
        assert owner.reads.get_job(bobs[1][0]).owner == BOB
        before = _snapshot(owner)
    finally:
        alice.db.engine.dispose()
    sub = _users_file(ALICE, tmp_path, "job.sub", "executable = /bin/true\nqueue\n")
    r = _cli(pool, "alice", "submit", str(sub), "--owner", BOB, account=ALICE)
    assert r.returncode == 1 and f"may not submit jobs as {BOB}" in _one_line(r.stderr)
    assert _snapshot(owner) == before
    # raw SQL with her credentials
    alice_sql = libpq_url(pool.url("alice"))
    attempts = [
        f"INSERT INTO clusters (owner, queue, num_procs, submitted_at) VALUES ('{BOB}', 'q', 1, 0)",
        f"UPDATE jobs SET owner = '{ALICE}' WHERE id = {bob_job}",
        f"INSERT INTO job_events (job_id, time, event, attempt) VALUES ({bob_job}, 0, 'hold', 0)",
        "UPDATE submitters SET factor = 10000",
        f"INSERT INTO queue_roles (role, super_user) VALUES ('{pool.roles['alice']}', true)",
        f"DELETE FROM jobs WHERE id = {bob_job}",
        "COPY jobs (owner) FROM STDIN",
        "SELECT jobstore_may_submit_as('x')",  # harmless: a function that only answers
    ]
    refused = 0
    with psycopg.connect(alice_sql, autocommit=True) as conn:
        for sql in attempts[:-1]:
            with pytest.raises(psycopg.Error):
                conn.execute(sql)
            refused += 1
        assert conn.execute(attempts[-1]).fetchone() == (False,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # not even her own
            conn.execute(f"UPDATE jobs SET cmd = '/tmp/evil.sh' WHERE id = {bob_job}")
    assert refused == len(attempts) - 1
    assert _snapshot(owner) == before


def test_a_submitter_cannot_forge_what_the_agent_trusts(pool: Pool, owner: JobStore) -> None:  # noqa: F811
    """Her own rows may not look like a running attempt on some slot (an agent would vacate
    that slot), nor carry a priority factor, nor stand for another's autocluster."""
    from jobstore.core.autoclusters import signature
    from jobstore.core.jobs import Job

    alice_job = submitted(pool, "alice")
    job = owner.reads.get_job(alice_job)
    before = _snapshot(owner)
    bob_sig = signature(Job.queued(SPEC[0], id=0, cluster_id=0, owner=BOB, queue="default",
                                   ad=job.ad, max_attempts=3, now=0.0))
    attempts = [
        f"UPDATE jobs SET status = 'running' WHERE id = {alice_job}",
        f"UPDATE jobs SET winding_down_until = 1e12 WHERE id = {alice_job}",
        f"UPDATE jobs SET lease_expires_at = 1e12 WHERE id = {alice_job}",
        "INSERT INTO jobs (cluster_id, proc_id, queue, status, owner, ad, cmd, request_cpus,"
        " request_memory, request_disk, max_attempts, submitted_at, updated_at, slot, host)"
        f" SELECT cluster_id, 7, queue, 'running', owner, ad, cmd, 1, 1, 1, 1, 0, 0,"
        f" 'slot1@n', 'n' FROM jobs WHERE id = {alice_job}",
        f"INSERT INTO submitters (name, factor, updated_at) VALUES ('{BOB}@x', 1e6, 0)",
        # where an access point's service stands in the events, and what it delivered
        "INSERT INTO event_cursors (name, high, updated_at) VALUES ('userlog:ap1', 1e9, 0)",
        "SELECT * FROM event_cursors",
        "INSERT INTO dagman_logs (dag_id, written, updated_at) VALUES (1, 2, 0)",
        "SELECT * FROM deliveries",
    ]
    with psycopg.connect(libpq_url(pool.url("alice")), autocommit=True) as conn:
        for sql in attempts:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)
        # an autocluster under bob's signature is hers (the door makes it as hers), and bob's
        # jobs never join it
        conn.execute("SELECT jobstore_queue_jobs(%s, %s, 0)", (job.cluster_id, json.dumps([{
            "proc_id": 1, "ad": job.ad, "cmd": "/bin/true", "request_cpus": 9999,
            "request_memory": 1, "request_disk": 1, "max_attempts": 1,
            "signature": bob_sig}])))
    alice_ac = owner.reads.find_jobs(job.cluster_id, 1)[0].autocluster_id
    assert _snapshot(owner)[:2] != before[:2]  # her new job
    bob_job = submitted(pool, "bob")
    with owner.db.engine.connect() as conn:
        from jobstore.db.schema import autoclusters

        row = conn.execute(select(autoclusters.c.owner, autoclusters.c.request_cpus,
                                  autoclusters.c.signature)
                           .where(autoclusters.c.id == owner.reads.get_job(bob_job).autocluster_id)
                           ).one()
    assert tuple(row) == (BOB, 1, bob_sig)  # the signature she used, and still his own row
    assert owner.reads.get_job(bob_job).autocluster_id != alice_ac


def test_only_the_owner_or_a_super_user_acts_on_a_job(pool: Pool, owner: JobStore) -> None:  # noqa: F811
    bob_job = submitted(pool, "bob")
    alice, bob, sup = pool.store("alice"), pool.store("bob"), pool.store("super")
    try:
        before = _snapshot(owner)
        for event in (Event.HOLD, Event.REMOVE, Event.RELEASE):
            with pytest.raises(NotOwner, match=f"{ALICE} may not {event} job {bob_job}"):
                alice.actions.admin(bob_job, event, "mine now")
        with pytest.raises(NotOwner, match="may not edit"):
            alice.actions.edit(bob_job, "Cmd", '"/tmp/evil.sh"')
        for args in (("hold", str(bob_job)), ("rm", str(bob_job)), ("release", str(bob_job)),
                     ("qedit", str(bob_job), "Cmd", '"/tmp/evil.sh"')):
            r = _cli(pool, "alice", *args, account=ALICE)
            assert r.returncode == 1, r
            assert "not its owner" in _one_line(r.stderr)
        assert _snapshot(owner) == before
        # the owner and a super user may
        assert bob.actions.edit(bob_job, "Cmd", '"/bin/false"')
        assert bob.actions.admin(bob_job, Event.HOLD, "mine").after == "held"
        assert sup.actions.admin(bob_job, Event.RELEASE, "the admin's").after == "idle"
        r = _cli(pool, "super", "rm", str(bob_job))
        assert r.returncode == 0, r.stderr
        assert owner.reads.get_job(bob_job).status == "removed"
        assert "/bin/false" in str(owner.reads.get_job(bob_job).ad.get("Cmd"))
    finally:
        for s in (alice, bob, sup):
            s.db.engine.dispose()


def test_a_running_job_of_another_is_left_running(pool: Pool, owner: JobStore) -> None:  # noqa: F811
    """The probe's attack: alice holds bob's running job. Refused; bob's own hold stops it."""
    bob_job = submitted(pool, "bob")
    agent = pool.store("agent")
    alice, bob = pool.store("alice"), pool.store("bob")
    try:
        job = claim(agent, REQ)
        assert job is not None and job.id == bob_job
        report(agent, job, Event.ACCEPT, lease=120)
        with pytest.raises(NotOwner):
            alice.actions.admin(bob_job, Event.HOLD, "no")
        assert owner.reads.get_job(bob_job).status == "accepted"
        assert bob.actions.admin(bob_job, Event.HOLD, "mine").after == "held"
        assert owner.reads.get_job(bob_job).winding_down_until is not None
    finally:
        for s in (agent, alice, bob):
            s.db.engine.dispose()


def test_a_portal_submits_only_for_the_accounts_its_rule_allows(pool: Pool,  # noqa: F811
                                                                 owner: JobStore) -> None:
    portal, sup = pool.store("portal"), pool.store("super")
    try:
        for who in (ALICE, CAROL):
            _, (job_id,) = portal.submissions.submit(SPEC, owner=who, queue="default",
                                                     max_attempts=3)
            assert owner.reads.get_job(job_id).owner == who
        before = _snapshot(owner)
        for who in (BOB, f"{ALICE}x", f"x{ALICE}"):  # the rule matches whole names only
            with pytest.raises(Refused, match=f"may not submit jobs as {who}"):
                portal.submissions.submit(SPEC, owner=who, queue="default", max_attempts=3)
        with pytest.raises(Refused):  # a super user with no rule impersonates nobody
            sup.submissions.submit(SPEC, owner=ALICE, queue="default", max_attempts=3)
        assert _snapshot(owner) == before
    finally:
        portal.db.engine.dispose()
        sup.db.engine.dispose()


def test_userprio_changes_need_the_admin_role(pool: Pool, owner: JobStore) -> None:  # noqa: F811
    submitted(pool, "bob")
    (row, _), = owner.negotiator.usage_table()
    for part in ("alice", "super"):
        r = _cli(pool, part, "userprio", "-setfactor", row.name, "10000")
        assert r.returncode == 1
        assert "needs the job store's admin role" in _one_line(r.stderr)
    assert owner.negotiator.usage_table()[0][0].factor == 1
    r = _cli(pool, "admin", "userprio", "-setfactor", row.name, "10")
    assert r.returncode == 0, r.stderr
    assert owner.negotiator.usage_table()[0][0].factor == 10


def test_everyone_reads_the_queue(pool: Pool) -> None:  # noqa: F811
    """Reads stay open to every submitter, as condor_q's are."""
    submitted(pool, "bob")
    submitted(pool, "alice")
    r = _cli(pool, "alice", "q", "-af", "Owner", account=ALICE)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == sorted([ALICE, BOB])


def test_grant_user_from_the_cli(pool: Pool, owner: JobStore) -> None:  # noqa: F811
    role = f"js_dave_{uuid.uuid4().hex[:8]}"
    admin = libpq_url(make_url(pool.owner_url).set(database="postgres").render_as_string(False))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        r = clirun.run([*JOBSTORE, "--db", pool.owner_url, "grant-user", role, "--account",
                            "jsdave"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "GRANT EXECUTE ON FUNCTION jobstore_new_cluster" in r.stdout
        assert "GRANT INSERT" not in r.stdout and "GRANT UPDATE" not in r.stdout
        dave = JobStore.from_url(make_url(pool.owner_url).set(username=role)
                                 .render_as_string(False))
        try:
            assert dave.db.identity().account == "jsdave"
            _, (job_id,) = dave.submissions.submit(SPEC, owner="jsdave", queue="default",
                                                   max_attempts=3)
        finally:
            dave.db.engine.dispose()
        assert owner.reads.get_job(job_id).owner == "jsdave"
        r = clirun.run([*JOBSTORE, "--db", pool.owner_url, "grant-user", role,
                            "--may-impersonate", "x"], capture_output=True, text=True,
                       timeout=60)
        assert r.returncode == 1 and "--super-user" in _one_line(r.stderr)
        r = clirun.run([*JOBSTORE, "--db", pool.owner_url, "grant-user", role,
                            "--super-user", "--may-impersonate", "(?P<name>a)"],
                       capture_output=True, text=True, timeout=60)  # Python's, not PG's
        assert r.returncode == 1
        assert "not one regular expression PostgreSQL takes" in _one_line(r.stderr)
        r = clirun.run([*JOBSTORE, "--db", pool.owner_url, "revoke-user", role],
                       capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        dave = JobStore.from_url(make_url(pool.owner_url).set(username=role)
                                 .render_as_string(False))
        try:
            with pytest.raises(Refused, match="may not submit jobs to this job store"):
                dave.submissions.submit(SPEC, owner="jsdave", queue="default", max_attempts=3)
        finally:
            dave.db.engine.dispose()
    finally:
        with psycopg.connect(libpq_url(pool.owner_url), autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


@pytest.mark.empty_database
def test_an_agent_role_granted_before_the_migration_keeps_working(db_url: str) -> None:
    """Migrations 0012, 0014, 0015, 0022, 0023 and 0029 give the roles that held the agent's
    grants their policies, the slots table, the sandbox files, the deliveries, the event
    cursors and the vacate requests."""
    upgrade(db_url, "0011")
    role = f"js_old_agent_{uuid.uuid4().hex[:8]}"
    admin = libpq_url(make_url(db_url).set(database="postgres").render_as_string(False))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        owner = JobStore.from_url(db_url)
        new = ("ON slots", "sandbox_", "job_files", "{files_sequence}", "None", "store_limits",
               " dags", "ON dag_", "jobstore_dag_", "job_attr_rules", "notify_keys", "deliveries",
               "event_cursors", "vacate_requests")
        old = [s.replace(", slots", "") for s in owner.db.backend.roles().hook_statements(role)
               if "POLICY" not in s and not any(n in s for n in new)]  # as granted before 0012
        with owner.db.engine.begin() as conn:
            from sqlalchemy import text

            for sql in old:
                conn.execute(text(sql))
        upgrade(db_url)
        _, (job_id,) = owner.submissions.submit(SPEC, owner=ALICE, queue="default", max_attempts=3)
        agent = JobStore.from_url(make_url(db_url).set(username=role).render_as_string(False))
        job = claim(agent, REQ)
        assert job is not None and job.id == job_id
        assert report(agent, job, Event.ACCEPT, lease=120).after == "accepted"
        owner.actions.act_where(jobs.c.id == job_id, Event.VACATE, "vacated")
        assert agent.reads.attempt_states([job_id])[job_id].vacate == "graceful"
        with agent.db.engine.begin() as conn, pytest.raises(Exception, match="permission denied"):
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(owner="x"))
        agent.slots.publish_slots([SlotRow("slot1@n", "n", 'Name = "slot1@n"', 1.0, 2.0)])
        assert agent.files.job_files_of(job) == []
        assert list(agent.files.file_content(ALICE, "0" * 64)) == []
        assert [r.name for r in agent.slots.live_slots(now=1.5)] == ["slot1@n"]
        assert agent.deliveries.take(job, "ap1", 1.0, 60.0)
        assert agent.deliveries.of([job_id])[job_id].home == "ap1"
        agent.event_cursors.save("userlog:ap1", EventCursor(7, {5: None}), 1.0)
        assert agent.event_cursors.get("userlog:ap1") == EventCursor(7, {5: None})
        agent.event_logs.dag_logged(12345, 1, 1.0)
        agent.db.engine.dispose()
        owner.db.engine.dispose()
    finally:
        with psycopg.connect(libpq_url(db_url), autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")



def test_the_database_refuses_inputs_over_the_store_limits(pool: Pool, owner: JobStore) -> None:  # noqa: F811
    """A submitter's client that skips the store's check cannot store more than the limits
    (migration 0016's triggers, through the door's functions): a file over
    max_input_file_mb, a job's inputs over max_input_mb, bytes beyond their file's declared
    size; the agent may store a larger output. Her raw INSERTs are refused outright."""
    owner.files.set_input_limits({"max_input_file_mb": 1, "max_input_mb": 2})
    cluster = owner.reads.get_job(submitted(pool, "alice")).cluster_id
    sha = "a" * 64
    refused = [
        f"SELECT jobstore_store_file('{ALICE}', '{sha}', 2097152)",
        f"SELECT jobstore_store_chunk('{ALICE}', '{'b' * 64}', 0, 'x')",  # no such file
    ]
    with psycopg.connect(libpq_url(pool.url("alice")), autocommit=True) as conn:
        for sql in refused:
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(sql)
        for sql in (f"INSERT INTO sandbox_files VALUES ('{ALICE}', '{sha}', 3, 0)",
                    f"INSERT INTO sandbox_chunks VALUES ('{ALICE}', '{sha}', 0, 'abc')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)
        conn.execute(f"SELECT jobstore_store_file('{ALICE}', '{sha}', 3)")
        with pytest.raises(psycopg.errors.CheckViolation):  # 4 bytes of a 3-byte file
            conn.execute(f"SELECT jobstore_store_chunk('{ALICE}', '{sha}', 0, 'abcd')")
        conn.execute(f"SELECT jobstore_store_chunk('{ALICE}', '{sha}', 0, 'abc')")
        big = "d" * 64
        with conn.transaction():
            conn.execute(f"SELECT jobstore_store_file('{ALICE}', '{big}', 1048576)")
        with pytest.raises(psycopg.errors.CheckViolation):  # 3 x 1 MB over the job's 2 MB
            conn.execute("SELECT jobstore_add_inputs(%s, NULL, %s)", (cluster, json.dumps(
                [{"name": n, "sha256": big, "mode": 420} for n in ("a", "b", "c")])))
    with psycopg.connect(libpq_url(pool.url("agent")), autocommit=True) as conn:
        conn.execute(f"INSERT INTO sandbox_files VALUES ('{ALICE}', '{'c' * 64}', 2097152, 0)")


@pytest.mark.empty_database
def test_a_submitters_role_granted_before_0015_loses_the_agents_file_policies(
        db_url: str) -> None:
    """0015 took every role that may update jobs.status for an agent's, so a submitter's role
    (hold, release and rm update it) granted before it could read every owner's files; 0016
    takes that back and leaves an agent's role its policies."""
    upgrade(db_url, "0014")
    suffix = uuid.uuid4().hex[:8]
    user, agent = f"js_old_user_{suffix}", f"js_old_agent_{suffix}"
    admin = libpq_url(make_url(db_url).set(database="postgres").render_as_string(False))
    with psycopg.connect(admin, autocommit=True) as conn:
        for role in (user, agent):
            conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        with psycopg.connect(libpq_url(db_url), autocommit=True) as conn:
            conn.execute(f"GRANT UPDATE (status) ON jobs TO {user}")
            conn.execute(f"GRANT UPDATE (status, slot) ON jobs TO {agent}")
        upgrade(db_url, "0015")

        def policies(role: str) -> int:
            with psycopg.connect(libpq_url(db_url)) as conn:
                return conn.execute(
                    "SELECT count(*) FROM pg_policies WHERE %s = ANY (roles) AND tablename IN"
                    " ('sandbox_files', 'sandbox_chunks', 'job_files')",
                    (role,)).fetchone()[0]  # type: ignore[index]

        assert (policies(user), policies(agent)) == (3, 3)  # what 0015 did
        upgrade(db_url)
        assert (policies(user), policies(agent)) == (0, 3)
        with psycopg.connect(libpq_url(db_url)) as conn:
            may_delete = conn.execute("SELECT has_table_privilege(%s, 'sandbox_chunks', "
                                      "'DELETE')", (user,)).fetchone()[0]  # type: ignore[index]
        assert may_delete is False
    finally:
        with psycopg.connect(libpq_url(db_url), autocommit=True) as conn:
            for role in (user, agent):
                conn.execute(f"DROP OWNED BY {role}")
        with psycopg.connect(admin, autocommit=True) as conn:
            for role in (user, agent):
                conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_a_submitters_dag_is_carried_forward_by_the_agents_role(pool: Pool, owner: JobStore,  # noqa: F811
                                                                tmp_path: Path) -> None:
    """With the grants of `jobstore grant-user` and `jobstore grant` only: a submitter queues
    a DAG, the agent's role runs its nodes and releases their children as their parents end,
    and the submitter removes what is left; another submitter sees none of it."""
    from jobstore.api.dags import submit_dag
    from jobstore.node import config

    (tmp_path / "n.sub").write_text("executable = /bin/true\nqueue\n")
    (tmp_path / "chain.dag").write_text("JOB A n.sub\nJOB B n.sub\nJOB C n.sub\n"
                                        "PARENT A CHILD B\nPARENT B CHILD C\n")
    alice, agent, bob = pool.store("alice"), pool.store("agent"), pool.store("bob")
    try:
        settings = config.load_settings(None, pool.url("alice"))
        dag_id = submit_dag(alice, str(tmp_path / "chain.dag"), settings).dag_id
        for _ in range(2):  # A, then B: each end releases the next
            job = claim(agent, REQ)
            assert job is not None and job.owner == ALICE
            report(agent, job, Event.EXIT, changes={"exit_code": 0, "exit_by_signal": False})
        assert {n.name: n.status for n in alice.dags.dag_nodes_of(dag_id)} == {
            "A": "done", "B": "done", "C": "queued"}
        assert bob.dags.dag_of(dag_id) is None and bob.dags.dag_nodes_of(dag_id) == []
        with pytest.raises(Refused, match="not its owner"):
            bob.dags.remove_dag(dag_id)
        assert alice.dags.remove_dag(dag_id)
        dag = owner.dags.dag_of(dag_id)
        assert dag is not None and dag.status == "removed"
    finally:
        for store in (alice, agent, bob):
            store.db.engine.dispose()
