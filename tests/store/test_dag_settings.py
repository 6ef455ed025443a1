"""What a DAG asks of its access point, on SQLite and PostgreSQL: its NODE_STATUS_FILE kept
current (read from the DAG file, given through the door and checked there, due every
minimumUpdateTime seconds while the DAG runs and once more after its end, written by the
service as the DAG's owner), and -MaxPre and -MaxPost."""

from __future__ import annotations

import dataclasses
import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest
from backends import BOTH_BACKENDS
from sqlalchemy import Connection
from test_dags import OWNER, _dag, _exit, _queued, _run

from jobstore.accesspoint.dagstatus import DagStatusFiles
from jobstore.db.backends import DagSettings
from jobstore.db.store import JobStore
from jobstore.errors import DagError, InvalidInput
from jobstore.node import config
from jobstore.submit.dag import read_dag
from jobstore.testing.factories import claim


@pytest.fixture
def ap(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> config.Settings:
    """Settings of the access point "ap" on the test's store."""
    monkeypatch.setenv("JOBSTORE_DATABASE_URL", store.db.engine.url.render_as_string(False))
    monkeypatch.setenv("JOBSTORE_SCHEDD_NAME", "ap")
    return config.load_settings(None)


@pytest.mark.parametrize(("text", "message"), [
    ("NODE_STATUS_FILE\n", "NODE_STATUS_FILE <file>"),
    ("NODE_STATUS_FILE s.txt x\n", "'x' is not an integer"),
    ("NODE_STATUS_FILE s.txt 5 NEVER\n", "NODE_STATUS_FILE <file>"),
    ("JOBSTATE_LOG j.log\n", "JOBSTATE_LOG is written by no process here"),
])
def test_what_is_refused_of_status_files(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(DagError, match=message):
        read_dag(str(_dag(tmp_path, "JOB A node.sub\n" + text)))


def test_the_status_file_is_read_with_its_update_time(tmp_path: Path) -> None:
    dag = read_dag(str(_dag(tmp_path, "JOB A node.sub\nNODE_STATUS_FILE s.txt 5 ALWAYS-UPDATE\n")))
    assert (dag.status_file, dag.status_every) == (str(tmp_path / "s.txt"), 5)
    dag = read_dag(str(_dag(tmp_path, "JOB A node.sub\nNODE_STATUS_FILE /x/s.txt\n")))
    assert (dag.status_file, dag.status_every) == ("/x/s.txt", 60)


@BOTH_BACKENDS
def test_the_door_checks_a_dags_settings_before_its_nodes(store: JobStore) -> None:
    for bad, message in ((DagSettings("rel", 5), "NODE_STATUS_FILE"),
                         (DagSettings("/a\nb", 5), "NODE_STATUS_FILE"),
                         (DagSettings("/a", -1), "NODE_STATUS_FILE"),
                         (DagSettings("/a", 86401), "NODE_STATUS_FILE"),
                         (DagSettings(None, 60, -1), "-MaxPre"),
                         (DagSettings(None, 60, None, -2), "-MaxPost")):
        with pytest.raises(InvalidInput, match=message), store.db.transaction() as conn:
            store.door.dag_settings(conn, _new_dag(store, conn), bad)
    with pytest.raises(InvalidInput, match="has its nodes already"), \
            store.db.transaction() as conn:
        dag_id = _new_dag(store, conn)
        store.door.dag_nodes(conn, dag_id, [{"name": "N", "procs": 1}], [], {}, 0.0)
        store.door.dag_settings(conn, dag_id, DagSettings("/d/s.txt", 5))


def _new_dag(store: JobStore, conn: Connection) -> int:
    return store.door.new_dag(conn, owner=OWNER, queue="default", path="/d/x.dag",
                              batch_name=None, max_jobs=None, max_idle=None, attrs={}, now=0.0,
                              home="ap")


@BOTH_BACKENDS
def test_max_pre_and_max_post_throttle_a_dags_scripts(store: JobStore, ap: config.Settings,
                                                      tmp_path: Path) -> None:
    """At most -MaxPre of a DAG's PRE scripts are due at once (DAGMAN_MAX_PRE_SCRIPTS in its
    CONFIG, else the access point's default, here 2; 0: as many as an owner may run)."""
    nodes = "".join(f"JOB N{i} node.sub\nSCRIPT PRE N{i} pre.sh\n" for i in range(4))
    for where, options, config_text, due in (("a", {"maxpre": 1}, "", 1),
                                             ("b", {}, "DAGMAN_MAX_PRE_SCRIPTS = 3\n", 3),
                                             ("c", {"maxpre": 0}, "", 4),
                                             ("d", {"maxpost": 1}, "", 2)):
        (tmp_path / where).mkdir()
        (tmp_path / where / "dag.config").write_text(config_text)
        dag_id = _queued(store, tmp_path / where, ap, nodes + "CONFIG dag.config\n", **options)
        rows = [r for r in store.dag_scripts.due("ap", per_dag=2) if r.dag_id == dag_id]
        assert len(rows) == due, where


@BOTH_BACKENDS
def test_the_status_file_is_kept_current_as_the_owner(store: JobStore, ap: config.Settings
                                                      ) -> None:
    """Written at once, again only after its update time, and once more as the DAG ends,
    as the owner, whole (what a reader finds is a whole file)."""
    work = Path(tempfile.mkdtemp(prefix="jobstore-status-"))  # the owner's, as a DAG's is
    if os.geteuid() == 0:
        from jobstore.testing.support import ensure_account

        user = ensure_account(OWNER)
        os.chown(work, user.pw_uid, user.pw_gid)
    dag_id = _queued(store, work, ap, "JOB A node.sub\nJOB B node.sub\nPARENT A CHILD B\n"
                     "NODE_STATUS_FILE status.txt 30\n")
    now = [1000.0]
    duty = DagStatusFiles(store, "ap", dataclasses.replace(ap), clock=lambda: now[0])
    status = work / "status.txt"
    assert duty.pass_once() == 1
    assert 'DagStatus = 3; /* "STATUS_SUBMITTED ()" */' in status.read_text()
    assert "NodesDone = 0;" in status.read_text()
    assert status.stat().st_uid == pwd.getpwnam(OWNER).pw_uid
    job = claim(store)
    assert job is not None
    _exit(store, job, 0)
    now[0] += 29
    assert duty.pass_once() == 0  # not before its time
    now[0] += 2
    assert duty.pass_once() == 1
    assert "NodesDone = 1;" in status.read_text()
    assert _run(store) == ["B"]
    assert duty.pass_once() == 1  # the DAG's end, at once
    dag = store.dags.dag_of(dag_id)
    assert dag is not None and dag.status == "completed"
    assert 'DagStatus = 5; /* "STATUS_DONE (success)" */' in status.read_text()
    now[0] += 3600
    assert DagStatusFiles(store, "ap", ap, clock=lambda: now[0]).pass_once() == 0
    shutil.rmtree(work)


@BOTH_BACKENDS
def test_one_owners_many_status_files_wait_their_turn(store: JobStore, ap: config.Settings
                                                      ) -> None:
    """A pass writes at most PER_OWNER of one owner's status files (the least lately written
    first), so that her many DAGs keep nobody's waiting long."""
    from jobstore.accesspoint import dagstatus

    work = Path(tempfile.mkdtemp(prefix="jobstore-status-"))
    if os.geteuid() == 0:
        from jobstore.testing.support import ensure_account

        user = ensure_account(OWNER)
        os.chown(work, user.pw_uid, user.pw_gid)
    for i in range(dagstatus.PER_OWNER + 2):
        (work / str(i)).mkdir()
        if os.geteuid() == 0:
            os.chown(work / str(i), user.pw_uid, user.pw_gid)
        _queued(store, work / str(i), ap, "JOB A node.sub\nNODE_STATUS_FILE s.txt\n")
    duty = DagStatusFiles(store, "ap", ap, clock=lambda: 1000.0)
    assert duty.pass_once() == dagstatus.PER_OWNER
    assert duty.pass_once() == 2
    shutil.rmtree(work)
