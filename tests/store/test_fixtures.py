"""The fixtures in conftest.py work."""

from pathlib import Path

import sqlalchemy as sa


def _roundtrip(url: str) -> list[tuple[int, str]]:
    engine = sa.create_engine(url)
    try:
        meta = sa.MetaData()
        table = sa.Table(
            "t", meta, sa.Column("id", sa.Integer, primary_key=True), sa.Column("v", sa.Text)
        )
        meta.create_all(engine)
        with engine.begin() as conn:
            conn.execute(table.insert(), [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(sa.select(table).order_by(table.c.id))]
    finally:
        engine.dispose()


def test_sqlite_url(sqlite_url, tmp_path):
    assert _roundtrip(sqlite_url) == [(1, "a"), (2, "b")]
    assert (tmp_path / "jobstore.db").is_file()


def test_pg_url(pg_url):
    assert sa.make_url(pg_url).database.startswith("jobstore_test_")
    assert _roundtrip(pg_url) == [(1, "a"), (2, "b")]


def test_db_url(db_url, request):
    backend = request.node.callspec.params["db_url"]
    assert sa.make_url(db_url).get_backend_name() == backend
    assert _roundtrip(db_url) == [(1, "a"), (2, "b")]


def test_condor_config(condor_config: Path):
    text = condor_config.read_text()
    assert "UID_DOMAIN = localdomain" in text
    assert "STARTD_JOB_HOOK_KEYWORD = JOBSTORE" in text
    assert (condor_config.parent / "log").is_dir()


def test_fixtures_dir(fixtures_dir: Path):
    """The transcripts live in the repository: a lone clone runs the tests."""
    transcripts = fixtures_dir / "htcondor-transcripts"
    assert (transcripts / "README.md").is_file()
    assert (transcripts / "01-normal-job" / "01-FETCH_WORK.stdin").is_file()
    assert Path(__file__).resolve().parents[1] in fixtures_dir.parents
