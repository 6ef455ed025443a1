"""`jobstore watch` and the subscriber API: every event once and in order, on PostgreSQL (LISTEN
and poll) and SQLite; the watcher runs as its own process where it matters. No timing
assertions: waits are generous, the assertions are about content."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from datetime import datetime

import clirun
import psycopg
import pytest
from backends import BOTH_BACKENDS
from hookrun import hook_env
from hookseq import ordinary_owner, run_sequence, submit_jobs
from privatepg import private_pg  # noqa: F401 - the module-scoped private cluster fixture

from jobstore.api.watch import JobEvent, JobFinished, subscribe, watch
from jobstore.core.claims import Verdict
from jobstore.core.policy import exit_verdict
from jobstore.core.states import Event
from jobstore.db.channels import CHANNEL as NOTIFY_CHANNEL
from jobstore.db.engine import upgrade
from jobstore.db.store import JobStore
from jobstore.testing.factories import claim, report
from jobstore.testing.support import first, libpq_url

TIMEOUT = 120


class Watcher:
    """`jobstore watch --json ...` as a separate process; stdout/stderr drained by threads."""

    def __init__(self, url: str, *args: str) -> None:
        self.url = url
        cmd = [sys.executable, "-m", "jobstore.cli", "--db", url, "watch", "--json", *args]
        self.proc = clirun.popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.err: list[str] = []
        self._threads = [threading.Thread(target=self._drain, args=(s, d), daemon=True)
                         for s, d in ((self.proc.stdout, self.lines), (self.proc.stderr, self.err))]
        for t in self._threads:
            t.start()

    @staticmethod
    def _drain(stream, into: list[str]) -> None:  # type: ignore[no-untyped-def]
        for line in stream:
            into.append(line)

    def wait_listening(self) -> None:
        """PostgreSQL: until the watcher's LISTEN connection is there."""
        deadline = time.monotonic() + TIMEOUT
        with psycopg.connect(libpq_url(self.url), autocommit=True) as conn:
            while True:
                n = first(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                 "current_database() AND query = %s",
                                 (f"LISTEN {NOTIFY_CHANNEL}",)))
                if n:
                    return
                assert self.proc.poll() is None, "".join(self.err)
                assert time.monotonic() < deadline, "the watcher never LISTENed"
                time.sleep(0.1)

    def wait_lines(self, n: int) -> None:
        deadline = time.monotonic() + TIMEOUT
        while len(self.lines) < n:
            assert self.proc.poll() is None or len(self.lines) >= n, "".join(self.err)
            assert time.monotonic() < deadline, f"only {len(self.lines)} lines"
            time.sleep(0.05)

    def wait_stderr(self, text: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while text not in "".join(self.err):
            assert time.monotonic() < deadline, f"no {text!r} on stderr: {self.err}"
            time.sleep(0.1)

    def finish(self) -> tuple[int, list[dict]]:
        try:
            rc = self.proc.wait(TIMEOUT)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        for t in self._threads:
            t.join(10)
        return rc, [json.loads(line) for line in self.lines]


def db_events(store: JobStore, job_ids: list[int], after: int = 0) -> list[dict]:
    return [e.to_json() for j in job_ids for e in store.reads.events(j, after_id=after)]


def check_stream(records: list[dict], expected: list[dict]) -> None:
    """Every expected event exactly once, each job's in order, then one `finished` per job."""
    events = [r for r in records if r["event"] != "finished"]
    ids = [e["id"] for e in events]
    assert len(ids) == len(set(ids)), "an event was shown twice"
    assert sorted(ids) == sorted(e["id"] for e in expected)
    by_id = {e["id"]: e for e in expected}
    for e in events:
        want = by_id[e["id"]]
        assert (e["job_id"], e["event"], e["from_status"], e["to_status"], e["attempt"]) == (
            want["job_id"], want["event"], want["from_status"], want["to_status"],
            want["attempt"])
    for job in {e["job_id"] for e in expected}:
        mine = [r for r in records if r["job_id"] == job]
        ev_ids = [r["id"] for r in mine if r["event"] != "finished"]
        assert ev_ids == sorted(ev_ids), f"job {job}: events out of order"


@pytest.fixture(params=["sqlite", "pg-listen", "pg-poll"])
def watch_db(request: pytest.FixtureRequest) -> tuple[str, list[str]]:
    """(database URL, extra watch arguments); `pg-listen` gets no catch-up read to speak of,
    so that only notifications can deliver the live events."""
    if request.param == "sqlite":
        url, extra = request.getfixturevalue("sqlite_url"), []
    elif request.param == "pg-listen":
        url, extra = request.getfixturevalue("pg_url"), ["--catch-up", "3600"]
    else:
        url, extra = request.getfixturevalue("pg_url"), ["--poll"]
    upgrade(url)
    return url, extra


def _start(url: str, extra: list[str], *args: str) -> Watcher:
    w = Watcher(url, *extra, *args)
    if "--catch-up" in extra:
        w.wait_listening()
    return w


# ---- the live stream ------------------------------------------------------------------------


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_hook_run_seen_in_order_exactly_once(db_url, hook_dir, condor_config, tmp_path):
    url, extra = db_url, ([] if db_url.startswith("sqlite") else ["--catch-up", "3600"])
    upgrade(url)
    store = JobStore.from_url(url)
    try:
        [job] = submit_jobs(store, 1, ordinary_owner())
        cluster = store.reads.get_job(job).cluster_id
        since = store.reads.last_event_id()
        w = _start(url, extra, str(cluster), "--until-done", "--since", str(since))
        env = hook_env(url, condor_config, JOBSTORE_SPOOL=str(tmp_path / "spool"))
        seq = run_sequence(hook_dir, env, "slot1@node01.example.org")
        assert seq.job_id == job
        rc, records = w.finish()
        assert rc == 0, "".join(w.err)
        expected = db_events(store, [job], since)
        assert [e["event"] for e in expected][:2] == ["fetch", "accept"]
        check_stream(records, expected)
        assert records[-1]["event"] == "finished"
        assert records[-1]["status"] == "completed" and records[-1]["succeeded"] is True
    finally:
        store.db.engine.dispose()


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_burst_complete_no_duplicates(watch_db):
    """500 transitions from 4 writers at once (commit order differs from id order on
    PostgreSQL) arrive complete, each once; removing the jobs ends --until-done with 1."""
    url, extra = watch_db
    store = JobStore.from_url(url)
    try:
        jobs = submit_jobs(store, 4, ordinary_owner())
        cluster = store.reads.get_job(jobs[0]).cluster_id
        since = store.reads.last_event_id()
        w = _start(url, extra, str(cluster), "--until-done", "--since", str(since))
        errors: list[BaseException] = []

        def writer(job: int) -> None:
            s = JobStore.from_url(url)
            try:
                for _ in range(62):
                    assert s.actions.admin(job, Event.HOLD).changed
                    assert s.actions.admin(job, Event.RELEASE).changed
                assert s.actions.admin(job, Event.REMOVE).changed
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                s.db.engine.dispose()

        threads = [threading.Thread(target=writer, args=(j,)) for j in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        rc, records = w.finish()
        assert rc == 1, "".join(w.err)
        expected = db_events(store, jobs, since)
        assert len(expected) == 500
        check_stream(records, expected)
        finished = [r for r in records if r["event"] == "finished"]
        assert sorted(r["job_id"] for r in finished) == sorted(jobs)
        assert all(r["status"] == "removed" and not r["succeeded"] for r in finished)
    finally:
        store.db.engine.dispose()


@BOTH_BACKENDS
def test_since_replays_history_then_follows(db_url):
    """A late watcher: --since 0 replays the whole history, then follows live changes."""
    upgrade(db_url)
    store = JobStore.from_url(db_url)
    try:
        [job] = submit_jobs(store, 1, ordinary_owner())
        cluster = store.reads.get_job(job).cluster_id
        store.actions.admin(job, Event.HOLD)
        store.actions.admin(job, Event.RELEASE)
        w = Watcher(db_url, f"{cluster}.0", "--until-done", "--since", "0")
        w.wait_lines(3)  # the history first: the removal below is followed live
        store.actions.admin(job, Event.REMOVE)
        rc, records = w.finish()
        assert rc == 1
        expected = db_events(store, [job])
        assert [e["event"] for e in expected] == ["submit", "hold", "release", "remove"]
        check_stream(records, expected)
        assert [r["event"] for r in records][-1] == "finished"
    finally:
        store.db.engine.dispose()


# ---- --until-done exit status -----------------------------------------------------------------


def _run(store: JobStore, job: int, event: Event, exit_code: int = 0) -> None:
    claimed = claim(store, claim_lease=60, judge=lambda row: Verdict(take=row.id == job))
    assert claimed is not None and claimed.id == job
    attrs = {"ExitCode": exit_code, "ExitBySignal": False}
    report(store, claimed, event, changes={"exit_code": exit_code, "exit_by_signal": False},
           exit_policy=lambda row: exit_verdict(row, attrs))


def test_until_done_exit_status(sqlite_url):
    upgrade(sqlite_url)
    store = JobStore.from_url(sqlite_url)
    try:
        owner = ordinary_owner()
        ok, bad_code, removed = (submit_jobs(store, 1, owner)[0] for _ in range(3))
        [failed] = submit_jobs(store, 1, owner, max_attempts=1)
        _run(store, ok, Event.EXIT, 0)
        _run(store, bad_code, Event.EXIT, 3)
        store.actions.admin(removed, Event.REMOVE)
        _run(store, failed, Event.EVICT)
        c = {j: str(store.reads.get_job(j).cluster_id) for j in (ok, bad_code, removed, failed)}
        assert store.reads.get_job(bad_code).status == "completed"
        assert store.reads.get_job(failed).status == "failed"

        def status(*jobs: int) -> tuple[int, list[dict]]:
            return Watcher(sqlite_url, "--until-done", *(c[j] for j in jobs)).finish()

        rc, records = status(ok)
        assert rc == 0 and [(r["event"], r["succeeded"]) for r in records] == [("finished", True)]
        rc, records = status(ok, bad_code, removed, failed)
        assert rc == 1
        assert {r["job_id"]: (r["status"], r["succeeded"]) for r in records} == {
            ok: ("completed", True), bad_code: ("completed", False),
            removed: ("removed", False), failed: ("failed", False)}
        help_text = clirun.run([sys.executable, "-m", "jobstore.cli", "watch", "--help"],
                               capture_output=True, text=True).stdout
        assert "status 0 if all completed" in " ".join(help_text.split())
        usage = clirun.run([sys.executable, "-m", "jobstore.cli", "--db", sqlite_url,
                                "watch", "--status", "bogus"], capture_output=True, text=True)
        assert usage.returncode == 2
    finally:
        store.db.engine.dispose()


# ---- the Python API ---------------------------------------------------------------------------


@BOTH_BACKENDS
def test_api_iterator_filters_and_callback(db_url):
    upgrade(db_url)
    store = JobStore.from_url(db_url)
    try:
        owner = ordinary_owner()
        a = submit_jobs(store, 1, owner, queue="qa")[0]
        b = submit_jobs(store, 1, owner, queue="qb")[0]
        mark = store.reads.last_event_id()
        store.actions.admin(a, Event.HOLD)
        store.actions.admin(b, Event.HOLD)
        store.actions.admin(a, Event.REMOVE)
        # a queue filter, replayed from an event id, ends when the jobs of the filter end
        with subscribe(db_url, queue="qa", since=mark, until_done=True) as sub:
            got = list(sub)
        assert [(type(r), r.job_id) for r in got] == [
            (JobEvent, a), (JobEvent, a), (JobFinished, a)]
        assert [r.event for r in got] == ["hold", "remove", "finished"]
        assert got[2].status == "removed" and not got[2].succeeded
        # a status filter and a time: only transitions into `held`, from a minute ago
        with subscribe(db_url, jobs=[f"{store.reads.get_job(b).cluster_id}"], statuses=["held"],
                       since=datetime.fromtimestamp(time.time() - 60)) as sub:
            first = next(iter(sub))
        assert (first.job_id, first.event, first.to_status) == (b, "hold", "held")
        # the callback form, live
        seen: list = []
        sub = watch(db_url, seen.append, jobs=[str(store.reads.get_job(b).cluster_id)],
                    until_done=True, poll=True, interval=0.1)
        store.actions.admin(b, Event.REMOVE)
        assert sub.join(TIMEOUT), "the watch thread did not end"
        assert sub.error is None
        assert [r.event for r in seen] == ["remove", "finished"]
    finally:
        store.db.engine.dispose()


# ---- a PostgreSQL restart in the middle of a watch --------------------------------------------


def test_postgres_restart_mid_watch(private_pg):  # noqa: F811 - the imported fixture
    url = private_pg.create_database("watch_restart")
    upgrade(url)
    store = JobStore.from_url(url)
    try:
        jobs = submit_jobs(store, 2, ordinary_owner())
        cluster = store.reads.get_job(jobs[0]).cluster_id
        since = store.reads.last_event_id()
        w = Watcher(url, str(cluster), "--until-done", "--since", str(since))
        w.wait_listening()
        store.actions.admin(jobs[0], Event.HOLD)
        private_pg.stop()
        try:
            w.wait_stderr("retrying")
        finally:
            private_pg.start()
        store.actions.admin(jobs[0], Event.RELEASE)
        for j in jobs:
            store.actions.admin(j, Event.REMOVE)
        rc, records = w.finish()
        assert rc == 1
        assert "database back" in "".join(w.err)
        expected = db_events(store, jobs, since)
        assert [e["event"] for e in expected] == ["hold", "release", "remove", "remove"]
        check_stream(records, expected)
        assert sum(r["event"] == "finished" for r in records) == 2
    finally:
        store.db.engine.dispose()


def test_late_commit_of_a_younger_transaction_is_not_lost(pg_url: str) -> None:
    """A gap whose writer got its transaction id *after* the last completed one (so the id is
    not below the snapshot's xmax) is kept until that writer ends: its event is delivered.
    U takes xid u, T takes xid t > u and event id a, U takes event id b > a and commits; the
    follower sees b, then reads again while T still runs, then T commits."""
    from jobstore.api.feed import EventFollower

    upgrade(pg_url)
    store = JobStore.from_url(pg_url)
    try:
        j1, j2 = submit_jobs(store, 2, ordinary_owner())
        follower = EventFollower(store, store.reads.last_event_id())
        insert = ("INSERT INTO job_events (job_id, time, event) VALUES (%s, 0, 'hold') "
                  "RETURNING id")
        with psycopg.connect(libpq_url(pg_url)) as u, psycopg.connect(libpq_url(pg_url)) as t:
            u.execute("UPDATE jobs SET reason = 'u' WHERE id = %s", (j1,))
            t.execute("UPDATE jobs SET reason = 't' WHERE id = %s", (j2,))
            a = first(t.execute(insert, (j2,)))
            b = first(u.execute(insert, (j1,)))
            assert a < b
            u.commit()
            delivered, _ = follower.read()
            assert [r.event.id for r in delivered] == [b]
            again, _ = follower.read()  # T still runs: its id must stay a gap
            assert again == [] and a in follower.gaps
            t.commit()
        late, _ = follower.read()
        assert [r.event.id for r in late] == [a]
    finally:
        store.db.engine.dispose()
