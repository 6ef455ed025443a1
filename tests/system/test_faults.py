"""Faults: the database stopped in the middle of an emulator run, hook processes killed with
SIGKILL at random points, many slots claiming at once. Each test prints a `FAULTS:` summary line
(see it with -s)."""

from __future__ import annotations

import multiprocessing
import os
import pwd
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from bulk import fill
from emulatornode import JOB_USERS, SERVICE_ACCOUNT, emulated_node, ensure_home_account, submit_text
from hookrun import hook_env
from hookseq import ordinary_owner, run_sequence, slot_ad, submit_jobs
from privatepg import private_pg  # noqa: F401 - the module-scoped private cluster fixture

from jobstore.core.states import Event
from jobstore.db.engine import DatabaseError, make_engine, upgrade
from jobstore.db.schema import job_events, jobs
from jobstore.db.store import JobStore, Offer
from jobstore.emulator import Emulator
from jobstore.node import spool
from jobstore.node.sending import record_group, spool_sender
from jobstore.node.services import direct
from jobstore.testing.factories import claim, claim_request, report, submit

FINAL = {"completed", "failed", "removed"}
ENDS_ATTEMPT = {"idle", "completed", "failed", "held", "removed"}


# ---- checks over job_events ----------------------------------------------------------------


def _all_events(url: str) -> dict[int, list[dict]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = [dict(r._mapping) for r in
                    conn.execute(sa.select(job_events).order_by(job_events.c.id))]
    finally:
        engine.dispose()
    by_job: dict[int, list[dict]] = {}
    for r in rows:
        by_job.setdefault(r["job_id"], []).append(r)
    return by_job


def check_history(job_id: int, events: list[dict]) -> list[str]:
    """Problems with one job's history: status changes that do not chain (from == previous to,
    starting with submit -> idle), a fetch while an attempt is open (two slots at once),
    attempt numbers that do not increase, a change by an attempt that is not the open one."""
    problems: list[str] = []
    changes = [e for e in events if e["to_status"] is not None]
    if not changes or (changes[0]["event"], changes[0]["from_status"],
                       changes[0]["to_status"]) != ("submit", None, "idle"):
        return [f"job {job_id}: does not start with submit -> idle"]
    status = "idle"
    open_attempt: int | None = None
    last_attempt = 0
    for e in changes[1:]:
        where = f"job {job_id} event {e['id']} {e['event']}"
        if e["from_status"] != status:
            problems.append(f"{where}: from {e['from_status']}, but the job was {status}")
        if e["event"] == "fetch":
            if open_attempt is not None:
                problems.append(f"{where}: fetched while attempt {open_attempt} is open")
            if e["attempt"] is None or e["attempt"] <= last_attempt:
                problems.append(f"{where}: attempt {e['attempt']} after {last_attempt}")
            open_attempt = last_attempt = e["attempt"]
        elif open_attempt is not None and e["attempt"] != open_attempt:
            problems.append(f"{where}: by attempt {e['attempt']}, open is {open_attempt}")
        status = e["to_status"]
        if status in ENDS_ATTEMPT:
            open_attempt = None
    return problems


def exits_by_job(events: dict[int, list[dict]]) -> dict[int, int]:
    return {j: sum(1 for e in ev if e["event"] == "exit" and e["to_status"] == "completed")
            for j, ev in events.items()}


def replay_all(directory: Path) -> tuple[int, int]:
    """`jobstore replay` as root, with the emulated startd's account as the service account."""
    services = {0}
    try:
        services.add(pwd.getpwnam(SERVICE_ACCOUNT).pw_uid)
    except KeyError:
        pass
    done = spool.replay(directory, spool_sender(frozenset(services), node=direct()),
                        limit=1_000_000, group=record_group)
    assert done.bad == 0
    return done.sent, done.left


# ---- a. the database stops in the middle of an emulator run ---------------------------------

FORTY = """\
executable = /bin/sh
arguments = "-c 'sleep 1; exit $(Process)'"
request_memory = 32
queue 40
"""


@pytest.mark.slow
def test_database_restart_during_emulator_run(private_pg, monkeypatch) -> None:  # noqa: F811
    url = private_pg.create_database("faults_restart")
    upgrade(url)
    base = Path(tempfile.mkdtemp(prefix="jobstore-faults-node-"))
    os.chmod(base, 0o1777)  # sticky, as /var/tmp: the spool below it stays root's
    spool_dir = base / "spool"
    spool_dir.mkdir()
    os.chmod(spool_dir, spool.DIR_MODE)
    monkeypatch.setenv("JOBSTORE_DATABASE_URL", url)
    store = JobStore.from_url(url)
    try:
        cfg, condor_config = emulated_node(base, url)
        with condor_config.open("a") as fh:
            fh.write(f"JOBSTORE_CLAIM_LEASE = 20\nJOBSTORE_LEASE_DURATION = 30\n"
                     f"JOBSTORE_SPOOL = {spool_dir}\n")
        cfg.env["JOBSTORE_SPOOL"] = str(spool_dir)
        monkeypatch.setenv("CONDOR_CONFIG", str(condor_config))
        owner = None
        if os.geteuid() == 0:
            owner = ensure_home_account(JOB_USERS[0]).pw_name
            cfg.condor_user = ensure_home_account(SERVICE_ACCOUNT).pw_name
        ids = submit_text(store, base, FORTY, owner)
        os.chmod(base, 0o1777)
        if (base / "JobstoreHookLog").exists():
            os.chmod(base / "JobstoreHookLog", 0o666)

        def all_final() -> bool:
            try:
                return not store.reads.list_jobs()
            except DatabaseError:
                return False

        result: dict = {}
        emulator = threading.Thread(target=lambda: result.update(
            report=Emulator(cfg).run(until=all_final, timeout=600, wait_for_jobs=True)))
        start = time.monotonic()
        emulator.start()
        time.sleep(5)
        private_pg.stop()
        stopped = time.monotonic()
        time.sleep(8)
        private_pg.start()
        outage = time.monotonic() - stopped
        replayed = 0
        while emulator.is_alive():  # what an operator would run: `jobstore replay`, `reap`
            time.sleep(2)
            replayed += replay_all(spool_dir)[0]
            store.maintenance.reap()
        emulator.join()
        sent, left = replay_all(spool_dir)
        replayed += sent
        seconds = time.monotonic() - start

        final = {j.id: j for j in store.reads.list_jobs(include_final=True)}
        events = _all_events(url)
    finally:
        store.db.engine.dispose()
        shutil.rmtree(base, ignore_errors=True)
    assert left == 0
    assert sorted(final) == sorted(ids)
    lost = [j for j in final.values() if j.status not in FINAL]
    exits = exits_by_job(events)
    duplicates = [j for j, n in exits.items() if n > 1]
    problems = [p for j in ids for p in check_history(j, events[j])]
    print(f"\nFAULTS: jobs={len(ids)} slots=4 faults=postgresql-stopped-{outage:.0f}s "
          f"lost={len(lost)} duplicates={len(duplicates)} replayed={replayed} "
          f"failed={sum(j.status == 'failed' for j in final.values())} "
          f"seconds={seconds:.0f}")
    assert not lost, [(j.id, j.status) for j in lost]
    assert not duplicates
    assert not problems, problems[:20]
    for job in final.values():
        if job.status == "completed":
            assert exits[job.id] == 1
            assert job.exit_code == job.proc_id and not job.exit_by_signal
        else:
            assert job.status == "failed" and job.reason, job
    assert not result["report"].refused_hooks


# ---- b. hook processes killed with SIGKILL at random points ---------------------------------

KILL_JOBS = int(os.environ.get("JOBSTORE_FAULT_JOBS", "30"))  # per backend
KILL_SLOTS = 4
KILL_PROBABILITY = 0.25


@pytest.mark.slow
def test_hooks_killed_at_random(db_url, hook_dir, condor_config, tmp_path, monkeypatch) -> None:
    upgrade(db_url)
    monkeypatch.setenv("JOBSTORE_DATABASE_URL", db_url)
    spool_dir = tmp_path / "spool"
    env = hook_env(db_url, condor_config, JOBSTORE_SPOOL=str(spool_dir),
                   JOBSTORE_HOOK_LOG=str(tmp_path / "hook.log"))
    store = JobStore.from_url(db_url)
    rng = random.Random(int(os.environ.get("JOBSTORE_FAULT_SEED", "0")) or None)
    try:
        ids = submit_jobs(store, KILL_JOBS, ordinary_owner(), max_attempts=1000)
        # How long one hook takes here: a kill between 0 and 0.4 s would hit only the
        # interpreter's start-up on a slow machine, so the window is stretched to that time.
        probe = run_sequence(hook_dir, env, "slot0@probe-none")
        assert probe.job_id is not None
        window = max(0.4, max(c.seconds for c in probe.calls))
        kills = calls = 0
        lock = threading.Lock()

        def killer(_hook: str) -> float | None:
            nonlocal kills, calls
            with lock:
                calls += 1
                if rng.random() < KILL_PROBABILITY:
                    kills += 1
                    return rng.uniform(0, window)
            return None

        errors: list[str] = []

        def slot(n: int) -> None:
            try:
                while True:
                    seq = run_sequence(hook_dir, env, f"slot{n}@node01.example.org",
                                       killer=killer)
                    if seq.job_id is None and not seq.calls[0].killed:
                        return
            except Exception as exc:
                errors.append(f"slot{n}: {type(exc).__name__}: {exc}")

        rounds = 0
        start = time.monotonic()
        while store.reads.list_jobs() and rounds < 40:
            rounds += 1
            threads = [threading.Thread(target=slot, args=(n,))
                       for n in range(1, KILL_SLOTS + 1)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=600)
            replay_all(spool_dir)
            store.maintenance.reap(now=time.time() + 10**6)  # whatever is still handed out is stuck
        seconds = time.monotonic() - start
        sent, left = replay_all(spool_dir)
        final = {j.id: j for j in store.reads.list_jobs(include_final=True)}
    finally:
        store.db.engine.dispose()
    events = _all_events(db_url)
    assert not errors, errors
    lost = [j for j in final.values() if j.status not in FINAL]
    exits = exits_by_job(events)
    duplicates = [j for j, n in exits.items() if n > 1]
    problems = [p for j in final for p in check_history(j, events[j])]
    backend = "sqlite" if db_url.startswith("sqlite") else "postgresql"
    print(f"\nFAULTS: jobs={len(ids)} slots={KILL_SLOTS} faults={kills}-SIGKILLs-of-{calls}-"
          f"hook-calls({backend},window={window:.2f}s) lost={len(lost)} "
          f"duplicates={len(duplicates)} rounds={rounds} seconds={seconds:.0f}")
    assert not lost, [(j.id, j.status, j.reason) for j in lost]
    assert all(j.status == "completed" for j in final.values()), \
        [(j.id, j.status, j.reason) for j in final.values() if j.status != "completed"]
    assert exits == dict.fromkeys(final, 1)
    assert not problems, problems[:20]
    assert left == 0 and (not spool_dir.exists() or os.listdir(spool_dir) == [])


# ---- c. many slots at once ------------------------------------------------------------------

MANY_SLOTS = 32
MANY_JOBS = 5000


def _many_worker(url: str, slot: str, queue) -> None:  # type: ignore[no-untyped-def]
    store = JobStore(make_engine(url, connect_timeout=30, pool=True))
    req = claim_request(offer=Offer(cpus=1, memory=1024, disk=1 << 20), slot=slot, host="node")
    ids: list[int] = []
    error = None
    try:
        while (job := claim(store, req)) is not None:
            for event in (Event.START, Event.EXIT):
                out = report(store, job, event,
                             changes={"job_pid": 7} if event == Event.START else None, lease=600)
                if not out.changed:
                    raise RuntimeError(f"job {job.id}: {event}: {out}")
            ids.append(job.id)
    except Exception as exc:
        error = f"{slot}: {type(exc).__name__}: {exc}"
    finally:
        store.db.engine.dispose()
        queue.put((ids, error))


@pytest.mark.slow
def test_many_slots_at_once(pg_url) -> None:
    ids = fill(pg_url, MANY_JOBS, ordinary_owner())
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_many_worker, args=(pg_url, f"slot{n}@node", queue))
             for n in range(1, MANY_SLOTS + 1)]
    start = time.monotonic()
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    seconds = time.monotonic() - start
    for p in procs:
        p.join(timeout=30)
    errors = [e for _, e in results if e]
    claimed = [i for r, _ in results for i in r]
    events = _all_events(pg_url)
    fetches = {j: sum(1 for e in ev if e["event"] == "fetch") for j, ev in events.items()}
    exits = exits_by_job(events)
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            states = dict(conn.execute(sa.select(jobs.c.id, jobs.c.status)).all())
    finally:
        engine.dispose()
    duplicates = len(claimed) - len(set(claimed))
    lost = [i for i in ids if states.get(i) != "completed"]
    print(f"\nFAULTS: jobs={len(ids)} slots={MANY_SLOTS} faults=none(contention) "
          f"lost={len(lost)} duplicates={duplicates} "
          f"rate={len(claimed) / seconds:.0f} jobs/s ({seconds:.1f} s, claim+START+EXIT)")
    assert not errors, errors
    assert duplicates == 0
    assert sorted(claimed) == sorted(ids)
    assert not lost
    assert fetches == dict.fromkeys(ids, 1)
    assert exits == dict.fromkeys(ids, 1)


