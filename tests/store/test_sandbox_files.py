"""A job's files in the store: stored once per owner and content, read back in
chunks, listed per cluster or proc, and on PostgreSQL never shown to another submitter, even
one who knows the hash."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from rolepool import ALICE, BOB, Pool, pool, submitted  # noqa: F401 - the pool fixture
from sqlalchemy import func, select

from jobstore.db import sandbox
from jobstore.db.sandbox import IN, OUT, FileSource
from jobstore.db.schema import job_files, sandbox_chunks, sandbox_files
from jobstore.db.store import JobStore
from jobstore.errors import FileChanged, Refused
from jobstore.submit.description import parse_submit_text


def _file(tmp_path: Path, name: str, data: bytes) -> FileSource:
    path = tmp_path / name
    path.write_bytes(data)
    return FileSource(name, str(path), 0o644)


def test_files_are_stored_once_and_read_back_in_chunks(
        store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "CHUNKS_READ", 3)  # read back 3 chunks a transaction
    big = os.urandom(10 * sandbox.CHUNK + sandbox.CHUNK // 2)
    with store.db.engine.begin() as conn:
        first = store.files.store_files(conn, cluster_id=7, proc_id=None, owner="alice",
                                   direction=IN, sources=[_file(tmp_path, "big.bin", big),
                                                          _file(tmp_path, "copy.bin", big)])
        store.files.store_files(conn, cluster_id=7, proc_id=2, owner="alice", direction=IN,
                           sources=[_file(tmp_path, "mine.txt", b"proc 2 only")])
        store.files.store_files(conn, cluster_id=8, proc_id=None, owner="bob", direction=IN,
                           sources=[_file(tmp_path, "big.bin", big)])
    sha = hashlib.sha256(big).hexdigest()
    assert [(f.name, f.sha256, f.size) for f in first] == [("big.bin", sha, len(big)),
                                                            ("copy.bin", sha, len(big))]
    with store.db.engine.connect() as conn:
        files = conn.execute(select(sandbox_files.c.owner, func.count()).group_by(
            sandbox_files.c.owner).order_by(sandbox_files.c.owner)).all()
        chunks = conn.execute(select(func.count()).select_from(sandbox_chunks).where(
            sandbox_chunks.c.owner == "alice", sandbox_chunks.c.sha256 == sha)).scalar()
    assert [tuple(r) for r in files] == [("alice", 2), ("bob", 1)]  # one row per owner's file
    assert chunks == 11  # stored once for alice, in chunks of CHUNK bytes
    assert b"".join(store.files.file_content("alice", sha)) == big
    assert list(store.files.file_content("carol", sha)) == []

    class Row:
        cluster_id, owner = 7, "alice"

        def __init__(self, proc: int) -> None:
            self.proc_id = proc

    names = {p: [f.name for f in store.files.job_files_of(Row(p))] for p in (0, 2)}  # type: ignore[arg-type]
    assert names == {0: ["big.bin", "copy.bin"], 2: ["mine.txt"]}  # its own, else the cluster's
    assert store.files.job_files_of(Row(0), OUT) == []  # type: ignore[arg-type]


def test_a_file_that_changes_while_stored_is_refused(
        store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = _file(tmp_path, "moving.txt", b"before")
    real = sandbox._digest

    def digest_then_change(f):  # type: ignore[no-untyped-def]
        out = real(f)
        Path(source.path).write_bytes(b"after!")
        return out

    monkeypatch.setattr(sandbox, "_digest", digest_then_change)
    with (pytest.raises(FileChanged, match="changed while it was being stored"),
          store.db.engine.begin() as conn):
        store.files.store_files(conn, cluster_id=1, proc_id=None, owner="alice", direction=IN,
                           sources=[source])
    with store.db.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(sandbox_files)).scalar() == 0
        assert conn.execute(select(func.count()).select_from(job_files)).scalar() == 0


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_another_submitter_never_reads_a_file_by_its_hash(pool: Pool, tmp_path: Path,  # noqa: F811
                                                           ) -> None:
    """Bob's file, and its hash known to alice (condor_q shows ads to all): she can neither
    read it nor list it, nor store a file as bob; bob, a super user and the agent can."""
    secret = b"bob's secret input"
    sha = hashlib.sha256(secret).hexdigest()
    bob_job = submitted(pool, "bob")
    stores = {part: pool.store(part) for part in ("alice", "bob", "super", "agent")}
    try:
        bob = stores["bob"]
        job = bob.reads.get_job(bob_job)
        with bob.db.engine.begin() as conn:
            bob.files.store_inputs(conn, cluster_id=job.cluster_id, proc_id=None, owner=BOB,
                                   sources=[_file(tmp_path, "secret.txt", secret)])
        for part in ("bob", "super", "agent"):
            assert b"".join(stores[part].files.file_content(BOB, sha)) == secret, part
            assert [f.name for f in stores[part].files.job_files_of(job)] == ["secret.txt"], part
        alice = stores["alice"]
        assert list(alice.files.file_content(BOB, sha)) == []
        assert alice.files.job_files_of(job) == []
        with (pytest.raises(Refused, match=f"may not submit jobs as {BOB}"),
              alice.db.transaction() as conn):
            alice.files.store_inputs(conn, cluster_id=job.cluster_id, proc_id=None,
                                     owner=BOB, sources=[_file(tmp_path, "x.txt", b"x")])
        with (pytest.raises(Exception, match="permission denied"),
              alice.db.engine.begin() as conn):  # an output is the agent's to store
            alice.files.store_files(conn, cluster_id=job.cluster_id, proc_id=None, owner=BOB,
                                    direction=OUT, sources=[_file(tmp_path, "x.txt", b"x")])
        # her own copy of the same bytes is her own row: it shows her nothing of bob's
        mine = alice.reads.get_job(submitted(pool, "alice")).cluster_id
        with alice.db.transaction() as conn:
            alice.files.store_inputs(conn, cluster_id=mine, proc_id=None, owner=ALICE,
                                     sources=[_file(tmp_path, "same.txt", secret)])
        assert b"".join(alice.files.file_content(ALICE, sha)) == secret
        assert alice.files.job_files_of(job) == []
    finally:
        for s in stores.values():
            s.db.engine.dispose()


def test_retention_removes_a_jobs_files_with_it(store: JobStore, tmp_path: Path) -> None:
    """Pruned jobs take their outputs, their emptied cluster's inputs and the contents no
    other job lists; a content another cluster still lists stays."""
    import time

    from sqlalchemy import update

    from jobstore.core.jobs import InputFile, JobSpec
    from jobstore.db.schema import jobs

    shared = _file(tmp_path, "shared.txt", b"in both clusters")
    only = _file(tmp_path, "only.txt", b"in the old one only")
    spec = JobSpec("/bin/true", inputs=(InputFile("shared.txt", shared.path),
                                        InputFile("only.txt", only.path)))
    old, (old_job,) = store.submissions.submit([spec], owner="alice", queue="default",
                                               max_attempts=1)
    keep = JobSpec("/bin/true", inputs=(InputFile("shared.txt", shared.path),))
    store.submissions.submit([keep], owner="alice", queue="default", max_attempts=1)
    with store.db.engine.begin() as conn:
        store.files.store_files(conn, cluster_id=old, proc_id=0, owner="alice", direction=OUT,
                           attempt=1, sources=[_file(tmp_path, "out.txt", b"result")])
        conn.execute(update(jobs).where(jobs.c.id == old_job).values(
            status="completed", finished_at=time.time() - 10))
    assert store.retention.prune(time.time()).jobs == 1
    with store.db.engine.connect() as conn:
        left = sorted(conn.execute(select(job_files.c.cluster_id, job_files.c.name)).all())
        contents = conn.execute(select(func.count()).select_from(sandbox_files)).scalar()
    assert [tuple(r) for r in left] == [(old + 1, "shared.txt")] and contents == 1
    assert b"".join(store.files.file_content("alice", hashlib.sha256(b"in both clusters")
                                             .hexdigest())) == b"in both clusters"


def test_inputs_over_the_store_limits_are_refused_before_anything_is_stored(
        store: JobStore, tmp_path: Path) -> None:
    """The limits come from the store (`jobstore init` sets them from the configuration), not
    from the submitting process: one line that names URLs, and nothing written."""
    from jobstore.errors import InputTooLarge

    assert store.files.input_limits() == {"max_input_file_mb": 1024, "max_input_mb": 4096,
                                   "max_output_mb": 0}
    store.files.set_input_limits({"max_input_file_mb": 1, "max_input_mb": 2})
    for name in ("a.bin", "b.bin", "c.bin"):
        (tmp_path / name).write_bytes(b"x" * (900 << 10))
    (tmp_path / "big.bin").write_bytes(b"x" * (1100 << 10))
    for files, why in (("big.bin", "more than the 1 MB an input file may be"),
                       ("a.bin, b.bin, c.bin", "more than the 2 MB a job may store")):
        specs = parse_submit_text("executable = /bin/true\ntransfer_executable = false\n"
                                  f"transfer_input_files = {files}\nqueue 2\n",
                                  base_dir=tmp_path)
        with pytest.raises(InputTooLarge, match=why) as exc:
            store.submissions.submit(specs, owner="alice", queue="default", max_attempts=3)
        assert "give" in str(exc.value) and "URL" in str(exc.value)
    assert store.reads.list_jobs(include_final=True) == []
    assert store.files.input_limits() == {"max_input_file_mb": 1, "max_input_mb": 2,
                                          "max_output_mb": 0}
