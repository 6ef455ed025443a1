"""The boundaries of a job's sandbox: the root the hooks accept, a sandbox
that exists already, outputs that would leave the sandbox, the calls the agent serves only to
the attempt's owner, and root's retrieval with the owner's rights."""

from __future__ import annotations

import hashlib
import os
import pwd
from pathlib import Path

import pytest

from jobstore.db.store import JobStore
from jobstore.node import sandbox, sandboxcalls
from jobstore.node.hookcall import HookRequest
from jobstore.node.reports import Caller
from jobstore.node.services import direct
from jobstore.testing.factories import claim, claim_request
from jobstore.testing.support import ensure_account

REQ = claim_request(shape="s")


def _ad(iwd: Path, extra: str = "") -> bytes:
    return (f'JobstoreJobId = 7\nJobstoreAttempt = 1\nJobstoreToken = "t0k"\n'
            f'JobstoreSandbox = true\nIwd = "{iwd}"\nRequestDisk = 1024\n{extra}').encode()


def _no_files() -> list[tuple[str, str, int, int]]:
    return []


def _never(*_args: object) -> bytes:
    raise AssertionError("nothing to read")


def test_the_root_must_be_roots_or_ours_and_sticky_when_shared(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(sandbox.SandboxError, match="not sticky"):
        sandbox.check_root(str(shared))
    shared.chmod(0o1777)
    sandbox.check_root(str(shared))
    link = tmp_path / "link"
    link.symlink_to(shared)
    with pytest.raises(sandbox.SandboxError, match="not a directory"):
        sandbox.check_root(str(link))
    if os.geteuid() == 0:
        other = ensure_account("jsbob", home=False)
        os.chown(shared, other.pw_uid, other.pw_gid)
        with pytest.raises(sandbox.SandboxError, match=f"belongs to uid {other.pw_uid}"):
            sandbox.check_root(str(shared))


def test_a_sandbox_made_by_someone_else_is_refused(tmp_path: Path) -> None:
    (tmp_path / "job").mkdir()  # there before PREPARE_JOB: not this attempt's
    out = sandbox.stage_in(_ad(tmp_path / "job"), _no_files, _never)
    assert b"JobstoreLaunchErrorCode = 13" in out and b"exists already" in out
    # too big for RequestDisk: refused before anything is written
    big = [("big.bin", "0" * 64, 2 << 20, 0o644)]
    out = sandbox.stage_in(_ad(tmp_path / "new"), lambda: big, _never)
    assert b"more than its RequestDisk" in out and not (tmp_path / "new").exists()
    # a job without a sandbox is left alone
    plain = b'JobstoreJobId = 7\nIwd = "/tmp"\n'
    assert sandbox.stage_in(plain, _never, _never) == plain  # type: ignore[arg-type]


def test_outputs_never_leave_the_sandbox(tmp_path: Path) -> None:
    iwd = tmp_path / "job"
    iwd.mkdir()
    (iwd / "ok.txt").write_text("fine")
    secret = tmp_path / "secret.txt"
    secret.write_text("not the job's")
    (iwd / "link.txt").symlink_to(secret)
    (iwd / "d").symlink_to(tmp_path)  # a directory link: sub paths through it are refused
    sent: list[str] = []

    def send(name: str, fd: int, mode: int) -> None:
        sent.append(name)

    for listed, why in (("link.txt", "a symbolic link is not sent back"),
                        ("d/secret.txt", "Not a directory"),  # O_NOFOLLOW on its link
                        ("../secret.txt", "is not a path inside the sandbox")):
        out = sandbox.stage_out(_ad(iwd, f'TransferOutput = "{listed}"\n'), _no_files, send)
        assert b"JobstoreOutputError" in out and why.encode() in out, (listed, out)
        assert iwd.exists()  # kept for a look
    assert sent == []
    # unset transfer_output_files: regular files only, links left out
    out = sandbox.stage_out(_ad(iwd), _no_files, send)
    assert sent == ["ok.txt"] and b"JobstoreOutputError" not in out and not iwd.exists()


def test_the_agent_serves_an_attempts_files_to_its_owner_only(store: JobStore,
                                                               tmp_path: Path) -> None:
    me = pwd.getpwuid(os.geteuid()).pw_name
    (tmp_path / "in.txt").write_text("input")
    from jobstore.submit.description import parse_submit_text

    specs = parse_submit_text("executable = /bin/cat\ntransfer_executable = false\n"
                              "transfer_input_files = in.txt\nqueue\n", base_dir=tmp_path)
    store.submissions.submit(specs, owner=me, queue="default", max_attempts=3)
    job = claim(store, REQ)
    assert job is not None and job.token
    url = store.db.engine.url.render_as_string(False)
    os.environ["JOBSTORE_DATABASE_URL"] = url
    try:
        def call(hook: str, *argv: str, token: str = job.token or "", uid: int | None = None,
                 data: bytes = b"") -> tuple[bytes, str | None]:
            r = sandboxcalls.handle(HookRequest(
                hook=hook, argv=["JOBSTORE", str(job.id), str(job.claims), token, *argv],
                stdin=data, caller=Caller(uid), node=direct()))
            return r.stdout, r.error

        listing, error = call("sandbox_list", uid=os.geteuid())
        sha = hashlib.sha256(b"input").hexdigest()
        assert error is None and listing.decode() == f"{sha} 5 644 in.txt"
        assert call("sandbox_read", sha, "1", "3") == (b"npu", None)
        assert "not the job's current attempt" in (call("sandbox_list", token="guess")[1] or "")
        assert "is not the owner" in (call("sandbox_list", uid=os.geteuid() + 4242)[1] or "")
        assert "is not an input of this job" in (call("sandbox_read", "0" * 64, "0", "9")[1]
                                                 or "")
        assert "not a path inside the sandbox" in (call("sandbox_write", "../x", "644", "0",
                                                        "1", data=b"x")[1] or "")
        assert call("sandbox_write", "o.txt", "644", "0", "0", data=b"ab")[1] is None
        assert "does not follow" in (call("sandbox_write", "o.txt", "644", "5", "1",
                                          data=b"x")[1] or "")
        assert call("sandbox_write", "o.txt", "644", "2", "1", data=b"c")[1] is None
        (out,) = store.files.job_files_of(job, "out")
        assert (out.name, b"".join(store.files.file_content(out.owner, out.sha256))) == (
            "o.txt", b"abc")
    finally:
        os.environ.pop("JOBSTORE_DATABASE_URL", None)


@pytest.mark.skipif(os.geteuid() != 0, reason="root's retrieval is root's")
def test_root_retrieves_with_the_owners_rights() -> None:
    """The owner points her output's directory at a place only root may write: root's
    transfer-data fails there (it writes as her), and writes nothing."""
    import shutil
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="jobstore-retrieve-"))  # pytest's is 0700
    try:
        _retrieve_as_owner(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="root's retrieval is root's")
