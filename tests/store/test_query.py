"""`jobstore q` projections, constraints and autoclusters on real SQLite and PostgreSQL.

The key property: a constraint run the way `jobstore q -constraint` runs it (translated
conjuncts in SQL, the rest by classad2 on each remaining job) selects exactly the jobs for which
classad2 itself says the expression is true on the job's ad.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import clirun
import pytest
from backends import BOTH_BACKENDS
from classad2 import ExprTree
from examples import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import update

from jobstore.core.jobs import Job, JobSpec
from jobstore.db.constraint import matches, plan
from jobstore.db.schema import jobs as jobs_table
from jobstore.db.store import AUTOCLUSTER_KEY, JobStore
from jobstore.errors import ConstraintError
from jobstore.formats import views

KW: dict[str, Any] = {"keyword": "JOBSTORE", "uid_domain": "localdomain"}

# (owner, queue, cpus, memory, priority, status, exit_code, exit_signal, slot, custom ad)
ROWS = [
    ("alice", "default", 1, 128, 0, "idle", None, None, None, {"Project": "x"}),
    ("alice", "default", 2, 128, 1, "running", None, None, "slot1@Host", {}),
    ("Alice", "GPU", 4, 2048, -1, "held", None, None, None, {"Project": "Y"}),
    ("bob", "default", 1, 64, 2, "completed", 0, None, "slot2@host", {}),
    ("bob", "gpu", 2, 1024, 0, "failed", 3, None, "slot1@host", {"Project": "x"}),
    ("carol", "default", 3, 128, 0, "removed", None, 9, None, {}),
    ("carol", "default", 1, 512, 5, "fetched", None, None, "slot1@host", {}),
    ("Bob", "default", 2, 128, 0, "accepted", 0, None, "slot3@host", {}),
]


def _fill(store: JobStore) -> list[Job]:
    """One cluster per row, then the row's status and outcome columns set directly."""
    for owner, queue, cpus, mem, prio, status, code, sig, slot, custom in ROWS:
        nj = JobSpec("/bin/true", request_cpus=cpus, request_memory=mem,
                     request_disk=1024 * cpus, priority=prio,
                     custom={k: f'"{v}"' for k, v in custom.items()})
        _, (job_id,) = store.submissions.submit([nj], owner=owner, queue=queue, max_attempts=3)
        with store.db.engine.begin() as conn:
            conn.execute(
                update(jobs_table)
                .where(jobs_table.c.id == job_id)
                .values(status=status, exit_code=code, exit_signal=sig, slot=slot)
            )
    return store.reads.list_jobs(include_final=True)


def run_constraint(store: JobStore, text: str) -> set[int]:
    """What `jobstore q -a -constraint TEXT` selects."""
    p = plan(text)
    found = store.reads.list_jobs(include_final=True, where=p.where)
    if p.residual is not None:
        found = [j for j in found if matches(p.residual, views.job_ad(j, **KW))]
    return {j.id for j in found}


def classad_truth(all_jobs: list[Job], text: str) -> set[int]:
    expr = ExprTree(text)
    return {j.id for j in all_jobs if matches(expr, views.job_ad(j, **KW))}


# ---- random constraints over the translated attributes ----------------------------------------

INT_ATTRS = [
    "ClusterId",
    "ProcId",
    "JobStatus",
    "JobPrio",
    "RequestCpus",
    "requestmemory",
    "RequestDisk",
    "ExitCode",
    "ExitSignal",
    "NumJobStarts",
    "JobstoreJobId",
]
STR_ATTRS = ["Owner", "JobstoreQueue", "JobstoreStatus", "RemoteHost", "OWNER"]
STRINGS = ["alice", "ALICE", "Bob", "default", "gpu", "held", "Running", "slot1@host", "", "x"]
# Not translated: evaluated by classad2 on the rows SQL leaves (the text marks them).
OPAQUE = [
    'Project == "x"',
    'Project =?= "x"',
    'regexp("^a", Owner)',
    'Owner < "b"',
    "RequestCpus / 2 >= 1",
    "(RequestCpus > 1 ? true : undefined)",
    "RequestMemory > 100.5",
    "ExitCode",
    "MY.RequestCpus > 1",
]

