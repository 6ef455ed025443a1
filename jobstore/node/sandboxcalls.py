"""What the hooks of a job with file transfer ask of the store, served by the agent
for the hook processes (jobstore.agent.client), or in the hook process itself in direct mode
(jobstore.node.sandboxdirect): the list of the attempt's input files, a range of an input's
bytes, and an output's bytes, a piece at a time.

Each call names the attempt by its keyword, job id, attempt number and token, and is served
only while that attempt is the job's current one, handed out, and (from an ordinary account)
only to the job's owner: a job's user reads her own job's inputs and sends its outputs, and
nothing else."""

from __future__ import annotations

import hmac
import os
import pwd
import tempfile
import threading
from pathlib import Path

from jobstore.core.jobs import Job
from jobstore.core.states import HANDED_OUT
from jobstore.db.sandbox import CHECKPOINT, OUT, FileSource
from jobstore.db.store import JobStore
from jobstore.errors import DatabaseError, HookError, SandboxError, UnknownJob
from jobstore.node import config
from jobstore.node.hookcall import HookRequest, HookResponse
from jobstore.node.inputcache import open_input
from jobstore.node.sandbox import MAX_NAME, check_name
from jobstore.node.sandboxroot import UPLOADS, ensure_private

CALLS = ("sandbox_list", "sandbox_read", "sandbox_open", "sandbox_write")
MAX_READ = 8 << 20  # bytes one sandbox_read returns at most
_uploads: str | None = None  # a hook process's own directory of outputs on their way in
_uploads_lock = threading.Lock()


def handle(request: HookRequest) -> HookResponse:
    """Serve one call; never raises (failures come back as `error`)."""
    try:
        settings, store, job = current_attempt(request)
        if request.hook == "sandbox_list":
            return _list(store, job)
        if request.hook == "sandbox_read":
            return _read(store, job, request.argv[4:])
        if request.hook == "sandbox_open":
            return _open(settings, store, job, request.argv[4:])
        if request.hook == "sandbox_write":
            return _write(settings, store, job, request.argv[4:], request.stdin)
        return HookResponse(error=f"unknown call {request.hook!r}")
    except DatabaseError as exc:
        return HookResponse(error=f"{request.hook}: {exc}", database_error=True)
    except (HookError, SandboxError, UnknownJob, config.ConfigError, ValueError,
            OSError) as exc:
        return HookResponse(error=f"{request.hook}: {exc}")
    except Exception as exc:  # a bug: one line, never a traceback
        return HookResponse(error=f"{request.hook}: internal error: {type(exc).__name__}: {exc}")


def current_attempt(request: HookRequest) -> tuple[config.Settings, JobStore, Job]:
    """The settings, store and job whose current attempt the call names (argv: keyword, job
    id, attempt, token), checked: HookError when it is not current or not the caller's."""
    if len(request.argv) < 4 or not all(a.isdigit() for a in request.argv[1:3]):
        raise HookError("needs the keyword, job id, attempt and token")
    keyword, job_id, attempt, token = request.argv[:4]
    settings = request.settings_for(config.starter_keyword(keyword))
    store = request.node.store_for(settings)
    job = store.reads.get_job(int(job_id))
    if not (job.token and hmac.compare_digest(job.token, token) and job.claims == int(attempt)
            and job.status in HANDED_OUT and job.keyword in (None, settings.keyword)):
        raise HookError(f"job {job.cluster_id}.{job.proc_id} attempt {attempt} is not the "
                        "job's current attempt")
    uid = request.caller.uid
    if uid is not None and uid != _uid_of(job.owner):
        raise HookError(f"uid {uid} is not the owner of job {job.cluster_id}.{job.proc_id}")
    return settings, store, job


def _uid_of(owner: str) -> int | None:
    try:
        return pwd.getpwnam(owner).pw_uid
    except KeyError:
        return None


def _list(store: JobStore, job: Job) -> HookResponse:
    lines = [f"{f.sha256} {f.size} {f.mode:o} {f.name}" for f in store.files.sandbox_start(job)]
    return HookResponse(stdout="\n".join(lines).encode("utf-8", "surrogateescape"))


