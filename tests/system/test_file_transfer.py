"""A fetched job's files, end to end: the emulated startd and starter run the real
hook executables; the inputs exist only in the job store once submitted, the job runs in a
sandbox of its own under the node's sandbox root, its outputs come back into the store, and
`jobstore transfer-data` writes them on the submit side. Through the agent and in direct mode,
on SQLite and PostgreSQL; as root, the job and its starter hooks run as an ordinary account."""

from __future__ import annotations

import functools
import os
import socket
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from emulatornode import job_owner, node_db, run_node, submit_text  # noqa: F401
from sqlalchemy import func, select, update

from jobstore.api.query import Shown
from jobstore.api.retrieve import retrieve
from jobstore.core import holds
from jobstore.db.sandbox import OUT
from jobstore.db.schema import sandbox_chunks
from jobstore.db.store import JobStore
from jobstore.node.sandboxroot import CACHE, OUTBOX, UPLOADS

SCRIPT = """#!/bin/sh
wc -w < in.txt > count.txt
cat in.txt
cat data/a.csv
echo oops >&2
mkdir -p sub && echo not-sent > sub/x.txt
"""
SUBMIT = """executable = count.sh
should_transfer_files = YES
transfer_input_files = in.txt, data
output = job.out
error = logs/job.err
request_memory = 32
{extra}
queue
"""


def _files(tmp: Path, owner: str | None) -> Path:
    sub = tmp / "submit"
    sub.mkdir(exist_ok=True)
    (sub / "in.txt").write_text("three little words\n")
    (sub / "data").mkdir(exist_ok=True)
    (sub / "data" / "a.csv").write_text("1,2\n")
    (sub / "logs").mkdir(exist_ok=True)
    (sub / "count.sh").write_text(SCRIPT)
    (sub / "count.sh").chmod(0o755)
    if owner:
        import pwd

        user = pwd.getpwnam(owner)
        for path in (sub, sub / "logs"):
            os.chown(path, user.pw_uid, user.pw_gid)
    return sub


