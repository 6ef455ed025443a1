"""A templated bulk submit: a cluster whose per-proc macros are plain text is made by
the PostgreSQL server from one row; anything else is expanded proc by proc. Either way the rows
are the same."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select

from jobstore.core.jobs import JOB_COLUMNS
from jobstore.db.engine import upgrade
from jobstore.db.schema import clusters, jobs
from jobstore.db.store import JobStore
from jobstore.submit import SubmitError, parse_submit_file
from jobstore.testing.support import ordinary_owner

HEAD = "executable = /bin/echo\ntransfer_executable = false\n"
TEMPLATED = {
    "static": "arguments = same for all\nqueue 4\n",
    "process": "arguments = job $(Process) of $(ProcId)\nqueue 12\n",
    "items": ("arguments = -n $(x) -m $(y)\noutput = out.$(x).$(Step)\nerror = err.$(Row)\n"
              "initialdir = /tmp/run$(ItemIndex)\nqueue 3 x, y from (\n a1, b.2\n c-3, d+4\n"
              " e_5, f6\n)\n"),
    "environment": "environment = \"A=$(Item) B=$(Process)\"\nqueue in (red, green, blue)\n",
    "indirect": "base = run.$(Process)\noutput = $(base).out\nqueue 5\n",
}
PROC_BY_PROC = {
    "macro function": "arguments = $INT(Process) \nqueue 3\n",
    "a function behind a macro": "n = $INT(Process)\narguments = job $(n)\nqueue 3\n",
    "item not plain text": "arguments = $(x)\nqueue x in (a1, 'b c')\n",
    "item starting with a dot": "output = $(x)\nqueue x in (a, ..)\n",
    "empty item": "arguments = a $(x)\nqueue x,y from (\n1, 2\n3\n)\n",
    "item named like a counter": "arguments = $(Step)\nqueue Step in (a, b)\n",
    "item named like a counter, in lower case": "arguments = $(row)\nqueue row in (a, b)\n",
    "custom attribute": "+Proc = $(Process)\nqueue 3\n",
    "number": "request_memory = $(Process)00\nqueue 3\n",
    "executable": "executable = /bin/$(x)\nqueue x in (true, false)\n",
    "requirements": "requirements = Memory > $(Process)\nqueue 3\n",
    "log": "log = /tmp/l.$(Process)\nqueue 3\n",
}


def specs_of(tmp_path: Path, body: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "job.sub"
    path.write_text(HEAD + body, encoding="utf-8")
    return parse_submit_file(path)


@pytest.mark.parametrize("body", TEMPLATED.values(), ids=TEMPLATED.keys())
def test_a_template_makes_each_proc_as_its_expansion_does(tmp_path: Path, body: str) -> None:
    specs = specs_of(tmp_path, body)
    template = specs.template()
    assert template is not None and template.procs == len(specs)
    assert [template.spec_of(proc) for proc in range(len(specs))] == list(specs)


@pytest.mark.parametrize("body", PROC_BY_PROC.values(), ids=PROC_BY_PROC.keys())
def test_what_a_template_cannot_hold_is_expanded_proc_by_proc(tmp_path: Path, body: str) -> None:
    specs = specs_of(tmp_path, body)
    assert specs.template() is None
    assert [spec.proc_id for spec in specs] == list(range(len(specs)))


@pytest.fixture
def pg_store(pg_url: str):  # type: ignore[no-untyped-def]
    upgrade(pg_url)
    store = JobStore.from_url(pg_url)
    yield store
    store.db.engine.dispose()


@pytest.mark.parametrize("body", TEMPLATED.values(), ids=TEMPLATED.keys())
def test_the_server_queues_the_rows_a_proc_by_proc_submit_queues(
    tmp_path: Path, pg_store: JobStore, body: str
) -> None:
    specs = specs_of(tmp_path, body)
    made, ids = pg_store.submissions.submit(specs, owner="alice", queue="default", max_attempts=3)
    # a plain list is expanded and inserted proc by proc
    expanded, expected = pg_store.submissions.submit(list(specs), owner="alice", queue="default",
                                                     max_attempts=3)
    assert ids == sorted(ids) and len(ids) == len(expected) == len(specs)
    varying = {"id", "cluster_id", "submitted_at", "updated_at"}
    for got, want in zip(ids, expected, strict=True):
        a, b = pg_store.reads.get_job(got), pg_store.reads.get_job(want)
        assert (a.cluster_id, b.cluster_id) == (made, expanded)
        assert {n: getattr(a, n) for n in JOB_COLUMNS if n not in varying} == {
            n: getattr(b, n) for n in JOB_COLUMNS if n not in varying}
        events = pg_store.reads.events(got)
        assert [(e.event, e.from_status, e.to_status, e.attempt) for e in events] == [
            ("submit", None, "idle", 0)]


def test_a_big_templated_submit_numbers_its_procs_in_order(
    pg_store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Made in statements of CHUNK procs (here 500, across the item rows' bounds)."""
    from jobstore.db.backends.postgresql import bulk

    monkeypatch.setattr(bulk, "CHUNK", 500)
    specs = specs_of(tmp_path, "arguments = $(Process) $(x)\nqueue 700 x in (a, b, c)\n")
    assert specs.template() is not None
    cluster, ids = pg_store.submissions.submit(specs, owner="alice", queue="default",
                                               max_attempts=3)
    with pg_store.db.engine.connect() as conn:
        rows = conn.execute(select(jobs.c.id, jobs.c.proc_id, jobs.c.ad)
                            .where(jobs.c.cluster_id == cluster).order_by(jobs.c.id)).all()
    assert [r.id for r in rows] == ids
    assert [r.proc_id for r in rows] == list(range(2100))
    assert [rows[p].ad["Args"] for p in (0, 499, 500, 699, 700, 1000, 1399, 1400, 2099)] == [
        "0 a", "499 a", "500 a", "699 a", "700 b", "1000 b", "1399 b", "1400 c", "2099 c"]
    assert len(pg_store.reads.events(ids[-1])) == 1


def test_the_widest_proc_of_a_template_is_checked(pg_url: str, tmp_path: Path) -> None:
    """The ad FETCH_WORK would send is checked for the proc with the longest values, not only
    the first and last: an item in the middle too long for a job ad refuses the submit."""
    import htcondor2

    import jobstore

    upgrade(pg_url)
    schedd = jobstore.Schedd(url=pg_url, owner=ordinary_owner())
    sub = htcondor2.Submit({"executable": "/bin/echo", "arguments": "$(x)",
                            "transfer_executable": "false"})
    items = [{"x": "short"}, {"x": "a" * 12_000}, {"x": "short"}]
    with pytest.raises(SubmitError, match="larger than"):
        schedd.submit(sub, itemdata=iter(items))
    store = JobStore.from_url(pg_url)
    try:
        with store.db.engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(jobs)).scalar_one() == 0
            assert conn.execute(select(func.count()).select_from(clusters)).scalar_one() == 0
    finally:
        store.db.engine.dispose()
    assert schedd.submit(sub, itemdata=iter([{"x": "a"}, {"x": "b"}])).num_procs() == 2
    # the widest proc is a real one: two long values in different rows are not added up
    two = htcondor2.Submit({"executable": "/bin/echo", "arguments": "$(x) $(y)",
                            "transfer_executable": "false"})
    rows = [{"x": "a" * 6_000, "y": "b"}, {"x": "a", "y": "b" * 6_000}]
    assert schedd.submit(two, itemdata=iter(rows)).num_procs() == 2
