"""The Alembic migrations produce exactly the schema of jobstore.db.schema, on both backends."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from backends import BOTH_BACKENDS

from jobstore.db.engine import alembic_config, make_engine, upgrade
from jobstore.db.schema import metadata

pytestmark = pytest.mark.empty_database  # each test migrates its database itself

# the command of the environment that runs the tests (this checkout's, never another's)
JOBSTORE_CLI = Path(sys.executable).parent / "jobstore"


def _diffs(conn: sa.Connection, target: sa.MetaData = metadata) -> list:
    mc = MigrationContext.configure(
        conn, opts={"compare_type": True, "compare_server_default": True}
    )
    with warnings.catch_warnings():
        # jobs.phase's expression as the server spells it differs in text only (test_sql.py
        # checks what the database computes)
        warnings.filterwarnings("ignore", "Computed default on jobs.phase cannot be modified")
        return compare_metadata(mc, target)


def _flatten(diffs: list) -> list:
    """compare_metadata nests column modifications in lists; flatten them to tuples."""
    out = []
    for d in diffs:
        if isinstance(d, list):
            out.extend(d)
        else:
            out.append(d)
    return out


def _metadata_index(name: str) -> sa.Index:
    return next(ix for t in metadata.tables.values() for ix in t.indexes if ix.name == name)


def _sqlite_desc_false_positive(conn: sa.Connection, diffs: list) -> list:
    """SQLite's reflection drops the DESC of the claim index (..., priority DESC, id), so
    alembic reports remove+add of that one index. Accept exactly that pair, and only after
    checking with PRAGMA index_xinfo that the real index has those columns and sort orders."""
    if conn.dialect.name != "sqlite":
        return diffs
    pair = [
        d for d in diffs if d[0] in ("remove_index", "add_index") and d[1].name == "ix_jobs_claim"
    ]
    if len(pair) != 2 or {d[0] for d in pair} != {"remove_index", "add_index"}:
        return diffs
    removed = next(d[1] for d in pair if d[0] == "remove_index")
    assert [c.name for c in removed.columns] == ["queue", "autocluster_id", "priority", "id"]
    xinfo = conn.exec_driver_sql("PRAGMA index_xinfo(ix_jobs_claim)").fetchall()
    keys = [(row[2], row[3]) for row in xinfo if row[5]]  # (column, desc) of key columns
    assert keys == [("queue", 0), ("autocluster_id", 0), ("priority", 1), ("id", 0)]
    return [d for d in diffs if d not in pair]


@BOTH_BACKENDS
def test_migrated_schema_matches_metadata(db_url):
    upgrade(db_url)
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            diffs = _sqlite_desc_false_positive(conn, _flatten(_diffs(conn)))
            assert diffs == []
            # at head
            head = ScriptDirectory.from_config(alembic_config(db_url)).get_current_head()
            assert MigrationContext.configure(conn).get_current_revision() == head
    finally:
        engine.dispose()


def test_comparison_is_live(db_url):
    """A control: the comparison used above does see a column, index and default difference."""
    upgrade(db_url)
    target = sa.MetaData(naming_convention=metadata.naming_convention)
    for table in metadata.tables.values():
        table.to_metadata(target)
    jobs = target.tables["jobs"]
    jobs.append_column(sa.Column("extra", sa.Integer))
    sa.Index("ix_jobs_extra", jobs.c.extra)
    jobs.c.claims.server_default = sa.DefaultClause(sa.text("7"))
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            diffs = _sqlite_desc_false_positive(conn, _flatten(_diffs(conn, target)))
            kinds = {d[0] for d in diffs}
    finally:
        engine.dispose()
    assert {"add_column", "add_index", "modify_default"} <= kinds


def _normalise_predicate(where) -> str | None:  # type: ignore[no-untyped-def]
    return None if where is None else re.sub(r"\s+", " ", str(where)).strip()


def _index_details(conn: sa.Connection, schema: str | None = None) -> dict:
    insp = sa.inspect(conn)
    out = {}
    for table in sorted(metadata.tables):
        for ix in insp.get_indexes(table, schema=schema):
            opts = ix.get("dialect_options", {})
            where = opts.get("postgresql_where", opts.get("sqlite_where"))
            out[ix["name"]] = (
                tuple(ix["column_names"]),
                bool(ix["unique"]),
                {k: tuple(v) for k, v in (ix.get("column_sorting") or {}).items()},
                _normalise_predicate(where),
            )
    return out


@BOTH_BACKENDS
def test_partial_index_predicates_and_sorting(db_url, tmp_path):
    """alembic's comparison ignores partial-index predicates: compare them against what the
    same database makes of `metadata.create_all` instead."""
    upgrade(db_url)
    engine = make_engine(db_url)
    try:
        if engine.dialect.name == "postgresql":
            with engine.begin() as conn:
                conn.exec_driver_sql("CREATE SCHEMA ref")
                metadata.create_all(conn.execution_options(schema_translate_map={None: "ref"}))
            with engine.connect() as conn:
                migrated, reference = _index_details(conn), _index_details(conn, "ref")
        else:
            ref_engine = make_engine(f"sqlite:///{tmp_path / 'reference.db'}", create=True)
            metadata.create_all(ref_engine)
            with engine.connect() as conn:
                migrated = _index_details(conn)
                # SQLite does not reflect DESC; compare the key columns' sort order directly
                xinfo = conn.exec_driver_sql("PRAGMA index_xinfo(ix_jobs_claim)").fetchall()
            with ref_engine.connect() as conn:
                reference = _index_details(conn)
                ref_xinfo = conn.exec_driver_sql("PRAGMA index_xinfo(ix_jobs_claim)").fetchall()
            ref_engine.dispose()
            # (seqno, name, desc, collation, key): the column numbers follow each one's order
            assert [r[:1] + r[2:] for r in xinfo] == [r[:1] + r[2:] for r in ref_xinfo]
    finally:
        engine.dispose()
    assert migrated == reference
    assert "phase" in migrated["ix_jobs_claim"][3] and "idle" in migrated["ix_jobs_claim"][3]
    assert "phase" in migrated["ix_jobs_lease"][3] and "out" in migrated["ix_jobs_lease"][3]
    names = {ix.name for t in metadata.tables.values() for ix in t.indexes}
    assert names <= set(migrated)
    if db_url.startswith("postgresql"):
        assert migrated["ix_jobs_claim"][2] == {"priority": ("desc",)}


def _plain(reflected: Any) -> str:
    """A reflected index as text (SQLite reflects predicates as TextClause objects)."""
    opts = {k: str(v) for k, v in reflected.get("dialect_options", {}).items()}
    return repr(sorted({**reflected, "dialect_options": opts}.items()))


def _snapshot(url: str) -> dict:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            insp = sa.inspect(conn)
            snap: dict = {}
            for table in sorted(insp.get_table_names()):
                snap[table] = {
                    "columns": [
                        (c["name"], str(c["type"]), c["nullable"], str(c.get("default")))
                        for c in insp.get_columns(table)
                    ],
                    "pk": insp.get_pk_constraint(table)["constrained_columns"],
                    "fks": sorted(str(fk) for fk in insp.get_foreign_keys(table)),
                    "uniques": sorted(str(u) for u in insp.get_unique_constraints(table)),
                    "indexes": sorted(_plain(ix) for ix in insp.get_indexes(table)),
                }
            snap["alembic_version"]["rows"] = conn.exec_driver_sql(
                "SELECT version_num FROM alembic_version"
            ).fetchall()
            snap["clusters_rows"] = conn.exec_driver_sql(
                "SELECT id, owner FROM clusters"
            ).fetchall()
        return snap
    finally:
        engine.dispose()


def test_upgrade_twice_is_a_noop(db_url):
    upgrade(db_url)
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(
            metadata.tables["clusters"].insert().values(
                owner="alice", queue="default", num_procs=0, submitted_at=1.0
            )
        )
    engine.dispose()
    before = _snapshot(db_url)
    upgrade(db_url)
    after = _snapshot(db_url)
    assert after == before
    assert len(after["alembic_version"]["rows"]) == 1
    assert after["clusters_rows"] == before["clusters_rows"] != []
    assert set(after) - {"clusters_rows"} == {"alembic_version", *metadata.tables}


def test_sqlite_file_mode(sqlite_url, tmp_path):
    upgrade(sqlite_url)
    assert (tmp_path / "jobstore.db").stat().st_mode & 0o777 == 0o660


def _cli(url: str, condor_config: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "CONDOR_CONFIG": str(condor_config),
    }
    return subprocess.run(
        [str(JOBSTORE_CLI), "--db", url, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_cli_init(db_url, condor_config):
    for _ in range(2):  # a second init upgrades nothing and still succeeds
        proc = _cli(db_url, condor_config, "init")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("job store ready: ")
    assert "at most 1024 MB a file, 4096 MB a job" in proc.stdout
    with open(condor_config, "a") as fh:  # the configured limits and rules go into the store
        fh.write("JOBSTORE_MAX_INPUT_FILE_MB = 8\nJOBSTORE_MAX_INPUT_MB = 16\n"
                 "JOBSTORE_MAX_OUTPUT_MB = 32\nIMMUTABLE_JOB_ATTRS = ProjectName\n"
                 "SECURE_JOB_ATTRS = Site\nPROTECTED_JOB_ATTRS = Budget Owner\n")
    assert _cli(db_url, condor_config, "init").returncode == 0
    from sqlalchemy import select

    from jobstore.db.schema import job_attr_rules
    from jobstore.db.store import JobStore

    store = JobStore.from_url(db_url)
    assert store.files.input_limits() == {"max_input_file_mb": 8, "max_input_mb": 16,
                                          "max_output_mb": 32}
    with store.db.engine.connect() as conn:
        rules = dict(conn.execute(select(job_attr_rules.c.name, job_attr_rules.c.rule)).all())
    assert (rules["projectname"], rules["site"], rules["budget"]) == (
        "immutable", "immutable", "protected")
    assert rules["owner"] == "immutable"  # the job store's own stays as it is
    store.db.engine.dispose()
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            head = ScriptDirectory.from_config(alembic_config(db_url)).get_current_head()
            assert MigrationContext.configure(conn).get_current_revision() == head
            assert _sqlite_desc_false_positive(conn, _flatten(_diffs(conn))) == []
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "url",
    ["mysql://u@h/db", "not a url", "postgresql+psycopg://postgres@127.0.0.1:1/unreachable"],
    ids=["mysql", "unparseable", "unreachable"],
)
def test_cli_init_refuses_unusable_urls(url, condor_config):
    proc = _cli(url, condor_config, "init")
    assert proc.returncode == 1
    assert proc.stderr.startswith("jobstore: ")
    assert "Traceback" not in proc.stderr


def test_upgrade_gives_existing_jobs_autoclusters_and_submitters(db_url):
    """A job store of revision 0001 with queued jobs: after the upgrade every job has its
    submitter and an autocluster (shared by identical jobs), and the idle ones are claimable."""
    from jobstore.core.claims import Offer
    from jobstore.db.store import JobStore
    from jobstore.testing.factories import claim, claim_request

    upgrade(db_url, "0001")
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO clusters (id, owner, queue, num_procs, submitted_at) "
                "VALUES (1, 'alice', 'default', 3, 1.0)"))
            for proc, (status, memory) in enumerate(
                [("idle", 128), ("idle", 128), ("idle", 4096), ("completed", 128)]
            ):
                conn.execute(sa.text(
                    "INSERT INTO jobs (cluster_id, proc_id, queue, status, priority, owner, ad, "
                    "cmd, request_cpus, request_memory, request_disk, max_attempts, "
                    "submitted_at, updated_at) VALUES (1, :proc, 'default', :status, 0, 'alice', "
                    ":ad, '/bin/true', 1, :memory, 1024, 3, 1.0, 1.0)"),
                    {"proc": proc, "status": status, "memory": memory,
                     "ad": json.dumps({"Cmd": "/bin/true", "Arguments": str(proc)})})
    finally:
        engine.dispose()
    upgrade(db_url)
    store = JobStore.from_url(db_url)
    try:
        jobs = store.reads.list_jobs(include_final=True)
        assert {j.submitter for j in jobs} == {"alice"}
        groups = [j.autocluster_id for j in jobs]
        assert None not in groups
        assert groups[0] == groups[1] == groups[3] != groups[2]
        assert [u.name for u, _ in store.negotiator.usage_table()] == ["alice"]
        req = claim_request(offer=Offer(cpus=1, memory=8192, disk=4096), claim_lease=60)
        claimed = {claim(store, req).id for _ in range(3)}
        assert claimed == {jobs[0].id, jobs[1].id, jobs[2].id}
    finally:
        store.db.engine.dispose()


def test_upgrade_0008_moves_the_changing_columns_last_and_keeps_rows_and_grants(pg_url):
    """0008 puts the columns that transitions change after the submitted ones (PostgreSQL's
    order is the metadata's): every row keeps its values, the defaults and NOT NULLs stay, the
    indexes are all there again and a role keeps its UPDATE on a moved column; 0009 lets a
    role that may renew leases write lease_renewed_until."""
    import uuid

    role = f"jobstore_test_{uuid.uuid4().hex[:12]}"
    upgrade(pg_url, "0007")
    engine = make_engine(pg_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO clusters (id, owner, queue, num_procs, submitted_at) "
                "VALUES (1, 'alice', 'default', 2, 1.0)"))
            conn.execute(sa.text(
                "INSERT INTO jobs (cluster_id, proc_id, queue, status, owner, ad, cmd,"
                " request_cpus, request_memory, request_disk, max_attempts, submitted_at,"
                " updated_at, claims, token, lease_expires_at, slot, host, job_pid)"
                " VALUES (1, 0, 'default', 'running', 'alice', '{\"Cmd\": \"/bin/true\"}',"
                " '/bin/true', 1, 64, 1024, 3, 1.0, 2.0, 1, 'tok', 900.0, 'slot1@n', 'n', 42),"
                " (1, 1, 'default', 'completed', 'alice', '{}', '/bin/true', 1, 64, 1024, 3,"
                " 1.0, 3.0, 1, NULL, NULL, NULL, NULL, NULL)"))
            conn.execute(sa.text(f"CREATE ROLE {role}"))
            conn.execute(sa.text(
                f"GRANT UPDATE (status, token, lease_expires_at) ON jobs TO {role}"))
            before = [dict(r._mapping) for r in conn.execute(sa.text(
                "SELECT * FROM jobs ORDER BY id"))]
        upgrade(pg_url, "0008")
        with engine.begin() as conn:
            after = [dict(r._mapping) for r in conn.execute(sa.text(
                "SELECT * FROM jobs ORDER BY id"))]
            order = list(conn.execute(sa.text(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'jobs'::regclass"
                " AND attnum > 0 AND NOT attisdropped ORDER BY attnum")).scalars())
        upgrade(pg_url)
        with engine.begin() as conn:
            granted = [conn.execute(sa.text(
                f"SELECT has_column_privilege('{role}', 'jobs', :c, 'UPDATE')"), {"c": c}).scalar()
                for c in ("status", "token", "lease_renewed_until", "claims")]
            conn.execute(sa.text(
                "INSERT INTO jobs (cluster_id, proc_id, queue, status, owner, ad, cmd,"
                " request_cpus, request_memory, request_disk, max_attempts, submitted_at,"
                " updated_at) VALUES (1, 2, 'default', 'idle', 'alice', '{}', '/bin/true', 1,"
                " 64, 1024, 3, 1.0, 4.0)"))
            claims = conn.execute(sa.text("SELECT claims FROM jobs WHERE proc_id = 2")).scalar()
            with pytest.raises(sa.exc.IntegrityError), conn.begin_nested():
                conn.execute(sa.text("UPDATE jobs SET status = NULL WHERE proc_id = 2"))
            diffs = _diffs(conn)
    finally:
        with engine.begin() as conn:
            if conn.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"),
                            {"r": role}).first():
                conn.execute(sa.text(f"DROP OWNED BY {role}"))
                conn.execute(sa.text(f"DROP ROLE {role}"))
        engine.dispose()
    assert not diffs
    assert after == before
    assert order == [c.name for c in metadata.tables["jobs"].columns
                     if c.name not in ("lease_renewed_until", "phase")]  # 0009's, 0010's
    assert order[-3:] == ["lease_expires_at", "updated_at", "status"]
    assert order.index("ad") < order.index("claims")
    assert granted == [True, True, True, False]
    assert claims == 0
