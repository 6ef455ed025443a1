"""One door into the queue: on a PostgreSQL server of the tests' own with peer authentication,
each OS account connects as its own role and tries what a hostile submitter would, with raw
SQL and with the door's functions given hostile arguments: every write outside the door is
refused, every value the door stores is checked, and nothing changes. Needs root (OS accounts,
initdb as postgres)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import clirun
import psycopg
import pytest

from jobstore.core.jobs import Job, JobSpec
from jobstore.db.backends.postgresql.door import job_json
from jobstore.formats.jobads import submitted_ad
from jobstore.testing.peerpg import PeerServer, pg_bin
from jobstore.testing.support import ensure_account

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or pg_bin() is None,
                                reason="needs root and PostgreSQL's initdb")

OWNER, ALICE, BOB, AGENT, PORTAL = "jsowner", "jsalice", "jsbob", "jsagent", "jsportal"
SUBMITTERS = (ALICE, BOB, PORTAL)


@dataclass
class Door:
    """The server, and the job store on it as `jobstore init` and the grants left it."""

    server: PeerServer
    config: Path  # CONDOR_CONFIG of every account's commands

    def run(self, account: str, code: str) -> Any:
        """`code` (Python, ending in an expression printed as JSON by `out(...)`) run as the
        OS account `account`, connected to nothing but what it opens itself."""
        user = ensure_account(account, home=True)
        program = ("import json, os, psycopg\ndef out(v): print(json.dumps(v))\n"
                   + textwrap.dedent(code))
        done = subprocess.run([sys.executable, "-"], input=program, capture_output=True,
                              text=True, timeout=120, user=user.pw_uid, group=user.pw_gid,
                              extra_groups=[], cwd=user.pw_dir, env=self.env(account))
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    def cli(self, account: str, *args: str) -> subprocess.CompletedProcess[str]:
        """`jobstore` as the OS account `account` with its own role."""
        user = ensure_account(account, home=True)
        return clirun.run([sys.executable, "-m", "jobstore.cli", "--db",
                               self.server.url(account), *args], capture_output=True, text=True,
                          timeout=120, user=user.pw_uid, group=user.pw_gid, extra_groups=[],
                          cwd=user.pw_dir, env=self.env(account))

    def env(self, account: str) -> dict[str, str]:
        return {"PATH": "/usr/bin:/bin", "HOME": f"/home/{account}", "LANG": "C.UTF-8",
                "CONDOR_CONFIG": str(self.config), "JOBSTORE_DSN": self.server.libpq(account)}

    def owner_sql(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """A statement as the tables' owner (root connects as postgres, then SET ROLE)."""
        with psycopg.connect(self.server.libpq("postgres"), autocommit=True) as conn:
            conn.execute(f"SET ROLE {OWNER}")
            cur = conn.execute(sql, params)
            return list(cur.fetchall()) if cur.description else []


@pytest.fixture(scope="module")
def door() -> Iterator[Door]:
    for account in (OWNER, *SUBMITTERS):
        ensure_account(account, home=True)
    server = PeerServer(agent=AGENT)
    base = Path(tempfile.mkdtemp(prefix="jobstore-door-"))  # every account reads its config
    os.chmod(base, 0o755)
    config = base / "condor_config"
    config.write_text("UID_DOMAIN = localdomain\nSTARTD_JOB_HOOK_KEYWORD = JOBSTORE\n"
                      f"LOG = {base}\n")
    config.chmod(0o644)
    try:
        with psycopg.connect(server.libpq("postgres", "postgres"), autocommit=True) as conn:
            for role in (OWNER, *SUBMITTERS, AGENT):
                conn.execute(f"CREATE ROLE {role} LOGIN")
            conn.execute(f"CREATE DATABASE jobstore OWNER {OWNER}")
        d = Door(server, config)
        for args in (["init"], ["grant", AGENT], ["grant-user", ALICE, BOB],
                     ["grant-user", PORTAL, "--super-user", "--may-impersonate", ALICE],
                     ["grant-user", BOB, "--accounting-group", "physics"]):
            done = d.cli(OWNER, *args)
            assert done.returncode == 0, (args, done.stderr)
        yield d
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


