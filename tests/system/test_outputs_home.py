"""Outputs home: a real `jobstore schedd` process on the access point writes the outputs of the
jobs submitted there into their Iwd as they complete, with no command of the user's, as their
owner and once; a spooled submit's wait for transfer-data; another access point's service
delivers none of them; a directory of the owner's swapped for a link to one she may not write
gets nothing. The jobs run on an emulated node with the real hooks and the agent."""

from __future__ import annotations

import os
import pwd
import signal

import clirun
import pytest
from apnode import JOBSTORE, hers, schedd_cmd, submit_dir, submit_in, wait_for
from emulatornode import job_owner, node_db, run_node  # noqa: F401

from jobstore.node import config

BACKENDS = pytest.mark.parametrize(
    "node_db", ["sqlite", pytest.param("postgresql", marks=pytest.mark.matrix)], indirect=True)


@BACKENDS
def test_outputs_come_home_as_the_jobs_complete(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    store, tmp = node_db
    owner = job_owner()
    home, spooled, other = (submit_dir(tmp, name, owner) for name in ("home", "spooled", "other"))
    ids = submit_in(store, home, owner)
    spooled_ids = submit_in(store, spooled, owner, spool=True)
    other_ids = submit_in(store, other, owner)
    other_cluster = store.reads.get_job(other_ids[0]).cluster_id
    with store.db.engine.begin() as conn:  # as if submitted on another access point
        conn.exec_driver_sql("UPDATE clusters SET home = 'ap2.example.org' WHERE id = "
                             f"{other_cluster}")
    hers(store, owner)
    service = clirun.popen(schedd_cmd(store), stderr=open(tmp / "schedd.log", "wb"))  # noqa: SIM115
    try:
        run_node(store, tmp, owner, "agent", {"completed", "held", "failed"}, slots=2)
        assert {store.reads.get_job(i).status for i in ids + spooled_ids + other_ids} == {
            "completed"}
        outputs = [home / "cat-0.out", home / "cat-1.out"]
        wait_for([*outputs, home / "logs" / "cat-1.err"])
        assert [p.read_text() for p in outputs] == ["hello from home\n"] * 2
        if owner:  # written with the owner's rights
            assert {p.stat().st_uid for p in outputs} == {pwd.getpwnam(owner).pw_uid}
        delivered = store.deliveries.of(ids + spooled_ids + other_ids)
        assert sorted(delivered) == sorted(ids)  # neither the spooled nor another home's
        assert {(d.files, d.error) for d in delivered.values()} == {(2, None)}
        assert not (spooled / "cat-0.out").exists() and not (other / "cat-0.out").exists()
        # the other access point's service delivers its own, and only once
        once = clirun.run(schedd_cmd(store, "--name", "ap2.example.org", "--once"),
                          capture_output=True, text=True, timeout=60)
        assert once.stdout.startswith("2 job(s)' outputs written home, 0 not.\n"), once.stderr
        assert (other / "cat-1.out").read_text() == "hello from other\n"
        again = clirun.run(schedd_cmd(store, "--name", "ap2.example.org", "--once"),
                           capture_output=True, text=True, timeout=60)
        assert again.stdout.startswith("0 job(s)'"), again.stderr
    finally:
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=20) == 0
    log = (tmp / "schedd.log").read_text()
    assert log.count("output(s) written home") == 2, log


