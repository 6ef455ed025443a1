"""The local report spool: what a killed hook leaves behind is sent once or cleaned up."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from jobstore.node import spool


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_writer_killed_before_rename(tmp_path: Path) -> None:
    """A complete report whose writer died before its rename is sent; a half-written one is
    dropped; one still being written by a live process is left alone."""
    d = tmp_path / "spool"
    d.mkdir(mode=0o700)
    dead = _dead_pid()
    (d / f".00000000000000000001-{dead}-abcd.tmp").write_text(json.dumps({"n": 1}))
    (d / f".00000000000000000002-{dead}-beef.tmp").write_text('{"n": ')
    live = d / f".00000000000000000003-{os.getppid()}-cafe.tmp"
    live.write_text("{}")
    sent: list[dict] = []
    assert spool.replay(d, lambda r, uid: sent.append(r))[:3] == (1, 0, 0)
    assert sent == [{"n": 1}]
    assert os.listdir(d) == [live.name]


def test_taker_killed_while_sending(tmp_path: Path) -> None:
    d = tmp_path / "spool"
    d.mkdir(mode=0o700)
    path = spool.put(d, {"n": 2})
    os.rename(path, d / f".{path.name}.{_dead_pid()}.taking")
    sent: list[dict] = []
    assert spool.replay(d, lambda r, uid: sent.append(r))[:3] == (1, 0, 0)
    assert sent == [{"n": 2}] and os.listdir(d) == []


def test_failed_send_keeps_order(tmp_path: Path) -> None:
    d = tmp_path / "spool"
    first, second = spool.put(d, {"n": 1}), spool.put(d, {"n": 2})

    def down(_record: dict, _uid: int) -> spool.Later:
        return spool.Later("database away")

    assert spool.replay(d, down) == (0, 2, 0, (  # and why each was left
        ("its database is away: database away", 1),
        ("an earlier report of the same job could not be sent (kept in order)", 1)), False)
    assert sorted(os.listdir(d)) == sorted([first.name, second.name])
    sent: list[dict] = []
    assert spool.replay(d, lambda r, uid: sent.append(r))[:3] == (2, 0, 0)
    assert sent == [{"n": 1}, {"n": 2}]


def test_a_report_of_another_store_is_left_and_keeps_nothing_back(tmp_path: Path) -> None:
    """A sender's NotMine leaves that report in the spool and sends the ones after it; what a
    sender raises is quarantined."""
    d = tmp_path / "spool"
    other, _mine, bad = (spool.put(d, {"n": n}) for n in range(3))
    sent: list[dict] = []

    def send(record: dict, _uid: int) -> spool.NotMine | None:
        if record["n"] == 0:
            return spool.NotMine()
        if record["n"] == 2:
            raise ValueError("not a report")
        sent.append(record)
        return None

    assert spool.replay(d, send) == (1, 1, 1, (
        ("about a job of another job store (its keyword's replay sends it)", 1),), False)
    assert sent == [{"n": 1}]
    left = os.listdir(d)
    (quarantined,) = [n for n in left if n != other.name]
    assert other.name in left
    assert quarantined.startswith(f".{bad.name}.") and quarantined.endswith(".bad")


def test_a_held_report_is_never_sent_by_a_replayer_too(tmp_path: Path, monkeypatch) -> None:
    """A hook's own report is held from the moment it appears in the spool: a replayer that
    lists the directory at any point while the hook writes it (here: while the directory is
    synced) leaves it to the hook, so the database never gets it twice."""
    d = tmp_path / "spool"
    d.mkdir(mode=0o700)
    sent: list[dict] = []
    sync = spool._fsync_dir

    def replay_meanwhile(directory: Path) -> None:
        sync(directory)
        with monkeypatch.context() as other:  # a replayer in another (live) process
            other.setattr(spool.os, "getpid", lambda: 1)
            other.setattr(spool, "_fsync_dir", sync)
            spool.replay(directory, lambda r, uid: sent.append(r))

    monkeypatch.setattr(spool, "_fsync_dir", replay_meanwhile)
    held = spool.hold(d, {"n": 3})
    assert sent == []
    assert os.listdir(d) == [held.path.name]
    spool.done(held.path)
    assert os.listdir(d) == []


def test_a_late_report_keeps_the_time_it_was_made(tmp_path: Path, monkeypatch) -> None:
    """A report sent at once is recorded at the time it is applied; one applied later (a
    replay from the spool) also keeps, as ReportedAt, the time its hook made it."""
    import time

    from jobstore.core.jobs import JobSpec
    from jobstore.db.engine import upgrade
    from jobstore.db.store import JobStore
    from jobstore.node.reports import Caller
    from jobstore.node.sending import send_record, store_identity
    from jobstore.node.services import direct
    from jobstore.testing.factories import claim

    url = f"sqlite:///{tmp_path / 'jobstore.db'}"
    upgrade(url)
    monkeypatch.setenv("JOBSTORE_DATABASE_URL", url)
    store = JobStore.from_url(url)
    store.submissions.submit([JobSpec(cmd="/bin/true")], owner="alice", queue="default",
                             max_attempts=1)
    job = claim(store, slot="slot1@node01")
    assert job is not None
    made = time.time() - 60

    def record(event: str, at: float) -> dict:
        return {"keyword": "JOBSTORE", "job_id": job.id, "event": event, "token": job.token,
                "attempt": job.claims, "changes": {}, "attrs": {}, "slot": "slot1",
                "time": at, "store": store_identity(url)}

    send_record(record("accept", time.time()), Caller(), node=direct())
    send_record(record("start", made), Caller(), node=direct())
    attrs = {e.event: e.attrs for e in store.reads.events(job.id)}
    assert not (attrs["accept"] or {}).get("ReportedAt")
    assert (attrs["start"] or {})["ReportedAt"] == made
    store.db.engine.dispose()


def test_one_replay_of_a_spool_at_a_time(tmp_path: Path, monkeypatch) -> None:
    """While one replayer (the agent) sends a spool's reports, another (a
    hook) sends none of them, so one job's reports are never applied out of order."""
    d = tmp_path / "spool"
    d.mkdir(mode=0o700)
    for n in range(3):
        spool.put(d, {"n": n})
    monkeypatch.setattr(spool, "REPLAY_LOCK_WAIT", 0.2)
    held = spool._lock_replays(d)
    assert held is not None and held >= 0
    sent: list[dict] = []
    try:
        busy = spool.replay(d, lambda r, uid: sent.append(r))
        assert sent == [] and busy.sent == 0
        assert busy.busy  # another replay of this spool is under way
    finally:
        os.close(held)
    assert spool.replay(d, lambda r, uid: sent.append(r))[:3] == (3, 0, 0)
    assert [r["n"] for r in sent] == [0, 1, 2]