def _retrieve(store: JobStore, ids: list[str]) -> list[Any]:
    """transfer-data of `ids`, as the jobs' owner would run it where root may not take the
    store's rows at their word (a SQLite file in the node's directory, which every account
    may write): in a child that becomes her, on the file made hers."""
    import json
    import pwd
    from types import SimpleNamespace

    from jobstore.accesspoint.outputs import become

    if os.geteuid() != 0 or store.db.engine.dialect.name != "sqlite":
        return retrieve(store, Shown("JOBSTORE", "localdomain"), ids)
    owner = job_owner() or ""
    user = pwd.getpwnam(owner)
    os.chown(str(store.db.engine.url.database), user.pw_uid, user.pw_gid)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: its answer is what the parent checks
        code = 1
        try:
            os.close(read)
            become(owner)
            mine = JobStore.from_url(store.db.engine.url.render_as_string(False))
            got = retrieve(mine, Shown("JOBSTORE", "localdomain"), ids)
            os.write(write, json.dumps([r.written for r in got]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        written = json.loads(answer.read() or b"null")
    assert os.waitpid(pid, 0)[1] == 0 and written is not None, "transfer-data failed"
    return [SimpleNamespace(written=[tuple(w) for w in each]) for each in written]


def _sandboxes(tmp: Path) -> list[Path]:
    """The attempts' sandboxes under the node's sandbox root (not the agent's own directories:
    outbox, cache, uploads)."""
    return [p for p in (tmp / "sandboxes").iterdir() if not p.name.startswith(".jobstore-")]


@pytest.mark.slow  # (make test's time: runs with make test-slow)
@pytest.mark.parametrize("mode", ["agent", "direct"])
def test_a_job_with_file_transfer_needs_no_shared_file_system(node_db, mode: str) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    store, tmp = node_db
    owner = job_owner()
    sub = _files(tmp, owner)
    (job_id,) = submit_text(store, tmp, SUBMIT.format(extra=""), owner)
    for gone in ("in.txt", "count.sh", "data/a.csv"):  # from now on only the store has them
        (sub / gone).unlink()
    run_node(store, tmp, owner, mode, {"completed", "held", "failed"})
    job = store.reads.get_job(job_id)
    assert (job.status, job.exit_code) == ("completed", 0), (job.status, job.reason)
    assert _sandboxes(tmp) == []  # each sandbox removed after its attempt
    if mode == "agent":  # the inputs were copied from the agent's node copies
        assert len(list((tmp / "sandboxes" / CACHE).iterdir())) == 3
    (got,) = _retrieve(store, [str(job.cluster_id)])
    assert sorted(name for name, _ in got.written) == ["count.txt", "job.err", "job.out"]
    assert (sub / "count.txt").read_text().strip() == "3"
    assert (sub / "job.out").read_text() == "three little words\n1,2\n"
    assert (sub / "logs" / "job.err").read_text() == "oops\n"  # where `error` said
    assert not (sub / "sub").exists() and not (sub / "in.txt").exists()  # not new at the top
    ad = store.reads.get_job(job_id).ad
    assert ad["TransferInput"] == {"expr": '"in.txt, data"'}
    if owner:  # root wrote them with the owner's rights
        import pwd

        assert (sub / "count.txt").stat().st_uid == pwd.getpwnam(owner).pw_uid


def test_an_input_that_cannot_be_had_holds_the_job(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """Stored bytes that no longer match their hash: PREPARE_JOB holds the job with
    HoldReasonCode 13 and the reason; it never runs, and no sandbox is left."""
    store, tmp = node_db
    owner = job_owner()
    _files(tmp, owner)
    (job_id,) = submit_text(store, tmp, SUBMIT.format(extra=""), owner)
    with store.db.engine.begin() as conn:
        conn.execute(update(sandbox_chunks).where(sandbox_chunks.c.seq == 0)
                     .values(data=b"three little wordz\n"))  # in.txt's length
    run_node(store, tmp, owner, "agent", {"held"})
    job = store.reads.get_job(job_id)
    assert (job.status, job.hold_code) == ("held", holds.TRANSFER_INPUT_ERROR), job.reason
    assert "Failed to transfer the job's input files" in (job.reason or "")
    assert "sha256 mismatch" in (job.reason or "")
    assert not [e for e in store.reads.events(job_id) if e.event == "start"]
    assert _sandboxes(tmp) == []


def test_a_missing_output_holds_the_job_and_keeps_its_sandbox(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """transfer_output_files names a file the job did not write: JOB_EXIT holds the job with
    HoldReasonCode 12 (as HTCondor's shadow would) and leaves the sandbox for a look."""
    store, tmp = node_db
    owner = job_owner()
    _files(tmp, owner)
    (job_id,) = submit_text(store, tmp, SUBMIT.format(
        extra="transfer_output_files = count.txt, never.txt"), owner)
    run_node(store, tmp, owner, "agent", {"held", "completed"})
    job = store.reads.get_job(job_id)
    assert (job.status, job.hold_code) == ("held", holds.TRANSFER_OUTPUT_ERROR), job.reason
    assert "never.txt: no such output file" in (job.reason or "")
    assert len(_sandboxes(tmp)) == 1


class _Files(SimpleHTTPRequestHandler):
    def log_message(self, *_args: object) -> None:  # quiet
        pass


@pytest.fixture
def web(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A real HTTP server on 127.0.0.1 serving a directory, and a socket that never answers."""
    served = tmp_path / "www"
    served.mkdir()
    (served / "data.txt").write_text("from the web\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Files,
                                                                     directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections wait in the backlog: nobody ever answers
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", \
            f"http://127.0.0.1:{silent.getsockname()[1]}"
    finally:
        server.shutdown()
        server.server_close()
        silent.close()


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_url_inputs_are_fetched_by_prepare_job(node_db, web) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """An http:// input is fetched on the node into the sandbox; one that answers 404 and one
    that never answers hold their jobs (HoldReasonCode 13), the latter within the timeout."""
    store, tmp = node_db
    base, silent = web
    owner = job_owner()
    _files(tmp, owner)
    jobs = {}
    for label, url in (("ok", f"{base}/data.txt"), ("missing", f"{base}/nope.txt"),
                       ("silent", f"{silent}/data.txt")):
        text = ("executable = /bin/cat\narguments = data.txt\ntransfer_executable = false\n"
                f"should_transfer_files = YES\ntransfer_input_files = {url}\n"
                f"output = {label}.out\nrequest_memory = 32\nqueue\n")
        (jobs[label],) = submit_text(store, tmp, text, owner)
    run_node(store, tmp, owner, "agent", {"completed", "held"},
         env={"JOBSTORE_URL_TIMEOUT": "1"}, slots=3)
    ok, missing, silent_job = (store.reads.get_job(jobs[k]) for k in ("ok", "missing", "silent"))
    assert ok.status == "completed", ok.reason
    (got,) = _retrieve(store, [str(ok.cluster_id)])
    assert (tmp / "submit" / "ok.out").read_text() == "from the web\n"
    for job, why in ((missing, "HTTP 404"), (silent_job, "no answer within 1 s")):
        assert (job.status, job.hold_code) == ("held", holds.TRANSFER_INPUT_ERROR), job.reason
        assert why in (job.reason or ""), job.reason


CHECKPOINTING = """#!/bin/sh
n=$(cat ckpt.txt 2>/dev/null || echo 0)
if [ "$n" -ge 2 ]; then echo "done after $n checkpoints" > result.txt; exit 0; fi
echo $((n + 1)) > ckpt.txt
exit 85
"""
EVICTED = """#!/bin/sh
if [ -f partial.txt ]; then cat partial.txt > result.txt; exit 0; fi
echo "made by the first attempt" > partial.txt
sleep 60
"""


def _script(tmp: Path, owner: str | None, text: str) -> None:
    sub = _files(tmp, owner)
    (sub / "count.sh").write_text(text)


def test_a_self_checkpointing_job_goes_on_from_its_checkpoint(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """checkpoint_exit_code: each exit with it stores transfer_checkpoint_files and requeues the
    job, whose next attempt starts from them (HTCondor's self-checkpointing, which fetched jobs
    had not); its last exit brings the outputs back."""
    store, tmp = node_db
    owner = job_owner()
    _script(tmp, owner, CHECKPOINTING)
    (job_id,) = submit_text(store, tmp, SUBMIT.format(
        extra="checkpoint_exit_code = 85\ntransfer_checkpoint_files = ckpt.txt\n"
              "transfer_output_files = result.txt"), owner)
    run_node(store, tmp, owner, "agent", {"completed", "held", "failed"})
    job = store.reads.get_job(job_id)
    assert (job.status, job.exit_code, job.claims) == ("completed", 0, 3), job.reason
    evicts = [e for e in store.reads.events(job_id) if e.event == "evict" and e.to_status]
    assert len(evicts) == 2
    assert "checkpointed (exit code 85)" in str(evicts[0].attrs)
    _retrieve(store, [str(job.cluster_id)])
    assert (tmp / "submit" / "result.txt").read_text() == "done after 2 checkpoints\n"
    assert not (tmp / "submit" / "ckpt.txt").exists()  # a checkpoint is not an output


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_on_exit_or_evict_starts_the_next_attempt_from_the_evicted_ones_files(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    store, tmp = node_db
    owner = job_owner()
    _script(tmp, owner, EVICTED)
    (job_id,) = submit_text(store, tmp, SUBMIT.format(
        extra="when_to_transfer_output = ON_EXIT_OR_EVICT"), owner)  # every new file saved
    evicted: list[int] = []

    def first_attempt(_index: int, _ad: dict) -> float | None:  # type: ignore[type-arg]
        if evicted:
            return None
        evicted.append(1)
        return 1.5

    run_node(store, tmp, owner, "agent", {"completed", "held", "failed"},
         vacate_after=first_attempt)
    job = store.reads.get_job(job_id)
    assert (job.status, job.claims) == ("completed", 2), job.reason
    (got,) = _retrieve(store, [str(job.cluster_id)])
    assert (tmp / "submit" / "result.txt").read_text() == "made by the first attempt\n"
    assert "partial.txt" not in dict(got.written)  # it came in as it went out: not new


def test_the_file_guides_example(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """docs/files.md's wc.sub, as written there: submitted, its input removed, run,
    transfer-data."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "files.md").read_text()
    block = guide.split("$ cat wc.sub\n", 1)[1]
    text = block[:block.index("queue\n") + len("queue\n")]
    assert "transfer_input_files = in.txt" in text and "output = count.out" in text
    store, tmp = node_db
    owner = job_owner()
    sub = _files(tmp, owner)
    (job_id,) = submit_text(store, tmp, text, owner)
    (sub / "in.txt").unlink()  # the node needs no copy of it
    run_node(store, tmp, owner, "agent", {"completed", "held", "failed"})
    assert store.reads.get_job(job_id).status == "completed", store.reads.get_job(job_id).reason
    _retrieve(store, [str(store.reads.get_job(job_id).cluster_id)])
    assert (sub / "count.out").read_text().split() == ["3", "in.txt"]


@pytest.mark.slow
def test_outputs_not_sent_in_job_exits_time_are_sent_by_the_agent(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """JOB_EXIT's time for sending is up at once (JOBSTORE_OUTPUT_SECONDS = 0): the hook hands
    the sandbox to the agent, which moves it into its outbox, sends the outputs, and records
    the exit only then; nothing is lost and nothing is left."""
    store, tmp = node_db
    owner = job_owner()
    sub = _files(tmp, owner)
    (job_id,) = submit_text(store, tmp, SUBMIT.format(extra=""), owner)
    run_node(store, tmp, owner, "agent", {"completed", "held", "failed"},
         env={"JOBSTORE_OUTPUT_SECONDS": "0"})
    job = store.reads.get_job(job_id)
    assert (job.status, job.exit_code) == ("completed", 0), (job.status, job.reason)
    assert "outputs not all sent in JOB_EXIT's time, handed to the agent" in \
        (tmp / "agent.log").read_text()
    assert _sandboxes(tmp) == []
    assert list((tmp / "sandboxes" / OUTBOX).iterdir()) == []
    assert list((tmp / "sandboxes" / UPLOADS).iterdir()) == []
    (got,) = _retrieve(store, [str(job.cluster_id)])
    assert sorted(name for name, _ in got.written) == ["count.txt", "job.err", "job.out"]
    assert (sub / "count.txt").read_text().strip() == "3"


class _Uploads(SimpleHTTPRequestHandler):
    """PUT stores the body under the served directory, as an upload endpoint would."""

    def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
        length = int(self.headers["Content-Length"])
        target = Path(self.directory) / self.path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(self.rfile.read(length))
        self.send_response(201)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.mark.slow
def test_output_destination_sends_the_outputs_to_a_url(node_db, tmp_path: Path) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """output_destination: the node sends the outputs (stdout and stderr too) to a file:// or
    an http:// URL, under their remapped names, as the job's user; nothing goes into the store
    and transfer-data has nothing to write."""
    store, tmp = node_db
    owner = job_owner()
    sub = _files(tmp, owner)
    shared = tmp / "shared-out"
    shared.mkdir()
    if owner:
        import pwd

        user = pwd.getpwnam(owner)
        os.chown(shared, user.pw_uid, user.pw_gid)
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 functools.partial(_Uploads, directory=str(uploads)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        ids = {}
        for label, url in (("file", f"file://{shared}"),
                           ("http", f"http://127.0.0.1:{server.server_address[1]}/jobs/")):
            (ids[label],) = submit_text(store, tmp, SUBMIT.format(extra=(
                f"output_destination = {url}\n"
                "transfer_output_remaps = \"count.txt = n/words.txt\"")), owner)
        run_node(store, tmp, owner, "agent", {"completed", "held", "failed"}, slots=2)
    finally:
        server.shutdown()
        server.server_close()
    for label, where in (("file", shared), ("http", uploads / "jobs")):
        job = store.reads.get_job(ids[label])
        assert (job.status, job.exit_code) == ("completed", 0), (label, job.reason)
        assert (where / "n" / "words.txt").read_text().strip() == "3", label
        assert (where / "job.out").read_text() == "three little words\n1,2\n", label
        assert (where / "job.err").read_text() == "oops\n", label
        assert store.files.job_files_of(job, "out") == []
    if owner:  # written with the job's user's rights
        assert (shared / "job.out").stat().st_uid == pwd.getpwnam(owner).pw_uid
    cluster = store.reads.get_job(ids["file"]).cluster_id
    got = _retrieve(store, [str(cluster)])
    assert all(not g.written for g in got) and not (sub / "count.txt").exists()


def test_a_flood_of_outputs_is_refused_at_its_request_disk(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """The probe's flood: 200 outputs of 512 KiB from a job whose RequestDisk is 1024 KiB. The
    agent and (PostgreSQL) the database refuse what goes past it: the job is held as one whose
    outputs could not be sent, and the store has grown by about its RequestDisk, not by
    100 MB."""
    store, tmp = node_db
    owner = job_owner()
    _script(tmp, owner, "#!/bin/sh\nfor i in $(seq 200); do head -c 524288 /dev/zero"
                        " > out.$i; done\n")
    (job_id,) = submit_text(store, tmp, "executable = count.sh\nshould_transfer_files = YES\n"
                        "request_disk = 1024\nqueue\n", owner)

    def stored() -> int:
        with store.db.engine.connect() as conn:
            return int(conn.execute(select(func.coalesce(func.sum(func.length(
                sandbox_chunks.c.data)), 0))).scalar_one())

    before = stored()
    run_node(store, tmp, owner, "agent", {"completed", "held", "failed"})
    job = store.reads.get_job(job_id)
    assert (job.status, job.hold_code) == ("held", holds.TRANSFER_OUTPUT_ERROR), job.reason
    assert "1024 KiB" in (job.reason or "")
    assert stored() - before <= 1024 * 1024


def test_max_transfer_input_and_output_mb_hold_the_job_as_htcondor_does(node_db) -> None:  # type: ignore[no-untyped-def] # noqa: F811
    """max_transfer_input_mb: inputs over it hold the job at PREPARE_JOB (HoldReasonCode 32,
    it never runs); max_transfer_output_mb: outputs over it hold the job at JOB_EXIT (33), the
    outputs before the one that went past it sent; a job within both completes."""
    store, tmp = node_db
    owner = job_owner()
    sub = _files(tmp, owner)
    (sub / "big.bin").write_bytes(b"\0" * (3 << 19))  # 1.5 MiB
    _script(tmp, owner, "#!/bin/sh\nhead -c 1000 /dev/zero > a.out\n"
                        "head -c 1572864 /dev/zero > b.out\n")
    common = "executable = count.sh\nshould_transfer_files = YES\nrequest_disk = 10240\n"
    (big_in,) = submit_text(store, tmp, common + "transfer_input_files = big.bin\n"
                            "max_transfer_input_mb = 1\nqueue\n", owner)
    (big_out,) = submit_text(store, tmp, common + "transfer_output_files = a.out, b.out\n"
                             "max_transfer_output_mb = 1\nqueue\n", owner)
    (fits,) = submit_text(store, tmp, common + "transfer_input_files = big.bin\n"
                          "transfer_output_files = a.out, b.out\nmax_transfer_input_mb = 2\n"
                          "max_transfer_output_mb = -1\nqueue\n", owner)
    run_node(store, tmp, owner, "agent", {"held", "completed"})
    job = store.reads.get_job(big_in)
    assert (job.status, job.hold_code) == ("held", holds.MAX_TRANSFER_INPUT_SIZE_EXCEEDED), (
        job.reason)
    assert "1.5 MiB, more than its max_transfer_input_mb of 1 MiB" in (job.reason or "")
    assert not [e for e in store.reads.events(big_in) if e.event == "start"]
    job = store.reads.get_job(big_out)
    assert (job.status, job.hold_code) == ("held", holds.MAX_TRANSFER_OUTPUT_SIZE_EXCEEDED), (
        job.reason)
    assert "more than its max_transfer_output_mb of 1 MiB (at b.out)" in (job.reason or "")
    assert [f.name for f in store.files.job_files_of(job, OUT)] == ["a.out"]
    assert store.reads.get_job(fits).status == "completed", store.reads.get_job(fits).reason
    assert job.ad.get("MaxTransferOutputMB") == {"expr": "1"}