def _read(store: JobStore, job: Job, argv: list[str]) -> HookResponse:
    if len(argv) != 3 or not argv[1].isdigit() or not argv[2].isdigit():
        raise HookError("sandbox_read needs a sha256, an offset and a length")
    sha, offset, length = argv[0], int(argv[1]), min(int(argv[2]), MAX_READ)
    if not any(f.sha256 == sha for f in store.files.sandbox_start(job)):
        raise HookError(f"{sha} is not an input of this job")
    return HookResponse(stdout=store.files.file_range(job.owner, sha, offset, length))


def _open(settings: config.Settings, store: JobStore, job: Job, argv: list[str],
          ) -> HookResponse:
    """An input of the attempt's, as an open descriptor of the node's copy (node.inputcache):
    for the agent, which hands it over its socket, never for a hook process's own call."""
    if len(argv) != 1:
        raise HookError("sandbox_open needs a sha256")
    for f in store.files.sandbox_start(job):
        if f.sha256 == argv[0]:
            fd = open_input(store, settings.sandbox_root, job.owner, f.sha256, f.size,
                            settings.input_cache_mb)
            return HookResponse(stdout=str(f.size).encode(), fd=fd)
    raise HookError(f"{argv[0]} is not an input of this job")


def _write(settings: config.Settings, store: JobStore, job: Job, argv: list[str],
           data: bytes) -> HookResponse:
    """One piece of an output (or of a checkpoint: a fifth argument `ckpt`), at its offset;
    the last one (`final` 1) stores it."""
    if len(argv) not in (4, 5) or not all(a.isdigit() for a in argv[1:4]) or (
            len(argv) == 5 and argv[4] != CHECKPOINT):
        raise HookError("sandbox_write needs a name, a mode, an offset, final 0 or 1, and "
                        "`ckpt` for a checkpoint")
    name, mode, offset, final = argv[0], int(argv[1], 8), int(argv[2]), argv[3] == "1"
    direction = CHECKPOINT if len(argv) == 5 else OUT
    if len(name) > MAX_NAME:
        raise HookError("output name too long")
    check_name(name)
    largest = settings.max_output_mb
    if offset + len(data) > largest << 20:
        raise HookError(f"{name}: larger than the {largest} MB an output may be "
                        "(JOBSTORE_MAX_OUTPUT_FILE_MB)")
    uploads = _upload_dir(settings.sandbox_root)
    most = (settings.max_job_output_mb << 20) or job.request_disk * 1024
    prefix = f"{job.id}.{job.claims}."
    path = uploads / f"{prefix}{direction}.{_safe(name)}"
    held = sum(entry.stat(follow_symlinks=False).st_size for entry in os.scandir(uploads)
               if entry.name.startswith(prefix) and entry.path != str(path))
    held += store.files.sent_bytes(job)
    if held + offset + len(data) > most:  # the database refuses more when they are stored
        raise HookError(f"{name}: the job's outputs would be more than the {most >> 10} KiB "
                        "it may send back (its RequestDisk, or JOBSTORE_MAX_OUTPUT_MB)")
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_TRUNC if offset == 0 else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if os.fstat(fd).st_size != offset:
            raise HookError(f"{name}: piece at {offset} does not follow the ones received")
        os.lseek(fd, offset, os.SEEK_SET)
        os.write(fd, data)
    finally:
        os.close(fd)
    if not final:
        return HookResponse()
    try:
        with store.db.engine.begin() as conn:
            store.files.store_files(conn, cluster_id=job.cluster_id, proc_id=job.proc_id,
                               owner=job.owner, direction=direction, attempt=job.claims,
                               sources=[FileSource(name, str(path), mode & 0o755)])
    finally:
        path.unlink(missing_ok=True)
    return HookResponse(log=[f"job {job.cluster_id}.{job.proc_id}: {direction} {name} stored"])


def _upload_dir(root: str) -> Path:
    """Where outputs wait until their last piece: the agent's own directory under the sandbox
    root (swept of what a stopped sending left, node.sandboxroot.sweep), or, in a hook process
    that does not own the root (direct mode, as the job's user), a directory of its own."""
    global _uploads
    try:
        if os.stat(root).st_uid == os.geteuid():
            return ensure_private(root, UPLOADS)
    except FileNotFoundError:
        pass
    with _uploads_lock:
        if _uploads is None:
            _uploads = tempfile.mkdtemp(prefix="jobstore-outputs-")
        return Path(_uploads)


def _safe(name: str) -> str:
    return name.replace("/", "%2F")
