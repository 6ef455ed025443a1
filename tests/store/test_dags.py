"""DAGs in the job store: DAGMan's input file read and refused line by line, and the
dependencies carried forward by the store itself in the transactions that end the nodes' jobs,
on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import pwd
import time
from pathlib import Path

import pytest
from backends import BOTH_BACKENDS
from emulatornode import node_db  # noqa: F401 - the fixture

from jobstore.api.dags import submit_dag
from jobstore.core import policy
from jobstore.core.claims import Verdict
from jobstore.core.jobs import Job
from jobstore.core.states import Event
from jobstore.db.store import AttemptReport, JobStore
from jobstore.errors import DagError
from jobstore.formats import views
from jobstore.node import config
from jobstore.submit.dag import read_dag
from jobstore.testing.factories import claim, claim_request, report

REQ = claim_request(shape="s")
SUB = "executable = /bin/true\narguments = $(JOB) $(word)\nqueue\n"
# root submits for an ordinary account; an ordinary account only as herself
OWNER = "alice" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name


def _dag(tmp: Path, text: str, sub: str = SUB) -> Path:
    (tmp / "node.sub").write_text(sub)
    path = tmp / "test.dag"
    path.write_text(text)
    return path


# ---- the language -------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "message"), [
    ("JOB A node.sub\nJOB A node.sub\n", "test.dag:2: duplicate node name 'A'"),
    ("JOB A node.sub\nPARENT A CHILD B\n", "test.dag:2: unknown node 'B'"),
    ("JOB A node.sub\nJOB B node.sub\nPARENT A CHILD B\nPARENT B CHILD A\n",
     "the DAG has a cycle: A -> B -> A"),
    ("JOB A missing.sub\n", "test.dag:1: node A: no such submit file"),
    ("JOB A node.sub\nSCRIPT DEFER 3 1 HOLD A hold.sh\n",
     "test.dag:2: SCRIPT DEFER of a HOLD script"),
    ("JOB A node.sub\nSPLICE S other.dag\n", "other.dag: cannot read the DAG file"),
    ("JOB A node.sub\nSUBDAG EXTERNAL S other.dag\n", "other.dag: cannot read the DAG file"),
    ("JOB A node.sub\nSUBDAG S test.dag\n", "test.dag:2: SUBDAG needs EXTERNAL"),
    ("JOB A node.sub\nREJECT\n", "test.dag:2: REJECT"),
    ("JOB A node.sub\nFROB A\n", "test.dag:2: unknown command 'FROB'"),
    ("JOB A node.sub\nRETRY A many\n", "test.dag:2: 'many' is not an integer"),
    ("JOB A node.sub\nVARS A word=unquoted\n", 'is not name="value"'),
    ("JOB A node.sub\nFINAL F node.sub\nPARENT A CHILD F\n", "the FINAL node F may not"),
    ("JOB A {\nexecutable = /bin/true\n", "the inline submit description has no closing"),
    ("# nothing\n", "the DAG has no nodes"),
])
def test_what_dagman_refuses_is_refused_with_its_line(tmp_path: Path, text: str,
                                                      message: str) -> None:
    with pytest.raises(DagError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_dag(str(_dag(tmp_path, text)))


def test_the_language(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "in.sub").write_text(SUB)
    (tmp_path / "more.dag").write_text("JOB E node.sub NOOP\nPARENT D CHILD E\n")
    (tmp_path / "dag.config").write_text("DAGMAN_MAX_JOBS_IDLE = 5\n")
    dag = read_dag(str(_dag(tmp_path, """
        # a comment
        job A node.sub
        JOB B in.sub DIR sub
        JOB C {
            executable = /bin/true
            queue
        }
        SUBMIT-DESCRIPTION shared {
            executable = /bin/false
            queue
        }
        JOB D shared DONE
        VARS A word="a \\"quoted\\" word" other="2"
        VARS ALL_NODES APPEND +Extra="\\"x\\""
        PARENT A B CHILD C D
        RETRY C 3 UNLESS-EXIT 42
        ABORT-DAG-ON A 7 RETURN 9
        PRIORITY B 10
        CATEGORY C light
        MAXJOBS light 2
        INCLUDE more.dag
        CONFIG dag.config
        SET_JOB_ATTR Project = "p1"
        FINAL F node.sub
    """.replace("\n        ", "\n"))))
    assert list(dag.nodes) == ["A", "B", "C", "D", "E", "F"]
    a, b, c, d, e, f = dag.nodes.values()
    assert [(v.name, v.value, v.prepend) for v in a.vars] == [
        ("word", 'a "quoted" word', None), ("other", "2", None), ("+Extra", '"x"', False)]
    assert b.directory == str(tmp_path / "sub") and b.priority == 10
    assert c.inline and "executable = /bin/true" in c.inline and c.parents == ["A", "B"]
    assert (c.retry, c.unless_exit, c.category) == (3, 42, "light")
    assert d.inline and "/bin/false" in d.inline and d.done
    assert (a.abort_exit, a.abort_return) == (7, 9)
    assert e.noop and e.parents == ["D"] and f.final and not f.vars
    assert dag.maxjobs == {"light": 2} and dag.config == {"DAGMAN_MAX_JOBS_IDLE": "5"}
    assert dag.job_attrs == {"Project": '"p1"'}


# ---- the dependencies, in the store -------------------------------------------------------

@pytest.fixture
def settings(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> config.Settings:
    monkeypatch.setenv("JOBSTORE_DATABASE_URL", store.db.engine.url.render_as_string(False))
    return config.load_settings(None)


def _queued(store: JobStore, tmp: Path, settings: config.Settings, text: str,
            **options: object) -> int:
    done = submit_dag(store, str(_dag(tmp, text)), settings, owner=OWNER,
                      options=options)
    return done.dag_id


def _states(store: JobStore, dag_id: int) -> dict[str, str]:
    return {n.name: n.status for n in store.dags.dag_nodes_of(dag_id)}


def _exit(store: JobStore, job: Job, code: int) -> None:
    """JOB_EXIT exit with `code`, the job's retry policy applied as the hook's handler does."""
    attrs = {"ExitCode": code, "ExitBySignal": False}
    report(store, job, Event.EXIT, changes={"exit_code": code, "exit_by_signal": False},
           attrs=attrs, exit_policy=lambda row: policy.exit_verdict(
               row, attrs, views.policy_ad(row, attrs)))


def _run(store: JobStore, exits: dict[str, int] | None = None) -> list[str]:
    """Run every claimable job to its end, as a slot would, each exiting with its node's code
    in `exits` (0 otherwise), until none is left; the nodes in the order they ran."""
    ran = []
    while (job := claim(store, REQ)) is not None:
        node = job.ad["DAGNodeName"]["expr"].strip('"')
        ran.append(node)
        report(store, job, Event.START)
        _exit(store, job, (exits or {}).get(node, 0))
    return ran


DIAMOND = """JOB A node.sub
JOB B node.sub
JOB C node.sub
JOB D node.sub
PARENT A CHILD B C
PARENT B C CHILD D
"""


@BOTH_BACKENDS
def test_a_diamond_runs_in_order_and_completes(store: JobStore, settings: config.Settings,
                                               tmp_path: Path) -> None:
    dag_id = _queued(store, tmp_path, settings, DIAMOND)
    assert _states(store, dag_id) == {"A": "queued", "B": "waiting", "C": "waiting",
                                      "D": "waiting"}
    statuses = {j.ad["DAGNodeName"]["expr"]: j.status for j in store.reads.list_jobs()}
    assert statuses == {'"A"': "idle", '"B"': "waiting", '"C"': "waiting", '"D"': "waiting"}
    ran = _run(store)
    assert ran[0] == "A" and sorted(ran[1:3]) == ["B", "C"] and ran[3] == "D"
    assert set(_states(store, dag_id).values()) == {"done"}
    dag = store.dags.dag_of(dag_id)
    assert dag is not None and (dag.status, dag.dag_status, dag.exit_code) == ("completed", 0, 0)
    job_b = next(j for j in store.reads.list_jobs(include_final=True)
                 if j.ad["DAGNodeName"]["expr"] == '"B"')
    assert job_b.ad["DAGManJobId"] == {"expr": str(dag_id)}
    assert job_b.ad["DAGParentNodeNames"] == {"expr": '"A"'}
    events = [e.event for e in store.reads.events(job_b.id)]
    assert events[:2] == ["submit", "node_ready"]
    # the history's retention takes the DAG with its jobs
    store.retention.prune(before=time.time() + 1)
    assert store.dags.dag_of(dag_id) is None and store.dags.dag_nodes_of(dag_id) == []


@BOTH_BACKENDS
def test_a_dag_and_its_nodes_are_its_access_points(store: JobStore, settings: config.Settings,
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Its own cluster and each node's record the access point it was submitted on; the
    door refuses one that is not a name."""
    from jobstore.db.schema import clusters
    from jobstore.errors import InvalidInput
    from jobstore.submit.dag import read_dag

    monkeypatch.setenv("JOBSTORE_SCHEDD_NAME", "schedd1@ap1.example.org")
    dag_id = _queued(store, tmp_path, config.load_settings(None), DIAMOND)
    with store.db.transaction() as conn:
        homes = dict(conn.execute(clusters.select().with_only_columns(clusters.c.id,
                                                                      clusters.c.home)).all())
    nodes = {n.cluster_id for n in store.dags.dag_nodes_of(dag_id)}
    assert len(nodes) == 4 and set(homes) == {dag_id, *nodes}
    assert set(homes.values()) == {"schedd1@ap1.example.org"}
    dag = read_dag(str(tmp_path / "test.dag"))
    with pytest.raises(InvalidInput, match="not the name of an access point"):
        store.dags.submit_dag(dag, lambda _: [], owner=OWNER, queue="default", max_attempts=1,
                              home="../etc")


