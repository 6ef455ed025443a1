"""A job's files in the store: content-addressed per owner, their bytes in chunks,
and which files each job takes into its sandbox (`in`) and brought back (`out`)."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable, Iterator
from typing import BinaryIO, NamedTuple

from sqlalchemy import Connection, func, insert, or_, select

from jobstore.core.jobs import Job
from jobstore.db.backends import Door, InputFile
from jobstore.db.schema import job_files, sandbox_chunks, sandbox_files, store_limits
from jobstore.db.transactions import Transactions
from jobstore.errors import FileChanged, InputTooLarge

CHUNK = 1 << 20  # bytes of a file per sandbox_chunks row
CHUNKS_READ = 16  # rows per transaction when a file is read back
IN, OUT, CHECKPOINT = "in", "out", "ckpt"  # job_files.direction
# store_limits' names and their values when unset, in MB (migrations 0016 and 0019 have the
# same defaults; a job's outputs: 0, its RequestDisk)
MAX_INPUT_FILE_MB, MAX_INPUT_MB = "max_input_file_mb", "max_input_mb"
MAX_OUTPUT_MB = "max_output_mb"
LIMIT_DEFAULTS = {MAX_INPUT_FILE_MB: 1024, MAX_INPUT_MB: 4096, MAX_OUTPUT_MB: 0}


class SandboxFile(NamedTuple):
    """One file of a job's sandbox: its path there, content and mode."""

    name: str
    sha256: str
    size: int
    mode: int
    owner: str


class FileSource(NamedTuple):
    """A file to store: its path in the sandbox, where to read it, its mode."""

    name: str
    path: str
    mode: int


