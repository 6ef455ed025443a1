"""The node's copies of input files, so that a job's sandbox is filled at the speed
of a local copy: the agent keeps each input it served once in its own directory under the
sandbox root (mode 0700, root's), named by its owner and sha256, checked against the hash as it
is written there, and hands the hook an open read-only descriptor of it; the hook, as the job's
user, copies from that descriptor into the sandbox (copy_file_range: the kernel's copy). A
cluster of 10,000 jobs that share an input reads it from the database once per node. The
oldest copies go once the cache is larger than its bound (JOBSTORE_INPUT_CACHE_MB)."""

from __future__ import annotations

import hashlib
import os
import queue
import secrets
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from jobstore.errors import SandboxError
from jobstore.node.sandbox import write_fully
from jobstore.node.sandboxroot import CACHE, ensure_private

if TYPE_CHECKING:
    from jobstore.db.store import JobStore

AHEAD = 16  # chunks read ahead of the hashing and writing: a transaction's (CHUNKS_READ)


def open_input(store: JobStore, root: str, owner: str, sha: str, size: int,
               limit_mb: int) -> int:
    """A read-only descriptor of `owner`'s input `sha` (of `size` bytes) in the node's cache
    under the sandbox root `root`, copied there from the store first when it is not there."""
    box = ensure_private(root, CACHE)
    path = box / f"{sha}-{hashlib.sha256(owner.encode()).hexdigest()[:16]}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        _fill(store, path, owner, sha, size)
        _trim(box, limit_mb << 20, keep=path.name)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    if os.fstat(fd).st_size != size:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise SandboxError(f"the node's copy of {sha} is not {size} bytes; removed")
    os.utime(fd)  # used now: the last to go
    return fd


def _fill(store: JobStore, path: os.PathLike[str], owner: str, sha: str, size: int) -> None:
    """Write the input from the store under a temporary name, check it, then rename it in."""
    temp = f"{os.fspath(path)}.{secrets.token_hex(4)}.part"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o400)
    digest, got = hashlib.sha256(), 0
    try:
        for data in _ahead(store.files.file_content(owner, sha)):
            digest.update(data)
            write_fully(fd, data)
            got += len(data)
    except BaseException:
        os.close(fd)
        os.unlink(temp)
        raise
    os.close(fd)
    if got != size or digest.hexdigest() != sha:
        os.unlink(temp)
        raise SandboxError(f"{sha}: the store gave {got} bytes that do not match its sha256")
    os.rename(temp, path)


def _ahead(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """`pieces`, read by a thread of their own up to AHEAD pieces ahead: the database's next
    chunks arrive while the last ones are hashed and written (each step releases the GIL)."""
    ahead: queue.Queue[tuple[bytes | None, BaseException | None]] = queue.Queue(AHEAD)
    stop = threading.Event()

    def offer(item: tuple[bytes | None, BaseException | None]) -> bool:
        while not stop.is_set():
            try:
                ahead.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for piece in pieces:
                if not offer((piece, None)):
                    return
            offer((None, None))
        except BaseException as exc:  # handed to the consumer, which raises it
            offer((None, exc))

    reader = threading.Thread(target=read, name="input-read", daemon=True)
    reader.start()
    try:
        while True:
            piece, exc = ahead.get()
            if exc is not None:
                raise exc
            if piece is None:
                return
            yield piece
    finally:
        stop.set()
        reader.join()


def _trim(box: os.PathLike[str], limit: int, keep: str) -> None:
    """Remove the least recently used copies (but `keep`) until the cache is within `limit`
    bytes."""
    entries = []
    with os.scandir(box) as found:
        for entry in found:
            if (entry.is_file(follow_symlinks=False) and entry.name != keep
                    and not entry.name.endswith(".part")):
                st = entry.stat(follow_symlinks=False)
                entries.append((st.st_mtime, st.st_size, entry.path))
    total = sum(size for _, size, _ in entries) + os.lstat(os.path.join(box, keep)).st_size
    for _mtime, size, path in sorted(entries):
        if total <= limit:
            break
        os.unlink(path)
        total -= size