@BOTH_BACKENDS
def test_nodes_that_share_a_submit_description(store: JobStore, settings: config.Settings,
                                               tmp_path: Path) -> None:
    """Nodes that share a submit file are read with one parse (on PostgreSQL their rows made
    by the server from one template): each is still its own cluster of proc 0, with its own
    $(JOB), VARS, RETRY and DAGMan's attributes, as a read per node makes it; where the file
    sets a variable a node's VARS also sets, the file's wins (DAGMan sets VARS first), and a
    parent list over 1,024 characters is left empty, as DAGMan leaves it."""
    many = [f"P{i:04d}" for i in range(200)]
    text = ("JOB N0 node.sub\nJOB N1 node.sub\nJOB N2 node.sub\nJOB N3 node.sub\n"
            "JOB N4 node.sub\nJOB N5 node.sub\n"
            + "".join(f"JOB {p} node.sub\n" for p in many)
            + "PARENT N0 CHILD N1 N2 N3 N4\nPARENT " + " ".join(many) + " CHILD N5\n"
            "VARS N1 word=\"w1\"\nVARS N4 word=\"w4\"\nRETRY N1 2\nRETRY N4 2\n"
            "VARS N2 word=\"w2\" mine=\"var\"\nVARS N3 word=\"w3\" mine=\"var\"\n")
    sub = ("executable = /bin/true\narguments = $(JOB) $(word) $(Process)\nmine = file\n"
           "+Mine = \"$(mine)\"\nqueue\n")
    done = submit_dag(store, str(_dag(tmp_path, text, sub)), settings, owner=OWNER)
    jobs = {j.ad["DAGNodeName"]["expr"].strip('"'): j for j in store.reads.list_jobs()}
    assert len(jobs) == 206 and all(j.proc_id == 0 for j in jobs.values())
    assert len({j.cluster_id for j in jobs.values()}) == 206
    assert {name: jobs[name].cluster_id for name in jobs} == done.clusters

    def args(name: str) -> list[str]:
        ad = jobs[name].ad
        return str(ad.get("Arguments", ad.get("Args"))).split()

    assert args("N0") == ["N0", "0"] and args("P0199") == ["P0199", "0"]
    assert args("N1") == ["N1", "w1", "0"] and args("N4") == ["N4", "w4", "0"]
    assert args("N2") == ["N2", "w2", "0"] and args("N3") == ["N3", "w3", "0"]
    assert {jobs[n].ad["Mine"]["expr"] for n in ("N0", "N1", "N2", "N3")} == {'"file"'}
    assert (jobs["N1"].max_retries, jobs["N4"].max_retries, jobs["N0"].max_retries) == (
        2, 2, None)
    assert jobs["N4"].ad["DAGParentNodeNames"] == {"expr": '"N0"'}
    assert jobs["N0"].ad["DAGParentNodeNames"] == {"expr": '""'}
    assert jobs["N5"].ad["DAGParentNodeNames"] == {"expr": '""'}  # 200 names: over 1,024
    assert {jobs[n].ad["DAGManJobId"]["expr"] for n in jobs} == {str(done.dag_id)}
    assert {n: j.status for n, j in jobs.items() if j.status == "idle"} == {
        **{"N0": "idle"}, **dict.fromkeys(many, "idle")}
    assert {e.event for j in jobs.values() for e in store.reads.events(j.id)} >= {"submit"}


