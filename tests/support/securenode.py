"""A node set up as the README says, for the attacks by local accounts: the accounts (`users`),
the node (`secure_node`: the agent connects as a least-privilege role, the spool lies in a
sticky, world-writable directory), the job store as its owner (`store`), and jobs through it
(`accepted_job`, `exit_spooled`, `spooled`, `write_as`)."""

from __future__ import annotations

import os
import pwd
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from agentnode import Node
from emulatornode import JOB_USERS, SERVICE_ACCOUNT, ensure_home_account
from hookseq import slot_ad, submit_jobs
from sqlalchemy.engine import make_url

from jobstore.db.store import JobStore
from jobstore.node import spool
from jobstore.testing.support import libpq_url

FLOOD_USERS = (*JOB_USERS, "jscarol", "jsdave")
ENDED = b"ExitCode = 0\nExitBySignal = false\n"


@pytest.fixture
def users() -> dict[str, pwd.struct_passwd]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create accounts and act as them")
    names = (SERVICE_ACCOUNT, *FLOOD_USERS)
    return {name: ensure_home_account(name) for name in names}


@pytest.fixture
def secure_node(node: Node, users: dict[str, pwd.struct_passwd]) -> Iterator[Node]:
    """A node set up as the README says: the agent (root) connects as a least-privilege role
    whose password only root can read; condor runs the startd's hooks; the spool lies in a
    sticky, world-writable directory (as /var/tmp is); condor's hook log is 0644."""
    condor = users[SERVICE_ACCOUNT]
    admin = libpq_url(node.db_url)
    role = f"jobstore_hooks_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'hooks-pw'")
    owner = JobStore.from_url(node.db_url)
    owner.db.backend.roles().grant_hook(role)
    owner.db.engine.dispose()
    secret = node.base / "db-password"
    secret.write_text("hooks-pw\n")
    os.chmod(secret, 0o600)
    shared = node.base / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    node.spool = shared / "spool"
    hook_log = node.base / "log" / "JobstoreHookLog"
    hook_log.write_text("")
    shutil.chown(hook_log, condor.pw_name)
    os.chmod(hook_log, 0o644)
    with open(node.config, "a") as fh:
        fh.write(f"JOBSTORE_AGENT_STARTD_USERS = {condor.pw_name}\n"
                 f"JOBSTORE_DATABASE_PASSWORD_FILE = {secret}\n"
                 f"JOBSTORE_HOOK_LOG = {hook_log}\n")
    owner_url = node.db_url
    node.owner_url = owner_url  # type: ignore[attr-defined]
    node.db_url = make_url(owner_url).set(username=role).render_as_string(hide_password=False)
    try:
        yield node
    finally:
        if node.agent is not None:
            node.agent.kill()
            node.agent.wait()
            node.agent = None
        node.db_url = owner_url
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
        with psycopg.connect(libpq_url(make_url(owner_url).set(database="postgres")
                                       .render_as_string(hide_password=False)),
                             autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


@pytest.fixture
def store(secure_node: Node) -> Iterator[JobStore]:
    """The job store as its owner (submit, and what the tests look at)."""
    s = JobStore.from_url(secure_node.owner_url)  # type: ignore[attr-defined]
    yield s
    s.db.engine.dispose()


def accepted_job(nd: Node, js: JobStore, owner: str, slot: str = "slot1@node01"
                  ) -> tuple[int, bytes]:
    """A job of `owner`, fetched and accepted by condor through the agent."""
    condor = pwd.getpwnam(SERVICE_ACCOUNT)
    (job_id,) = submit_jobs(js, 1, owner)
    sad = slot_ad(slot)
    job = nd.hook("fetch_job", sad, user=condor, JOBSTORE_HOOK_MODE="agent").stdout
    assert b"JobstoreJobId = %d" % job_id in job
    nd.hook("reply_fetch", job + b"-----\n" + sad, ["accept"], user=condor)
    assert js.reads.get_job(job_id).status == "accepted"
    return job_id, job


def exit_spooled(nd: Node, js: JobStore, owner: pwd.struct_passwd) -> tuple[int, Path]:
    """A job of `owner` accepted through the agent, whose JOB_EXIT came while the agent was
    stopped: its id and the one report the spool holds."""
    nd.start()
    job_id, job = accepted_job(nd, js, owner.pw_name)
    assert nd.stop() == 0
    nd.hook("job_exit", job + ENDED, ["exit"], user=owner)
    (report,) = spooled(nd)
    return job_id, report


def spooled(nd: Node) -> list[Path]:
    assert nd.spool is not None
    return sorted(p for p in nd.spool.iterdir() if p.name.endswith(spool.SUFFIX))


def write_as(path: Path, data: bytes, user: pwd.struct_passwd) -> None:
    """A file `user` wrote (made by root, then given to her: the same bytes and owner)."""
    path.write_bytes(data)
    os.chown(path, user.pw_uid, user.pw_gid)
    os.chmod(path, 0o600)
