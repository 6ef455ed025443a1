"""DAG node scripts in the store: SCRIPT PRE and POST read from the DAG file, the nodes that
wait for them (`pre`, `post`), the lease on one run of a script, and the exits that carry the
DAG forward, on SQLite and PostgreSQL (the access point's service runs them:
tests/system/test_node_scripts.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from backends import BOTH_BACKENDS
from test_dags import DIAMOND, OWNER, _dag, _exit, _queued, _run, _states

from jobstore.api.dags import submit_dag
from jobstore.core.states import Event
from jobstore.db.dagscripts import ScriptExit
from jobstore.db.store import JobStore
from jobstore.errors import DagError, InvalidInput
from jobstore.node import config
from jobstore.submit.dag import read_dag
from jobstore.testing.factories import claim

TOKEN = "0123456789abcdef" * 2


@pytest.fixture
def ap(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> config.Settings:
    """Settings of the access point "ap" on the test's store."""
    monkeypatch.setenv("JOBSTORE_DATABASE_URL", store.db.engine.url.render_as_string(False))
    monkeypatch.setenv("JOBSTORE_SCHEDD_NAME", "ap")
    return config.load_settings(None)


def _script(store: JobStore, dag_id: int, name: str, code: int, n: int = 0) -> None:
    """Run node `name`'s due script, as the access point's service does: the lease, then
    the exit `code`."""
    row = next(r for r in store.dag_scripts.due("ap", owner=OWNER)
               if r.dag_id == dag_id and r.name == name)
    token = f"{n:032x}"
    assert store.dag_scripts.start([(row, token), (row, f"{n + 1:032x}")]) == [True, False]
    assert row not in store.dag_scripts.due("ap")  # one run holds it
    assert store.dag_scripts.held_by("ap", token[:16])[0].token == token
    store.dag_scripts.done([ScriptExit(dag_id, name, row.kind, token, code)])