@BOTH_BACKENDS
def test_a_failed_node_fails_its_descendants_and_the_dag(store: JobStore,
                                                         settings: config.Settings,
                                                         tmp_path: Path) -> None:
    dag_id = _queued(store, tmp_path, settings, DIAMOND + "JOB E node.sub\n")
    ran = _run(store, {"B": 3})
    assert sorted(ran) == ["A", "B", "C", "E"]  # D never runs
    assert _states(store, dag_id) == {"A": "done", "B": "failed", "C": "done", "D": "futile",
                                      "E": "done"}
    job_d = next(j for j in store.reads.list_jobs(include_final=True)
                 if j.ad["DAGNodeName"]["expr"] == '"D"')
    assert job_d.status == "removed" and "node B failed" in (job_d.reason or "")
    dag = store.dags.dag_of(dag_id)
    assert dag is not None and (dag.status, dag.dag_status, dag.exit_code) == ("failed", 2, 1)


@BOTH_BACKENDS
def test_retry_unless_exit_abort_and_final(store: JobStore, settings: config.Settings,
                                           tmp_path: Path) -> None:
    dag_id = _queued(store, tmp_path, settings, """JOB A node.sub
JOB B node.sub
JOB C node.sub
FINAL F node.sub
PARENT A CHILD B
PARENT B CHILD C
RETRY A 2
RETRY B 5 UNLESS-EXIT 4
ABORT-DAG-ON B 4 RETURN 17
""")
    exits = {"A": 1}
    ran: list[str] = []
    while (job := claim(store, REQ)) is not None:
        node = job.ad["DAGNodeName"]["expr"].strip('"')
        ran.append(node)
        code = exits.get(node, 0) if not (node == "A" and ran.count("A") == 3) else 0
        _exit(store, job, 4 if node == "B" else code)
    assert ran == ["A", "A", "A", "B", "F"]  # A retried twice; B not (UNLESS-EXIT); F at end
    assert _states(store, dag_id) == {"A": "done", "B": "failed", "C": "futile", "F": "done"}
    dag = store.dags.dag_of(dag_id)  # the FINAL node decides: it succeeded
    assert dag is not None and (dag.status, dag.dag_status) == ("completed", 0)


@BOTH_BACKENDS
def test_abort_dag_on_without_final_returns_its_value(store: JobStore,
                                                      settings: config.Settings,
                                                      tmp_path: Path) -> None:
    dag_id = _queued(store, tmp_path, settings, """JOB A node.sub
JOB B node.sub
JOB C node.sub
PARENT A CHILD C
ABORT-DAG-ON A 4 RETURN 17
""")
    job_a = next(j for j in store.reads.list_jobs() if j.ad["DAGNodeName"]["expr"] == '"A"')
    others = [j for j in store.reads.list_jobs() if j.id != job_a.id and j.status == "idle"]
    assert [j.ad["DAGNodeName"]["expr"] for j in others] == ['"B"']
    claimed = store.negotiator.claim(REQ, lambda j: Verdict(take=j.id == job_a.id))
    assert claimed is not None and claimed.id == job_a.id
    _exit(store, claimed, 4)
    assert _states(store, dag_id) == {"A": "failed", "B": "failed", "C": "futile"}
    job_b = store.reads.get_job(others[0].id)
    assert job_b.status == "removed" and "ABORT-DAG-ON" in (job_b.reason or "")
    dag = store.dags.dag_of(dag_id)
    assert dag is not None and (dag.status, dag.dag_status, dag.exit_code) == ("failed", 3, 17)


