"""DAG node scripts on the access point: a real `jobstore schedd` runs the DAG's PRE and POST
scripts as its owner, in the node's directory, with DAGMan's macros, while an emulated node
with the real hooks and the agent runs the nodes' jobs; a service killed while a script runs
and started again loses no exit and runs no script twice."""

from __future__ import annotations

import dataclasses
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import clirun
import htcondor2
import pytest
from apnode import hers, schedd_cmd, submit_dir, wait_for_events
from emulatornode import job_owner, node_db, run_node  # noqa: F401

from jobstore.core.states import Event
from jobstore.db.store import JobStore
from jobstore.node import config

BACKENDS = pytest.mark.parametrize(
    "node_db", ["sqlite", pytest.param("postgresql", marks=pytest.mark.matrix)], indirect=True)
ENDED = {"completed", "removed", "held", "failed"}
ET = htcondor2.JobEventType
SCRIPT = """#!/bin/sh
echo "$0 $* $(id -u) $(pwd)" >> scripts.txt
{body}
"""


def _script(sub: Path, name: str, body: str, owner: str | None) -> None:
    path = sub / name
    path.write_text(SCRIPT.format(body=body))
    path.chmod(0o755)
    if owner:
        user = pwd.getpwnam(owner)
        os.chown(path, user.pw_uid, user.pw_gid)


def _scripts_dir(store: JobStore, owner: str | None) -> Path:
    """A directory for the service's scripts' exits where nobody else may change a
    directory above it (the node's directory is everybody's): the owner's when the service
    becomes her (her SQLite file)."""
    path = Path(tempfile.mkdtemp(prefix="jobstore-scripts-"))
    if owner and store.db.engine.dialect.name == "sqlite":
        user = pwd.getpwnam(owner)
        os.chown(path, user.pw_uid, user.pw_gid)
    return path