@BACKENDS
@pytest.mark.skipif(os.geteuid() != 0, reason="the service writes as the owner only as root")
def test_a_link_swapped_into_iwd_gets_nothing(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    store, tmp = node_db
    owner = job_owner()
    assert owner is not None
    home = submit_dir(tmp, "home", owner)
    guarded = tmp / "guarded"
    guarded.mkdir(mode=0o700)
    ids = submit_in(store, home, owner)
    (home / "logs").rmdir()  # her own directory, now a link to one only root may write
    (home / "logs").symlink_to(guarded)
    os.lchown(home / "logs", pwd.getpwnam(owner).pw_uid, -1)
    run_node(store, tmp, owner, "agent", {"completed", "held", "failed"}, slots=2)
    hers(store, owner)
    once = clirun.run(schedd_cmd(store, "--once"), capture_output=True, text=True, timeout=60)
    assert once.stdout.startswith("0 job(s)' outputs written home, 2 not.\n"), once.stderr
    assert list(guarded.iterdir()) == []
    records = store.deliveries.of(ids).values()
    assert [d.delivered_at for d in records] == [None, None]
    assert all("Permission denied" in (d.error or "") for d in records), records
    assert "outputs not written home" in once.stderr


@BACKENDS
def test_a_submit_names_its_access_point_unless_spooled(node_db, monkeypatch) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """`jobstore submit` and Schedd.submit record this access point (JOBSTORE_SCHEDD_NAME,
    else the host's name); -spool and spool=True record none."""
    import socket

    import jobstore
    from jobstore.db.schema import clusters

    store, tmp = node_db
    owner = job_owner()
    sub = submit_dir(tmp, "sub", owner)
    url = store.db.engine.url.render_as_string(False)
    as_owner = ["--owner", owner] if owner else []
    for extra in ([], ["-spool"]):
        done = clirun.run([*JOBSTORE, "--db", url, "submit", str(sub / "jobs.sub"), *as_owner,
                           *extra], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    monkeypatch.chdir(sub)
    monkeypatch.setenv("JOBSTORE_SCHEDD_NAME", "schedd1@ap1.example.org")
    with jobstore.Schedd(url=url, owner=owner) as schedd:
        for spool in (False, True):
            schedd.submit({"executable": "/bin/true", "transfer_executable": "false"},
                          spool=spool)
    with store.db.engine.connect() as conn:
        homes = list(conn.execute(clusters.select().order_by(clusters.c.id)).mappings())
    assert [c["home"] for c in homes] == [socket.gethostname(), None,
                                          "schedd1@ap1.example.org", None]


@BACKENDS
@pytest.mark.skipif(os.geteuid() != 0, reason="the service writes as the owner only as root")
def test_an_ad_that_cannot_be_delivered_is_no_bomb(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """A job whose stored ad cannot say where its outputs go (remaps that do not parse, an
    Iwd that is no absolute path, remaps that are an expression: never evaluated, however
    costly), or whose owner is no account here, is recorded with its reason and left; the next
    job is delivered."""
    from jobstore.accesspoint.outputs import OutputsHome
    from jobstore.db.schema import jobs
    from jobstore.testing.factories import completed, job_spec

    store, tmp = node_db
    owner = job_owner()
    assert owner is not None
    sub = submit_dir(tmp, "sub", owner)
    (tmp / "x").write_text("x\n")
    ids = []
    for ad_owner in (owner, owner, owner, "jsnobody", owner):
        ids += store.submissions.submit([job_spec(0, iwd=str(sub))], owner=ad_owner,
                                        queue="default", max_attempts=1, home="ap1")[1]
    for _ in ids:
        completed(store, {"x.out": tmp / "x"})
    with store.db.engine.begin() as conn:
        for job_id, ad in ((ids[0], {"Iwd": str(sub), "TransferOutputRemaps": "\"=b\""}),
                           (ids[1], {"Iwd": "relative/dir"}),
                           (ids[4], {"Iwd": str(sub), "TransferOutputRemaps": {
                               "expr": '[s = "aaaa"; b0 = regexp("(a*)*b", s); b1 = b0 + b0].b1'
                           }})):
            conn.execute(jobs.update().where(jobs.c.id == job_id).values(ad=ad))
    settings = config.load_settings("JOBSTORE", store.db.engine.url.render_as_string(False))
    service = OutputsHome(store, "ap1", settings)
    assert service.pass_once() == 1
    assert (sub / "x.out").read_text() == "x\n"
    records = store.deliveries.of(ids)
    assert records[ids[2]].files == 1
    assert "is not NAME = TARGET" in (records[ids[0]].error or "")
    assert "is not an absolute path" in (records[ids[1]].error or "")
    assert records[ids[3]].error == "account jsnobody is not on this access point"
    assert "its TransferOutputRemaps is not a string literal" in (records[ids[4]].error or "")
    assert service.pass_once() == 0  # left until their time comes again


@pytest.mark.parametrize("node_db", ["sqlite"], indirect=True)
@pytest.mark.skipif(os.geteuid() != 0, reason="the service writes as the owner only as root")
def test_root_writes_only_the_owners_jobs_of_her_sqlite_store(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """A SQLite store is its file owner's, who may write any row: a job there that says it is
    another account's is written for nobody, by root's service or root's transfer-data."""
    from jobstore.accesspoint.outputs import OutputsHome
    from jobstore.api.retrieve import write_outputs
    from jobstore.errors import ConfigError, InvalidInput
    from jobstore.testing.factories import completed, job_spec
    from jobstore.testing.support import ensure_account

    store, tmp = node_db
    alice = pwd.getpwnam(job_owner() or "")
    bob = ensure_account("jsbob")
    os.chown(str(store.db.engine.url.database), alice.pw_uid, alice.pw_gid)
    victim = tmp / "bob"
    victim.mkdir(mode=0o700)
    os.chown(victim, bob.pw_uid, bob.pw_gid)
    (tmp / "x").write_text("alice's\n")
    (job_id,) = store.submissions.submit([job_spec(0, iwd=str(victim))], owner="jsbob",
                                         queue="default", max_attempts=1, home="ap1")[1]
    job = completed(store, {"notes.txt": tmp / "x"})
    settings = config.load_settings("JOBSTORE", store.db.engine.url.render_as_string(False))
    with pytest.raises(ConfigError, match="serve it as jsalice"):
        OutputsHome(store, "ap1", settings)
    with pytest.raises(InvalidInput, match="root writes none of its outputs"):
        write_outputs(store, job)
    served = clirun.run(schedd_cmd(store, "--name", "ap1", "--once"), capture_output=True,
                        text=True, timeout=60)  # root's service becomes her
    assert served.stdout.startswith("0 job(s)' outputs written home, 0 not.\n"), served.stderr
    assert list(victim.iterdir()) == [] and store.deliveries.of([job_id]) == {}
    # root is never led by a path others may change: a link (to bob's directory, say) or a
    # chain of them, `..`, a root file in a directory others may write (SQLite's journal goes
    # there), a system account's file
    database = str(store.db.engine.url.database)
    (tmp / "to-bob").symlink_to(victim)
    chain = tmp / "link0"
    chain.symlink_to(database)
    for n in range(1, 45):
        (tmp / f"link{n}").symlink_to(tmp / f"link{n - 1}")
    (tmp / "sub").mkdir()
    refused = {f"{tmp}/to-bob": "no link or `..` on the way",
               f"{tmp}/link44": "job store",  # too many links to be one
               f"{tmp}/sub/../jobstore.db": "no link or `..` on the way"}
    for path, why in refused.items():
        done = clirun.run([*JOBSTORE, "--db", f"sqlite:///{path}", "schedd", "--once"],
                          capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and why in done.stderr, (path, done.stderr)
    os.chown(database, 0, 0)
    os.chmod(tmp, 0o1777)  # sticky: still SQLite's journal's directory
    shared = clirun.run(schedd_cmd(store, "--once"), capture_output=True, text=True, timeout=60)
    assert shared.returncode == 1 and "others may replace it" in shared.stderr, shared.stderr
    os.chown(database, pwd.getpwnam("daemon").pw_uid, 0)
    system = clirun.run(schedd_cmd(store, "--once"), capture_output=True, text=True, timeout=60)
    assert system.returncode == 1 and "a system account" in system.stderr, system.stderr