@BOTH_BACKENDS
def test_noop_done_and_a_category_throttle(store: JobStore, settings: config.Settings,
                                           tmp_path: Path) -> None:
    fan = "".join(f"JOB W{i} node.sub\nCATEGORY W{i} narrow\n" for i in range(5))
    dag_id = _queued(store, tmp_path, settings, "JOB A node.sub DONE\nJOB N node.sub NOOP\n"
                     + fan + "PARENT A CHILD N\nPARENT N CHILD "
                     + " ".join(f"W{i}" for i in range(5)) + "\nMAXJOBS narrow 2\n")
    states = _states(store, dag_id)
    assert (states["A"], states["N"]) == ("done", "done")  # never run
    assert sorted(states[f"W{i}"] for i in range(5)) == ["queued"] * 2 + ["ready"] * 3
    assert len(store.reads.list_jobs(statuses=["idle"])) == 2
    assert sorted(_run(store)) == [f"W{i}" for i in range(5)]
    assert store.dags.dag_of(dag_id).status == "completed"  # type: ignore[union-attr]


@BOTH_BACKENDS
def test_maxjobs_option(store: JobStore, settings: config.Settings, tmp_path: Path) -> None:
    fan = "".join(f"JOB W{i} node.sub\n" for i in range(4))
    dag_id = _queued(store, tmp_path, settings, fan, maxjobs=1, batch_name="mine")
    assert list(_states(store, dag_id).values()).count("queued") == 1
    assert len(_run(store)) == 4
    dag = store.dags.dag_of(dag_id)
    assert dag is not None and (dag.batch_name, dag.status) == ("mine", "completed")


@BOTH_BACKENDS
def test_maxidle_releases_a_node_when_a_job_starts(store: JobStore, settings: config.Settings,
                                                   tmp_path: Path) -> None:
    """-maxidle counts the idle jobs: a node's job that starts makes room for another node at
    once, as DAGMan submits more when a job begins to run (not only when one ends)."""
    fan = "".join(f"JOB W{i} node.sub\n" for i in range(5))
    dag_id = _queued(store, tmp_path, settings, fan, maxidle=2)
    assert list(_states(store, dag_id).values()).count("queued") == 2
    job = claim(store, REQ)
    assert job is not None
    assert list(_states(store, dag_id).values()).count("queued") == 2  # fetched: not yet
    report(store, job, Event.START)
    assert list(_states(store, dag_id).values()).count("queued") == 3
    _exit(store, job, 0)
    assert len(_run(store)) == 4
    assert store.dags.dag_of(dag_id).status == "completed"  # type: ignore[union-attr]


@BOTH_BACKENDS
def test_rm_hold_and_release_of_a_dag(store: JobStore, settings: config.Settings,
                                      tmp_path: Path) -> None:
    dag_id = _queued(store, tmp_path, settings, DIAMOND + "FINAL F node.sub\n")
    assert store.dags.pause_dag(dag_id, held=True)
    job = claim(store, REQ)
    assert job is not None  # A was queued before the hold: it runs
    _exit(store, job, 0)
    assert _states(store, dag_id)["B"] == "ready"  # held: not released
    assert claim(store, REQ) is None
    assert store.dags.pause_dag(dag_id, held=False)
    assert _states(store, dag_id)["B"] == "queued"
    assert store.dags.remove_dag(dag_id)
    states = _states(store, dag_id)
    assert (states["B"], states["C"], states["D"], states["F"]) == (
        "failed", "failed", "futile", "queued")  # the FINAL node still runs
    assert _run(store) == ["F"]
    dag = store.dags.dag_of(dag_id)
    assert dag is not None and (dag.status, dag.dag_status) == ("removed", 4)
    assert not store.dags.remove_dag(dag_id)


@BOTH_BACKENDS
def test_a_node_with_a_final_only_macro_is_refused(store: JobStore, settings: config.Settings,
                                                   tmp_path: Path) -> None:
    (tmp_path / "status.sub").write_text("executable = /bin/echo\narguments = $(DAG_STATUS)\n"
                                         "queue\n")
    with pytest.raises(DagError, match=r"node A: \$\(DAG_STATUS\) is known only"):
        _queued(store, tmp_path, settings, "JOB A status.sub\n")
    assert store.reads.list_jobs(include_final=True) == []
    assert os.path.exists(tmp_path / "test.dag")


@BOTH_BACKENDS
@pytest.mark.parametrize("count", [1, 3])  # one job (a template of nodes), or a cluster
def test_a_node_submitted_on_hold_is_refused(store: JobStore, settings: config.Settings,
                                             tmp_path: Path, count: int) -> None:
    """`hold = true` in a node's submit description: DAGMan holds the job when the node is
    submitted (its parents done); here it would be held, and could be released, before."""
    (tmp_path / "held.sub").write_text(f"executable = /bin/true\nhold = true\nqueue {count}\n")
    with pytest.raises(DagError, match="node A: hold = true is not supported"):
        _queued(store, tmp_path, settings, "JOB A held.sub\nJOB B held.sub\n")
    assert store.reads.list_jobs(include_final=True) == []