def snapshot(door: Door) -> list[Any]:
    """Every row a submitter could have changed, as the owner reads it."""
    out: list[Any] = []
    for table in ("clusters", "jobs", "job_events", "autoclusters", "autocluster_limits",
                  "concurrency_limits", "submitters", "dags", "dag_nodes", "dag_edges",
                  "dag_categories", "sandbox_files", "sandbox_chunks", "job_files",
                  "queue_roles", "job_attr_rules", "accounting_groups", "store_limits",
                  "slots", "passes"):
        out.append(door.owner_sql(f"SELECT count(*), md5(coalesce(string_agg(t::text, ','"
                                  f" ORDER BY t::text), '')) FROM {table} t"))
    return out


def refusals(door: Door, account: str, calls: Sequence[tuple[str, str | None]],
             ) -> list[list[str] | None]:
    """Each statement (with its one parameter, if any) run as `account` in a session of its
    own: None where it ran, else [SQLSTATE, the message's first line]."""
    got = door.run(account, f"""
        found = []
        with psycopg.connect(os.environ["JOBSTORE_DSN"], autocommit=True) as conn:
            for sql, params in {calls!r}:
                try:
                    conn.execute(sql, (params,) if params is not None else None)
                    found.append(None)
                except psycopg.Error as exc:
                    found.append([exc.sqlstate, str(exc).splitlines()[0]])
        out(found)
        """)
    assert isinstance(got, list)
    return got


def submitted(door: Door, account: str, text: str = "executable = /bin/true\nqueue\n",
              ) -> list[int]:
    """Job ids a submit through the CLI as `account` queued."""
    sub = Path(f"/home/{account}/job.sub")
    sub.write_text(text)
    user = ensure_account(account)
    os.chown(sub, user.pw_uid, user.pw_gid)
    done = door.cli(account, "submit", str(sub))
    assert done.returncode == 0, done.stderr
    cluster = int(done.stdout.strip().rsplit(" ", 1)[-1].rstrip("."))
    return [int(r[0]) for r in door.owner_sql(
        "SELECT id FROM jobs WHERE cluster_id = %s ORDER BY proc_id", (cluster,))]


def test_a_submitter_writes_nothing_but_through_the_door(door: Door) -> None:
    """Raw SQL with her own credentials: INSERT, UPDATE, DELETE, TRUNCATE and COPY on every
    table, the sequences, the functions only the door's call, the attempt's token, the schema:
    each refused, nothing changed."""
    (bob_job,) = submitted(door, BOB)
    before = snapshot(door)
    attempts = [
        "INSERT INTO clusters (owner, queue, num_procs, submitted_at) VALUES ('jsalice', 'q', 1,"
        " 0)",
        f"UPDATE jobs SET ad = ad::jsonb || '{{\"OsUser\": \"{BOB}\"}}' WHERE id = {bob_job}",
        "UPDATE jobs SET submitter = 'jsbob' WHERE owner = 'jsalice'",
        f"DELETE FROM jobs WHERE id = {bob_job}",
        "TRUNCATE job_events",
        "COPY jobs (owner) FROM STDIN",
        "INSERT INTO job_events (job_id, time, event) VALUES (1, 0, 'hold')",
        "INSERT INTO dag_nodes (dag_id, name, owner, cluster_id, status, pending, updated_at)"
        f" VALUES (1, 'x', 'jsalice', {bob_job}, 'ready', 0, 0)",
        "INSERT INTO dag_edges (dag_id, parent, child, owner) VALUES (1, 'a', 'b', 'jsalice')",
        "INSERT INTO submitters (name, updated_at) VALUES ('jsalice', 0)",
        "UPDATE submitters SET factor = 1e6",
        "INSERT INTO autoclusters (signature, queue, owner, submitter, request_cpus,"
        " request_memory, request_disk, created_at) VALUES ('x', 'q', 'jsalice', 'jsalice', 1,"
        " 1, 1, 0)",
        "INSERT INTO autocluster_limits VALUES (1, 'lic', -100)",
        "INSERT INTO sandbox_files VALUES ('jsalice', repeat('a', 64), 1, 0)",
        "INSERT INTO queue_roles (role, super_user) VALUES ('jsalice', true)",
        "INSERT INTO job_attr_rules (name, rule) VALUES ('x', 'immutable')",
        "DELETE FROM job_attr_rules WHERE name = 'osuser'",
        "INSERT INTO accounting_groups VALUES ('jsalice', 'physics')",
        "UPDATE store_limits SET value = 1e9",
        "SELECT nextval(pg_get_serial_sequence('jobs', 'id'))",
        "SELECT token FROM jobs",
        "SELECT * FROM jobs",
        "SELECT jobstore_apply_act(ARRAY[1]::bigint[], 'remove', 'x', 1, 0, 0, 'acted')",
        "SELECT jobstore_dag_advance(1, 0)",
        "SELECT jobstore_autoclusters('jsbob', '[]', 0)",
        "SELECT jobstore_dag_jobs_ended(ARRAY[1]::bigint[], 0)",
        "SELECT jobstore_dag_script_start(1, 'A', 'pre', repeat('a', 32), 0)",
        "SELECT jobstore_dag_script_done(1, 'A', 'post', repeat('a', 32), 0, 0)",
        "UPDATE dag_nodes SET script_token = NULL, pre_script = 'x'",
        "UPDATE dag_nodes SET late_inputs = '[[\"/etc/shadow\", \"s\"]]'",
        "UPDATE dags SET status_file = '/etc/passwd'",
        "INSERT INTO dag_files VALUES (1, 0, true)",
        "CREATE TABLE jobstore_mine (x int)",
        "CREATE FUNCTION lower(text) RETURNS text LANGUAGE sql AS 'SELECT $1'",
    ]
    refused = door.run(ALICE, f"""
        refused = []
        with psycopg.connect(os.environ["JOBSTORE_DSN"], autocommit=True) as conn:
            for sql in {attempts!r}:
                try:
                    conn.execute(sql)
                    refused.append(None)
                except psycopg.errors.InsufficientPrivilege as exc:
                    refused.append(type(exc).__name__)
        out(refused)
        """)
    assert refused == ["InsufficientPrivilege"] * len(attempts), list(
        zip(attempts, refused, strict=False))
    assert snapshot(door) == before