int_atom = st.one_of(
    st.sampled_from(INT_ATTRS),
    st.integers(-2, 6).map(str),
    st.sampled_from(["128", "1024", "2048", "undefined"]),
)
int_expr = st.recursive(
    int_atom,
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        inner.map(lambda e: f"-{e}"),
    ),
    max_leaves=3,
)
str_atom = st.one_of(st.sampled_from(STR_ATTRS), st.sampled_from(STRINGS).map(lambda s: f'"{s}"'))
EQ_OPS = ["==", "!=", "=?=", "=!=", "is", "isnt"]
comparison = st.one_of(
    st.tuples(int_expr, st.sampled_from([*EQ_OPS, "<", "<=", ">", ">="]), int_expr),
    st.tuples(str_atom, st.sampled_from(EQ_OPS), str_atom),
    st.tuples(str_atom, st.sampled_from(["==", "=?="]), int_atom),  # error / never identical
).map(lambda t: f"{t[0]} {t[1]} {t[2]}")
bool_atom = st.one_of(
    comparison, st.sampled_from(["true", "false", "undefined", "error"]), st.sampled_from(OPAQUE)
)


def _combine(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    # unparenthesised on purpose now and then: precedence must match classad2's
    return st.one_of(
        st.tuples(inner, st.sampled_from(["&&", "||"]), inner, st.booleans()).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})" if t[3] else f"{t[0]} {t[1]} {t[2]}"
        ),
        inner.map(lambda e: f"!({e})"),
    )


constraint = st.recursive(bool_atom, _combine, max_leaves=5)


@pytest.fixture
def filled(store: JobStore) -> tuple[JobStore, list[Job]]:
    return store, _fill(store)


@BOTH_BACKENDS
@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=constraint)
def test_constraint_in_sql_equals_classad2(filled: tuple[JobStore, list[Job]], text: str) -> None:
    store, all_jobs = filled
    assert run_constraint(store, text) == classad_truth(all_jobs, text), text
    if not any(o in text for o in OPAQUE):
        assert plan(text).residual is None, f"not translated: {text}"


@BOTH_BACKENDS
def test_case_and_undefined_semantics(filled: tuple[JobStore, list[Job]]) -> None:
    store, all_jobs = filled
    by_owner = {j.id: j.owner for j in all_jobs}
    alices = run_constraint(store, 'Owner == "ALICE"')
    assert {by_owner[i] for i in alices} == {"alice", "Alice"}
    exact = run_constraint(store, 'Owner =?= "alice"')
    assert {by_owner[i] for i in exact} == {"alice"} and len(exact) == 2
    # undefined does not match, and neither does its negation
    assert run_constraint(store, "ExitCode == 0") | run_constraint(store, "ExitCode != 0") == {
        j.id for j in all_jobs if j.exit_code is not None
    }
    assert len(run_constraint(store, "ExitCode =?= undefined")) == 5
    assert len(run_constraint(store, "JobStatus == 2")) == 2  # accepted and running
    assert run_constraint(store, 'Owner == 1 || true') == set()  # error || true is error


def test_plan_splits_conjuncts() -> None:
    p = plan('RequestCpus > 1 && regexp("a", Owner) && Owner == "alice"')
    assert (p.translated, p.conjuncts) == (2, 3) and p.where is not None and p.residual is not None
    full = plan('RequestCpus > 1 && (Owner == "alice" || JobStatus =!= 5)')
    assert full.residual is None and full.where is not None
    assert plan("[a = 1].a == 1").where is None  # records are left to classad2
    for bad in ("RequestCpus >", "a b", "", "(Owner"):
        with pytest.raises(ConstraintError):
            plan(bad)


@BOTH_BACKENDS
def test_autoclusters_group_in_the_database(filled: tuple[JobStore, list[Job]]) -> None:
    store, all_jobs = filled
    where = plan("RequestMemory >= 128").where
    groups = store.reads.autoclusters(include_final=True, where=where)
    wanted = [j for j in all_jobs if j.request_memory >= 128]
    expected = views.group_jobs(wanted, AUTOCLUSTER_KEY)

    def key(g: dict) -> tuple:
        return tuple(str(g[k]) for k in AUTOCLUSTER_KEY)

    assert sorted((key(g), g["jobs"], g["status"]) for g in groups) == sorted(
        (key(g), g["jobs"], g["status"]) for g in expected
    )
    alice = [g for g in groups if g["owner"] == "alice" and g["request_memory"] == 128]
    assert len(alice) == 2  # 1 and 2 cpus are different autoclusters
    not_final = store.reads.autoclusters()
    assert sum(g["jobs"] for g in not_final) == 5


# ---- the command, as a separate process --------------------------------------------------------


