"""Waiting fetches: in agent mode a FETCH_WORK that finds nothing waits, up to
JOBSTORE_FETCH_WAIT seconds, for work that fits its slot, and returns it as soon as it is
claimable; the agent and the hooks run as separate processes, on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agentnode import WAIT, Node, node, store  # noqa: F401 - the fixtures
from backends import BOTH_BACKENDS
from hookseq import ordinary_owner, slot_ad, submit_jobs

from jobstore.core.jobs import JobSpec
from jobstore.core.states import Event
from jobstore.db.store import JobStore
from jobstore.emulator.spawn import hook_preexec

BOUND = "4"  # JOBSTORE_FETCH_WAIT in these tests (at most the hook's deadline less 3 s)


@pytest.fixture
def waiting(node: Node) -> Iterator[Node]:  # noqa: F811
    """The node's agent, with JOBSTORE_FETCH_WAIT and its metrics (how many fetches wait)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(node.config, "a") as fh:
        fh.write(f"JOBSTORE_AGENT_METRICS_PORT = {port}\n")
    node.start(_CONDOR_JOBSTORE_FETCH_WAIT=BOUND)
    node.wait_log("metrics served on")
    node.metrics = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
    node.metrics_port = port  # type: ignore[attr-defined]
    yield node


def _fetch(node: Node, name: str) -> subprocess.Popen:  # noqa: F811
    """A FETCH_WORK hook for slot `name`, started and left running."""
    return _fetch_ad(node, slot_ad(name))