def test_the_door_checks_every_value_it_stores(door: Door) -> None:
    """The door's functions, called by hand with hostile arguments: another's owner, a
    reserved attribute, an expression bomb, an ad too large, another's cluster, a fair-share
    account not granted, a placeholder in a name, a negative concurrency limit, another's job
    to act on or edit, an attribute the job store sets, condor_userprio without the admin
    role. Each refused in one line; nothing changed."""
    (bob_job,) = submitted(door, BOB)
    (alice_job,) = submitted(door, ALICE)
    bob_cluster = door.owner_sql("SELECT cluster_id FROM jobs WHERE id = %s", (bob_job,))[0][0]
    alice_cluster = door.owner_sql("SELECT cluster_id FROM jobs WHERE id = %s",
                                   (alice_job,))[0][0]
    before = snapshot(door)

    def job(**custom: str) -> str:
        """Her job, its ad with attributes no honest client sends (`custom`)."""
        spec = JobSpec(cmd="/bin/true", iwd="/tmp", proc_id=7)
        ad = {**submitted_ad(spec), **{k: {"expr": v} for k, v in custom.items()}}
        made = Job.queued(spec, id=0, cluster_id=alice_cluster, owner=ALICE, queue="default",
                          ad=ad, max_attempts=3, now=0.0)
        return json.dumps([job_json(made)])

    def raw(**fields: object) -> str:
        spec = JobSpec(cmd="/bin/true", iwd="/tmp", proc_id=7)
        made = Job.queued(spec, id=0, cluster_id=alice_cluster, owner=ALICE, queue="default",
                          ad=submitted_ad(spec), max_attempts=3, now=0.0)
        return json.dumps([{**job_json(made), **fields}])

    def shaped(value: object, **fields: object) -> str:
        """Her job whose ad's `Foo` is the JSON `value` as sent (a small ad)."""
        spec = JobSpec(cmd="/bin/true", iwd="/tmp", proc_id=7)
        made = Job.queued(spec, id=0, cluster_id=alice_cluster, owner=ALICE, queue="default",
                          ad={"Cmd": "/bin/true", "Foo": value}, max_attempts=3, now=0.0)
        return json.dumps([{**job_json(made), **fields}])

    long, deep = "+".join(["1"] * 8_000), "+".join(["1"] * 4_000)  # 16 KB; 8 KB, 3,999 ops
    (sig,) = door.owner_sql("SELECT a.signature FROM autoclusters a JOIN jobs j"
                            " ON j.autocluster_id = a.id WHERE j.id = %s", (alice_job,))[0]
    calls = [
        ("SELECT * FROM jobstore_new_cluster('jsbob', 'default', NULL, 1, NULL, 0)",
         "may not submit jobs as jsbob"),
        ("SELECT * FROM jobstore_new_cluster('root', 'default', NULL, 1, NULL, 0)",
         "may not submit jobs as root"),
        ("SELECT * FROM jobstore_new_cluster(NULL, 'q''; DROP TABLE jobs; --', NULL, 1, NULL,"
         " 0)", "not a queue name"),
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", "OsUser"),
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", "HookKeyword"),
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", "JobstoreSandbox"),
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", "10240 characters"),
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", "2048 operators"),
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", "larger than 32768"),
        (f"SELECT jobstore_queue_jobs({bob_cluster}, %s, 0)", "may not submit jobs as jsbob"),
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", "accounting group physics"),
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", "a list of limits"),
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", "differ in what matching"),
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", "only a DAG node"),
        (f"SELECT * FROM jobstore_edit(ARRAY[{alice_job}]::bigint[], 'OsUser', '\"jsbob\"',"
         f" ARRAY['{'0' * 64}'], false, 0)", "set by the job store"),
        (f"SELECT * FROM jobstore_edit(ARRAY[{alice_job}]::bigint[], 'AcctGroup', '\"x\"',"
         f" ARRAY['{'0' * 64}'], false, 0)", "cannot change"),
        ("SELECT jobstore_set_factor('jsbob', 1000)", "may not change priority factors"),
        ("SELECT jobstore_reset_usage(NULL, 0)", "may not reset usage"),
        ("SELECT jobstore_store_file('jsbob', repeat('a', 64), 1)",
         "may not submit jobs as jsbob"),
        (f"SELECT jobstore_add_inputs({alice_cluster}, NULL, %s)", "not a path inside"),
        ("SELECT jobstore_remove_dag(1, 'x', 0)", "no DAG"),
        # values no reader takes, however small the ad
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", "not a value"),
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", "not a value"),
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", "not a value"),
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", "not a value"),
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", "integer out of range"),
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", "out of range"),
        # her own autocluster, with a job that differs in what matching sees
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", "differ in what matching"),
    ]
    params = [None, None, None, job(OsUser='"jsbob"'), job(HookKeyword='"OTHER"'),
              job(JobstoreSandbox="true"), job(Note=long), job(Note=deep),
              job(**{f"A{i}": '"' + "x" * 5000 + '"' for i in range(7)}),
              raw(cluster_id=bob_cluster), raw(submitter="physics.jsalice"),
              raw(concurrency_limits="lic:-100"), raw(signature=sig, request_cpus=64),
              job(DAGNodeName='"A"'), None, None, None, None, None,
              json.dumps([{"name": "../../etc/passwd", "sha256": "a" * 64, "mode": 420}]),
              None,
              shaped({"bar": 1}), shaped({"expr": {"a": "b"}}), shaped([1, {"x": 2}]),
              shaped(json.loads("[" * 500 + "]" * 500)), shaped(10 ** 30), shaped(1e301),
              shaped("bad", signature=sig)]
    got = refusals(door, ALICE, [(sql, p) for (sql, _), p in zip(calls, params, strict=True)])
    for (sql, expected), result in zip(calls, got, strict=True):
        assert result is not None, (sql, expected)
        state, message = result
        assert state in ("JS001", "JS002", "JS004", "23514"), (sql, result)
        assert expected in message, (sql, message)
    # her own key is hers: bob's cluster under the same key is never hers
    keys = door.run(ALICE, """
        with psycopg.connect(os.environ["JOBSTORE_DSN"], autocommit=True) as conn:
            out(conn.execute("SELECT * FROM jobstore_new_cluster(NULL, 'default', NULL, 0,"
                             " 'k1', 0)").fetchone())
        """)
    assert keys == [keys[0], True]  # type: ignore[index]
    door.owner_sql("DELETE FROM clusters WHERE idempotency_key = 'k1'")
    assert snapshot(door) == before


