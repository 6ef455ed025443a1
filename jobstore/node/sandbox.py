"""A fetched job's sandbox on the execute node, made and emptied by the hooks that
run as the job's user: PREPARE_JOB makes the job's Iwd under the sandbox root and fills it with
the inputs stored at submit (checked against their hashes and the job's RequestDisk); JOB_EXIT
sends the outputs back into the store and removes the sandbox.

Standard library only (it runs in the hook process, before the call reaches the agent). The
bytes come from a `transport`: the agent's (jobstore.agent.client) or the database itself in
direct mode (jobstore.node.sandboxdirect). Nothing here follows a symbolic link: the sandbox is
made fresh (mkdir, mode 0700), files are created with O_EXCL | O_NOFOLLOW and outputs are read
with O_NOFOLLOW, so neither another account nor the job itself can point a hook at a file
outside the sandbox.
"""

from __future__ import annotations

import errno
import os
import stat

from jobstore.errors import HandOff, SandboxError
from jobstore.node.launchcheck import ATTR_CODE, ATTR_ERROR, ATTR_SUBCODE, string_attrs

ATTR_OUTPUT_ERROR = b"JobstoreOutputError"
ATTR_OUTPUT_ERROR_CODE = b"JobstoreOutputErrorCode"  # its HoldReasonCode, when not 12
ATTR_CHECKPOINTED = b"JobstoreCheckpointed"  # true: the job exited to checkpoint, go on later
ATTR_HAND_OFF = b"JobstoreHandOff"  # true: outputs not all sent in JOB_EXIT's time, the agent
TRANSFER_INPUT_ERROR = 13  # HTCondor's HoldReasonCode for an input that cannot be had
MAX_INPUT_EXCEEDED = 32  # ... for inputs over the job's MaxTransferInputMB
MAX_OUTPUT_EXCEEDED = 33  # ... for outputs over its MaxTransferOutputMB
MIB = 1 << 20
CHUNK = 1 << 20  # bytes per read or write through a transport
# bytes of an output per call: four such calls, with their names, fit in what the agent takes
# in flight from one account (JOBSTORE_AGENT_MAX_BYTES_PER_UID's default, 8 MiB)
SEND_PIECE = 2 * CHUNK - 16 * 1024
OUTPUT_SECONDS = 15.0  # JOB_EXIT's sending, at most (JOBSTORE_OUTPUT_SECONDS changes it)
URL_SECONDS = 30.0  # a URL input's wait for its next bytes (JOBSTORE_URL_TIMEOUT changes it)
MAX_NAME = 4096
TYPE_CHECKING = False  # not `typing`'s: the hot path does not import typing
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

Manifest = list  # of (name, sha256, size, mode)


class Files:
    """A sandbox's files in the store, through `call` (a transport: the agent's socket, or
    jobstore.node.sandboxcalls in this process): the inputs' list and bytes, and the outputs
    sent back a piece at a time."""

    def __init__(self, ad: bytes) -> None:
        job_id, attempt, token, _iwd = attempt_of(ad) or ("", "", "", "")
        keyword = string_attrs(ad, (b"hookkeyword",)).get(b"hookkeyword", "")
        self.who = [keyword, job_id, attempt, token]  # the attempt every call names

    def call(self, name: str, argv: list[str], data: bytes = b"") -> bytes:
        raise NotImplementedError

    def manifest(self) -> Manifest:
        out = []
        for line in self.call("sandbox_list", []).decode("utf-8", "surrogateescape").split("\n"):
            if line:
                sha, size, mode, name = line.split(" ", 3)
                out.append((name, sha, int(size), int(mode, 8)))
        return out

    def read(self, sha: str, offset: int, length: int) -> bytes:
        return self.call("sandbox_read", [sha, str(offset), str(length)])

    def open_input(self, sha: str) -> int | None:
        """An open descriptor of the node's checked copy of input `sha` (the agent's input
        cache), or None where there is none: the bytes are then read."""
        return None

    def send(self, name: str, fd: int, mode: int) -> None:
        """An output, a piece at a time."""
        self._send(name, fd, mode, [])

    def send_checkpoint(self, name: str, fd: int, mode: int) -> None:
        """A file of a checkpoint, which the job's next attempt starts from."""
        self._send(name, fd, mode, ["ckpt"])

    def _send(self, name: str, fd: int, mode: int, kind: list[str]) -> None:
        offset, pending = 0, b""
        for data in read_chunks(fd, SEND_PIECE):
            if pending:
                self.call("sandbox_write", [name, f"{mode:o}", str(offset), "0", *kind], pending)
                offset += len(pending)
            pending = data
        self.call("sandbox_write", [name, f"{mode:o}", str(offset), "1", *kind], pending)