def test_the_owner_cannot_stop_roots_writer_and_a_stalled_one_is_killed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The child that writes as her keeps root's real uid: she may not signal it (a stopped
    writer would hold root's service). One that takes no bytes for IDLE seconds is killed,
    and the file is left as it was (the piece it had begun stays, under a name of its own)."""
    import shutil
    import signal
    import subprocess
    import tempfile

    from jobstore.api import ownerwrite

    owner = ensure_account("jsalice", home=False)
    tmp_path = Path(tempfile.mkdtemp(prefix="jobstore-writer-"))
    os.chmod(tmp_path, 0o755)
    os.chown(tmp_path, owner.pw_uid, owner.pw_gid)
    children: list[int] = []

    def mine() -> set[int]:
        found = set()
        for p in os.listdir("/proc"):
            try:
                if p.isdigit() and Path(f"/proc/{p}/stat").read_text().rsplit(
                        ")", 1)[1].split()[1] == str(os.getpid()):
                    found.add(int(p))
            except OSError:
                pass  # gone meanwhile
        return found

    before = mine()

    def content(stop: bool) -> list[bytes]:
        (child,) = mine() - before  # the writer this call forked
        children.append(child)
        tried = subprocess.run(["setpriv", f"--reuid={owner.pw_uid}", f"--regid={owner.pw_gid}",
                                "--clear-groups", "kill", "-STOP", str(child)],
                               capture_output=True, text=True)
        assert tried.returncode != 0 and "not permitted" in tried.stderr, tried
        if stop:  # as root: it stalls
            os.kill(child, signal.SIGSTOP)
        return [b"x" * (1 << 20)] * 4

    try:
        ownerwrite.write_as("jsalice", [ownerwrite.Wanted(
            str(tmp_path / "a"), 0o644, 4 << 20, lambda: content(False))])
        assert (tmp_path / "a").stat().st_size == 4 << 20
        monkeypatch.setattr(ownerwrite, "IDLE", 1.0)
        with pytest.raises(OSError, match="took no bytes for 1 s"):
            ownerwrite.write_as("jsalice", [ownerwrite.Wanted(
                str(tmp_path / "a"), 0o644, 4 << 20, lambda: content(True))])
        assert not Path(f"/proc/{children[-1]}").exists()  # killed, and reaped
        assert (tmp_path / "a").stat().st_size == 4 << 20  # as it was
        # what the killed writer had begun stays a piece of its own, never the file
        assert {p.name[:10] for p in tmp_path.iterdir() if p.name != "a"} <= {".jobstore-"}
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _retrieve_as_owner(tmp_path: Path) -> None:
    from jobstore.api.ownerwrite import Wanted, write_as

    owner = ensure_account("jsalice", home=False)
    guarded = tmp_path / "guarded"
    guarded.mkdir(mode=0o700)
    mine = tmp_path / "mine"
    mine.mkdir()
    os.chown(mine, owner.pw_uid, owner.pw_gid)
    os.chmod(tmp_path, 0o755)
    (mine / "logs").symlink_to(guarded)

    def wanted(path: Path, data: bytes, size: int | None = None) -> Wanted:
        return Wanted(str(path), 0o644, len(data) if size is None else size, lambda: [data])

    with pytest.raises(OSError, match="not written as jsalice"):
        write_as("jsalice", [wanted(mine / "logs" / "job.err", b"x")])
    assert list(guarded.iterdir()) == []
    write_as("jsalice", [wanted(mine / "job.out", b"ok"), wanted(mine / "sub" / "b", b"b")])
    assert (mine / "job.out").stat().st_uid == owner.pw_uid
    assert (mine / "sub" / "b").read_bytes() == b"b"  # several files, one writer
    # a writer stopped midway leaves the file as it was, and no piece of it
    with pytest.raises(OSError, match="1 of its 2 bytes came"):
        write_as("jsalice", [wanted(mine / "job.out", b"n", size=2)])
    assert (mine / "job.out").read_bytes() == b"ok"
    assert sorted(p.name for p in mine.iterdir()) == ["job.out", "logs", "sub"]


def test_the_sweep_removes_what_a_crash_left(tmp_path: Path) -> None:
    """Sandboxes of attempts that are not their job's current one, once old enough; never the
    current attempt's, a young one, a link, or a name that is not a sandbox's; and outputs'
    pieces whose sending stopped, once as old."""
    from jobstore.node.sandboxroot import UPLOADS, ensure_private, ensure_root, sweep

    root = tmp_path / "sandboxes"
    ensure_root(str(root))
    names = {"old": "3.0.1-" + "a" * 16, "current": "3.0.2-" + "b" * 16,
             "young": "4.0.1-" + "c" * 16, "other": "not-a-sandbox"}
    for name in names.values():
        (root / name).mkdir()
        (root / name / "f.txt").write_text("x")
    (root / ("5.0.1-" + "d" * 16)).symlink_to(tmp_path)
    for name in ("old", "current", "other"):
        os.utime(root / names[name], (1, 1))
    uploads = ensure_private(str(root), UPLOADS)
    (uploads / "9.1.out.stale.txt").write_text("half")
    os.utime(uploads / "9.1.out.stale.txt", (1, 1))
    (uploads / "9.2.out.fresh.txt").write_text("half")
    attempts = {(3, 0): 2, (4, 0): None}
    removed = sweep(str(root), lambda c, p: attempts.get((c, p)), older_than=600)
    assert removed == [names["old"], f"{UPLOADS}/9.1.out.stale.txt"]
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [names["current"], names["young"], names["other"], "5.0.1-" + "d" * 16, UPLOADS])
    assert [p.name for p in uploads.iterdir()] == ["9.2.out.fresh.txt"]
    assert (tmp_path / "sandboxes").exists() and list(tmp_path.iterdir())  # the link's target