def test_another_submitters_job_is_only_reported_never_touched(door: Door) -> None:
    """A hold, rm, release or qedit of bob's job by alice: denied, reported as such, not even
    locked; a queue super user acts on it; the portal submits as alice only."""
    (bob_job,) = submitted(door, BOB)
    (name,) = door.owner_sql("SELECT cluster_id || '.' || proc_id FROM jobs WHERE id = %s",
                             (bob_job,))[0]
    for args in (("hold", name), ("rm", name), ("qedit", name, "Cmd", '"/tmp/evil"')):
        done = door.cli(ALICE, *args)
        assert done.returncode == 1 and "not its owner" in done.stderr, done
    assert door.owner_sql("SELECT status, cmd FROM jobs WHERE id = %s", (bob_job,)) == [
        ("idle", "/bin/true")]
    sub = Path(f"/home/{PORTAL}/job.sub")
    sub.write_text("executable = /bin/true\nqueue\n")
    sub.chmod(0o644)
    portal = door.cli(PORTAL, "submit", str(sub), "--owner", BOB)
    assert portal.returncode == 1 and "may not submit jobs as jsbob" in portal.stderr
    done = door.cli(PORTAL, "hold", name)
    assert done.returncode == 0, done.stderr
    assert door.owner_sql("SELECT status, hold_code FROM jobs WHERE id = %s", (bob_job,)) == [
        ("held", 1)]