class SandboxFiles:
    """Writes and reads of sandbox_files, sandbox_chunks and job_files: a submit's inputs
    through the door (backends.Door), the outputs an attempt sends back by the agent's role."""

    def __init__(self, db: Transactions, door: Door) -> None:
        self.db = db
        self.door = door

    def store_inputs(self, conn: Connection, *, cluster_id: int, proc_id: int | None,
                     owner: str, sources: Iterable[FileSource]) -> None:
        """Store `sources` as `owner`'s and list them as the inputs of a cluster (`proc_id`
        None: every proc's) or of one proc. FileChanged when a file changes while it is read
        (one read to hash it, one to store it when it is new)."""
        sources = list(sources)
        self._check_input_sizes(conn, sources)
        stored = []
        for source in sources:
            with open(source.path, "rb") as f:
                sha, size = _digest(f)
                if self.door.store_file(conn, owner, sha, size):
                    f.seek(0)
                    digest = hashlib.sha256()
                    for seq, data in enumerate(iter(lambda: f.read(CHUNK), b"")):
                        digest.update(data)
                        self.door.store_chunk(conn, owner, sha, seq, data)
                    if digest.hexdigest() != sha:
                        raise FileChanged(f"{source.path} changed while it was being stored")
            stored.append(InputFile(source.name, sha, source.mode))
        if stored:
            self.door.add_inputs(conn, cluster_id, proc_id, stored)

    def _store_content(self, conn: Connection, owner: str, path: str) -> tuple[str, int]:
        """Store the file at `path` as `owner`'s, once: (sha256, size). FileChanged when it
        changes under the two reads (one to hash it, one to store it when it is new)."""
        with open(path, "rb") as f:
            sha, size = _digest(f)
            if conn.execute(select(sandbox_files.c.size).where(
                    sandbox_files.c.owner == owner, sandbox_files.c.sha256 == sha)).first():
                return sha, size
            if not self._insert_missing_file(conn, owner, sha, size):
                return sha, size  # a concurrent submit stored it
            f.seek(0)
            digest = hashlib.sha256()
            for seq, data in enumerate(iter(lambda: f.read(CHUNK), b"")):
                digest.update(data)
                conn.execute(insert(sandbox_chunks).values(owner=owner, sha256=sha, seq=seq,
                                                           data=data))
        if digest.hexdigest() != sha:
            raise FileChanged(f"{path} changed while it was being stored")
        return sha, size

    def _insert_missing_file(self, conn: Connection, owner: str, sha: str, size: int) -> bool:
        """Insert the file's row unless it is there (a concurrent submit's, once committed):
        whether it was inserted."""
        return self.db.backend.insert_missing(conn, sandbox_files, {
            "owner": owner, "sha256": sha, "size": size, "created_at": time.time()})

    def store_files(self, conn: Connection, *, cluster_id: int, proc_id: int | None,
                     owner: str, direction: str, sources: Iterable[FileSource],
                     attempt: int | None = None) -> list[SandboxFile]:
        """Store `sources` as `owner`'s and list them as the files of a cluster (`proc_id`
        None: every proc's) or of one proc, in `direction`."""
        now = time.time()
        out: list[SandboxFile] = []
        sources = list(sources)
        if direction == IN:
            self._check_input_sizes(conn, sources)
        for source in sources:
            sha, size = self._store_content(conn, owner, source.path)
            out.append(SandboxFile(source.name, sha, size, source.mode, owner))
        if out:
            conn.execute(insert(job_files), [
                {"cluster_id": cluster_id, "proc_id": proc_id, "direction": direction,
                 "name": f.name, "owner": owner, "sha256": f.sha256, "size": f.size,
                 "mode": f.mode, "attempt": attempt, "created_at": now} for f in out])
        return out

    def input_limits(self, conn: Connection | None = None) -> dict[str, int]:
        """The store's limits on a submit's inputs, in MB (LIMIT_DEFAULTS where unset)."""
        q = select(store_limits.c.name, store_limits.c.value)
        if conn is not None:  # in the caller's transaction
            rows = dict(conn.execute(q).all())
        else:
            with self.db.transaction() as c:
                rows = dict(c.execute(q).all())
        return {name: int(rows.get(name, default)) for name, default in LIMIT_DEFAULTS.items()}

    def set_input_limits(self, limits: dict[str, int]) -> None:
        """Set the store's limits (MB) by name, as `jobstore init` does from the configuration."""
        from sqlalchemy import delete

        with self.db.transaction() as conn:
            conn.execute(delete(store_limits).where(store_limits.c.name.in_(list(limits))))
            conn.execute(insert(store_limits), [{"name": n, "value": v}
                                                for n, v in limits.items()])

    def _check_input_sizes(self, conn: Connection, sources: list[FileSource]) -> None:
        """InputTooLarge before anything is stored when a file, or all of a job's, are over
        the store's limits (which the database enforces too, on PostgreSQL)."""
        limits = self.input_limits(conn)
        largest, most = limits[MAX_INPUT_FILE_MB] << 20, limits[MAX_INPUT_MB] << 20
        total = 0
        for source in sources:
            size = os.path.getsize(source.path)
            if size > largest:
                raise InputTooLarge(
                    f"transfer_input_files: {source.path} is {size / (1 << 20):.1f} MB, more "
                    f"than the {largest >> 20} MB an input file may be "
                    "(JOBSTORE_MAX_INPUT_FILE_MB); give it as a URL or on a shared file system")
            total += size
        if total > most:
            raise InputTooLarge(
                f"transfer_input_files: the job's inputs are {total / (1 << 20):.1f} MB, more "
                f"than the {most >> 20} MB a job may store (JOBSTORE_MAX_INPUT_MB); give the big "
                "ones as URLs or on a shared file system")

    def job_files_of(self, job: Job, direction: str = IN) -> list[SandboxFile]:
        """The files `job` takes into its sandbox (IN: its own when it has some, else its
        cluster's) or brought back (OUT), in the order stored; only its owner's (and a super
        user's or an agent's) session sees them on PostgreSQL."""
        q = (select(job_files.c.proc_id, job_files.c.name, job_files.c.sha256,
                    job_files.c.size, job_files.c.mode, job_files.c.owner)
             .where(job_files.c.cluster_id == job.cluster_id,
                    job_files.c.direction == direction,
                    job_files.c.owner == job.owner,
                    or_(job_files.c.proc_id.is_(None), job_files.c.proc_id == job.proc_id))
             .order_by(job_files.c.id))
        with self.db.transaction() as conn:
            rows = conn.execute(q).all()
        own = [r for r in rows if r[0] is not None]
        return [SandboxFile(*r[1:]) for r in (own or rows)]

    def sent_names(self, job: Job, direction: str = OUT) -> set[str]:
        """The names of the files `job`'s current attempt has stored in `direction` (OUT or
        CHECKPOINT) so far."""
        q = select(job_files.c.name).where(
            job_files.c.cluster_id == job.cluster_id, job_files.c.proc_id == job.proc_id,
            job_files.c.owner == job.owner, job_files.c.direction == direction,
            job_files.c.attempt == job.claims)
        with self.db.transaction() as conn:
            return set(conn.execute(q).scalars())

    def sent_bytes(self, job: Job) -> int:
        """The bytes `job`'s current attempt has stored as outputs and checkpoint so far."""
        q = select(func.coalesce(func.sum(job_files.c.size), 0)).where(
            job_files.c.cluster_id == job.cluster_id, job_files.c.proc_id == job.proc_id,
            job_files.c.owner == job.owner, job_files.c.direction.in_((OUT, CHECKPOINT)),
            job_files.c.attempt == job.claims)
        with self.db.transaction() as conn:
            return int(conn.execute(q).scalar_one())

    def sandbox_start(self, job: Job) -> list[SandboxFile]:
        """What `job`'s next sandbox starts with: its inputs, and over them (by name) the files
        its newest checkpoint sent (an eviction with ON_EXIT_OR_EVICT, or an exit with its
        checkpoint_exit_code)."""
        q = (select(job_files.c.attempt, job_files.c.name, job_files.c.sha256,
                    job_files.c.size, job_files.c.mode, job_files.c.owner)
             .where(job_files.c.cluster_id == job.cluster_id,
                    job_files.c.proc_id == job.proc_id, job_files.c.owner == job.owner,
                    job_files.c.direction == CHECKPOINT)
             .order_by(job_files.c.id))
        with self.db.transaction() as conn:
            rows = conn.execute(q).all()
        newest = max((r[0] or 0 for r in rows), default=None)
        saved = {r[1]: SandboxFile(*r[1:]) for r in rows if (r[0] or 0) == newest}
        start = [f for f in self.job_files_of(job, IN) if f.name not in saved]
        return start + list(saved.values())

    def file_range(self, owner: str, sha256: str, offset: int, length: int) -> bytes:
        """At most `length` bytes of `owner`'s file `sha256` from `offset` (fewer at its end;
        none when the session may not see it)."""
        first, last = _chunk_range(offset, length)
        with self.db.transaction() as conn:
            data = b"".join(self.db.backend.file_stream(conn, owner, sha256, first, last))
        start = offset - first * CHUNK
        return data[start:start + length]

    def file_content(self, owner: str, sha256: str) -> Iterator[bytes]:
        """The bytes of `owner`'s file `sha256`, a chunk at a time: CHUNKS_READ chunks per
        transaction, each read whole and ended before its chunks are handed on (a slow reader
        holds no transaction open); nothing when the session may not see it."""
        first = 0
        while True:
            with self.db.transaction() as conn:
                pieces = list(self.db.backend.file_stream(conn, owner, sha256, first,
                                                          first + CHUNKS_READ - 1))
            yield from pieces
            if len(pieces) < CHUNKS_READ:
                return
            first += CHUNKS_READ


def _chunk_range(offset: int, length: int) -> tuple[int, int]:
    return offset // CHUNK, (offset + max(length, 1) - 1) // CHUNK


def _digest(f: BinaryIO) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    for data in iter(lambda: f.read(CHUNK), b""):
        digest.update(data)
        size += len(data)
    return digest.hexdigest(), size
