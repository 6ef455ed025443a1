"""condor_transfer_data for fetched jobs: a finished job's outputs, which its
JOB_EXIT sent back into the store, written where condor_submit's commands say they go on the
submit side (transfer_output_remaps, output and error, else the job's Iwd)."""

from __future__ import annotations

import os
import pwd
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from classad2 import ExprTree

from jobstore.api.query import Shown, iter_query
from jobstore.core.jobs import Job
from jobstore.db.sandbox import OUT
from jobstore.db.store import JobStore
from jobstore.formats.classads import Expr
from jobstore.formats.jobads import stored_attrs
from jobstore.submit.transfer import output_destination, parse_remaps


@dataclass(frozen=True)
class Retrieved:
    """The outputs of one job written on the submit side: (output, where it went)."""

    job: Job
    written: tuple[tuple[str, str], ...]


def retrieve(store: JobStore, shown: Shown, ids: Sequence[str] = (),
             constraint: str | None = None) -> list[Retrieved]:
    """Write the outputs of the jobs named (finished or not; those that sent none are left
    out) to their submit-side paths, each by a rename of a whole file, never half of one; as
    root, with the rights of each job's owner."""
    out = []
    for job in iter_query(store, shown, ids, constraint, include_final=True):
        files = {f.name: f for f in store.files.job_files_of(job, OUT)}  # the newest attempt's
        if not files:
            continue
        ad = stored_attrs(job.ad, strict=False)
        iwd = str(ad.get("Iwd") or "/")
        remaps = parse_remaps(_string(ad.get("TransferOutputRemaps")))
        listed = tuple(n.strip() for n in _string(ad.get("TransferOutput")).split(",")
                       if n.strip())
        written = []
        for name, f in files.items():
            dest = output_destination(name, iwd, remaps, _text(ad.get("Out")),
                                      _text(ad.get("Err")), listed)
            _write_as(job.owner, dest, store.files.file_content(f.owner, f.sha256), f.mode)
            written.append((name, dest))
        out.append(Retrieved(job, tuple(written)))
    return out


def _string(value: object) -> str:
    """A stored string attribute's value (an expression's, evaluated)."""
    if isinstance(value, Expr):
        result = ExprTree(str(value)).eval()
        return result if isinstance(result, str) else ""
    return value if isinstance(value, str) else ""


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value != "/dev/null" else None


def _write_as(owner: str, dest: str, chunks: Iterable[bytes], mode: int) -> None:
    """`_write`, as `owner` when this process is root (by a child process with her rights):
    root must never write where the owner's directories, or links in them, point."""
    if os.geteuid() != 0 or owner == "root":
        _write(dest, chunks, mode)
        return
    user = pwd.getpwnam(owner)
    data_r, data_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: her rights, then the file
        os.close(data_w)
        os.close(err_r)
        try:
            os.initgroups(owner, user.pw_gid)
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            with os.fdopen(data_r, "rb") as source:
                _write(dest, iter(lambda: source.read(1 << 20), b""), mode)
            os._exit(0)
        except BaseException as exc:  # noqa: BLE001 - said to the parent, then gone
            os.write(err_w, str(exc).encode("utf-8", "replace")[:1000])
            os._exit(1)
    os.close(data_r)
    os.close(err_w)
    try:
        with os.fdopen(data_w, "wb") as sink:
            for data in chunks:
                sink.write(data)
    except BrokenPipeError:
        pass  # the child gave up: its reason follows
    finally:
        _, status = os.waitpid(pid, 0)
        with os.fdopen(err_r, "rb") as errors:
            why = errors.read().decode("utf-8", "replace")
    if status != 0:
        raise OSError(f"{dest}: not written as {owner}: {why or 'failed'}")


def _write(dest: str, chunks: Iterable[bytes], mode: int) -> None:
    directory = os.path.dirname(dest) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".jobstore-")
    try:
        with os.fdopen(fd, "wb") as f:
            for data in chunks:
                f.write(data)
        os.chmod(tmp, mode & 0o755 | 0o600)
        os.replace(tmp, dest)
    except BaseException:
        os.unlink(tmp)
        raise
