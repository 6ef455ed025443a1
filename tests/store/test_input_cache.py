"""The node's copies of inputs: the agent fills its cache from the store once per
input, checked against the hash, and hands out read-only descriptors of it; the least recently
used copies go once the cache is over its bound. In process, on real databases and files."""

from __future__ import annotations

import errno
import hashlib
import os
import pwd
import time
from pathlib import Path

import pytest
from sqlalchemy import delete, update

from jobstore.db.schema import sandbox_chunks
from jobstore.db.store import JobStore
from jobstore.errors import SandboxError
from jobstore.node.inputcache import open_input
from jobstore.node.sandboxroot import CACHE, ensure_root
from jobstore.submit.description import parse_submit_text


def _stored(store: JobStore, tmp: Path, contents: list[bytes]) -> list[str]:
    for i, data in enumerate(contents):
        (tmp / f"in{i}.bin").write_bytes(data)
    names = ", ".join(f"in{i}.bin" for i in range(len(contents)))
    specs = parse_submit_text("executable = /bin/true\ntransfer_executable = false\n"
                              f"transfer_input_files = {names}\nqueue\n", base_dir=tmp)
    store.submissions.submit(specs, owner=pwd.getpwuid(os.geteuid()).pw_name, queue="default",
                             max_attempts=3)
    return [hashlib.sha256(d).hexdigest() for d in contents]


def test_an_input_is_read_from_the_store_once_per_node(store: JobStore, tmp_path: Path) -> None:
    root = tmp_path / "sandboxes"
    ensure_root(str(root))
    owner = pwd.getpwuid(os.geteuid()).pw_name
    data = os.urandom(3 << 20)
    (sha,) = _stored(store, tmp_path, [data])
    fd = open_input(store, str(root), owner, sha, len(data), 100)
    try:
        assert os.pread(fd, len(data) + 1, 0) == data
        with pytest.raises(OSError) as exc:
            os.write(fd, b"x")  # what the hook gets is read-only
        assert exc.value.errno == errno.EBADF
    finally:
        os.close(fd)
    cached = list((root / CACHE).iterdir())
    assert [p.name.split("-")[0] for p in cached] == [sha]
    with store.db.engine.begin() as conn:  # from now on the node's copy serves it
        conn.execute(delete(sandbox_chunks))
    fd = open_input(store, str(root), owner, sha, len(data), 100)
    assert os.pread(fd, 16, 0) == data[:16]
    os.close(fd)
    with pytest.raises(SandboxError, match="not 5 bytes"):  # a copy that is not what is listed
        open_input(store, str(root), owner, sha, 5, 100)
    assert list((root / CACHE).iterdir()) == []


def test_bytes_that_do_not_match_their_hash_never_enter_the_cache(store: JobStore,
                                                                   tmp_path: Path) -> None:
    root = tmp_path / "sandboxes"
    ensure_root(str(root))
    (sha,) = _stored(store, tmp_path, [b"three little words\n"])
    with store.db.engine.begin() as conn:
        conn.execute(update(sandbox_chunks).values(data=b"three little wordz\n"))
    with pytest.raises(SandboxError, match="do not match its sha256"):
        open_input(store, str(root), pwd.getpwuid(os.geteuid()).pw_name, sha, 19, 100)
    assert list((root / CACHE).iterdir()) == []


def test_the_least_recently_used_copies_go_first(store: JobStore, tmp_path: Path) -> None:
    root = tmp_path / "sandboxes"
    ensure_root(str(root))
    owner = pwd.getpwuid(os.geteuid()).pw_name
    contents = [bytes([i]) * (400 << 10) for i in range(4)]  # 400 KiB each, a 1 MB bound
    shas = _stored(store, tmp_path, contents)
    for sha in shas[:2]:
        os.close(open_input(store, str(root), owner, sha, 400 << 10, 1))
        time.sleep(0.01)
    os.close(open_input(store, str(root), owner, shas[0], 400 << 10, 1))  # used again
    time.sleep(0.01)
    os.close(open_input(store, str(root), owner, shas[2], 400 << 10, 1))
    kept = {p.name.split("-")[0] for p in (root / CACHE).iterdir()}
    assert kept == {shas[0], shas[2]}  # shas[1] was the least recently used
    os.close(open_input(store, str(root), owner, shas[3], 400 << 10, 0))  # bound 0: just it
    assert {p.name.split("-")[0] for p in (root / CACHE).iterdir()} == {shas[3]}


def _fails_then_copies(store: JobStore, root: Path, sha: str, data: bytes,
                       monkeypatch: pytest.MonkeyPatch, target: object, name: str,
                       broken: object, error: type[BaseException], match: str) -> None:
    """With `target.name` replaced by `broken`, a node copy raises `error` and leaves none;
    with it back, the next copy is the file."""
    owner = pwd.getpwuid(os.geteuid()).pw_name
    real = getattr(target, name)
    monkeypatch.setattr(target, name, broken)
    with pytest.raises(error, match=match):
        open_input(store, str(root), owner, sha, len(data), 100)
    assert list((root / CACHE).iterdir()) == []
    monkeypatch.setattr(target, name, real)
    fd = open_input(store, str(root), owner, sha, len(data), 100)
    try:
        assert os.pread(fd, len(data) + 1, 0) == data
    finally:
        os.close(fd)
    assert b"".join(store.files.file_content(owner, sha)) == data


def test_a_file_of_many_pieces_is_read_ahead_whole_and_a_failed_read_leaves_nothing(
        store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next pieces come from the database while the last are hashed and written; what
    is cached is the file, and a read that fails half-way raises and leaves no copy."""
    from jobstore.db import sandbox
    from jobstore.errors import DatabaseError

    monkeypatch.setattr(sandbox, "CHUNKS_READ", 1)  # a transaction per 1 MiB chunk
    root = tmp_path / "sandboxes"
    ensure_root(str(root))
    data = os.urandom((5 << 20) + 123)
    (sha,) = _stored(store, tmp_path, [data])
    backend = store.files.db.backend
    real, calls = backend.file_stream, []

    def failing(conn, owner: str, sha256: str, first: int, last: int):  # noqa: ANN001, ANN202
        calls.append(first)
        if len(calls) == 3:
            raise DatabaseError("the server went away")
        return real(conn, owner, sha256, first, last)

    _fails_then_copies(store, root, sha, data, monkeypatch, backend, "file_stream", failing,
                       DatabaseError, "went away")


def test_a_copy_given_up_mid_read_leaves_the_store_usable(
        db_url: str, store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> None:
    """A node copy that fails while its chunks are still arriving (a full disk) ends the
    read's transaction: nothing is cached, and the agent's store (one kept connection, no
    other) reads again at once."""
    from jobstore.node import inputcache

    agent_store = JobStore.from_url(db_url, pool=True, max_overflow=0)
    request.addfinalizer(agent_store.db.engine.dispose)
    root = tmp_path / "sandboxes"
    ensure_root(str(root))
    data = os.urandom((5 << 20) + 7)
    (sha,) = _stored(store, tmp_path, [data])
    real, writes = inputcache.write_fully, []

    def full_disk(fd: int, piece: bytes) -> None:
        writes.append(len(piece))
        if len(writes) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, piece)

    _fails_then_copies(agent_store, root, sha, data, monkeypatch, inputcache, "write_fully",
                       full_disk, OSError, "No space")