def test_a_fair_share_account_is_the_one_the_admin_granted(door: Door) -> None:
    """HTCondor's accounting_group is free text; the job store's is what `grant-user
    --accounting-group` gives: alice may not charge physics, bob may (as physics.jsbob)."""
    sub = "executable = /bin/true\naccounting_group = physics\nqueue\n"
    path = Path(f"/home/{ALICE}/group.sub")
    path.write_text(sub)
    user = ensure_account(ALICE)
    os.chown(path, user.pw_uid, user.pw_gid)
    done = door.cli(ALICE, "submit", str(path))
    assert done.returncode == 1 and "may not charge accounting group physics" in done.stderr
    (job_id,) = submitted(door, BOB, sub)
    assert door.owner_sql("SELECT submitter FROM jobs WHERE id = %s", (job_id,)) == [
        ("physics.jsbob",)]


def test_an_impersonation_rule_is_one_whole_name_pattern(door: Door) -> None:
    """`alice)|(x` would have matched names that begin with alice or end with x once wrapped;
    it is refused at grant-user, and the database holds no such rule."""
    done = door.cli(OWNER, "grant-user", PORTAL, "--super-user", "--may-impersonate",
                    "jsalice)|(x")
    assert done.returncode == 1 and "one regular expression" in done.stderr
    with pytest.raises(psycopg.errors.CheckViolation):
        door.owner_sql("UPDATE queue_roles SET may_impersonate = 'jsalice)|(x'"
                       f" WHERE role = '{PORTAL}'")
    assert door.owner_sql(f"SELECT may_impersonate FROM queue_roles WHERE role = '{PORTAL}'") == [
        (ALICE,)]