def transfer(hook: str, ad: bytes, argv: list[str], files: Files) -> bytes:
    """A sandbox's part of PREPARE_JOB (fill it) or JOB_EXIT, as condor_submit's commands say:
    an exit sends the outputs, or with its checkpoint_exit_code the checkpoint (the job is
    requeued to go on from it: JobstoreCheckpointed); an eviction with ON_EXIT_OR_EVICT sends
    the outputs as a checkpoint too; nothing comes back otherwise. The sandbox is removed after
    each attempt (kept when its outputs could not be sent). Returns the ad the handler reads:
    with JobstoreHandOff when the transport's time ran out (HandOff), the sandbox left as it
    is for the agent, which sends the rest and then reports the exit."""
    if hook == "prepare_job":
        return stage_in(ad, files.manifest, files.read, files.open_input)
    found = attempt_of(ad)
    if found is None:
        return ad
    try:
        return _send_back(ad, found[3], argv, files)
    except HandOff:
        return ad.rstrip(b"\n") + b"\n" + ATTR_HAND_OFF + b" = true\n"


def _send_back(ad: bytes, iwd: str, argv: list[str], files: Files) -> bytes:
    plain = _plain_attrs(ad, (b"checkpointexitcode", b"exitcode"))
    when = string_attrs(ad, (b"whentotransferoutput",)).get(b"whentotransferoutput", "")
    if argv == ["exit"]:
        code = plain.get(b"checkpointexitcode")
        if code is None or code != plain.get(b"exitcode"):
            url = string_attrs(ad, (b"outputdestination",)).get(b"outputdestination")
            send = _Destination(ad, url).send if url else files.send
            return stage_out(ad, files.manifest, send)
        sent = stage_out(ad, files.manifest, files.send_checkpoint, listed=b"transfercheckpoint")
        return sent if ATTR_OUTPUT_ERROR in sent else sent + ATTR_CHECKPOINTED + b" = true\n"
    if argv == ["evict"] and when.upper() == "ON_EXIT_OR_EVICT":
        stage_out(ad, files.manifest, files.send_checkpoint, must_exist=False)
    remove_sandbox(iwd)
    return ad


def failed(hook: str, ad: bytes, why: str) -> bytes:
    """The ad of a PREPARE_JOB (hold, code 13) or JOB_EXIT (hold, code 12) whose transfer
    failed before it could say how."""
    if hook == "prepare_job":
        return _annotate(ad, ATTR_ERROR, f"Failed to transfer the job's input files: {why}",
                         (TRANSFER_INPUT_ERROR, 0))
    return _annotate(ad, ATTR_OUTPUT_ERROR, f"Failed to transfer the job's output files: {why}")


def attempt_of(ad: bytes) -> tuple[str, str, str, str] | None:
    """(job id, attempt, token, Iwd) of a job ad whose job runs in a sandbox, else None."""
    values = _plain_attrs(ad, (b"jobstorejobid", b"jobstoreattempt", b"jobstoresandbox"))
    if values.get(b"jobstoresandbox") != b"true":
        return None
    texts = string_attrs(ad, (b"jobstoretoken", b"iwd"))
    job_id, attempt = values.get(b"jobstorejobid"), values.get(b"jobstoreattempt")
    token, iwd = texts.get(b"jobstoretoken"), texts.get(b"iwd")
    if not (job_id and attempt and token and iwd and job_id.isdigit() and attempt.isdigit()):
        return None
    return job_id.decode(), attempt.decode(), token, iwd