def test_slot_ad_helper_is_takeable() -> None:
    """The slot ad the fault tests fetch with is one a slot could take work with."""
    from jobstore.formats import classads
    from jobstore.formats.matching import why_slot_cannot_take

    assert why_slot_cannot_take(classads.parse_ad(slot_ad("slot1@x").decode())) is None


# ---- c. PostgreSQL restarted again and again under claims and reports ----------------------

RESTARTS = int(os.environ.get("JOBSTORE_FAULT_RESTARTS", "6"))
RESTART_WORKERS = 4


@pytest.mark.slow
def test_restarts_mid_claim_and_mid_report_are_clean_outages(private_pg) -> None:  # noqa: F811
    """Workers claim jobs and report START and EXIT through pooled stores (as the agent does)
    while PostgreSQL is restarted RESTARTS times. Every failed call must be the store's
    DatabaseError (one line, as the hooks turn into nothing printed or a spooled report), never
    an internal error; a report that failed is sent again, as the spool would, and no report is
    lost: every job completes with exactly one exit."""
    url = private_pg.create_database("faults_restarts")
    upgrade(url)
    owner = ordinary_owner()
    jobs_n = 200
    seeding = JobStore.from_url(url)
    try:
        ids = submit(seeding, jobs_n, owner=owner, max_attempts=50)
    finally:
        seeding.db.engine.dispose()
    internal: list[str] = []
    outages = [0]
    stop = threading.Event()

    def call(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        """`fn` until it answers: DatabaseError means wait and send again (the spool)."""
        while True:
            try:
                return fn(*args, **kwargs)
            except DatabaseError:
                outages[0] += 1
                time.sleep(0.05)
            except Exception as exc:  # noqa: BLE001 - what the test looks for
                internal.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.05)

    def worker(n: int) -> None:
        store = JobStore.from_url(url, pool=True, connect_timeout=2)
        req = claim_request(slot=f"slot{n}@faults")
        try:
            while not stop.is_set():
                job = call(claim, store, req)
                if job is None:
                    return
                call(report, store, job, Event.START, changes={"job_pid": 1000 + n})
                call(report, store, job, Event.EXIT, changes={"exit_code": 0})
        finally:
            store.db.engine.dispose()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(RESTART_WORKERS)]
    for t in threads:
        t.start()
    try:
        for _ in range(RESTARTS):
            time.sleep(random.uniform(0.2, 0.8))
            private_pg.stop()
            time.sleep(random.uniform(0.2, 1.0))
            private_pg.start()
    finally:
        for t in threads:
            t.join(timeout=300)
        stop.set()
    # a claim whose commit's answer was lost leaves its job fetched until its lease runs out:
    # run the reaper as if that time had come, and the workers again
    store = JobStore.from_url(url)
    try:
        recovered = store.maintenance.reap(now=time.time() + 10_000)
    finally:
        store.db.engine.dispose()
    if recovered:
        worker(RESTART_WORKERS)
    events = _all_events(url)
    exits = exits_by_job(events)
    print(f"\nFAULTS: jobs={jobs_n} restarts={RESTARTS} outages={outages[0]} "
          f"internal={len(internal)} lost-claims={len(recovered)}")
    assert not internal, sorted(set(internal))[:10]
    store = JobStore.from_url(url)
    try:
        final = store.reads.list_jobs(include_final=True)
    finally:
        store.db.engine.dispose()
    assert {j.status for j in final} == {"completed"}, sorted({j.status for j in final})
    assert all(exits.get(i) == 1 for i in ids)