def cli(db_url: str, *args: str) -> subprocess.CompletedProcess:
    return clirun.run(
        [sys.executable, "-m", "jobstore.cli", "--db", db_url, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_cli_af_constraint_autocluster(
    db_url: str, tmp_path: Path, condor_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONDOR_CONFIG", str(condor_config))
    monkeypatch.delenv("JOBSTORE_DATABASE_URL", raising=False)
    assert cli(db_url, "init").returncode == 0
    store = JobStore.from_url(db_url)
    try:
        _fill(store)
    finally:
        store.db.engine.dispose()
    r = cli(
        db_url, "q", "-a", "-constraint", 'RequestCpus > 1 && Owner == "alice"',
        "-af", "ClusterId", "ProcId", "Owner", "JobStatus", "Cmd", "Project", "RequestCpus * 2",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    # == on strings ignores case, as in ClassAds
    assert r.stdout.splitlines() == [
        "2 0 alice 2 /bin/true undefined 4",
        "3 0 Alice 5 /bin/true Y 8",
    ]
    r = cli(db_url, "q", "-autoformat", "Owner", "--constraint", 'regexp("^b", Owner, "i")', "8")
    assert r.stdout.splitlines() == ["Bob"], r.stderr  # job id 8 plus a function call
    r = cli(db_url, "q", "-constraint", "RequestCpus >")
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert lines == ["jobstore: invalid constraint expression: RequestCpus >"]
    r = cli(db_url, "q", "-autocluster", "--json", "-constraint", "JobStatus =?= 1")
    groups = json.loads(r.stdout)
    assert [(g["owner"], g["jobs"], g["status"]) for g in groups] == [
        ("alice", 1, {"idle": 1}),
        ("carol", 1, {"fetched": 1}),
    ]
    table = cli(db_url, "q", "-autocluster").stdout
    assert "IDLE" in table and "Total: 5 jobs in 5 autoclusters" in table
    hist = cli(db_url, "history", "-af", "Owner", "ExitCode", "-constraint", "ExitCode == 3")
    assert hist.stdout.splitlines() == ["bob 3"], hist.stderr


def test_a_projection_of_columns_reads_no_stored_ad(
        filled: tuple[JobStore, list[Job]]) -> None:
    """Projection in SQL: the attributes of views.COLUMN_ATTRIBUTES are the same whether the
    stored ad is read or not (so a projection of them leaves the `ad` column unread), and
    Schedd.query and history leave it unread exactly then."""
    from sqlalchemy import event

    from jobstore.api import query
    from jobstore.api.schedd import Schedd

    store, _ = filled
    job = store.reads.list_jobs(include_final=True)[0]
    # a stored ad that names column attributes too: the columns win either way
    shadowing = job.but(ad={**(job.ad or {}), "ExitCode": 7, "NumHolds": 3, "Project": "x"})
    full = views.job_ad(shadowing, **KW)
    bare = views.job_ad(job.but(ad=None), **KW)
    for name in views.COLUMN_ATTRIBUTES:
        assert full.get(name) == bare.get(name), name
    statements: list[str] = []

    def seen(_c: object, _cur: object, statement: str, *_rest: object) -> None:
        statements.append(statement)

    event.listen(store.db.engine, "before_cursor_execute", seen)
    schedd = Schedd(store=store)
    try:
        narrow = schedd.query("JobPrio >= 0", ["ClusterId", "ProcId", "JobStatus", "ServerTime"])
        assert narrow and all(set(ad.keys()) == {"ClusterId", "ProcId", "JobStatus",
                                                 "ServerTime"} for ad in narrow)
        assert statements and not any("jobs.ad" in s for s in statements)
        statements.clear()
        wide = schedd.query("JobPrio >= 0", ["ClusterId", "Project"])
        assert {ad.get("Project") for ad in wide} >= {"x"}
        assert any("jobs.ad" in s for s in statements)
        statements.clear()
        assert len(schedd.history(projection=["ClusterId", "ExitCode"], match=2)) == 2
        assert not any("jobs.ad" in s for s in statements)
        statements.clear()
        # a constraint evaluated on the ads needs them, whatever the projection
        residual = list(query.iter_query(store, schedd.shown, constraint='Project == "x"',
                                         projection=["ClusterId"], include_final=True))
        assert {views.job_ad(j, **KW)["Project"] for j in residual} == {"x"}
    finally:
        event.remove(store.db.engine, "before_cursor_execute", seen)