def stage_in(ad: bytes, manifest: Callable[[], Manifest],
             read: Callable[[str, int, int], bytes],
             open_input: Callable[[str], int | None] | None = None) -> bytes:
    """PREPARE_JOB's part for a job with file transfer: make its Iwd and put its inputs there
    (copied from the node's checked copy when `open_input` gives one, else read and checked
    against their hashes). Returns the ad, with a launch error (HoldReasonCode 13, the handler
    holds the job) when the sandbox cannot be made or filled; unchanged for a job without a
    sandbox."""
    found = attempt_of(ad)
    if found is None:
        return ad
    iwd = found[3]
    try:
        files = manifest()
        limit = transfer_limit(ad, b"maxtransferinputmb")
        total = sum(size for _name, _sha, size, _mode in files)
        if limit is not None and total > limit:
            return _annotate(ad, ATTR_ERROR, "Failed to transfer the job's input files: they "
                             f"are {total / MIB:.1f} MiB, more than its max_transfer_input_mb "
                             f"of {limit // MIB} MiB", (MAX_INPUT_EXCEEDED, 0))
        room = _check_disk(ad, files)
        _make_sandbox(iwd)
        try:
            for name, sha, size, mode in files:
                _fetch(iwd, name, sha, size, mode, read, open_input)
            urls = string_attrs(ad, (b"jobstoreinputurls",)).get(b"jobstoreinputurls", "")
            for url in urls.split():
                room -= _download(iwd, url, room)
        except BaseException:
            remove_sandbox(iwd)
            raise
    except (SandboxError, OSError) as exc:
        why = f"Failed to transfer the job's input files into {iwd}: {_reason(exc)}"
        return _annotate(ad, ATTR_ERROR, why, (TRANSFER_INPUT_ERROR, exc.errno or 0))
    return ad


def stage_out(ad: bytes, manifest: Callable[[], Manifest],
              send: Callable[[str, int, int], None], *, listed: bytes = b"transferoutput",
              must_exist: bool = True) -> bytes:
    """JOB_EXIT's part after the job exited: send its outputs back (`send(name, fd, mode)`)
    and remove the sandbox. Returns the ad, with JobstoreOutputError (the handler holds the
    job with HoldReasonCode 12) when an output cannot be sent; the sandbox is then kept.
    `listed`: the attribute that lists them (falls back to TransferOutput)."""
    found = attempt_of(ad)
    if found is None:
        return ad
    iwd = found[3]
    limit = transfer_limit(ad, b"maxtransferoutputmb") if listed == b"transferoutput" else None
    total = 0
    try:
        inputs = {name: sha for name, sha, _size, _mode in manifest()}
        for name in outputs(ad, iwd, inputs, listed):
            if not must_exist and not os.path.lexists(os.path.join(iwd, name)):
                continue
            fd = _open_in(iwd, name)
            try:
                st = os.fstat(fd)
                total += st.st_size
                if limit is not None and total > limit:
                    why = (f"Failed to transfer the job's output files: they are more than its "
                           f"max_transfer_output_mb of {limit // MIB} MiB (at {name})")
                    return _annotate(ad, ATTR_OUTPUT_ERROR, why) + (
                        ATTR_OUTPUT_ERROR_CODE + b" = %d\n" % MAX_OUTPUT_EXCEEDED)
                send(name, fd, stat.S_IMODE(st.st_mode))
            finally:
                os.close(fd)
    except (SandboxError, OSError) as exc:
        why = f"Failed to transfer the job's output files from {iwd}: {_reason(exc)}"
        return _annotate(ad, ATTR_OUTPUT_ERROR, why)
    remove_sandbox(iwd)
    return ad


def outputs(ad: bytes, iwd: str, inputs: dict[str, str],
            attr: bytes = b"transferoutput") -> list[str]:
    """The outputs of a job, as condor_submit's transfer_output_files (or `attr`:
    TransferCheckpoint) says (every one must exist), else every regular file at the sandbox's
    top that is new or changed (not an input as it came in); its standard output and error
    files always."""
    texts = string_attrs(ad, (b"transferoutput", attr, b"out", b"err"))
    listed = texts.get(attr, texts.get(b"transferoutput"))
    names: list[str] = []
    if listed is not None:
        for name in (n.strip().rstrip("/") for n in listed.split(",")):
            if name:
                check_name(name)
                names.extend(_files_under(iwd, name))
    else:
        with os.scandir(iwd) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if not entry.is_file(follow_symlinks=False):
                    continue
                sha = inputs.get(entry.name)
                if sha is None or _sha256_of(os.path.join(iwd, entry.name)) != sha:
                    names.append(entry.name)
    for attr in (b"out", b"err"):
        std = texts.get(attr)
        if (std and "/" not in std and std not in names
                and os.path.lexists(os.path.join(iwd, std))):
            names.append(std)
    return names