def _fetch_ad(node: Node, ad: bytes) -> subprocess.Popen:  # noqa: F811
    """A FETCH_WORK hook given the slot ad `ad`, started and left running."""
    proc = subprocess.Popen(
        [str(node.hooks / "fetch_job")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=node.env(JOBSTORE_HOOK_MODE="agent"),
        preexec_fn=hook_preexec(False))
    assert proc.stdin is not None
    proc.stdin.write(ad)
    proc.stdin.close()
    proc.stdin = None  # (communicate would flush it)
    return proc


def _parked(node: Node, count: int) -> None:  # noqa: F811
    """Wait until the agent's metrics say `count` fetches are waiting."""
    end = time.monotonic() + WAIT
    while True:
        with urllib.request.urlopen(node.metrics, timeout=10) as answer:  # type: ignore[attr-defined]
            text = answer.read().decode()
        found = re.search(r"^jobstore_agent_waiting_fetches (\S+)$", text, re.M)
        if found and float(found.group(1)) == count:
            return
        assert time.monotonic() < end, f"not {count} waiting fetches: {found}"
        time.sleep(0.05)


def _metric(node: Node, name: str) -> float:  # noqa: F811
    with urllib.request.urlopen(node.metrics, timeout=10) as answer:  # type: ignore[attr-defined]
        text = answer.read().decode()
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def _one_claim(store: JobStore, *waiting: subprocess.Popen) -> None:  # noqa: F811
    """One job submitted while `waiting` fetches wait: one of them returns it, the others
    nothing at their bound; the job was claimed once."""
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    outs = sorted(_out(proc) for proc in waiting)
    assert set(outs[:-1]) == {b""} and f"JobstoreJobId = {job_id}".encode() in outs[-1]
    row = store.reads.get_job(job_id)
    assert (row.status, row.claims) == ("fetched", 1)


def _out(proc: subprocess.Popen) -> bytes:
    out, _err = proc.communicate(timeout=WAIT)
    return out


@BOTH_BACKENDS
def test_a_job_submitted_to_an_idle_node_is_fetched_by_the_waiting_fetch(
        waiting: Node, store: JobStore) -> None:  # noqa: F811
    """The fetch finds nothing, waits; the job submitted meanwhile is what it returns (a fetch
    that did not wait would have returned nothing before the job existed)."""
    proc = _fetch(waiting, "slot1@node01")
    _parked(waiting, 1)
    assert proc.poll() is None
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    out = _out(proc)
    assert f"JobstoreJobId = {job_id}".encode() in out
    assert store.reads.get_job(job_id).status == "fetched"


@pytest.mark.slow  # (waits its bound: make test's time)
def test_work_that_fits_no_waiting_slot_wakes_none_and_the_bound_ends_the_wait(
        waiting: Node, store: JobStore) -> None:  # noqa: F811
    """A job too large for the waiting slot is not fetched; the fetch returns nothing at its
    bound; the job is still idle."""
    proc = _fetch(waiting, "slot1@node01")
    _parked(waiting, 1)
    _, (job_id,) = store.submissions.submit(
        [JobSpec(cmd="/bin/true", iwd="/tmp", request_memory=4096)],
        owner=ordinary_owner(), queue="default", max_attempts=3)
    assert _out(proc) == b""
    assert store.reads.get_job(job_id).status == "idle"


@BOTH_BACKENDS
def test_a_release_and_a_requeue_wake_a_waiting_fetch(waiting: Node, store: JobStore) -> None:  # noqa: F811
    """A held job released, and a job whose fetch was rejected (idle again), each wake a
    waiting fetch, which returns it."""
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    store.actions.admin(job_id, Event.HOLD, "test")
    proc = _fetch(waiting, "slot1@node01")
    _parked(waiting, 1)
    store.actions.admin(job_id, Event.RELEASE, "test")
    out = _out(proc)
    assert f"JobstoreJobId = {job_id}".encode() in out
    rejected = waiting.hook("reply_fetch", out + b"-----\n" + slot_ad("slot1@node01"),
                            ["reject"], JOBSTORE_HOOK_MODE="agent")
    assert rejected.returncode == 0 and store.reads.get_job(job_id).status == "idle"
    again = _fetch(waiting, "slot2@node01")
    assert f"JobstoreJobId = {job_id}".encode() in _out(again)


def test_sigterm_ends_a_waiting_fetch_and_nothing_is_handed_to_it(
        waiting: Node, store: JobStore) -> None:  # noqa: F811
    """SIGTERM to the hook ends it at once (empty); the agent drops its wait, so a job
    submitted afterwards stays idle for the next fetch."""
    proc = _fetch(waiting, "slot1@node01")
    _parked(waiting, 1)
    proc.send_signal(signal.SIGTERM)
    assert _out(proc) == b""
    _parked(waiting, 0)
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    time.sleep(0.5)  # (not a speed assertion: only time for a wrong hand-out to happen)
    assert store.reads.get_job(job_id).status == "idle"


@pytest.mark.slow  # (waits its bound: make test's time)
def test_two_waiting_fetches_one_job_one_claim(waiting: Node, store: JobStore) -> None:  # noqa: F811
    """One job for two waiting slots: one fetch returns it, the other nothing at its bound;
    the job was claimed once."""
    first, second = _fetch(waiting, "slot1@node01"), _fetch(waiting, "slot2@node01")
    _parked(waiting, 2)
    _one_claim(store, first, second)


@pytest.mark.slow  # (make test's time on two cores)
def test_an_idle_emulated_node_runs_a_new_job_without_waiting_for_fetchworkdelay(
        waiting: Node, store: JobStore) -> None:  # noqa: F811
    """The emulated startd (FetchWorkDelay 300 s for an idle slot, as a real one counts it)
    with the agent: the slot's first fetch finds nothing and waits; a job submitted then runs to
    its end, which no later fetch could have done within the run."""
    import threading

    from jobstore.emulator import Emulator, EmulatorConfig
    from jobstore.node.hooktable import CONDOR_NAMES

    cfg = EmulatorConfig(
        hooks={condor: str(waiting.hooks / ours) for ours, condor in CONDOR_NAMES.items()},
        work_dir=str(waiting.base / "node"), keyword="JOBSTORE", static_slots=1, cpus=1,
        memory=1024, initial_update_interval=0.2, update_interval=5.0,
        fetch_work_delay='ifThenElse(State == "Claimed" && Activity == "Idle", 0, 300)',
        env=waiting.env(JOBSTORE_HOOK_MODE="agent"))
    submitted: list[int] = []

    def submit_when_waiting() -> None:
        _parked(waiting, 1)
        submitted.extend(submit_jobs(store, 1, ordinary_owner()))

    thread = threading.Thread(target=submit_when_waiting, daemon=True)
    thread.start()
    Emulator(cfg).run(until=lambda: bool(submitted) and store.reads.get_job(
        submitted[0]).status == "completed", timeout=60, wait_for_jobs=True)
    thread.join(WAIT)
    assert submitted and store.reads.get_job(submitted[0]).status == "completed"


@pytest.mark.slow  # (make test's time on two cores)
def test_an_idle_node_claims_nothing_while_no_work_is_announced(
        waiting: Node, store: JobStore) -> None:  # noqa: F811
    """PostgreSQL announces new work: a slot's fetch after one whose claim found nothing waits
    without a claim (jobstore_agent_fetch_waits_total{how="quiet"}), and still gets the job
    submitted while it waits. SQLite announces nothing: every fetch claims."""
    quiet = 'jobstore_agent_fetch_waits_total{how="quiet"}'
    claimed = 'jobstore_agent_fetch_waits_total{how="claimed"}'
    assert _out(_fetch(waiting, "slot1@node01")) == b""
    proc = _fetch(waiting, "slot1@node01")
    _parked(waiting, 1)
    pg = waiting.db_url.startswith("postgresql")
    assert (_metric(waiting, quiet), _metric(waiting, claimed)) == ((1, 1) if pg else (0, 2))
    claims = _metric(waiting, "jobstore_agent_claims_total")
    assert claims == 1 if pg else claims >= 2  # SQLite's waiting fetch claims at each poll too
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    assert f"JobstoreJobId = {job_id}".encode() in _out(proc)


@pytest.mark.slow  # (waits for the agent's second try)
def test_a_new_agent_nudges_the_startd_until_its_first_fetch(node: Node, store: JobStore) -> None:  # noqa: F811
    """A startd runs its first FETCH_WORK only at its first periodic update; the agent sends it
    UPDATE_MACHINE_AD (JOBSTORE_AGENT_NUDGE_COMMAND, condor_update_machine_ad's arguments) until
    it took one, and stops once the startd's first fetch came."""
    calls = node.base / "nudges"
    tool = node.base / "fake_update_machine_ad"
    tool.write_text(f'#!/bin/sh\ncat "$1" >> {calls}\ntest "$(wc -l < {calls})" -ge 2\n')
    tool.chmod(0o755)
    node.start(_CONDOR_JOBSTORE_AGENT_NUDGE_COMMAND=str(tool))
    node.wait_log("startd not nudged yet")  # its first try: as if the startd were not up
    node.wait_log("startd nudged to fetch now")
    lines = calls.read_text().splitlines()
    assert len(lines) == 2 and all(re.fullmatch(r"JobstoreAgentStartTime = \d+", x)
                                   for x in lines)
    assert "no more nudges" not in node.log.read_text()
    node.hook("fetch_job", slot_ad("slot1@node01"), JOBSTORE_HOOK_MODE="agent")
    node.wait_log("the startd fetches: no more nudges")
    assert len(calls.read_text().splitlines()) == 2


def test_the_agent_nudges_a_startd_again_whenever_it_goes_quiet(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A startd restarted by the condor_master (after SIGKILL, say) does not fetch before its
    first UPDATE_INTERVAL either: once no fetch came for QUIET seconds and none waits, the
    agent nudges again; while fetches come, never."""
    from jobstore.agent import startdnudge

    monkeypatch.setattr(startdnudge, "QUIET", 0.4)
    monkeypatch.setattr(startdnudge, "NUDGE_EVERY", 0.05)
    monkeypatch.setattr(startdnudge, "NUDGE_AGAIN", 0.3)
    calls = tmp_path / "nudges"
    tool = tmp_path / "update_machine_ad"
    tool.write_text(f"#!/bin/sh\necho nudge >> {calls}\n")
    tool.chmod(0o755)
    waiting = [0]
    fetches = startdnudge.FetchActivity(lambda: waiting[0])
    stop = threading.Event()
    nudger = threading.Thread(target=startdnudge.nudge_startd,
                              args=(str(tool), time.time(), fetches, stop.is_set))
    nudger.start()
    try:
        _until(lambda: calls.exists())  # quiet from the start: nudged
        for _ in range(20):  # a fetch every 0.05 s: never quiet
            fetches.seen()
            time.sleep(0.05)
        busy = len(calls.read_text().splitlines())
        waiting[0] = 1  # a fetch waits in the agent: not quiet either
        time.sleep(0.8)
        assert len(calls.read_text().splitlines()) == busy
        waiting[0] = 0  # the startd died: nothing waits, nothing comes
        _until(lambda: len(calls.read_text().splitlines()) > busy)
    finally:
        stop.set()
        nudger.join(5)


def test_work_no_waiting_fetch_can_take_nudges_the_startd_only_for_a_slot_just_freed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Announced work that no waiting fetch could take nudges the startd (its Claimed/Idle
    slot then fetches before its timer) only while a slot whose job has just ended has not
    fetched again; a node whose slots are busy or waiting is never nudged for it."""
    from jobstore.agent import startdnudge

    monkeypatch.setattr(startdnudge, "NUDGE_EVERY", 0.2)
    calls = tmp_path / "nudges"
    tool = tmp_path / "update_machine_ad"
    tool.write_text(f"#!/bin/sh\necho nudge >> {calls}\n")
    tool.chmod(0o755)
    fetches = startdnudge.FetchActivity(lambda: 0)
    fetches.seen("slot1@node01")  # the startd fetches: no quiet-spell nudges
    stop = threading.Event()
    nudger = threading.Thread(target=startdnudge.nudge_startd,
                              args=(str(tool), time.time(), fetches, stop.is_set))
    nudger.start()
    try:
        fetches.starved()  # every slot busy (no job ended): nothing to nudge for
        time.sleep(0.5)  # (not a speed assertion: only time for a wrong nudge to happen)
        assert not calls.exists()
        fetches.freed("slot1@node01")
        fetches.starved()
        _until(lambda: calls.exists())
        fetches.seen("slot1@node01")  # it fetched: no longer a slot in waiting
        fetches.starved()
        time.sleep(0.8)
        assert len(calls.read_text().splitlines()) == 1
    finally:
        stop.set()
        nudger.join(10)


def _until(probe: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.02)


@pytest.mark.slow  # (one fetch waits its bound)
def test_two_nodes_one_job_one_claim(waiting: Node, store: JobStore) -> None:  # noqa: F811
    """Two nodes (two agents on one database), a waiting fetch on each, one job: one node's
    fetch returns it, the other's nothing; the job was claimed once."""
    import shutil

    other_base = waiting.base / "other"
    other_base.mkdir()
    other_config = other_base / "condor_config"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mine = f"JOBSTORE_AGENT_METRICS_PORT = {waiting.metrics_port}"  # type: ignore[attr-defined]
    other_config.write_text(waiting.config.read_text().replace(
        mine, f"JOBSTORE_AGENT_METRICS_PORT = {port}"))
    shutil.copytree(waiting.base / "spool", other_base / "spool")
    other = Node(other_base, waiting.db_url, other_config, str(other_base / "agent.sock"),
                 waiting.hooks, other_base / "agent.log")
    try:
        other.start(_CONDOR_JOBSTORE_FETCH_WAIT=BOUND)
        other.wait_log("metrics served on")
        other.metrics = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
        first, second = _fetch(waiting, "slot1@node01"), _fetch(other, "slot1@node02")
        _parked(waiting, 1)
        _parked(other, 1)
        _one_claim(store, first, second)
    finally:
        if other.agent is not None:
            other.stop()


REQUEST = b"JSA1" + (4).to_bytes(4, "big") + (0).to_bytes(4, "big")  # one empty item


class _FakeAgent:
    """A socket served by this test's account that answers each call with `frames` (each a
    list of items), `gap` seconds apart."""

    def __init__(self, path: str, frames: list[list[bytes]], gap: float) -> None:
        import threading

        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen()
        self.frames, self.gap = frames, gap
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        from jobstore.agent.protocol import encode

        conn, _ = self.listener.accept()
        with conn:
            header = conn.recv(8, socket.MSG_WAITALL)
            conn.recv(int.from_bytes(header[4:8], "big"), socket.MSG_WAITALL)
            for frame in self.frames:
                time.sleep(self.gap)
                try:
                    conn.sendall(encode(frame))
                except OSError:  # the hook gave up: what the test looks for
                    return


@pytest.mark.parametrize(("hold", "answered"), [(b"2", True), (b"0.2", False)])
def test_the_agents_hold_moves_a_fetchs_deadline_within_its_limit(
        tmp_path, hold: bytes, answered: bool) -> None:
    """A `hold` moves the deadline on by its seconds (the answer 0.6 s after it is read), and
    never past the limit the hook gives (a short hold: the late answer is not waited for)."""
    import os

    from jobstore.agent.client import ask
    from jobstore.agent.protocol import HOLD, OK

    path = str(tmp_path / "agent.sock")
    _FakeAgent(path, [[HOLD, hold], [OK, b"0", b"JobstoreJobId = 7\n", b""]], gap=0.3)
    now = time.monotonic()
    try:
        if answered:
            items = ask(path, REQUEST, now + 0.5, (os.getuid(),), hold_limit=now + 5)
            assert items is not None and items[:3] == [OK, b"0", b"JobstoreJobId = 7\n"]
        else:
            with pytest.raises(TimeoutError):
                ask(path, REQUEST, now + 0.5, (os.getuid(),), hold_limit=now + 5)
        with pytest.raises(TimeoutError):  # the limit bounds the hold
            _FakeAgent(path + "2", [[HOLD, b"60"], [OK, b"0", b"", b""]], gap=0.3)
            ask(path + "2", REQUEST, time.monotonic() + 0.5, (os.getuid(),),
                hold_limit=time.monotonic() + 0.45)
    finally:
        signal.alarm(0)


@pytest.mark.parametrize("hold", [b"x", b"-1", b"100000"])
def test_a_fetch_hook_given_a_bad_hold_prints_nothing_and_says_why(tmp_path, hold: bytes) -> None:
    """The hook process, given a hold that is not a number of seconds within its limit:
    nothing on stdout, one line on stderr, exit 0, at once."""
    import os
    import sys

    from jobstore.agent.protocol import HOLD, OK

    path = str(tmp_path / "agent.sock")
    _FakeAgent(path, [[HOLD, hold], [OK, b"0", b"JobstoreJobId = 7\n", b""]], gap=0)
    code = f"from jobstore.agent.client import main; main('fetch_job', None, ({os.getuid()},))"
    done = subprocess.run(
        [sys.executable, "-c", code], input=slot_ad("slot1@node01"), capture_output=True,
        timeout=WAIT, env={**os.environ, "JOBSTORE_AGENT_SOCKET": path,
                           "JOBSTORE_HOOK_MODE": "agent"})
    assert (done.returncode, done.stdout) == (0, b"")
    assert done.stderr.decode().count("\n") == 1 and "hold" in done.stderr.decode()


@pytest.mark.slow  # (waits past the hook's own 10 s deadline)
def test_a_wait_longer_than_the_hooks_own_deadline_is_held_by_the_agent(
        node: Node, store: JobStore) -> None:  # noqa: F811
    """JOBSTORE_FETCH_WAIT beyond the fetch hook's own deadline (10 s): the agent's hold keeps
    the hook waiting, and a job submitted 11 s into the wait is what it returns."""
    node.start(_CONDOR_JOBSTORE_FETCH_WAIT="20")
    started = time.monotonic()
    proc = _fetch(node, "slot1@node01")
    time.sleep(11)
    assert proc.poll() is None
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    assert f"JobstoreJobId = {job_id}".encode() in _out(proc)
    assert time.monotonic() - started > 11


@pytest.mark.slow  # (waits out a claim lease)
def test_a_job_whose_claim_lease_expired_wakes_a_waiting_fetch(
        node: Node, store: JobStore) -> None:  # noqa: F811
    """A job fetched for a slot that never answered (no REPLY_FETCH) is requeued when its claim
    lease expires (any node's upkeep: here the test's reap); a fetch already waiting on another
    slot returns it, its second claim."""
    node.start(_CONDOR_JOBSTORE_FETCH_WAIT="30", _CONDOR_JOBSTORE_CLAIM_LEASE="5")
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    assert f"JobstoreJobId = {job_id}".encode() in _out(_fetch(node, "slot1@node01"))
    proc = _fetch(node, "slot2@node01")
    time.sleep(6)  # the claim lease (5 s) runs out
    assert proc.poll() is None and store.reads.get_job(job_id).status == "fetched"
    store.maintenance.reap()
    assert f"JobstoreJobId = {job_id}".encode() in _out(proc)
    row = store.reads.get_job(job_id)
    assert (row.status, row.claims, row.slot) == ("fetched", 2, "slot2@node01")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_timer_wake_reads_and_claims_only_when_a_job_is_idle(
        waiting: Node, store: JobStore) -> None:  # noqa: F811
    """SQLite announces nothing: the agent wakes a waiting fetch every half second, which
    reads whether its queue has an idle job and claims only then (an empty queue: no claim
    after the fetch's first), and still returns the job submitted while it waits."""
    proc = _fetch(waiting, "slot1@node01")
    _parked(waiting, 1)
    time.sleep(2)  # four timer wake-ups
    assert _metric(waiting, "jobstore_agent_claims_total") == 1 and proc.poll() is None
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    assert f"JobstoreJobId = {job_id}".encode() in _out(proc)
    assert _metric(waiting, "jobstore_agent_claims_total") == 2


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_forged_notifications_wake_no_fetch(waiting: Node, store: JobStore) -> None:  # noqa: F811
    """Anyone who may connect may NOTIFY: 2,000 unsigned shapes that fit the waiting slot, and
    a real one of the database's replayed, wake nothing (no claim, the wait goes on, the agent
    says what it dropped); the next real job still reaches the waiting fetch at once."""
    import psycopg

    from jobstore.testing.support import libpq_url

    proc = _fetch(waiting, "slot1@node01")
    _parked(waiting, 1)
    claims = _metric(waiting, "jobstore_agent_claims_total")
    with psycopg.connect(libpq_url(waiting.db_url), autocommit=True) as conn:
        conn.execute("LISTEN jobstore_work")
        submit_jobs(store, 1, ordinary_owner(), queue="elsewhere")  # a real one, not for us
        (real,) = [n.payload for n in conn.notifies(timeout=10, stop_after=1)]
        with conn.transaction():
            conn.execute("SELECT pg_notify('jobstore_work', 'default 1 ' || i || ' 1')"
                         " FROM generate_series(1, 2000) AS i")
        for _ in range(3):  # signed, but replayed: the agent saw it already
            conn.execute("SELECT pg_notify('jobstore_work', %s)", (real,))
    waiting.wait_log("dropped: not signed by the database, or replayed")
    time.sleep(1)  # a woken fetch would claim now
    assert _metric(waiting, "jobstore_agent_claims_total") == claims and proc.poll() is None
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    assert f"JobstoreJobId = {job_id}".encode() in _out(proc)


def _busy(name: str, starter: int) -> bytes:
    """A static slot's ad while its job runs, its starter `starter`."""
    return slot_ad(name).replace(b'State = "Unclaimed"\nActivity = "Idle"',
                                 b'State = "Claimed"\nActivity = "Busy"') + (
        f'SlotType = "Static"\nStarterPid = {starter}\n').encode()


def test_a_busy_slots_fetch_waits_for_its_job_and_takes_the_next_one_on_its_claim(
        waiting: Node, store: JobStore, tmp_path: Path) -> None:  # noqa: F811
    """A static slot's fetch while its job runs (Claimed/Busy, its condor_starter alive)
    waits in the agent and is handed nothing while the starter lives; once the starter is
    reaped, it is served for the slot as it is then (Claimed/Idle) and returns the job, where
    an empty answer would have ended the slot's claim."""
    exe = tmp_path / "condor_starter"
    shutil.copy("/bin/sleep", exe)
    starter = subprocess.Popen([str(exe), "30"])
    try:
        proc = _fetch_ad(waiting, _busy("slot1@node01", starter.pid))
        _parked(waiting, 1)
        (job_id,) = submit_jobs(store, 1, ordinary_owner())
        time.sleep(0.5)  # (not a speed assertion: only time for a wrong hand-out to happen)
        assert proc.poll() is None and store.reads.get_job(job_id).status == "idle"
    finally:
        starter.kill()
        starter.wait()
    assert f"JobstoreJobId = {job_id}".encode() in _out(proc)
    row = store.reads.get_job(job_id)
    assert (row.status, row.slot) == ("fetched", "slot1@node01")


def test_a_busy_slot_whose_starter_is_not_here_is_answered_at_once(
        waiting: Node, store: JobStore) -> None:  # noqa: F811
    """A busy slot ad naming no condor_starter of this machine (a recorded ad, another
    process) is answered as before: nothing, at once, and no job is handed out."""
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    proc = _fetch_ad(waiting, _busy("slot1@node01", os.getpid()))
    out, _err = proc.communicate(timeout=2.5)  # not held to its bound (3 s at least)
    assert out == b""
    assert store.reads.get_job(job_id).status == "idle"


def test_a_busy_slots_fetch_whose_starter_has_just_ended_is_served_for_the_idle_slot(
        waiting: Node, store: JobStore) -> None:  # noqa: F811
    """The job ended between the startd's writing of the ad and the agent's reading of it (its
    starter is gone, the ad was written moments ago): the fetch is served for the slot as it is
    now, Claimed/Idle, and returns the job; a recorded ad's gone starter is not this."""
    gone = subprocess.Popen(["/bin/true"])
    gone.wait()
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    old = _fetch_ad(waiting, _busy("slot2@node01", gone.pid) + b"MyCurrentTime = 1795324186\n")
    out, _err = old.communicate(timeout=2.5)
    assert out == b"" and store.reads.get_job(job_id).status == "idle"
    now = f"MyCurrentTime = {int(time.time())}\n".encode()
    assert f"JobstoreJobId = {job_id}".encode() in _out(
        _fetch_ad(waiting, _busy("slot1@node01", gone.pid) + now))
