"""A PostgreSQL job store with one role per part (`Pool`, the `pool` fixture): two submitters
(ALICE, BOB), a portal that may submit for ALICE and CAROL, a plain super user, an admin and an
agent; `submitted` queues a job as one of them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from sqlalchemy.engine import make_url

from jobstore.core.jobs import JobSpec
from jobstore.db.backends import UserRights
from jobstore.db.engine import upgrade
from jobstore.db.store import JobStore
from jobstore.testing.support import libpq_url

SPEC = [JobSpec(cmd="/bin/true")]
# OS accounts of the submitters (created as root; elsewhere only names the database maps to)
ALICE, BOB, CAROL = "jsalice", "jsbob", "jscarol"


@dataclass
class Pool:
    """A job store with its owner's URL and one role per part: two submitters, a portal (a
    queue super user that may submit for ALICE and CAROL), a plain super user, an admin and an
    agent."""

    owner_url: str
    roles: dict[str, str]  # part -> role name

    def url(self, part: str) -> str:
        return make_url(self.owner_url).set(username=self.roles[part]).render_as_string(
            hide_password=False)

    def store(self, part: str) -> JobStore:
        return JobStore.from_url(self.url(part))


@pytest.fixture
def pool(db_url: str) -> Iterator[Pool]:
    upgrade(db_url)
    suffix = uuid.uuid4().hex[:8]
    roles = {part: f"js_{part}_{suffix}"
             for part in ("alice", "bob", "portal", "super", "admin", "agent")}
    admin = libpq_url(make_url(db_url).set(database="postgres").render_as_string(False))
    with psycopg.connect(admin, autocommit=True) as conn:
        for role in roles.values():
            conn.execute(f"CREATE ROLE {role} LOGIN")
    owner = JobStore.from_url(db_url)
    granted = owner.db.backend.roles()
    granted.grant_user(roles["alice"], UserRights(account=ALICE))
    granted.grant_user(roles["bob"], UserRights(account=BOB))
    granted.grant_user(roles["portal"], UserRights(
        super_user=True, may_impersonate=f"{ALICE}|{CAROL}"))
    granted.grant_user(roles["super"], UserRights(super_user=True))
    granted.grant_user(roles["admin"], UserRights(admin=True))
    granted.grant_hook(roles["agent"])
    owner.db.engine.dispose()
    try:
        yield Pool(db_url, roles)
    finally:
        with psycopg.connect(libpq_url(db_url), autocommit=True) as conn:
            for role in roles.values():
                conn.execute(f"DROP OWNED BY {role}")
        with psycopg.connect(admin, autocommit=True) as conn:
            for role in roles.values():
                conn.execute(f"DROP ROLE IF EXISTS {role}")


def submitted(pool: Pool, part: str, owner: str | None = None) -> int:
    store = pool.store(part)
    try:
        who = owner or store.db.identity().account
        _, (job_id,) = store.submissions.submit(SPEC, owner=who, queue="default", max_attempts=3)
        return job_id
    finally:
        store.db.engine.dispose()