def test_a_spool_of_this_process_own_reports_is_passed_without_the_lock(
        tmp_path: Path, monkeypatch) -> None:
    """With nothing in the spool but the reports this process holds, a replay sends nothing
    and takes no lock (another replayer holding it does not delay it); a waiting report, or
    one another live process holds or writes, sends it the long way, which waits for the
    lock; so does a replay while another of this process's threads replays."""
    d = tmp_path / "spool"
    d.mkdir(mode=0o700)
    own = spool.hold(d, {"n": 1})
    monkeypatch.setattr(spool, "REPLAY_LOCK_WAIT", 0.1)
    lock = spool._lock_replays(d)
    assert lock is not None and lock >= 0
    sent: list[dict] = []
    try:
        assert spool.replay(d, lambda r, uid: sent.append(r)) == spool.Replayed(0, 0)
        monkeypatch.setattr(spool, "_replaying", 1)
        assert spool.replay(d, lambda r, uid: sent.append(r)).busy
        monkeypatch.setattr(spool, "_replaying", 0)
        for name in (f".00000000000000000001-{os.getppid()}-abcd.report.{os.getppid()}.taking",
                     f".00000000000000000002-{os.getppid()}-abcd.tmp",
                     "00000000000000000003-1-abcd.report"):
            (d / name).write_text("{}")
            assert spool.replay(d, lambda r, uid: sent.append(r)).busy
            os.unlink(d / name)
    finally:
        os.close(lock)
    assert sent == [] and os.listdir(d) == [own.path.name]


def test_a_spool_checked_a_moment_ago_is_checked_again_once_it_changed(tmp_path: Path) -> None:
    """ensure_dir trusts its last check only while the directory is the same one with the same
    owner and mode: a directory put in its place, or opened to others, is checked anew."""
    d = tmp_path / "spool"

    def repaired(mode: int) -> list[str]:
        if os.geteuid() == 0:
            return [f"spool {d} had mode {mode:o}: now 1733"]
        return [f"spool {d} was open to others: now 0700"]

    assert spool.ensure_dir(d) == []
    assert spool.ensure_dir(d) == []
    os.chmod(d, 0o777)
    assert spool.ensure_dir(d) == repaired(0o777)
    os.rename(d, tmp_path / "aside")
    d.mkdir(mode=0o755)
    assert spool.ensure_dir(d) == repaired(0o755)
    assert spool.ensure_dir(d) == []