def _files_under(iwd: str, name: str) -> list[str]:
    """`name` itself, or when it is a directory (not a link to one) the regular files in it, at
    any depth, as paths in the sandbox: HTCondor sends a directory output whole."""
    top = os.path.join(iwd, name)
    try:
        if not stat.S_ISDIR(os.lstat(top).st_mode):
            return [name]
    except OSError:
        return [name]  # sending it says what is wrong
    found = []
    for here, dirs, files in os.walk(top):
        dirs.sort()
        rel = os.path.relpath(here, iwd)
        for f in sorted(files):
            if os.path.isfile(os.path.join(here, f)) and not os.path.islink(
                    os.path.join(here, f)):
                check_name(f"{rel}/{f}")
                found.append(f"{rel}/{f}")
    return found


def remove_sandbox(iwd: str) -> None:
    """Remove a sandbox and everything in it (never through a symbolic link)."""
    import shutil  # only when there is one

    shutil.rmtree(iwd, ignore_errors=True)


def check_root(root: str) -> None:
    """A sandbox root the hooks may use: a real directory of root's (or of this account's),
    which the others cannot rename things in (sticky when they may write to it)."""
    try:
        st = os.lstat(root)
    except OSError as exc:
        raise SandboxError(f"the sandbox root {root} is not there: {exc.strerror}",
                           exc.errno or 0) from None
    if not stat.S_ISDIR(st.st_mode):
        raise SandboxError(f"the sandbox root {root} is not a directory", errno.ENOTDIR)
    if st.st_uid not in (0, os.geteuid()):
        raise SandboxError(f"the sandbox root {root} belongs to uid {st.st_uid}, not root",
                           errno.EPERM)
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise SandboxError(f"the sandbox root {root} may be written by others and is not "
                           "sticky", errno.EPERM)


def _make_sandbox(iwd: str) -> None:
    check_root(os.path.dirname(iwd))
    try:
        os.mkdir(iwd, 0o700)
    except FileExistsError:
        raise SandboxError(f"{iwd} exists already: not made by this attempt",
                           errno.EEXIST) from None


def _check_disk(ad: bytes, files: Manifest) -> int:
    """The room RequestDisk leaves after the stored inputs (bytes); SandboxError when they do
    not fit."""
    need = sum(size for _name, _sha, size, _mode in files)
    disk = _plain_attrs(ad, (b"requestdisk",)).get(b"requestdisk")
    room = int(disk) * 1024 if disk and disk.isdigit() else 1 << 62
    if need > room:
        raise SandboxError(f"its inputs take {need // 1024} KiB, more than its RequestDisk of "
                           f"{room // 1024} KiB", errno.ENOSPC)
    return room - need


def transfer_limit(ad: bytes, name: bytes) -> int | None:
    """The job's max_transfer_input_mb or max_transfer_output_mb (`name`) in bytes; None for
    none (absent, -1 or not an integer)."""
    value = _plain_attrs(ad, (name,)).get(name)
    if value is None or not value.isdigit() or len(value) > 12:
        return None
    return int(value) * MIB


def output_seconds(default: float = OUTPUT_SECONDS) -> float:
    """Seconds JOB_EXIT may spend sending outputs (JOBSTORE_OUTPUT_SECONDS in the hook's
    environment): inside the starter's 30 s for the hook, with time left for its report."""
    try:
        return max(0.0, float(os.environ.get("JOBSTORE_OUTPUT_SECONDS") or default))
    except ValueError:
        return default


class _Destination:
    """output_destination: the outputs sent to a URL by this process, as the job's user
    (file:// writes the file, http(s):// PUTs it, as HTCondor's curl plugin uploads), each
    under its transfer_output_remaps name or its last component; all within output_seconds()."""

    def __init__(self, ad: bytes, url: str) -> None:
        import time

        from jobstore.formats import remaps

        texts = string_attrs(ad, (b"transferoutputremaps", b"transferoutput"))
        self.url = url.rstrip("/")
        self.remaps = remaps.parse(texts.get(b"transferoutputremaps", ""))
        self.listed = tuple(n.strip() for n in texts.get(b"transferoutput", "").split(",")
                            if n.strip())
        self.stop_at = time.monotonic() + output_seconds()

    def send(self, name: str, fd: int, mode: int) -> None:
        import time
        from urllib.parse import quote, unquote, urlsplit

        from jobstore.formats import remaps

        target = remaps.landing(name, self.remaps, self.listed)
        url = f"{self.url}/{quote(target)}"
        left = self.stop_at - time.monotonic()
        if left <= 0:
            raise SandboxError(f"{name}: not sent to {self.url} within {output_seconds():g} s",
                               errno.ETIMEDOUT)
        if url.startswith("file:"):
            _write_to(unquote(urlsplit(url).path), fd, mode)
        else:
            _put(url, fd, min(left, url_timeout()))