@BOTH_BACKENDS
def test_the_dags_own_ad_node_status_file_and_jobstate_log(
        store: JobStore, settings: config.Settings, tmp_path: Path) -> None:
    """What DAGMan shows of a DAG, made from the store: its own job ad with DAGMan's counters
    (in Schedd.query as DAGMan's job is in condor_q), the node status file and the jobstate
    log in DAGMan's formats, as the DAG goes on and once it failed."""
    import classad2

    import jobstore
    from jobstore.api.dags import dag_ads, jobstate_log, node_status_file

    dag_id = _queued(store, tmp_path, settings, DIAMOND + "SET_JOB_ATTR Project = \"p1\"\n")
    (ad,) = dag_ads(store, [dag_id])
    assert {k: ad[k] for k in ("ClusterId", "JobUniverse", "JobStatus", "DAG_NodesTotal",
                               "DAG_NodesQueued", "DAG_NodesUnready", "DAG_NodesDone",
                               "DAG_JobsSubmitted", "DAG_JobsIdle", "DAG_Status",
                               "Project")} == {
        "ClusterId": dag_id, "JobUniverse": 7, "JobStatus": 2, "DAG_NodesTotal": 4,
        "DAG_NodesQueued": 1, "DAG_NodesUnready": 3, "DAG_NodesDone": 0,
        "DAG_JobsSubmitted": 1, "DAG_JobsIdle": 1, "DAG_Status": 0, "Project": "p1"}
    schedd = jobstore.Schedd(store=store, owner=OWNER)
    (found,) = schedd.query(f"ClusterId == {dag_id}", ["DAG_NodesTotal", "DAG_NodesDone"])
    assert dict(found) == {"DAG_NodesTotal": 4, "DAG_NodesDone": 0}
    assert len(schedd.query(f"DAGManJobId == {dag_id}")) == 4  # the nodes' jobs
    assert _run(store, {"C": 3}) in (["A", "B", "C"], ["A", "C", "B"])
    assert dag_ads(store) == []  # ended: no longer in the queue
    (ad,) = dag_ads(store, [dag_id])
    assert (ad["JobStatus"], ad["ExitCode"], ad["DAG_Status"], ad["DAG_NodesDone"],
            ad["DAG_NodesFailed"], ad["DAG_NodesFutile"], ad["DAG_JobsCompleted"]) == (
        4, 1, 2, 2, 1, 1, 3)

    status = node_status_file(store, dag_id)
    ads = list(classad2.parseAds(status))
    assert [a["Type"] for a in ads] == ["DagStatus", "NodeStatus", "NodeStatus", "NodeStatus",
                                        "NodeStatus", "StatusEnd"]
    assert (ads[0]["DagFiles"][0], ads[0]["DagStatus"], ads[0]["NodesTotal"],
            ads[0]["NodesFailed"], ads[0]["NodesFutile"]) == (str(tmp_path / "test.dag"), 6,
                                                             4, 1, 1)
    assert "/* \"STATUS_ERROR (failed)\" */" in status
    nodes = {a["Node"]: (a["NodeStatus"], a["StatusDetails"]) for a in ads[1:-1]}
    assert nodes == {"A": (5, ""), "B": (5, ""), "C": (6, "Job failed with exit code 3"),
                     "D": (7, "Had an ancestor node fail")}
    assert ads[-1]["NextUpdate"] == 0

    log = jobstate_log(store, dag_id).splitlines()
    words = [line.split()[1:] for line in log]
    assert words[0] == ["INTERNAL", "***", "DAGMAN_STARTED", f"{dag_id}.0", "***"]
    assert words[-1] == ["INTERNAL", "***", "DAGMAN_FINISHED", "1", "***"]
    a_cluster = next(j.cluster_id for j in store.reads.list_jobs(include_final=True)
                     if j.ad["DAGNodeName"]["expr"] == '"A"')
    assert [w for w in words if w[0] == "A"] == [
        ["A", event, f"{a_cluster}.0", "-", "-", "1"]
        for event in ("SUBMIT", "EXECUTE", "JOB_TERMINATED")] + [
        ["A", "JOB_SUCCESS", "0", "-", "-", "1"]]
    assert [w for w in words if w[0] == "C"][-1][:5] == ["C", "JOB_FAILURE", "3", "-", "-"]
    assert not [w for w in words if w[0] == "D"]  # futile: never submitted
    times = [int(line.split()[0]) for line in log]
    assert times == sorted(times)
    with pytest.raises(DagError, match="no DAG 999"):
        node_status_file(store, 999)


# ---- through the emulator and the real hooks ----------------------------------------------