@pytest.mark.parametrize(("text", "message"), [
    ("SCRIPT PRE A\n", "SCRIPT needs .* PRE, POST or HOLD, a node and an executable"),
    ("SCRIPT DEFER 0 10 PRE A x.sh\n", "0 is less than 1"),
    ("SCRIPT DEFER 256 10 PRE A x.sh\n", "a status of 1 to 255"),
    ("SCRIPT DEFER 1 -1 PRE A x.sh\n", "-1 is less than 0"),
    ("SCRIPT DEFER 1 PRE A x.sh\n", "'PRE' is not an integer"),
    ("SCRIPT DEBUG f BOTH PRE A x.sh\n", "SCRIPT DEBUG needs a file and STDOUT"),
    ("SCRIPT DEFER 1 10 DEBUG f ALL HOLD A x.sh\n", "SCRIPT DEFER of a HOLD script"),
    ("SCRIPT DEBUG f ALL DEFER 1 10 PRE A x.sh\n", "SCRIPT needs"),  # DAGMan's order only
    ("SCRIPT PRE Z x.sh\n", "unknown node 'Z'"),
    ("PRE_SKIP A 0\n", "PRE_SKIP's exit code is not 0"),
    ("PRE_SKIP A x\n", "'x' is not an integer"),
    ("SCRIPT POST A x.sh\nRETRY A 2\n", "node A has a SCRIPT and a RETRY"),
])
def test_what_is_refused_of_scripts(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(DagError, match=message):
        read_dag(str(_dag(tmp_path, "JOB A node.sub\n" + text)))


def test_scripts_are_read_with_their_arguments(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "node.sub").write_text("queue\n")
    dag = read_dag(str(_dag(tmp_path, "JOB A node.sub\nJOB B node.sub DIR sub\n"
                            "SCRIPT PRE A pre.sh $JOB  two\t3\nSCRIPT post ALL_NODES "
                            "post.sh $RETURN\nPRE_SKIP B 7\n")))
    a, b = dag.nodes["A"], dag.nodes["B"]
    assert (a.pre_script, a.post_script, a.pre_skip) == ("pre.sh $JOB two 3", "post.sh $RETURN",
                                                         None)
    assert (b.pre_script, b.post_script, b.pre_skip) == (None, "post.sh $RETURN", 7)
    assert b.directory == str(tmp_path / "sub")


def test_defer_and_debug_are_read_for_the_script_they_precede(tmp_path: Path) -> None:
    dag = read_dag(str(_dag(tmp_path, "JOB A node.sub\nJOB B node.sub\n"
                            "SCRIPT DEFER 4 30 DEBUG a.log ALL PRE A pre.sh $JOB\n"
                            "SCRIPT debug b.log stderr POST ALL_NODES post.sh\n"
                            "SCRIPT POST B plain.sh\n")))
    a, b = dag.nodes["A"], dag.nodes["B"]
    assert a.pre_script == "pre.sh $JOB" and b.post_script == "plain.sh"
    assert a.script_options == {"pre": {"defer": [4, 30], "debug": ["a.log", "ALL"]},
                                "post": {"debug": ["b.log", "STDERR"]}}
    assert b.script_options == {}  # its own later SCRIPT POST has none


@BOTH_BACKENDS
def test_a_deferred_script_is_due_again_after_its_time(store: JobStore, ap: config.Settings,
                                                      tmp_path: Path) -> None:
    """SCRIPT DEFER: the run that exits with the status gives its lease back and the node
    waits in `pre`; the script is due again once its time has passed, and its next exit
    carries the DAG as any other."""
    dag_id = _queued(store, tmp_path, ap, DIAMOND + "SCRIPT DEFER 3 1 DEBUG a.log STDOUT "
                     "PRE A pre.sh\n")
    [row] = store.dag_scripts.due("ap", owner=OWNER)
    assert (row.defer, row.debug) == ((3, 1), ("a.log", "STDOUT"))
    assert store.dag_scripts.start([(row, TOKEN)]) == [True]
    store.dag_scripts.defer([(ScriptExit(dag_id, "A", "pre", TOKEN, 3), time.time() + 0.5)])
    assert _states(store, dag_id)["A"] == "pre"
    assert store.dag_scripts.due("ap") == []  # not before its time
    assert store.dag_scripts.holding([(dag_id, "A", "pre")])[(dag_id, "A", "pre")] is None
    time.sleep(0.6)
    [again] = store.dag_scripts.due("ap")
    assert again.name == "A" and again.token is None
    _script(store, dag_id, "A", 0, n=7)
    assert _states(store, dag_id)["A"] == "queued"


@BOTH_BACKENDS
def test_a_hold_script_is_due_once_for_the_holds_since_its_last_run(
        store: JobStore, ap: config.Settings, tmp_path: Path) -> None:
    """SCRIPT HOLD: due when a job of its node was held since it last started (its own lease,
    beside the node's POST script's), and again for the holds that came while it ran; its
    exit changes nothing."""
    dag_id = _queued(store, tmp_path, ap, DIAMOND + "SCRIPT DEBUG h.log ALL HOLD A hold.sh "
                     "$JOB\nSCRIPT POST A post.sh\nSCRIPT HOLD B hold.sh\n")
    assert store.dag_scripts.due_holds("ap") == []
    job = store.reads.list_jobs()[0]
    store.actions.admin(job.id, Event.HOLD, "held by hand")
    [row] = store.dag_scripts.due_holds("ap", owner=OWNER)
    assert (row.name, row.kind, row.command, row.debug, row.token) == (
        "A", "hold", "hold.sh $JOB", ("h.log", "ALL"), None)
    assert store.dag_scripts.due_holds("elsewhere") == []
    assert store.dag_scripts.due_holds("ap", per_dag=0) == []  # its DAG's throttle
    assert store.dag_scripts.due_holds("ap", per_owner=0) == []  # and its owner's
    assert store.dag_scripts.start([(row, TOKEN), (row, f"{1:032x}")]) == [True, False]
    assert store.dag_scripts.held_by("ap", TOKEN[:16])[0].kind == "hold"
    store.actions.admin(job.id, Event.RELEASE, "released")
    store.actions.admin(job.id, Event.HOLD, "held again while the script runs")
    assert store.dag_scripts.due_holds("ap") == []  # one runs
    assert store.dag_scripts.holding([(dag_id, "A", "hold")])[(dag_id, "A", "hold")] == TOKEN
    store.dag_scripts.done([ScriptExit(dag_id, "A", "hold", TOKEN, 9)])
    [again] = store.dag_scripts.due_holds("ap")  # the second hold
    store.dag_scripts.start([(again, f"{2:032x}")])
    store.dag_scripts.done([ScriptExit(dag_id, "A", "hold", f"{2:032x}", 0)])
    assert store.dag_scripts.due_holds("ap") == []
    assert _states(store, dag_id)["A"] == "queued"  # the exits changed nothing
    store.actions.admin(job.id, Event.RELEASE, "released")
    assert "A" in _run(store)
    assert _states(store, dag_id)["A"] == "post"


@BOTH_BACKENDS
@pytest.mark.parametrize(("options", "message"), [
    ({"Z": {"pre": {"defer": [1, 1]}}}, "no node Z"),
    ({"A": {"post": {"defer": [1, 1]}}}, "the node has no POST script"),
    ({"A": {"pre": {"defer": [0, 1]}}}, "DEFER is an exit status of 1 to 255"),
    ({"A": {"pre": {"defer": [1, 10**9]}}}, "DEFER is an exit status"),
    ({"A": {"pre": {"defer": ["1", 1]}}}, "DEFER is an exit status"),
    ({"A": {"pre": {"debug": ["a\nb", "ALL"]}}}, "DEBUG is a file's name"),
    ({"A": {"pre": {"debug": ["a", "BOTH"]}}}, "DEBUG is a file's name"),
    ({"A": {"pre": {"run_as": "root"}}}, "DEFER and DEBUG are its only options"),
    ({"A": {"hold": {"defer": [1, 1]}}}, "its command line and DEBUG are its only options"),
    ({"A": {"hold": {"command": " "}}}, "its command line is one line"),
    ({"A": {"hold": {"command": "x.sh\nrm -rf /"}}}, "its command line is one line"),
    ({"A": {"other": {}}}, "is not PRE, POST or HOLD"),
    ({"A": ["pre"]}, "not an object"),
])
def test_the_door_checks_every_script_option(store: JobStore, ap: config.Settings,
                                             tmp_path: Path, options: dict[str, Any],
                                             message: str) -> None:
    """What a client that skips the DAG file's reading may send is checked where it cannot
    lie (on PostgreSQL, the door's own function): one line, nothing stored."""
    dag_id = _queued(store, tmp_path, ap, DIAMOND + "SCRIPT PRE A pre.sh\n")
    with pytest.raises(InvalidInput, match=message), store.db.transaction() as conn:
        store.dags.door.dag_script_options(conn, dag_id, options)
    [row] = store.dag_scripts.due("ap")
    assert (row.defer, row.debug) == (None, None)


@BOTH_BACKENDS
def test_pre_and_post_scripts_carry_the_dag(store: JobStore, ap: config.Settings,
                                            tmp_path: Path) -> None:
    """A PRE script holds its node's jobs until it exits 0; a POST script's exit is its
    node's (here it turns a failed job into a done node); the counts and tokens say so."""
    dag_id = _queued(store, tmp_path, ap, DIAMOND
                     + "SCRIPT PRE A pre.sh\nSCRIPT POST B post.sh $RETURN\n")
    assert _states(store, dag_id) == {"A": "pre", "B": "waiting", "C": "waiting",
                                      "D": "waiting"}
    assert claim(store) is None  # A's job waits for its PRE script
    [row] = store.dag_scripts.due("ap", owner=OWNER)
    assert (row.name, row.kind, row.command, row.directory, row.token) == (
        "A", "pre", "pre.sh", str(tmp_path), None)
    assert store.dag_scripts.due("elsewhere") == []
    _script(store, dag_id, "A", 0)
    assert _states(store, dag_id)["A"] == "queued"
    assert sorted(_run(store, {"B": 3})) == ["A", "B", "C"]
    assert _states(store, dag_id)["B"] == "post"
    [row] = store.dag_scripts.due("ap")
    assert (row.name, row.kind, row.job_code, row.pre_code) == ("B", "post", 3, None)
    assert row.cluster_id is not None
    assert [(j.status, j.exit_code) for j in store.dag_scripts.node_jobs(row.cluster_id)] == [
        ("completed", 3)]
    _script(store, dag_id, "B", 0)
    [posted] = [e for e in store.reads.events(store.reads.find_jobs(row.cluster_id)[0].id)
                if e.event == "post_script"]
    assert (posted.from_status, posted.to_status) == ("completed", "completed")
    assert posted.attrs == {"ReturnValue": 0, "DAGNodeName": "B"}
    assert _run(store) == ["D"]
    assert set(_states(store, dag_id).values()) == {"done"}
    dag = store.dags.dag_of(dag_id)
    assert dag is not None and (dag.status, dag.exit_code) == ("completed", 0)


@BOTH_BACKENDS
def test_a_failing_pre_script_fails_its_node_and_pre_skip_skips_it(
        store: JobStore, ap: config.Settings, tmp_path: Path) -> None:
    dag_id = _queued(store, tmp_path, ap, DIAMOND
                     + "SCRIPT PRE B pre.sh\nSCRIPT PRE C pre.sh\nPRE_SKIP C 9\n"
                     "SCRIPT POST B post.sh\n")
    assert _run(store) == ["A"]
    assert {k: v for k, v in _states(store, dag_id).items() if v == "pre"} == {
        "B": "pre", "C": "pre"}
    _script(store, dag_id, "C", 9)
    _script(store, dag_id, "B", 4, n=5)
    states = _states(store, dag_id)
    assert (states["B"], states["C"], states["D"]) == ("failed", "done", "futile")
    nodes = {n.name: n for n in store.dags.dag_nodes_of(dag_id)}
    assert (nodes["B"].exit_code, nodes["B"].pre_code, nodes["C"].pre_code) == (4, 4, 9)
    jobs = {j.cluster_id: j for j in store.reads.list_jobs(include_final=True)}
    assert jobs[nodes["B"].cluster_id].status == "removed"
    assert "its PRE script exited with 4" in (jobs[nodes["B"].cluster_id].reason or "")
    assert "PRE_SKIP" in (jobs[nodes["C"].cluster_id].reason or "")
    assert claim(store) is None
    dag = store.dags.dag_of(dag_id)
    assert dag is not None and (dag.status, dag.exit_code) == ("failed", 1)


@BOTH_BACKENDS
def test_a_noop_node_runs_its_scripts_and_a_removed_dag_drops_a_due_one(
        store: JobStore, ap: config.Settings, tmp_path: Path) -> None:
    dag_id = _queued(store, tmp_path, ap,
                     "JOB N node.sub NOOP\nJOB A node.sub\nPARENT N CHILD A\n"
                     "SCRIPT PRE N pre.sh\nSCRIPT POST N post.sh\nSCRIPT PRE A pre.sh\n")
    _script(store, dag_id, "N", 0)
    assert _states(store, dag_id) == {"N": "post", "A": "waiting"}
    _script(store, dag_id, "N", 0, n=2)
    assert _states(store, dag_id) == {"N": "done", "A": "pre"}
    [row] = store.dag_scripts.due("ap")
    assert store.dag_scripts.start([(row, TOKEN)]) == [True]
    assert store.dag_scripts.holding([(dag_id, "A", "pre")])[(dag_id, "A", "pre")] == TOKEN
    assert store.dags.remove_dag(dag_id)
    assert _states(store, dag_id)["A"] == "futile"
    assert store.dag_scripts.holding([(dag_id, "A", "pre")])[(dag_id, "A", "pre")] is None
    store.dag_scripts.done([ScriptExit(dag_id, "A", "pre", TOKEN, 0)])  # too late: nothing
    assert _states(store, dag_id)["A"] == "futile" and claim(store) is None
    dag = store.dags.dag_of(dag_id)
    assert dag is not None and dag.status == "removed"
    with pytest.raises(InvalidInput):
        store.dag_scripts.start([(row._replace(name="A"), "../../etc/passwd")])


@BOTH_BACKENDS
def test_a_held_dag_starts_no_pre_script(store: JobStore, ap: config.Settings,
                                         tmp_path: Path) -> None:
    dag_id = _queued(store, tmp_path, ap,
                     "JOB A node.sub\nSCRIPT PRE A pre.sh\nSCRIPT POST A post.sh\n")
    [row] = store.dag_scripts.due("ap")
    assert store.dags.pause_dag(dag_id, True)
    assert store.dag_scripts.due("ap") == []
    assert store.dag_scripts.start([(row, TOKEN)]) == [False]
    assert store.dags.pause_dag(dag_id, False)
    _script(store, dag_id, "A", 0)
    job = claim(store)
    assert job is not None
    _exit(store, job, 0)
    _script(store, dag_id, "A", 2, n=3)
    dag = store.dags.dag_of(dag_id)
    assert dag is not None and (dag.status, dag.exit_code) == ("failed", 1)
    assert store.dags.dag_nodes_of(dag_id)[0].exit_code == 2


@BOTH_BACKENDS
def test_nobodys_many_scripts_keep_anothers_waiting(store: JobStore, ap: config.Settings,
                                                    tmp_path: Path) -> None:
    """What is due comes at most `per_dag` of a DAG's PRE scripts and `per_owner` of an
    owner's, each owner's oldest first and the owners in turn: a DAG of many due scripts
    (or an owner of many DAGs) never hides another's."""
    many = "".join(f"JOB N{i} node.sub NOOP\nSCRIPT PRE N{i} pre.sh\n" for i in range(30))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _queued(store, tmp_path / "a", ap, many)
    second = _queued(store, tmp_path / "b", ap, "JOB A node.sub\nSCRIPT PRE A pre.sh\n")
    due = store.dag_scripts.due("ap", per_dag=20, per_owner=100)
    assert len(due) == 21 and (second, "A") in [(r.dag_id, r.name) for r in due]
    assert len(store.dag_scripts.due("ap", per_dag=20, per_owner=5)) == 5
    # an owner's cap counts what her DAGs' caps let through
    assert len(store.dag_scripts.due("ap", per_dag=20, per_owner=25)) == 21
    if os.geteuid() != 0:
        return  # another owner's DAG: submitted by root only
    (tmp_path / "c").mkdir()
    theirs = submit_dag(store, str(_dag(tmp_path / "c", "JOB B node.sub\nSCRIPT PRE B x.sh\n")),
                        ap, owner="jsbob").dag_id
    due = store.dag_scripts.due("ap", per_dag=20, per_owner=100, limit=2)
    assert [(r.dag_id, r.name) for r in due] == [(first, "N0"), (theirs, "B")]


@BOTH_BACKENDS
def test_a_removed_dag_runs_no_post_script(store: JobStore, ap: config.Settings,
                                           tmp_path: Path) -> None:
    """A node whose job ended waits for its POST script: the DAG removed meanwhile fails it
    (its FINAL node's still runs), and no POST script of it is due any more."""
    dag_id = _queued(store, tmp_path, ap, "JOB A node.sub\nJOB B node.sub\n"
                     "SCRIPT POST ALL_NODES post.sh\nFINAL F node.sub\nSCRIPT POST F post.sh\n")
    for _ in range(2):
        job = claim(store)
        assert job is not None
        _exit(store, job, 0)
    assert {r.name for r in store.dag_scripts.due("ap")} == {"A", "B"}
    assert store.dags.remove_dag(dag_id)
    assert _states(store, dag_id) == {"A": "failed", "B": "failed", "F": "queued"}
    job = claim(store)
    assert job is not None
    _exit(store, job, 0)
    assert [r.name for r in store.dag_scripts.due("ap")] == ["F"]
    _script(store, dag_id, "F", 0)
    dag = store.dags.dag_of(dag_id)
    assert dag is not None and dag.status == "removed"


def _exit_with_output(store: JobStore, tmp: Path, node: str) -> int:
    """Run the next job (node `node`'s) to a 0 exit, with an output sent back, as JOB_EXIT
    does: its id."""
    from jobstore.db.sandbox import OUT, FileSource

    job = claim(store)
    assert job is not None and job.ad["DAGNodeName"]["expr"].strip('"') == node
    (tmp / "out.txt").write_text(node)
    with store.db.transaction() as conn:
        store.files.store_files(conn, cluster_id=job.cluster_id, proc_id=job.proc_id,
                                owner=job.owner, direction=OUT, attempt=job.claims,
                                sources=[FileSource("out.txt", str(tmp / "out.txt"), 0o644)])
    _exit(store, job, 0)
    return job.id


@BOTH_BACKENDS
def test_scripts_wait_for_the_outputs_they_may_read(store: JobStore, ap: config.Settings,
                                                    tmp_path: Path) -> None:
    """A POST script waits until its node's outputs are home, a PRE script until its
    parents' are: delivered into their Iwd, or failed once (DAGMan runs them after the
    shadow wrote the outputs)."""
    dag_id = _queued(store, tmp_path, ap, "JOB A node.sub\nJOB B node.sub\nJOB C node.sub\n"
                     "PARENT A CHILD B\nPARENT B CHILD C\nSCRIPT POST A post.sh\n"
                     "SCRIPT PRE C pre.sh\n")
    a = _exit_with_output(store, tmp_path, "A")
    assert _states(store, dag_id)["A"] == "post"
    assert store.dag_scripts.due("ap") == []
    assert store.deliveries.take(store.reads.get_job(a), "ap", 1.0, 300.0)
    assert store.dag_scripts.due("ap") == []  # taken, not yet written
    store.deliveries.delivered(a, 1, 2.0)
    _script(store, dag_id, "A", 0)
    b = _exit_with_output(store, tmp_path, "B")
    assert _states(store, dag_id)["C"] == "pre"
    assert store.dag_scripts.due("ap") == []
    assert store.deliveries.take(store.reads.get_job(b), "ap", 1.0, 300.0)
    store.deliveries.failed(b, "Iwd is gone", 2.0, 60.0)
    _script(store, dag_id, "C", 0)
    assert _run(store) == ["C"]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_the_door_takes_a_script_with_its_absolute_directory_only(store: JobStore) -> None:
    """What the service would refuse to run is refused when the DAG is queued."""
    for bad in ({"post_script": "x", "directory": "rel"}, {"post_script": "  "},
                {"pre_script": "x"}, {"pre_script": "x\ny", "directory": "/d"}):
        with pytest.raises(InvalidInput, match="a SCRIPT is a command"), \
                store.db.transaction() as conn:
            dag_id = store.door.new_dag(conn, owner=OWNER, queue="default", path="/d/x.dag",
                                        batch_name=None, max_jobs=None, max_idle=None,
                                        attrs={}, now=0.0, home="ap")
            store.door.dag_nodes(conn, dag_id, [{"name": "N", "procs": 0, **bad}], [], {}, 0.0)


@BOTH_BACKENDS
def test_a_script_with_no_room_to_start_keeps_its_lease(store: JobStore, ap: config.Settings,
                                                        tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """When the host has no room for a runner, the run keeps its lease and its runner starts
    on a later pass; a run whose DAG is removed meanwhile never starts."""
    import dataclasses
    import errno
    import time

    from jobstore.accesspoint import dagscripts, scriptrunner
    from jobstore.testing.support import ensure_account

    if os.geteuid() == 0:
        ensure_account(OWNER)
    (tmp_path / "results").mkdir(mode=0o700)
    settings = dataclasses.replace(ap, dag_scripts=str(tmp_path / "results"))
    real = scriptrunner.start
    started: list[str] = []

    def no_room(*args: object) -> int:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    def counted(directory: Path, token: str, *args: object) -> int:
        started.append(token)
        return real(directory, token, *args)  # type: ignore[arg-type]

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    kept = _queued(store, tmp_path / "a", ap, "JOB A node.sub\nSCRIPT PRE A /bin/false\n")
    dropped = _queued(store, tmp_path / "b", ap, "JOB B node.sub\nSCRIPT PRE B /bin/false\n")
    monkeypatch.setattr(scriptrunner, "start", no_room)
    duty = dagscripts.DagScripts(store, "ap", settings)
    duty.pass_once()
    held = {r.name: str(r.token) for r in store.dag_scripts.held_by("ap", "")}
    assert set(held) == {"A", "B"} and all(duty._runs[t].waiting for t in held.values())
    assert store.dags.remove_dag(dropped)
    monkeypatch.setattr(scriptrunner, "start", counted)
    duty._check_at = 0.0
    deadline = time.monotonic() + 30
    while duty._runs:
        assert time.monotonic() < deadline, duty._runs
        duty.pass_once()
        time.sleep(0.05)
    assert started == [held["A"]]  # once; B's never
    assert store.dags.dag_nodes_of(kept)[0].status == "failed"  # its script ran, and failed
    assert _states(store, dropped) == {"B": "futile"}


def _late_dag(store: JobStore, ap: config.Settings, tmp: Path, inputs: dict[str, str],
              made: Callable[[Path], None], queue: str = "queue",
              dead_service: bool = False) -> tuple[Path, int]:
    """A DAG of node A (run at once) and children that read `inputs` (node -> its
    transfer_input_files) when they are submitted, in a directory of the owner's where
    `made(dir)` then makes A's outputs (each child's submit description ends with
    `queue`); the access point's service run until no child waits to be submitted: (the
    directory, the DAG's id). `dead_service`: one took the leases first, and died."""
    import dataclasses
    import tempfile
    import time

    from jobstore.accesspoint import dagscripts
    from jobstore.testing.support import ensure_account

    work = Path(tempfile.mkdtemp(prefix="jobstore-late-"))  # the owner's, as a DAG's is
    if os.geteuid() == 0:
        user = ensure_account(OWNER)
        os.chown(work, user.pw_uid, user.pw_gid)
    (tmp / "results").mkdir(mode=0o700)
    settings = dataclasses.replace(ap, dag_scripts=str(tmp / "results"))
    for node, listed in inputs.items():
        (work / f"{node}.sub").write_text("executable = /bin/true\ntransfer_executable = false\n"
                                          "should_transfer_files = YES\n"
                                          f"transfer_input_files = {listed}\n{queue}\n")
    dag_id = _queued(store, work, ap, "JOB A node.sub\n" + "".join(
        f"JOB {n} {n}.sub\nPARENT A CHILD {n}\n" for n in inputs))
    assert _run(store) == ["A"]
    assert {k: v for k, v in _states(store, dag_id).items() if k != "A"} == dict.fromkeys(
        inputs, "pre")
    made(work)
    duty = dagscripts.DagScripts(store, "ap", settings)
    if dead_service:  # one takes the leases and dies before it wrote or read anything
        duty._start(store.dag_scripts.due("ap"))
        assert duty._runs
        for left in (tmp / "results").glob("*/*.json"):
            left.unlink()
        duty = dagscripts.DagScripts(store, "ap", settings)
    deadline = time.monotonic() + 30
    while {_states(store, dag_id)[n] for n in inputs} & {"pre"}:
        assert time.monotonic() < deadline, _states(store, dag_id)
        duty.pass_once()
        time.sleep(0.05)
    assert not duty._runs
    assert not [p for p in (tmp / "results").glob("*/*") if p.name != "id"]
    return work, dag_id


@BOTH_BACKENDS
def test_a_childs_inputs_are_read_when_it_is_submitted(store: JobStore, ap: config.Settings,
                                                       tmp_path: Path) -> None:
    """A node with parents takes the transfer_input_files they make: read by the access
    point as the DAG's owner once its parents are done, stored with its jobs' release, by
    the service started again when the one that leased them died; one it cannot read fails
    its node (DAGMan's -1001) and nothing of it runs."""
    import shutil

    from jobstore.db.sandbox import IN

    def made(work: Path) -> None:
        (work / "a.out").write_text("made by A")
        (work / "d").mkdir()
        (work / "d" / "x.txt").write_text("x")

    work, dag_id = _late_dag(store, ap, tmp_path, {"B": "a.out, d", "C": "missing.txt"}, made,
                             dead_service=True)
    nodes = {n.name: n for n in store.dags.dag_nodes_of(dag_id)}
    assert (nodes["B"].status, nodes["C"].status, nodes["C"].exit_code) == (
        "queued", "failed", -1001)
    jobs = {j.cluster_id: j for j in store.reads.list_jobs(include_final=True)}
    assert "transfer_input_files could not be read" in (jobs[nodes["C"].cluster_id].reason
                                                          or "")
    b = claim(store)
    assert b is not None and b.cluster_id == nodes["B"].cluster_id
    files = {f.name: f.size for f in store.files.job_files_of(b, IN)}
    assert files == {"a.out": len("made by A"), "d/x.txt": 1}
    assert claim(store) is None
    shutil.rmtree(work)


@BOTH_BACKENDS
def test_a_childs_inputs_are_what_the_owner_reads_within_the_limits(
        store: JobStore, ap: config.Settings, tmp_path: Path) -> None:
    """The service never reads her files itself: what a file shows its reader (/proc) is
    what she would read; a file is taken at the size it had when it was opened, and one
    over the store's limits fails its node before its bytes are taken, as does a name that
    is not UTF-8."""
    import shutil

    from jobstore.db.sandbox import IN

    store.files.set_input_limits({"max_input_file_mb": 1})

    def made(work: Path) -> None:
        with open(work / "big.dat", "wb") as f:
            f.truncate(2 << 20)  # sparse: no disk, 2 MB
        (work / "d").mkdir()
        (work / "d" / os.fsdecode(b"\xff")).write_text("x")

    work, dag_id = _late_dag(store, ap, tmp_path, {"B": "/proc/kallsyms", "C": "big.dat",
                                                   "D": "d"}, made)
    nodes = {n.name: (n.status, n.exit_code) for n in store.dags.dag_nodes_of(dag_id)}
    assert nodes == {"A": ("done", 0), "B": ("queued", None), "C": ("failed", -1001),
                     "D": ("failed", -1001)}
    b = claim(store)
    assert b is not None
    [stored] = store.files.job_files_of(b, IN)
    content = b"".join(store.files.file_content(stored.owner, stored.sha256))
    with open("/proc/kallsyms", "rb") as f:
        roots = f.readline()
    if os.geteuid() == 0 and not roots.startswith(b"0000"):
        assert roots not in content  # root's view of the kernel's addresses
    shutil.rmtree(work)


@BOTH_BACKENDS
def test_the_door_takes_late_inputs_with_absolute_paths_and_sandbox_names(
        store: JobStore) -> None:
    """What the access point would read as the owner is checked when the DAG is queued: an
    absolute path, a name inside the sandbox, no control characters, at most 1000 in 1 MB."""
    bads: list[Any] = ["x", [], [["rel", "x"]], [["/a", "../x"]], [["/a", "/x"]],
                       [["/a\n", "x"]], [["/a", "x", "y"]], [[1, "x"]], [["/a", "x"]] * 1001,
                       [["/" + "a" * 4000, "b" * 4000]] * 200]  # 1.6 MB
    for bad in bads:
        with pytest.raises(InvalidInput, match="late input"), store.db.transaction() as conn:
            dag_id = store.door.new_dag(conn, owner=OWNER, queue="default", path="/d/x.dag",
                                        batch_name=None, max_jobs=None, max_idle=None,
                                        attrs={}, now=0.0, home="ap")
            store.door.dag_nodes(conn, dag_id, [{"name": "N", "procs": 1,
                                                 "late_inputs": bad}], [], {}, 0.0)
    with store.db.transaction() as conn:
        dag_id = store.door.new_dag(conn, owner=OWNER, queue="default", path="/d/x.dag",
                                    batch_name=None, max_jobs=None, max_idle=None,
                                    attrs={}, now=0.0, home="ap")
        store.door.dag_nodes(conn, dag_id, [{"name": "N", "procs": 1,
                                             "late_inputs": [["/d/a b", "d/a b"], ["/d/", ""]]}],
                             [], {}, 0.0)


def test_late_inputs_are_read_one_node_of_each_owner_a_pass(store: JobStore,
                                                           ap: config.Settings,
                                                           tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """One owner's many (or slow) late inputs keep another's node waiting one of hers at
    most: each pass reads one node of each owner, the owners served least lately first."""
    import dataclasses

    from jobstore.accesspoint import dagscripts

    (tmp_path / "results").mkdir(mode=0o700)
    duty = dagscripts.DagScripts(store, "ap", dataclasses.replace(
        ap, dag_scripts=str(tmp_path / "results")))
    read: list[str] = []
    monkeypatch.setattr(duty, "_store_inputs", lambda token, run: read.append(token))
    runs = [(f"m{i}", dagscripts._Run(1, f"M{i}", "pre", "mallory", 0.0, late=True))
            for i in range(3)] + [("b0", dagscripts._Run(2, "B", "pre", "bob", 0.0, late=True))]
    duty._read_inputs(runs)
    assert read == ["m0", "b0"]
    duty._read_inputs(runs[1:3])  # hers that are left; bob's was read
    duty._read_inputs([runs[2], ("b1", dagscripts._Run(2, "C", "pre", "bob", 0.0, late=True))])
    assert read[2:] == ["m1", "b1", "m2"]  # bob was served less lately than she


def test_a_child_that_does_not_end_is_killed_and_never_waited_for() -> None:
    """The owner's reader or writer that does not end is killed, and the caller goes on."""
    import time

    from jobstore.api.ownerwrite import reap

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(3)
    assert reap(pid, 5.0) == 3 << 8
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        time.sleep(60)
        os._exit(0)
    start = time.monotonic()
    assert reap(pid, 0.1) is None
    assert time.monotonic() - start < 1.5
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped once killed


@BOTH_BACKENDS
def test_a_childs_inputs_go_to_each_of_its_jobs(store: JobStore, ap: config.Settings,
                                                tmp_path: Path) -> None:
    """Jobs of a node whose own inputs differ (each its `input`) take the node's late
    inputs too."""
    import shutil

    from jobstore.db.sandbox import IN

    def made(work: Path) -> None:
        (work / "a.out").write_text("made by A")

    work, _dag_id = _late_dag(store, ap, tmp_path, {"B": "a.out"}, made,
                              queue="input = $(f)\nqueue f in (/etc/hostname, /etc/passwd)")
    jobs = [claim(store), claim(store)]
    assert all(j is not None for j in jobs)
    names = [sorted(f.name for f in store.files.job_files_of(j, IN)) for j in jobs if j]
    assert names == [["a.out", "hostname"], ["a.out", "passwd"]]
    shutil.rmtree(work)



@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_an_owners_open_transaction_keeps_nobody_elses_scripts_waiting(
        store: JobStore, ap: config.Settings, tmp_path: Path) -> None:
    """A hostile review's stall: her session locks her own DAG's rows (a door call in a
    transaction she never ends); the service's leases and exits skip her nodes, and the
    other DAGs' scripts go on at once (hers when she lets go)."""
    import psycopg
    from sqlalchemy.engine import make_url

    from jobstore.testing.support import libpq_url

    (tmp_path / "hers").mkdir()
    (tmp_path / "theirs").mkdir()
    hers = _queued(store, tmp_path / "hers", ap, "JOB A node.sub\nSCRIPT PRE A pre.sh\n")
    theirs = _queued(store, tmp_path / "theirs", ap, "JOB A node.sub\nSCRIPT PRE A pre.sh\n")
    rows = {r.dag_id: r for r in store.dag_scripts.due("ap")}
    # the service's own session, as the agents' role it connects as, which would wait for her
    # (and fail) were her rows waited for
    role = f"js_ap_{os.urandom(4).hex()}"
    owner_url = store.db.engine.url.render_as_string(False)
    with psycopg.connect(libpq_url(owner_url), autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
    store.db.backend.roles().grant_hook(role)
    store = JobStore.from_url(make_url(owner_url).set(username=role).render_as_string(False),
                              statement_timeout_ms=10_000)
    with psycopg.connect(libpq_url(owner_url)) as her:
        her.execute("SELECT 1 FROM dag_nodes n JOIN dags d ON d.id = n.dag_id "
                    "WHERE n.dag_id = %s FOR UPDATE", (hers,))
        started = time.monotonic()
        assert store.dag_scripts.start([(rows[hers], TOKEN), (rows[theirs], f"{1:032x}")]) == [
            False, True]
        exits = [ScriptExit(theirs, "A", "pre", f"{1:032x}", 0)]
        assert store.dag_scripts.done(exits) == exits
        assert time.monotonic() - started < 5
        assert _states(store, theirs)["A"] == "queued" and _states(store, hers)["A"] == "pre"
        her.rollback()
    assert store.dag_scripts.start([(rows[hers], TOKEN)]) == [True]
    mine = [ScriptExit(hers, "A", "pre", TOKEN, 0)]
    with psycopg.connect(libpq_url(owner_url)) as her:
        her.execute("SELECT 1 FROM dags WHERE id = %s FOR UPDATE", (hers,))
        assert store.dag_scripts.done(mine) == []  # given on a later pass
        her.rollback()
    assert store.dag_scripts.done(mine) == mine
    assert _states(store, hers)["A"] == "queued"
    store.db.engine.dispose()
    with psycopg.connect(libpq_url(owner_url), autocommit=True) as admin:
        admin.execute(f"DROP OWNED BY {role}")
        admin.execute(f"DROP ROLE {role}")


def test_an_owners_deferred_scripts_start_again_a_minute_at_most(
        ap: config.Settings, store: JobStore, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A DEFER that always asks again costs the service a process per run: one owner's
    deferred scripts start again AGAIN_PER_MINUTE times a minute at most."""
    from jobstore.accesspoint.dagscripts import AGAIN_PER_MINUTE, DagScripts

    monkeypatch.setenv("JOBSTORE_DAG_SCRIPTS", str(tmp_path / "runs"))
    service = DagScripts(store, "ap", config.load_settings(None))
    assert all(service._may_run_again("mallory") for _ in range(AGAIN_PER_MINUTE))
    assert not service._may_run_again("mallory")
    assert service._may_run_again("alice")


def test_the_service_logs_what_is_not_printable_as_question_marks(
        caplog: pytest.LogCaptureFixture) -> None:
    """Node names, commands and paths are the owners': root's log shows them, not obeys them
    (a hostile review put a C1 CSI and a right-to-left override in a HOLD command)."""
    from jobstore.accesspoint.service import LOG

    with caplog.at_level("WARNING", logger=LOG.name):
        LOG.warning("DAG %s node %s: its HOLD script: %s", 1, "A", "fake\x9b2J\u202eFAKE")
    assert caplog.records[-1].getMessage() == "DAG 1 node A: its HOLD script: fake?2J?FAKE"