def _write_to(path: str, fd: int, mode: int) -> None:
    """Copy the open file `fd` to `path` (replaced, never through a link at its end)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode | 0o600)
    try:
        _copy(fd, out, os.fstat(fd).st_size, path)
    finally:
        os.close(out)


def _put(url: str, fd: int, timeout: float) -> None:
    """PUT the open file `fd` to `url` with Python's own HTTP client."""
    import urllib.error
    import urllib.request

    with os.fdopen(os.dup(fd), "rb") as body:
        request = urllib.request.Request(url, data=body, method="PUT", headers={
            "Content-Length": str(os.fstat(fd).st_size),
            "Content-Type": "application/octet-stream"})
        try:
            with urllib.request.urlopen(request, timeout=timeout):  # noqa: S310 - checked
                pass
        except urllib.error.HTTPError as exc:
            raise SandboxError(f"{url}: HTTP {exc.code} {exc.reason}", errno.EIO) from None
        except urllib.error.URLError as exc:
            raise SandboxError(f"{url}: {exc.reason}", errno.EIO) from None
        except TimeoutError:
            raise SandboxError(f"{url}: no answer within {timeout:g} s",
                               errno.ETIMEDOUT) from None


def url_timeout() -> float:
    """Seconds a URL input may keep PREPARE_JOB waiting for its next bytes
    (JOBSTORE_URL_TIMEOUT in the hook's environment, default URL_SECONDS)."""
    text = os.environ.get("JOBSTORE_URL_TIMEOUT", "")
    try:
        return max(0.1, float(text)) if text else URL_SECONDS
    except ValueError:
        return URL_SECONDS