@contextmanager
def _service(store: JobStore, tmp: Path, scripts: Path) -> Iterator[subprocess.Popen[str]]:
    """`jobstore schedd` on `store`, its scripts' exits kept in `scripts`."""
    env = {**os.environ, "JOBSTORE_DAG_SCRIPTS": str(scripts)}
    process = clirun.popen(schedd_cmd(store, "--log", str(tmp / "schedd.log")), env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def _dag_end(store: JobStore, dag_id: int, timeout: float = 60.0) -> object:
    deadline = time.monotonic() + timeout
    while True:
        dag = store.dags.dag_of(dag_id)
        assert dag is not None
        if dag.status in ("completed", "failed", "removed"):
            return dag
        assert time.monotonic() < deadline, dag
        time.sleep(0.2)


@contextmanager
def _dag_run(store: JobStore, tmp: Path, sub: Path, dag: str,
             owner: str | None) -> Iterator[tuple[int, object]]:
    """Queue `dag` and run it to its end with the service and an emulated node: (its id, its
    end), while the service still runs."""
    dag_id = _submit(store, sub, dag, owner)
    hers(store, owner)
    scripts = _scripts_dir(store, owner)
    with _service(store, tmp, scripts):
        run_node(store, tmp, owner, "agent", ENDED, slots=1)
        yield dag_id, _dag_end(store, dag_id)
    shutil.rmtree(scripts)


def _submit(store: JobStore, sub: Path, dag: str, owner: str | None) -> int:
    from jobstore.api.dags import submit_dag

    settings = config.load_settings("JOBSTORE", store.db.engine.url.render_as_string(False))
    return submit_dag(store, str(sub / dag), settings, owner=owner).dag_id


@BACKENDS
def test_pre_and_post_scripts_run_as_dagman_runs_them(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """A POST script turns its node's failed job into success and is told its $RETURN, once
    the job's output is home; a failing PRE script fails its node (whose job never runs)
    and the DAG; PRE_SKIP skips a node; each script runs once, as the owner, in the node's
    DIR."""
    store, tmp = node_db
    owner = job_owner()
    sub = submit_dir(tmp, "dag", owner)
    (sub / "a.sub").write_text("executable = /bin/sh\ntransfer_executable = false\n"
                               "arguments = \"-c 'echo a > a.out; exit 1'\"\n"
                               "should_transfer_files = YES\ntransfer_output_files = a.out\n"
                               "request_memory = 32\nlog = nodes.log\nqueue\n")
    (sub / "b.sub").write_text("executable = /bin/true\ntransfer_executable = false\n"
                               "should_transfer_files = YES\nrequest_memory = 32\nqueue\n")
    (sub / "d").mkdir()
    (sub / "d" / "b.sub").write_text((sub / "b.sub").read_text())
    if owner:
        user = pwd.getpwnam(owner)
        os.chown(sub / "d", user.pw_uid, user.pw_gid)
    _script(sub, "post.sh", "test -s a.out", owner)  # the job's output is home first
    _script(sub, "pre.sh", 'case "$1" in B) exit 1;; C) exit 5;; esac', owner)
    _script(sub / "d", "pre.sh", "exit 0", owner)
    (sub / "s.dag").write_text(
        "JOB A a.sub\nJOB B b.sub\nJOB C b.sub\nJOB D b.sub DIR d\nJOB E b.sub\n"
        "PARENT A CHILD B C D\nPARENT B CHILD E\n"
        "SCRIPT POST A post.sh $JOB $RETURN $PRE_SCRIPT_RETURN $JOBID $UNKNOWN\n"
        "SCRIPT PRE B pre.sh $NODE\nSCRIPT PRE C pre.sh $JOB $RETURN\nPRE_SKIP C 5\n"
        "SCRIPT PRE D pre.sh $JOB\n")
    with _dag_run(store, tmp, sub, "s.dag", owner) as (dag_id, dag):
        # DAGMan's 016 in the node's log, after its job's end
        events = wait_for_events(sub / "nodes.log", {0: {ET.POST_SCRIPT_TERMINATED}})
    nodes = {n.name: (n.status, n.exit_code) for n in store.dags.dag_nodes_of(dag_id)}
    assert nodes == {"A": ("done", 0), "B": ("failed", 1), "C": ("done", 0), "D": ("done", 0),
                     "E": ("futile", None)}
    assert (dag.status, dag.exit_code) == ("failed", 1)  # type: ignore[attr-defined]
    uid = pwd.getpwnam(owner).pw_uid if owner else os.getuid()
    a_job = next(j for j in store.reads.list_jobs(include_final=True)
                 if j.ad["DAGNodeName"]["expr"] == '"A"')
    lines = sorted((sub / "scripts.txt").read_text().splitlines())
    assert lines == sorted([
        f"post.sh A 1 -1 {a_job.cluster_id}.0 $UNKNOWN {uid} {sub}",
        f"pre.sh B {uid} {sub}", f"pre.sh C $RETURN {uid} {sub}"])
    assert (sub / "d" / "scripts.txt").read_text() == f"pre.sh D {uid} {sub / 'd'}\n"
    assert [e.type for e in events if e.type != ET.IMAGE_SIZE][-2:] == [
        ET.JOB_TERMINATED, ET.POST_SCRIPT_TERMINATED]
    assert (events[-1]["ReturnValue"], events[-1]["DAGNodeName"], events[-1].cluster) == (
        0, "A", a_job.cluster_id)
    ran = {j.ad["DAGNodeName"]["expr"].strip('"'): j.status
           for j in store.reads.list_jobs(include_final=True)}
    assert ran == {"A": "completed", "B": "removed", "C": "removed", "D": "completed",
                   "E": "removed"}


@BACKENDS
def test_a_service_killed_while_a_script_runs_loses_nothing(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """The service is killed (SIGKILL) while a PRE script runs; the script finishes on its
    own, and the service started again gives its exit to the store: the node runs, once."""
    store, tmp = node_db
    owner = job_owner()
    sub = submit_dir(tmp, "dag", owner)
    (sub / "a.sub").write_text("executable = /bin/true\ntransfer_executable = false\n"
                               "should_transfer_files = YES\nrequest_memory = 32\nqueue\n")
    _script(sub, "pre.sh", "touch started; sleep 3", owner)
    (sub / "one.dag").write_text("JOB A a.sub\nSCRIPT PRE A pre.sh $JOB\n")
    dag_id = _submit(store, sub, "one.dag", owner)
    hers(store, owner)
    scripts = _scripts_dir(store, owner)
    with _service(store, tmp, scripts) as first:
        deadline = time.monotonic() + 30
        while not (sub / "started").exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        first.kill()
        first.wait(timeout=10)
    time.sleep(3.5)  # the script ends while no service runs
    assert store.dags.dag_nodes_of(dag_id)[0].status == "pre"
    with _service(store, tmp, scripts):
        run_node(store, tmp, owner, "agent", ENDED, slots=1)
        dag = _dag_end(store, dag_id)
    assert (dag.status, dag.exit_code) == ("completed", 0)  # type: ignore[attr-defined]
    assert len((sub / "scripts.txt").read_text().splitlines()) == 1
    (own,) = scripts.iterdir()  # this access point's on this store
    assert not [p for p in own.iterdir() if p.name != "id"]
    shutil.rmtree(scripts)


@BACKENDS
def test_a_child_takes_what_its_parent_made(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """A child's transfer_input_files name its parent's output: the parent's output comes
    home, the service reads it as the owner when the child is submitted, and the child's job
    reads it in its sandbox; a child whose input the owner may not read fails (-1001) and
    runs nothing; the DAG's node status file is kept current, as the owner."""
    store, tmp = node_db
    owner = job_owner()
    sub = submit_dir(tmp, "dag", owner)
    head = ("transfer_executable = false\nshould_transfer_files = YES\n"
            "request_memory = 32\n")
    (sub / "a.sub").write_text(head + "executable = /bin/sh\n"
                               "arguments = \"-c 'echo made by A > a.out'\"\n"
                               "transfer_output_files = a.out\nqueue\n")
    (sub / "b.sub").write_text(head + "executable = /bin/sh\n"
                               "arguments = \"-c 'cat a.out > b.out'\"\n"
                               "transfer_input_files = a.out\ntransfer_output_files = b.out\n"
                               "queue\n")
    (sub / "c.sub").write_text(head + "executable = /bin/true\n"
                               "transfer_input_files = /etc/shadow\nqueue\n")
    (sub / "x.dag").write_text("JOB A a.sub\nJOB B b.sub\nJOB C c.sub\n"
                               "PARENT A CHILD B C\nNODE_STATUS_FILE x.status 0\n")
    status = sub / "x.status"
    with _dag_run(store, tmp, sub, "x.dag", owner) as (dag_id, dag):
        deadline = time.monotonic() + 30
        while not (sub / "b.out").exists() or "DagStatus = 6;" not in (
                status.read_text() if status.exists() else ""):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert status.stat().st_uid == (pwd.getpwnam(owner).pw_uid if owner else os.getuid())
    assert 'Node = "C";\n  NodeStatus = 6;' in status.read_text()
    assert (sub / "b.out").read_text() == "made by A\n"
    nodes = {n.name: (n.status, n.exit_code) for n in store.dags.dag_nodes_of(dag_id)}
    assert nodes == {"A": ("done", 0), "B": ("done", 0), "C": ("failed", -1001)}
    assert (dag.status, dag.exit_code) == ("failed", 1)  # type: ignore[attr-defined]


@BACKENDS
def test_a_deferred_script_runs_again_and_debug_keeps_its_output(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """SCRIPT DEFER 3 1: a PRE script that exits 3 runs again a second later (the node
    waits, nothing fails), and its exit 0 then releases the node; SCRIPT DEBUG appends each
    run's output, after DAGMan's line, to the owner's debug file in the node's directory."""
    store, tmp = node_db
    owner = job_owner()
    sub = submit_dir(tmp, "dag", owner)
    (sub / "a.sub").write_text("executable = /bin/true\ntransfer_executable = false\n"
                               "should_transfer_files = YES\nrequest_memory = 32\nqueue\n")
    _script(sub, "pre.sh", 'echo "run $(cat runs 2>/dev/null)"; echo err >&2\n'
                           "if [ -e runs ]; then exit 0; fi\necho 1 > runs; exit 3", owner)
    (sub / "d.dag").write_text("JOB A a.sub\nSCRIPT DEFER 3 1 DEBUG pre.log ALL PRE A pre.sh "
                               "$JOB\n")
    with _dag_run(store, tmp, sub, "d.dag", owner) as (dag_id, dag):
        pass
    assert (dag.status, dag.exit_code) == ("completed", 0)  # type: ignore[attr-defined]
    assert store.dags.dag_nodes_of(dag_id)[0].pre_code == 0
    assert len((sub / "scripts.txt").read_text().splitlines()) == 2  # deferred once
    log = (sub / "pre.log").read_text().splitlines()
    assert [line.split(" Completion=")[0] for line in log if line.startswith("***")] == [
        "*** Node=A Type=PRE ExitCode=3", "*** Node=A Type=PRE ExitCode=0"]
    assert f"Cmd='{sub / 'pre.sh'} A'" in log[0] or "Cmd='pre.sh A'" in log[0], log[0]
    assert [line for line in log if not line.startswith("***")] == [
        "run ", "err", "run 1", "err"]
    assert (sub / "pre.log").stat().st_uid == (pwd.getpwnam(owner).pw_uid if owner
                                               else os.getuid())


@BACKENDS
def test_a_hold_script_runs_when_a_nodes_job_is_held(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """SCRIPT HOLD: the node's job is held; the service runs the HOLD script once, as the
    owner, in the node's directory, with its macros; the node goes on when the job is
    released."""
    store, tmp = node_db
    owner = job_owner()
    sub = submit_dir(tmp, "dag", owner)
    (sub / "a.sub").write_text("executable = /bin/true\ntransfer_executable = false\n"
                               "should_transfer_files = YES\nrequest_memory = 32\nqueue\n")
    _script(sub, "hold.sh", "exit 4", owner)  # its exit changes nothing
    (sub / "h.dag").write_text("JOB A a.sub\nSCRIPT HOLD A hold.sh $JOB $DAGID\n")
    dag_id = _submit(store, sub, "h.dag", owner)
    (job,) = store.reads.list_jobs()
    store.actions.admin(job.id, Event.HOLD, "held by hand")
    hers(store, owner)
    scripts = _scripts_dir(store, owner)
    with _service(store, tmp, scripts):
        deadline = time.monotonic() + 30
        while not (sub / "scripts.txt").exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        store.actions.admin(job.id, Event.RELEASE, "released")
        run_node(store, tmp, owner, "agent", ENDED, slots=1)
        dag = _dag_end(store, dag_id)
    shutil.rmtree(scripts)
    assert (dag.status, dag.exit_code) == ("completed", 0)  # type: ignore[attr-defined]
    uid = pwd.getpwnam(owner).pw_uid if owner else os.getuid()
    assert (sub / "scripts.txt").read_text() == f"hold.sh A {dag_id} {uid} {sub}\n"


def test_the_services_directory_is_one_nobody_else_may_change(tmp_path: Path,
                                                              store: JobStore) -> None:
    """Below a directory others may write (not sticky), a link, or a relative path, the
    service runs no script (whoever could replace a directory above could forge exits);
    directories not there yet below a safe one, the service makes (a new machine's
    /var/lib/jobstore)."""
    from jobstore.accesspoint.dagscripts import _safe_path

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (tmp_path / "link").symlink_to(shared)
    for where in (shared / "scripts", tmp_path / "link" / "scripts", Path("scripts"),
                  shared / "missing" / "scripts"):
        with pytest.raises(OSError, match="not"):
            _safe_path(str(where))
    shared.chmod(0o1777)  # sticky, as /tmp
    assert _safe_path(str(shared / "scripts")) == str(shared / "scripts")
    missing = tmp_path / "lib" / "jobstore" / "dagscripts"
    assert _safe_path(str(missing)) == str(missing)
    from jobstore.accesspoint.dagscripts import DagScripts

    settings = config.load_settings(None)
    duty = DagScripts(store, "ap", dataclasses.replace(settings, dag_scripts=str(missing)))
    assert duty._directory is not None and duty._directory.parent == missing