def test_another_submitters_dag_is_out_of_reach(door: Door) -> None:
    """bob's DAG, as alice tries it with raw calls: new nodes in it, starting, pausing or
    removing it, a job queued into a node's cluster of his, or into her own naming his DAG's
    node; and condor_rm of it. Each refused in one line; nothing changed."""
    home = Path(f"/home/{BOB}")
    for name in ("a", "b"):
        (home / f"{name}.sub").write_text("executable = /bin/true\nqueue\n")
    (home / "two.dag").write_text("JOB A a.sub\nJOB B b.sub\nPARENT A CHILD B\n")
    bob = ensure_account(BOB)
    for path in home.glob("*.*"):
        os.chown(path, bob.pw_uid, bob.pw_gid)
    done = door.cli(BOB, "submit-dag", str(home / "two.dag"))
    assert done.returncode == 0, done.stderr
    ((dag_id,),) = door.owner_sql("SELECT id FROM dags WHERE owner = %s", (BOB,))
    ((b_cluster,),) = door.owner_sql(
        "SELECT cluster_id FROM dag_nodes WHERE dag_id = %s AND name = 'B'", (dag_id,))
    (alice_job,) = submitted(door, ALICE)
    ((alice_cluster,),) = door.owner_sql("SELECT cluster_id FROM jobs WHERE id = %s",
                                         (alice_job,))
    before = snapshot(door)

    def node_job(cluster: int) -> str:
        spec = JobSpec(cmd="/bin/true", iwd="/tmp", proc_id=5,
                       custom={"DAGManJobId": str(dag_id), "DAGNodeName": '"B"'})
        made = Job.queued(spec, id=0, cluster_id=cluster, owner=ALICE, queue="default",
                          ad=submitted_ad(spec), max_attempts=3, now=0.0)
        return json.dumps([job_json(made)])

    node = json.dumps([{"name": "X", "cluster_id": None, "status": "ready", "pending": 0}])
    calls = [
        (f"SELECT * FROM jobstore_dag_nodes({dag_id}, %s, '[]', '{{}}', 0)", node),
        (f"SELECT * FROM jobstore_start_dag({dag_id}, 0)", None),
        (f"SELECT * FROM jobstore_pause_dag({dag_id}, true, 0)", None),
        (f"SELECT * FROM jobstore_remove_dag({dag_id}, 'mine now', 0)", None),
        (f"SELECT jobstore_queue_jobs({b_cluster}, %s, 0)", node_job(b_cluster)),
        (f"SELECT jobstore_queue_jobs({alice_cluster}, %s, 0)", node_job(alice_cluster)),
    ]
    got = refusals(door, ALICE, calls)
    for (sql, _), result in zip(calls, got, strict=True):
        assert result is not None, sql
        assert result[0] in ("JS001", "JS002", "JS004"), (sql, result)
        assert "\n" not in result[1]
    done = door.cli(ALICE, "rm", str(dag_id))  # a DAG she cannot see: no job of hers
    assert done.returncode == 1 and f"no unfinished job {dag_id}" in done.stderr, done
    assert snapshot(door) == before


def test_a_template_makes_no_more_than_it_says(door: Door) -> None:
    """A templated submit by hand: an item value holding another placeholder (each proc's ad
    would grow past every bound as the placeholders are replaced in turn), or a placeholder in
    an attribute matching looks at (one autocluster's jobs would differ): refused."""
    (alice_job,) = submitted(door, ALICE)
    ((cluster,),) = door.owner_sql("SELECT cluster_id FROM jobs WHERE id = %s", (alice_job,))
    first, second = "JOBSTOREPROC001X000000000001", "JOBSTOREPROC002X000000000002"
    before = snapshot(door)

    def template(ad: dict[str, object]) -> str:
        spec = JobSpec(cmd="/bin/true", iwd="/tmp")
        made = Job.queued(spec, id=0, cluster_id=cluster, owner=ALICE, queue="default",
                          ad={"Cmd": "/bin/true", **ad}, max_attempts=3, now=0.0)
        return json.dumps(job_json(made))

    def call(ad: dict[str, object], items: dict[str, list[str]]) -> tuple[str, str]:
        return (f"SELECT jobstore_queue_procs({cluster}::bigint, NULL::bigint[], %s::json, 1,"
                f" '{{}}'::json, '{json.dumps(items)}'::json, 1,"
                f" {len(next(iter(items.values())))}, 0)", template(ad))

    calls = [
        call({"Args": first}, {first: [second * 300], second: ["1+" * 5000 + "1"]}),
        call({"Foo": first}, {first: ["good", "bad"]}),
    ]
    got = refusals(door, ALICE, calls)
    assert got[0] is not None and got[0][0] == "JS001" and "JOBSTORE" in got[0][1], got
    assert got[1] is not None and "matching looks at" in got[1][1], got
    assert snapshot(door) == before


def test_the_database_knows_what_matching_does_not_look_at() -> None:
    """The door's list of attributes one autocluster's jobs may differ in is the package's."""
    from jobstore.core.autoclusters import PER_JOB

    sql = (Path(__file__).parents[2] / "jobstore" / "db" / "migrations" / "versions"
           / "0019_one_door.sql").read_text()
    body = sql[sql.index("CREATE FUNCTION jobstore_per_job"):]
    start = body.index("IN (") + 4
    listed = body[start:body.index(")", start)]
    assert {n.strip().strip("'") for n in listed.split(",")} == set(PER_JOB)