@pytest.mark.slow  # (make test's time on two cores)
@pytest.mark.parametrize("mode", ["agent", "direct"])
def test_a_dag_through_the_hooks(node_db, mode: str) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """The emulated startd runs the real hook executables; no DAGMan process: each node's job
    starts only after its parents' jobs ended, whichever process recorded the end. A diamond
    whose middle nodes share a category of MAXJOBS 1, a node that fails once and is retried
    (RETRY 2 UNLESS-EXIT 42), a DONE node that never runs, a splice and a sub-DAG after them,
    and a FINAL node last."""
    from contextlib import ExitStack

    from emulatornode import emulated_node, give_node, job_owner, running_agent

    from jobstore.emulator import Emulator

    store, tmp = node_db
    owner = job_owner()
    sub = tmp / "submit"
    sub.mkdir()
    marks = tmp / "marks"
    marks.mkdir()
    os.chmod(marks, 0o1777)  # the job's user leaves its mark here
    (sub / "node.sub").write_text("executable = /bin/sh\narguments = \"-c 'sleep 0.3'\"\n"
                                  "request_memory = 32\nqueue\n")
    (sub / "retry.sub").write_text(
        "executable = /bin/sh\n"
        f"arguments = \"-c 'test -e {marks}/$(JOB) || {{ touch {marks}/$(JOB); exit 3; }}'\"\n"
        "request_memory = 32\nqueue\n")
    (sub / "leaf.dag").write_text("JOB L node.sub\n")
    (sub / "diamond.dag").write_text(
        DIAMOND + "JOB R retry.sub\nJOB X node.sub DONE\nSPLICE S leaf.dag\n"
        "SUBDAG EXTERNAL T leaf.dag\nFINAL F node.sub\nPARENT D CHILD R X\n"
        "PARENT R CHILD S\nPARENT S CHILD T\nRETRY R 2 UNLESS-EXIT 42\nCATEGORY B small\n"
        "CATEGORY C small\nMAXJOBS small 1\n")
    settings = config.load_settings("JOBSTORE", store.db.engine.url.render_as_string(False))
    dag_id = submit_dag(store, str(sub / "diamond.dag"), settings, owner=owner).dag_id
    cfg, condor_config = emulated_node(tmp, store.db.engine.url.render_as_string(False))
    if os.geteuid() == 0:
        give_node(cfg, store, tmp, owner, personal=mode == "direct")
    with ExitStack() as stack:
        if mode == "agent":
            cfg.env.update(stack.enter_context(running_agent(tmp, condor_config, cfg.condor_user)))
        Emulator(cfg).run(until=lambda: store.dags.dag_of(dag_id).status != "running",  # type: ignore[union-attr]
                          timeout=120, wait_for_jobs=True)
    dag = store.dags.dag_of(dag_id)
    assert dag is not None and (dag.status, dag.exit_code) == ("completed", 0)
    span, exits = {}, {}
    for job in store.reads.list_jobs(include_final=True):
        events = store.reads.events(job.id)
        times = {e.event: e.time for e in events}
        name = job.ad["DAGNodeName"]["expr"].strip('"')
        span[name] = (min(e.time for e in events if e.event == "start"), times["exit"])
        exits[name] = sum(e.event == "exit" for e in events)
    assert "X" not in span and exits == {**dict.fromkeys(span, 1), "R": 2}
    assert span["A"][1] <= min(span["B"][0], span["C"][0])
    first, second = sorted((span["B"], span["C"]))
    assert first[1] <= second[0]  # MAXJOBS small 1: one at a time
    assert max(span["B"][1], span["C"][1]) <= span["D"][0]
    order = ["D", "R", "S+L", "T+L", "F"]
    assert all(span[a][1] <= span[b][0] for a, b in zip(order, order[1:], strict=False))