def _download(iwd: str, url: str, room: int) -> int:
    """Fetch a URL input (http, https, file) into the sandbox under its last path component,
    with Python's own HTTP client, each wait bounded by url_timeout() and the whole by ten of
    them; its size, which must fit in `room`."""
    import time
    import urllib.error
    import urllib.request
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "file"):
        raise SandboxError(f"{url}: the {parts.scheme}:// scheme is not supported",
                           errno.EPROTONOSUPPORT)
    name = os.path.basename(parts.path)
    check_name(name)
    limit = url_timeout()
    deadline = time.monotonic() + 10 * limit
    fd = os.open(os.path.join(iwd, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                 0o600)
    got = 0
    try:
        with urllib.request.urlopen(url, timeout=limit) as response:  # noqa: S310 - listed
            while data := response.read(CHUNK):
                got += len(data)
                if got > room:
                    raise SandboxError(f"{url}: more than its RequestDisk leaves room for",
                                       errno.ENOSPC)
                if time.monotonic() > deadline:
                    raise SandboxError(f"{url}: not fetched within {10 * limit:g} s",
                                       errno.ETIMEDOUT)
                write_fully(fd, data)
    except urllib.error.HTTPError as exc:
        raise SandboxError(f"{url}: HTTP {exc.code} {exc.reason}", errno.EIO) from None
    except urllib.error.URLError as exc:
        raise SandboxError(f"{url}: {exc.reason}", errno.EIO) from None
    except TimeoutError:
        raise SandboxError(f"{url}: no answer within {limit:g} s", errno.ETIMEDOUT) from None
    finally:
        os.close(fd)
    return got


def _fetch(iwd: str, name: str, sha: str, size: int, mode: int,
           read: Callable[[str, int, int], bytes],
           open_input: Callable[[str], int | None] | None = None) -> None:
    """Write one input into the sandbox: a kernel copy of the node's copy (checked when it was
    made) when there is one, else its bytes read and checked against its hash."""
    import hashlib  # not for jobs without a sandbox

    check_name(name)
    parent = iwd
    for part in name.split("/")[:-1]:
        parent = os.path.join(parent, part)
        if not os.path.isdir(parent):
            os.mkdir(parent, 0o700)
    path = os.path.join(iwd, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        source = open_input(sha) if open_input is not None and size else None
    except SandboxError:
        source = None  # no node copy (an older agent, a full disk): read it instead
    if source is not None:
        try:
            _copy(source, fd, size, name)
            os.fchmod(fd, mode & 0o755 | 0o600)
        finally:
            os.close(source)
            os.close(fd)
        return
    digest, offset = hashlib.sha256(), 0
    try:
        while offset < size:
            data = read(sha, offset, min(CHUNK * 8, size - offset))
            if not data:
                raise SandboxError(f"{name}: the store gave {offset} of its {size} bytes",
                                   errno.EIO)
            digest.update(data)
            write_fully(fd, data)
            offset += len(data)
        os.fchmod(fd, mode & 0o755 | 0o600)
    finally:
        os.close(fd)
    if digest.hexdigest() != sha:
        raise SandboxError(f"{name}: its content is not what was stored (sha256 mismatch)",
                           errno.EIO)


def _copy(source: int, fd: int, size: int, name: str) -> None:
    """Copy `size` bytes from the start of `source` to `fd`, in the kernel; SandboxError when
    `source` turns out shorter."""
    offset = 0
    while offset < size:
        try:
            done = os.copy_file_range(source, fd, size - offset, offset, offset)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            done = os.sendfile(fd, source, offset, size - offset)
        if not done:
            raise SandboxError(f"{name}: only {offset} of its {size} bytes could be copied",
                               errno.EIO)
        offset += done


def _open_in(iwd: str, name: str) -> int:
    """An output of the sandbox, opened for reading without following a link."""
    check_name(name)
    dirfd = os.open(iwd, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in name.split("/")[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dirfd)
            os.close(dirfd)
            dirfd = nxt
        try:
            fd = os.open(name.split("/")[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK,
                         dir_fd=dirfd)
        except FileNotFoundError:
            raise SandboxError(f"{name}: no such output file", errno.ENOENT) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SandboxError(f"{name}: a symbolic link is not sent back",
                                   errno.ELOOP) from None
            raise
    finally:
        os.close(dirfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SandboxError(f"{name}: not a regular file", errno.EINVAL)
    return fd


def read_chunks(fd: int, size: int = CHUNK) -> Iterator[bytes]:
    """An open file's bytes, `size` bytes at a time."""
    while data := os.read(fd, size):
        yield data


def check_name(name: str) -> None:
    parts = name.split("/")
    if (not name or len(name) > MAX_NAME or name.startswith("/") or ".." in parts
            or "" in parts or "." in parts or any(ord(c) < 32 for c in name)):
        raise SandboxError(f"{name!r} is not a path inside the sandbox", errno.EINVAL)


def _sha256_of(path: str) -> str | None:
    import hashlib

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        digest = hashlib.sha256()
        for data in read_chunks(fd):
            digest.update(data)
        return digest.hexdigest()
    finally:
        os.close(fd)


def write_fully(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd` (OSError as the system says)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _plain_attrs(ad: bytes, wanted: tuple[bytes, ...]) -> dict[bytes, bytes]:
    """The literal values (lower-cased) of `wanted` attributes in an old-syntax ClassAd."""
    found: dict[bytes, bytes] = {}
    for line in ad.split(b"\n"):
        name, sep, value = line.partition(b" = ")
        key = name.strip().lower()
        if sep and key in wanted:
            found[key] = value.strip().lower()
    return found


def _annotate(ad: bytes, name: bytes, text: str, code: tuple[int, int] | None = None) -> bytes:
    """The ad with the string attribute `name` = `text` (and a launch error's code and
    subcode)."""
    quoted = text.encode("utf-8", "surrogateescape").replace(b"\\", b"\\\\").replace(
        b'"', b'\\"').replace(b"\n", b" ")
    lines = [name + b' = "' + quoted + b'"']
    if code is not None:
        lines += [ATTR_CODE + b" = %d" % code[0], ATTR_SUBCODE + b" = %d" % code[1]]
    return ad.rstrip(b"\n") + b"\n" + b"\n".join(lines) + b"\n"


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
