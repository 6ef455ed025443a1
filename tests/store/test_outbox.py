"""The agent's outbox: a JOB_EXIT that ran out of time hands its sandbox over; the
agent moves it out of the job's user's reach, sends its outputs, and only then records the
exit; what a stopped agent left is sent by the next one; a hand-off that cannot be taken holds
the job (HoldReasonCode 12). In process, on real databases and directories."""

from __future__ import annotations

import os
import pwd
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobstore.agent.outbox import Outbox
from jobstore.core import holds
from jobstore.core.jobs import Job
from jobstore.db.store import JobStore
from jobstore.formats import classads
from jobstore.formats.jobads import render_job
from jobstore.node import config, fetching
from jobstore.node.hookcall import HookRequest
from jobstore.node.reports import SERVICE
from jobstore.node.sandboxroot import OUTBOX, ensure_root
from jobstore.node.services import direct
from jobstore.submit.description import parse_submit_text
from jobstore.testing.factories import claim, claim_request

REQ = claim_request(shape="s")


@pytest.fixture
def node(store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The store's settings as a node's (environment), with a sandbox root; the sandbox root."""
    root = tmp_path / "sandboxes"
    ensure_root(str(root))
    monkeypatch.setenv("JOBSTORE_DATABASE_URL", store.db.engine.url.render_as_string(False))
    monkeypatch.setenv("JOBSTORE_SANDBOX_ROOT", str(root))
    monkeypatch.setenv("JOBSTORE_SPOOL", str(tmp_path / "spool"))
    direct().drop_stores()
    yield root
    direct().drop_stores()


def _exited(store: JobStore, tmp: Path) -> tuple[Job, bytes]:
    """A job with file transfer, claimed, its sandbox made and written as a job leaves it; the
    ad its JOB_EXIT hook hands off."""
    (tmp / "in.txt").write_text("input")
    specs = parse_submit_text("executable = /bin/cat\ntransfer_executable = false\n"
                              "transfer_input_files = in.txt\noutput = job.out\nqueue\n",
                              base_dir=tmp)
    store.submissions.submit(specs, owner=pwd.getpwuid(os.geteuid()).pw_name, queue="default",
                             max_attempts=3)
    job = claim(store, REQ)
    assert job is not None
    settings = config.load_settings("JOBSTORE")
    sandbox = Path(fetching.sandbox_dir(job, settings) or "")
    sandbox.mkdir(mode=0o700)
    (sandbox / "job.out").write_text("out\n")
    (sandbox / "made.txt").write_text("new\n")
    ad = render_job(job, sandbox=str(sandbox), keyword="JOBSTORE", uid_domain="localdomain",
                    job_lease_duration=2400)
    return job, (ad + "ExitCode = 0\nExitBySignal = false\nJobstoreHandOff = true\n").encode()


def _job_exit(ad: bytes) -> HookRequest:
    return HookRequest(hook="job_exit", argv=["exit"], stdin=ad, caller=SERVICE, node=direct())


def _wait(store: JobStore, job: Job, status: str) -> Job:
    deadline = time.monotonic() + 30
    while (got := store.reads.get_job(job.id)).status != status:
        assert time.monotonic() < deadline, (got.status, got.reason)
        time.sleep(0.05)
    return got


def test_the_next_agent_sends_what_a_stopped_one_was_handed(store: JobStore, node: Path,
                                                             tmp_path: Path) -> None:
    job, ad = _exited(store, tmp_path)
    taken = Outbox(direct()).hand_off(_job_exit(ad), classads.parse_ad(classads.decode(ad)))
    assert taken.error is None and "handed to the agent" in taken.log[0]
    box = node / OUTBOX
    assert [p.name for p in node.iterdir()] == [OUTBOX]  # moved, out of the user's reach
    name = Path(fetching.sandbox_dir(job, config.load_settings("JOBSTORE")) or "").name
    assert sorted(p.name for p in box.iterdir()) == [name, name + ".exit"]
    assert sorted(p.name for p in (box / name).iterdir()) == ["job.out", "made.txt"]
    assert store.reads.get_job(job.id).status == job.status  # the exit waits for the outputs
    Outbox(direct()).start([str(node)])  # a new agent finds it and goes on
    done = _wait(store, job, "completed")
    assert done.exit_code == 0
    assert sorted(f.name for f in store.files.job_files_of(done, "out")) == ["job.out", "made.txt"]
    deadline = time.monotonic() + 30  # the outbox clears it after the exit it recorded
    while list(box.iterdir()):
        assert time.monotonic() < deadline, list(box.iterdir())
        time.sleep(0.05)


def test_a_hand_off_without_its_sandbox_holds_the_job(store: JobStore, node: Path,
                                                      tmp_path: Path) -> None:
    job, ad = _exited(store, tmp_path)
    sandbox = Path(fetching.sandbox_dir(job, config.load_settings("JOBSTORE")) or "")
    for child in sandbox.iterdir():
        child.unlink()
    sandbox.rmdir()
    taken = Outbox(direct()).hand_off(_job_exit(ad), classads.parse_ad(classads.decode(ad)))
    assert taken.error is None
    held = store.reads.get_job(job.id)
    assert (held.status, held.hold_code) == ("held", holds.TRANSFER_OUTPUT_ERROR), held.reason
    assert "not handed to the agent" in (held.reason or "")
    assert "is not there" in (held.reason or "")


def test_a_hand_off_of_another_attempt_is_refused(store: JobStore, node: Path,
                                                  tmp_path: Path) -> None:
    job, ad = _exited(store, tmp_path)
    forged = ad.replace(f'"{job.token}"'.encode(), b'"guess"')
    taken = Outbox(direct()).hand_off(_job_exit(forged), classads.parse_ad(classads.decode(forged)))
    assert taken.stale  # recorded only, as any report with a wrong token; nothing moved
    assert store.reads.get_job(job.id).status == job.status
    assert not (node / OUTBOX).exists() or not any((node / OUTBOX).iterdir())
    assert Path(fetching.sandbox_dir(job, config.load_settings("JOBSTORE")) or "").is_dir()


def test_a_forged_hand_off_takes_no_path_or_name_from_the_hook(store: JobStore, node: Path,
                                                                tmp_path: Path) -> None:
    """The probe's attack: the job's user runs JOB_EXIT herself with a hand-off whose ad says
    where outputs go (a file:// destination, remaps, her own output list and stdout path, a
    checkpoint exit code). The agent sends what the job's row says, into the store, and writes
    nothing anywhere."""
    job, ad = _exited(store, tmp_path)
    target = tmp_path / "etc"
    target.mkdir()
    forged = ad + (f'OutputDestination = "file://{target}"\n'
                   f'TransferOutputRemaps = "job.out={target}/evil"\n'
                   f'TransferOutput = "../../x,made.txt"\nOut = "{target}/out"\n'
                   'WhenToTransferOutput = "ON_EXIT_OR_EVICT"\n'
                   f'Iwd = "{target}"\nHookKeyword = "JOBSTORE"\n').encode()
    taken = Outbox(direct()).hand_off(_job_exit(forged), classads.parse_ad(classads.decode(forged)))
    assert taken.error is None and "handed to the agent" in taken.log[0]
    Outbox(direct()).start([str(node)])
    done = _wait(store, job, "completed")
    assert sorted(f.name for f in store.files.job_files_of(done, "out")) == ["job.out", "made.txt"]
    assert list(target.iterdir()) == []


def test_a_job_with_an_output_destination_is_never_handed_off(store: JobStore, node: Path,
                                                               tmp_path: Path) -> None:
    """Its outputs go where its row says, by its JOB_EXIT as the job's user: the agent takes
    none of them (the job is held, as one whose outputs could not be sent)."""
    (tmp_path / "in.txt").write_text("input")
    specs = parse_submit_text(
        "executable = /bin/cat\ntransfer_executable = false\ntransfer_input_files = in.txt\n"
        f"output = job.out\noutput_destination = file://{tmp_path}/dest\nqueue\n",
        base_dir=tmp_path)
    store.submissions.submit(specs, owner=pwd.getpwuid(os.geteuid()).pw_name, queue="default",
                             max_attempts=3)
    job = claim(store, REQ)
    assert job is not None
    sandbox = Path(fetching.sandbox_dir(job, config.load_settings("JOBSTORE")) or "")
    sandbox.mkdir(mode=0o700)
    (sandbox / "job.out").write_text("out\n")
    ad = (render_job(job, sandbox=str(sandbox), keyword="JOBSTORE", uid_domain="localdomain",
                     job_lease_duration=2400)
          + "ExitCode = 0\nExitBySignal = false\nJobstoreHandOff = true\n").encode()
    taken = Outbox(direct()).hand_off(_job_exit(ad), classads.parse_ad(classads.decode(ad)))
    assert taken.error is None
    held = store.reads.get_job(job.id)
    assert (held.status, held.hold_code) == ("held", holds.TRANSFER_OUTPUT_ERROR), held.reason
    assert "never handed to the agent" in (held.reason or "")
    assert sandbox.is_dir() and not (node / OUTBOX / sandbox.name).exists()


def _busy_agent(path: Path, busy: int) -> tuple[list[int], socket.socket]:
    """A socket that answers like an agent (this process's uid): `busy` times BUSY, as the
    agent does, from the request's header alone, and closes; then OK with the payload
    `listed`; the calls it had."""

    from jobstore.agent.protocol import BUSY, HEADER, MAX_REQUEST, OK, body_length, encode

    calls: list[int] = []
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                need = body_length(conn.recv(HEADER, socket.MSG_WAITALL), MAX_REQUEST)
                calls.append(len(calls))
                if len(calls) <= busy:
                    conn.sendall(encode([BUSY, b"0", b"", b"busy"]))
                    continue
                while need > 0:
                    need -= len(conn.recv(need))
                conn.sendall(encode([OK, b"0", b"listed", b""]))

    threading.Thread(target=serve, daemon=True).start()
    return calls, listener


@pytest.mark.parametrize("stop", [False, True])
def test_a_busy_agent_is_waited_for_not_taken_for_absent(tmp_path: Path, stop: bool,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           ) -> None:
    """An agent that answers BUSY (another account's requests fill its per-account bound) is
    asked again until it serves the call; one that stays busy past the call's time is a
    SandboxError, or within JOB_EXIT's bound a hand-off, never a fall-back to direct mode."""
    from jobstore.agent import client
    from jobstore.errors import HandOff, SandboxError

    ad = b'HookKeyword = "JOBSTORE"\nJobstoreJobId = 1\nJobstoreAttempt = 1\n'
    calls, listener = _busy_agent(tmp_path / "a.sock", busy=3)
    try:
        files = client._AgentFiles(str(tmp_path / "a.sock"), (os.geteuid(),), ad)
        piece = os.urandom(2 << 20)  # more than the socket takes before it is read
        assert files.call("sandbox_write", ["out", "644", "0", "0"], piece) == b"listed"
        assert len(calls) == 4
    finally:
        listener.close()
    calls, listener = _busy_agent(tmp_path / "b.sock", busy=10**6)
    try:
        files = client._AgentFiles(str(tmp_path / "b.sock"), (os.geteuid(),), ad)
        monkeypatch.setattr(client, "SANDBOX_CALL_SECONDS", 0.3)
        if stop:
            files.stop_at = time.monotonic() + 0.3
        with pytest.raises(HandOff if stop else SandboxError, match=None if stop else "busy"):
            files.call("sandbox_write", ["out", "644", "0", "1"], os.urandom(2 << 20))
        assert len(calls) >= 2
    finally:
        listener.close()