@pytest.mark.slow
def test_a_dag_written_by_htcondor2_dags_through_schedd_submit(
        store: JobStore, settings: config.Settings, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """htcondor2.dags writes PARENT lines before the JOB they name, as DAGMan reads them (two
    passes); jobstore.Submit.from_dag and Schedd.submit take it as htcondor2's do."""
    import htcondor2
    import htcondor2.dags as dags

    import jobstore

    dag = dags.DAG()
    prep = dag.layer(name="prep", submit_description=htcondor2.Submit(
        {"executable": "/bin/echo", "arguments": "$(x)"}), vars=[{"x": "1"}, {"x": "2"}])
    prep.child_layer(name="work", submit_description=htcondor2.Submit(
        {"executable": "/bin/true"}), vars=[{"y": "a"}], retries=2)
    path = dags.write_dag(dag, tmp_path, dag_file_name="wf.dag")
    monkeypatch.chdir(tmp_path)
    schedd = jobstore.Schedd(store=store, owner=OWNER)
    result = schedd.submit(jobstore.Submit.from_dag(str(path), {"batch-name": "wf"}))
    dag_id = result.cluster()
    assert result.clusterad()["JobBatchName"] == "wf"
    assert _states(store, dag_id) == {"prep:0": "queued", "prep:1": "queued",
                                      "work:0": "waiting"}
    args = sorted(str(j.ad.get("Args", j.ad.get("Arguments"))) for j in store.reads.list_jobs()
                  if j.ad["DAGNodeName"]["expr"].startswith('"prep'))
    assert args == ["1", "2"]
    assert sorted(_run(store)) == ["prep:0", "prep:1", "work:0"]
    with pytest.raises(DagError, match="option 'maxhold' is not supported"):
        jobstore.Submit.from_dag(str(path), {"maxhold": 2})


@BOTH_BACKENDS
def test_htcondor2s_own_from_dag_is_queued_as_its_dag(
        store: JobStore, settings: config.Settings, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`schedd.submit(htcondor2.Submit.from_dag(...))`, unchanged but for the Schedd: DAGMan's
    job as htcondor2 describes it queues its DAG with its options; what DAGMan would do that
    the job store does not is refused with one line."""
    import htcondor2

    import jobstore

    bin_dir = tmp_path / "bin"  # htcondor2 wants a condor_dagman on PATH, and never runs it
    bin_dir.mkdir()
    (bin_dir / "condor_dagman").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "condor_dagman").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    _dag(tmp_path, DIAMOND)
    monkeypatch.chdir(tmp_path)
    schedd = jobstore.Schedd(store=store, owner=OWNER)
    description = htcondor2.Submit.from_dag("test.dag", {"maxjobs": 1, "batch-name": "wf",
                                                         "maxpre": 2, "maxpost": 0})
    result = schedd.submit(description)
    dag = store.dags.dag_of(result.cluster())
    assert dag is not None and (dag.path, dag.batch_name, dag.max_jobs, dag.max_pre,
                                dag.max_post) == (str(tmp_path / "test.dag"), "wf", 1, 2, 0)
    ran = _run(store)
    assert ran[0] == "A" and sorted(ran[1:3]) == ["B", "C"] and ran[3] == "D"
    refused = {"usedagdir": "-UseDagDir is not supported",
               "notification": "notification is not supported"}
    for option, message in refused.items():
        (tmp_path / "test.dag.condor.sub").unlink()
        with pytest.raises(DagError, match=message):
            schedd.submit(htcondor2.Submit.from_dag("test.dag", {option: "1"}))


@pytest.mark.slow
def test_submit_dag_q_batch_and_dag_from_the_cli(db_url: str, condor_config: Path,
                                                 tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`jobstore submit-dag`, `q -batch`, `q -dag`, and hold/release/rm of the DAG's id; a DAG
    file with a refused command fails with one line naming it, and queues nothing."""
    from jobstorecli import cli

    from jobstore.db.engine import upgrade

    monkeypatch.setenv("CONDOR_CONFIG", str(condor_config))
    upgrade(db_url)
    owner = ["--owner", "alice"] if os.geteuid() == 0 else []
    path = _dag(tmp_path, DIAMOND)
    done = cli(db_url, "submit-dag", str(path), "-batch-name", "diamond", "-maxjobs", "3",
               *owner)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"DAG {path} submitted as 1: 4 node job cluster(s).")
    batch = cli(db_url, "q", "-batch").stdout.splitlines()
    assert batch[0].split() == ["OWNER", "BATCH_NAME", "SUBMITTED", "DONE", "RUN", "IDLE",
                                "HOLD", "TOTAL", "JOB_IDS"]
    assert batch[1].split()[1:2] + batch[1].split()[4:] == [
        "diamond", "_", "_", "4", "_", "4", "2.0", "...", "5.0"]
    dag_view = cli(db_url, "q", "-dag").stdout
    assert "DAG diamond" in dag_view and " |-A " in dag_view and " |-D " in dag_view
    assert cli(db_url, "hold", "1").stdout.strip() == "DAG 1: held"
    assert cli(db_url, "release", "1").stdout.strip() == "DAG 1: released"
    assert cli(db_url, "rm", "1").stdout.strip() == "DAG 1: removed"
    again = cli(db_url, "rm", "1")
    assert again.returncode == 1
    assert again.stderr.strip() == "jobstore: DAG 1 is removed; cannot remove"
    (tmp_path / "bad.dag").write_text("JOB A node.sub\nSCRIPT DEFER 3 1 HOLD A hold.sh\n")
    bad = cli(db_url, "submit-dag", str(tmp_path / "bad.dag"), *owner)
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1
    assert f"{tmp_path / 'bad.dag'}:2: SCRIPT DEFER of a HOLD script" in bad.stderr
    appended = cli(db_url, "submit-dag", str(path), "-append", "x = 1", *owner)
    assert appended.returncode == 1 and "-append and -insert_sub_file are not supported" in \
        appended.stderr


@BOTH_BACKENDS
def test_a_splice_is_its_nodes_named_after_it(store: JobStore, settings: config.Settings,
                                              tmp_path: Path) -> None:
    """SPLICE: the spliced file's nodes as `S+node` (nested: `S+T+node`), their categories
    scoped, the splice's name in PARENT/CHILD standing for its first or last nodes; ALL_NODES
    of a file is its own nodes."""
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "node.sub").write_text(SUB)
    (inner / "leaf.dag").write_text("JOB L node.sub\n")
    (inner / "diamond.dag").write_text(DIAMOND + "CATEGORY A small\nMAXJOBS small 1\n"
                                       "SPLICE T leaf.dag\nPARENT D CHILD T\n"
                                       "VARS ALL_NODES word=\"in\"\n")
    dag_id = _queued(store, tmp_path, settings,
                     "JOB first node.sub\nJOB last node.sub\nSPLICE S diamond.dag DIR inner\n"
                     "PARENT first CHILD S\nPARENT S CHILD last\n"
                     "VARS ALL_NODES word=\"top\"\n")
    dag = read_dag(str(tmp_path / "test.dag"))
    assert list(dag.nodes) == ["first", "last", "S+A", "S+B", "S+C", "S+D", "S+T+L"]
    assert dag.nodes["S+A"].parents == ["first"] and dag.nodes["last"].parents == ["S+T+L"]
    assert dag.nodes["S+T+L"].parents == ["S+D"] and dag.nodes["S+A"].category == "S+small"
    assert dag.maxjobs == {"S+small": 1}
    assert [v.value for v in dag.nodes["S+B"].vars] == ["in"]
    assert [v.value for v in dag.nodes["first"].vars] == ["top"]
    assert dag.nodes["S+A"].directory == str(inner)
    ran = _run(store)
    assert ran[0] == "first" and ran[1] == "S+A" and ran[-2:] == ["S+T+L", "last"]
    assert store.dags.dag_of(dag_id).status == "completed"  # type: ignore[union-attr]
    (tmp_path / "loop.dag").write_text("JOB A node.sub\nSPLICE me loop.dag\n")
    with pytest.raises(DagError, match="the splice me includes itself"):
        read_dag(str(tmp_path / "loop.dag"))


