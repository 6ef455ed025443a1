"""The named SQL statements and the typed rows: one place each, and in step with the schema and
the state machine."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from jobstore.core.jobs import EVENT_COLUMNS, JOB_COLUMNS, Job, JobEvent, JobSpec, parse_job_id
from jobstore.core.states import Status
from jobstore.db import channels
from jobstore.db.backends import statements
from jobstore.db.backends.postgresql import queries as pg
from jobstore.db.schema import job_events, jobs
from jobstore.db.store import JobStore

PACKAGE = Path(__file__).resolve().parents[2] / "jobstore"
# Words that start a hand-written statement in a string literal.
SQL_STARTS = ("SELECT ", "INSERT INTO", "UPDATE ", "DELETE FROM", "WITH ", "LISTEN ", "NOTIFY ",
              "SET LOCAL", "SET statement", "GRANT ", "REVOKE ")


# Each backend's statements: its own queries.sql, in its own parameter style
BACKEND_QUERIES = {
    "postgresql": (pg.QUERIES, re.compile(r"%\(\w+\)s")),
    "sqlite": (statements.load("jobstore.db.backends.sqlite"),
               re.compile(r"(?<![:\w]):[a-z_]+\b")),
}


def test_every_statement_has_a_name_a_purpose_and_sql() -> None:
    assert set(pg.QUERIES) >= {"claim_in_autoclusters", "idle_autoclusters", "notify_event",
                               "listen_events", "begin_transaction", "snapshot_bounds",
                               "xact_horizon", "lock_limits", "grant_revoke", "door_act"}
    assert set(BACKEND_QUERIES["sqlite"][0]) == {"idle_autoclusters"}
    for queries, _ in BACKEND_QUERIES.values():
        for st in queries.values():
            assert st.purpose and st.sql and not st.sql.endswith(";"), st.name


def test_a_statement_without_a_purpose_is_refused() -> None:
    with pytest.raises(ValueError, match="purpose"):
        statements.parse("-- name: bare\nSELECT 1;\n")
    with pytest.raises(ValueError, match="one name"):
        statements.parse("-- name: a\n-- one\nSELECT 1;\n-- name: a\n-- two\nSELECT 2;\n")


def test_each_backend_takes_its_own_parameter_style() -> None:
    """PostgreSQL's statements take psycopg's %(name)s (they run on psycopg), SQLite's :name
    (SQLAlchemy's text()); neither takes the other's."""
    styles = {name: style for name, (_, style) in BACKEND_QUERIES.items()}
    for backend, (queries, _) in BACKEND_QUERIES.items():
        other = next(style for name, style in styles.items() if name != backend)
        for name, statement in queries.items():
            assert not other.search(statement.sql), (backend, name)
    assert styles["postgresql"].search(pg.QUERIES["idle_autoclusters"].sql)
    assert styles["sqlite"].search(BACKEND_QUERIES["sqlite"][0]["idle_autoclusters"].sql)


def test_the_holding_statuses_are_the_negotiators() -> None:
    """Fair share and limits count the jobs in the statuses that hold a slot, in SQL too: the
    phase `out`, which the index of the handed-out jobs is made for."""
    from jobstore.core.states import HANDED_OUT, PHASES
    from jobstore.db.schema import OUT_PHASE

    assert {"fetched", "accepted", "running"} == HANDED_OUT
    assert {s for s, p in PHASES.items() if p == "out"} == HANDED_OUT
    assert OUT_PHASE == "phase = 'out'"
    from sqlalchemy.dialects import postgresql, sqlite

    from jobstore.db.negotiator import LIMITS_IN_USE, SUBMITTER_USAGE

    for statement in (SUBMITTER_USAGE, LIMITS_IN_USE):
        for dialect in (postgresql.dialect(), sqlite.dialect()):
            assert "jobs.phase = 'out'" in str(statement.compile(dialect=dialect))
    for index in jobs.indexes:
        if index.name in ("ix_jobs_active", "ix_jobs_lease"):
            assert str(index.dialect_options["postgresql"]["where"]) == OUT_PHASE


def test_the_phases_are_the_state_machines() -> None:
    """jobs.phase's expression gives each status the phase of jobstore.core.states.PHASES, and
    the indexes' predicates name the phases of the statuses they are for."""
    from jobstore.core.states import FINAL, PHASES
    from jobstore.db.schema import CLAIMABLE, FINISHED, PHASE, UNFINISHED

    for status in Status:
        # the CASE as the database evaluates it: the first WHEN whose list has the status
        expected = PHASES[status]
        got = status.value
        for when in PHASE.split(" WHEN ")[1:]:
            listed, _, then = when.partition(" THEN ")
            if f"'{status.value}'" in listed:
                got = then.split()[0].strip("'")
                break
        assert got == expected, status
    assert f"phase = '{PHASES[Status.IDLE]}'" == CLAIMABLE
    assert {s for s, p in PHASES.items() if p == "done"} == set(FINAL)
    assert FINISHED == "phase = 'done'" and UNFINISHED == "phase <> 'done'"
    (index,) = [i for i in jobs.indexes if i.name == "ix_jobs_unfinished"]
    assert str(index.dialect_options["postgresql"]["where"]) == UNFINISHED


def test_the_database_gives_each_status_its_phase(store: JobStore) -> None:
    """The computed column, read back from the database for every status."""
    import sqlalchemy as sa

    from jobstore.core.states import PHASES

    (job_id,) = store.submissions.submit([JobSpec(cmd="/bin/true", iwd="/tmp")], owner="alice",
                                         queue="default", max_attempts=1)[1]
    with store.db.engine.begin() as conn:
        for status in Status:
            conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(status=status.value))
            phase = conn.execute(sa.select(jobs.c.phase).where(jobs.c.id == job_id)).scalar()
            assert phase == PHASES[status], status


def test_listen_and_notify_use_one_channel() -> None:
    assert f"LISTEN {channels.CHANNEL}" == pg.LISTEN_EVENTS


def test_no_statement_is_written_anywhere_else() -> None:
    found = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("db/migrations/"):  # Alembic's revisions keep their own DDL
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and node.value.lstrip().startswith(SQL_STARTS)):
                found.append(f"{rel}:{node.lineno}")
    assert not found, f"hand-written SQL outside the backends' queries.sql: {found}"


def test_typed_rows_have_every_column_of_their_table() -> None:
    """Every column a row is written with (not the one the database computes: jobs.phase)."""
    assert set(JOB_COLUMNS) == {c.name for c in jobs.c if c.computed is None}
    assert [c.name for c in jobs.c if c.computed is not None] == ["phase"]
    assert set(EVENT_COLUMNS) == set(job_events.c.keys())


def test_job_ids_parse_as_htcondor_spells_them() -> None:
    assert parse_job_id("12") == (12, None) and parse_job_id("12.3") == (12, 3)
    with pytest.raises(ValueError, match="CLUSTER.PROC"):
        parse_job_id("12.x")


def test_a_queued_job_is_the_row_the_database_holds(store: JobStore) -> None:
    """The job the commit listeners see at submit (Job.queued) is the row read back."""
    seen: list[Job] = []

    def listener(events):  # type: ignore[no-untyped-def]
        seen.extend(e["job"] for e in events)

    store.db.listen(listener)
    spec = JobSpec(cmd="/bin/true", iwd="/tmp", max_retries=2, custom={"Project": '"x"'})
    _, (job_id,) = store.submissions.submit([spec], owner="alice", queue="q", max_attempts=5)
    assert seen == [store.reads.get_job(job_id)]
    assert isinstance(store.reads.events(job_id)[0], JobEvent)