@BOTH_BACKENDS
def test_a_subdag_runs_as_its_nodes_and_ends_as_its_node_would(
        store: JobStore, settings: config.Settings, tmp_path: Path) -> None:
    """SUBDAG EXTERNAL: the sub-DAG's nodes run in the DAG (named `S+node`), after the SUBDAG
    node's parents and before its children, so that the children run once the whole sub-DAG
    is done and never when a node of it failed; DONE marks it all done; what would make the
    sub-DAG run differently from its nodes in place is refused with its line."""
    (tmp_path / "node.sub").write_text(SUB)
    (tmp_path / "inner.dag").write_text(DIAMOND)
    dag_id = _queued(store, tmp_path, settings,
                     "JOB first node.sub\nJOB last node.sub\nSUBDAG EXTERNAL S inner.dag\n"
                     "SUBDAG EXTERNAL T inner.dag DONE\nPARENT first CHILD S T\n"
                     "PARENT S T CHILD last\n")
    states = _states(store, dag_id)
    assert {n: s for n, s in states.items() if n.startswith("T+")} == dict.fromkeys(
        ["T+A", "T+B", "T+C", "T+D"], "done")
    ran = _run(store)
    assert ran[0] == "first" and ran[1] == "S+A" and ran[-2:] == ["S+D", "last"]
    assert store.dags.dag_of(dag_id).status == "completed"  # type: ignore[union-attr]
    failed = _queued(store, tmp_path, settings, "JOB last node.sub\n"
                     "SUBDAG EXTERNAL S inner.dag\nPARENT S CHILD last\n")
    assert "last" not in _run(store, {"S+B": 1})
    assert _states(store, failed)["last"] == "futile"
    for text, message in (
            ("SUBDAG EXTERNAL S inner.dag\nRETRY S 2\n", "S is a SUBDAG, whose nodes run"),
            ("SUBDAG EXTERNAL S inner.dag FROB\n", "SUBDAG needs EXTERNAL"),
            ("SUBDAG EXTERNAL S abort.dag\n", "the sub-DAG S has ABORT-DAG-ON"),
            ("SUBDAG EXTERNAL S final.dag\n", "the sub-DAG S has a FINAL node")):
        (tmp_path / "abort.dag").write_text("JOB A node.sub\nABORT-DAG-ON A 3\n")
        (tmp_path / "final.dag").write_text("JOB A node.sub\nFINAL F node.sub\n")
        with pytest.raises(DagError, match=message):
            _queued(store, tmp_path, settings, text)


@BOTH_BACKENDS
def test_retry_with_a_retry_macro_is_refused(store: JobStore, settings: config.Settings,
                                             tmp_path: Path) -> None:
    """$(RETRY) in a node that retries: DAGMan submits each try anew with its number; here a
    retry runs the same job again, so the node is refused rather than run with 0 each time."""
    with pytest.raises(DagError, match=r"node A: \$\(RETRY\) would be 0 in every try"):
        submit_dag(store, str(_dag(tmp_path, "JOB A node.sub\nRETRY A 2\n",
                                   "executable = /bin/true\narguments = $(retry)\nqueue\n")),
                   settings, owner=OWNER)
    assert store.reads.list_jobs(include_final=True) == []


@BOTH_BACKENDS
def test_a_failed_dag_reruns_from_where_it_stopped(store: JobStore, settings: config.Settings,
                                                   tmp_path: Path) -> None:
    """-rescue DAGID: the nodes the ended DAG got done are DONE, the rest run again (DAGMan's
    rescue DAG); a running DAG, another file's or an unknown one is refused."""
    first = _queued(store, tmp_path, settings, DIAMOND)
    assert sorted(_run(store, {"C": 1})) == ["A", "B", "C"]
    assert store.dags.dag_of(first).status == "failed"  # type: ignore[union-attr]
    second = _queued(store, tmp_path, settings, DIAMOND, rescue=first)
    assert _states(store, second) == {"A": "done", "B": "done", "C": "queued", "D": "waiting"}
    assert _run(store) == ["C", "D"]
    assert store.dags.dag_of(second).status == "completed"  # type: ignore[union-attr]
    with pytest.raises(DagError, match="no such DAG"):
        _queued(store, tmp_path, settings, DIAMOND, rescue=999)
    third = _queued(store, tmp_path, settings, DIAMOND)
    with pytest.raises(DagError, match="the DAG is running; rm it first"):
        _queued(store, tmp_path, settings, DIAMOND, rescue=third)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_batch_of_a_dag_nodes_reports_is_made_once_on_its_locked_row(
        store: JobStore, settings: config.Settings, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A DAG node's job is written at each transition (its DAG reads the row): the agent's
    batch of its reports locks the row at once instead of failing on its own first write and
    being made again."""
    _queued(store, tmp_path, settings, "JOB A node.sub\n")
    job = claim(store, REQ)
    assert job is not None and "DAGNodeName" in job.ad
    tries: list[bool] = []
    real = store.reports._report_batch

    def counted(reports, ids, locked):  # type: ignore[no-untyped-def]
        tries.append(locked)
        return real(reports, ids, locked)

    monkeypatch.setattr(store.reports, "_report_batch", counted)
    t = time.time()
    reports = [(job.id, AttemptReport(event, job.token, job.claims, now=t + i, lease=900,
                                      keyword="JOBSTORE", slot="slot1@node"))
               for i, event in enumerate((Event.ACCEPT, Event.START))]
    outcomes = store.reports.report_many(reports)
    assert [getattr(o, "after", o) for o in outcomes] == ["accepted", "running"]
    assert tries == [False]
