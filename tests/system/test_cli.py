"""The `jobstore` command as an admin uses it: real processes, real databases."""

from __future__ import annotations

import json
import os
import pwd
import socket
import subprocess
import time
from pathlib import Path

import clirun
import pytest
from backends import BOTH_BACKENDS
from hookrun import hook_env, run_hook
from jobstorecli import JOBSTORE, cli, db, submit  # noqa: F401 - the db fixture
from testdata import TRANSCRIPTS

from jobstore.testing.support import ordinary_owner as _owner


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_submit_q_json_and_long(db: str, tmp_path: Path) -> None:  # noqa: F811
    sub = _write(
        tmp_path,
        "a.sub",
        "executable = /bin/echo\narguments = hi\n"
        'request_memory = 1GB\npriority = 7\n+Project = "x"\nqueue 3\n',
    )
    r = submit(db, sub)
    assert r.returncode == 0, r.stderr
    assert "3 job(s) submitted to cluster 1" in r.stdout
    jobs = json.loads(cli(db, "q", "--json").stdout)
    assert [j["id"] for j in jobs] == ["1.0", "1.1", "1.2"]
    for j in jobs:
        assert {"id", "status", "owner", "queue", "attempts", "exit_code"} <= set(j)
        assert j["status"] == "idle" and j["owner"] == _owner() and j["attempts"] == 0
        assert j["request_memory"] == 1024
    long = cli(db, "q", "1.1", "-l").stdout
    assert 'Cmd = "/bin/echo"' in long and "JobPrio = 7" in long and 'Project = "x"' in long
    assert "JobstoreToken" not in long
    table = cli(db, "q").stdout.splitlines()
    assert table[0].split() == ["ID", "OWNER", "SUBMITTED", "RUN_TIME", "ST", "PRI", "SIZE",
                                "CMD"]
    row = table[3].split()
    assert row[0] == "1.2" and row[4:] == ["0+00:00:00", "I", "7", "0.0", "/bin/echo", "hi"]
    assert table[-1] == ("Total for query: 3 jobs; 0 completed, 0 removed, 3 idle, 0 running, "
                         "0 held, 0 suspended")


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_condor_q_options_and_history_columns(db: str, tmp_path: Path) -> None:  # noqa: F811
    """condor_q's single-dash options (-nobatch -totals -limit -format -json -long -run) and
    condor_history's columns, job ids and -match; `jobstore qedit` as condor_qedit."""
    submit(db, _write(tmp_path, "a.sub", "executable = /bin/true\npriority = 3\nqueue 4\n"))
    assert cli(db, "q", "-nobatch").stdout == cli(db, "q").stdout
    assert cli(db, "q", "-totals").stdout.strip() == (
        "Total for query: 4 jobs; 0 completed, 0 removed, 4 idle, 0 running, 0 held, "
        "0 suspended")
    assert len(json.loads(cli(db, "q", "-json", "-limit", "2").stdout)) == 2
    out = cli(db, "q", "-format", "%d.", "ClusterId", "-format", "%d ", "ProcId",
              "-format", "%v\\n", "JobPrio")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:2] == ["1.0 3", "1.1 3"]
    assert "JobPrio = 3" in cli(db, "q", "1.0", "-long").stdout
    assert cli(db, "q", "-run").stdout.splitlines()[0].split() == [
        "ID", "OWNER", "SUBMITTED", "RUN_TIME", "HOST(S)"]
    edited = cli(db, "qedit", "1.1", "JobPrio", "9")
    assert edited.returncode == 0 and "for 1 job(s)" in edited.stdout, edited.stderr
    assert cli(db, "q", "1.1", "-af", "JobPrio").stdout.strip() == "9"
    refused = cli(db, "qedit", "1.1", "Owner", '"root"')
    assert refused.returncode == 1 and "cannot be edited" in refused.stderr
    for proc in ("1.2", "1.0", "1.3"):
        assert cli(db, "rm", proc).returncode == 0
    hist = cli(db, "history").stdout.splitlines()
    assert hist[0].split() == ["ID", "OWNER", "SUBMITTED", "RUN_TIME", "ST", "COMPLETED", "CMD"]
    assert [ln.split()[0] for ln in hist[1:]] == ["1.3", "1.0", "1.2"]  # latest first
    assert [ln.split()[5] for ln in hist[1:]] == ["X", "X", "X"]  # (SUBMITTED is 2 words)
    assert [ln.split()[0] for ln in cli(db, "history", "-match", "1").stdout.splitlines()[1:]
            ] == ["1.3"]
    assert [ln.split()[0] for ln in cli(db, "history", "1.0").stdout.splitlines()[1:]] == [
        "1.0"]


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_hold_release_rm_history_stats_events(db: str, tmp_path: Path) -> None:  # noqa: F811
    submit(db, _write(tmp_path, "a.sub", "executable = /bin/true\nqueue 2\n"))
    assert cli(db, "hold", "1.0", "-r", "maintenance").returncode == 0
    held = json.loads(cli(db, "q", "--json", "-s", "held").stdout)
    assert [j["id"] for j in held] == ["1.0"] and held[0]["reason"] == "maintenance"
    assert cli(db, "release", "1.0").returncode == 0
    assert cli(db, "rm", "1").returncode == 0
    assert json.loads(cli(db, "q", "--json").stdout) == []
    gone = json.loads(cli(db, "history", "--json").stdout)
    assert {j["status"] for j in gone} == {"removed"} and len(gone) == 2
    stats = json.loads(cli(db, "stats", "--json").stdout)
    assert stats == {"default": {"removed": 2}}
    events = [json.loads(x) for x in cli(db, "events", "1.0", "--json").stdout.splitlines()]
    assert [(e["event"], e["to_status"]) for e in events] == [
        ("submit", "idle"),
        ("hold", "held"),
        ("release", "idle"),
        ("remove", "removed"),
    ]
    again = cli(db, "release", "1.0")  # removed: no longer in the queue
    assert again.returncode == 1 and "no unfinished job 1.0" in again.stderr


@pytest.mark.slow  # (make test's time: runs with make test-slow)
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("executable = /bin/true\nrequest_cpus = many\nqueue\n", "request_cpus"),
        ("arguments = x\nqueue\n", "executable"),
        ("executable = /bin/true\nrequirements = (((\nqueue\n", "requirements"),
        ('executable = /bin/true\n+HookKeyword = "OTHER"\nqueue\n', "HookKeyword"),
        ("executable = /bin/true\nuniverse = docker\nqueue\n", "universe"),
    ],
)
def test_bad_submit_files_change_nothing(db: str, tmp_path: Path, text: str, message: str) -> None:  # noqa: F811
    r = submit(db, _write(tmp_path, "bad.sub", text))
    assert r.returncode != 0
    assert message.lower() in r.stderr.lower()
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert json.loads(cli(db, "q", "--json", "--all").stdout) == []


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_errors_are_one_line(db: str, tmp_path: Path) -> None:  # noqa: F811
    for args in (("q", "42.0"), ("rm", "nope"), ("events", "9"), ("submit", "/nonexistent")):
        r = cli(db, *args)
        assert r.returncode == 1, args
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_root_jobs_are_refused(db: str, tmp_path: Path) -> None:  # noqa: F811
    sub = _write(tmp_path, "a.sub", "executable = /bin/true\nqueue\n")
    r = cli(db, "submit", str(sub), "--owner", "root")
    assert r.returncode == 1 and "root" in r.stderr
    r = cli(db, "submit", str(sub), "--owner", "daemon")
    assert r.returncode == 1 and "system account" in r.stderr


def test_bad_database_url_is_one_line(condor_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONDOR_CONFIG", str(condor_config))
    r = cli("postgresql+psycopg://u:topsecret@127.0.0.1:1/x", "q")
    assert r.returncode == 1 and "topsecret" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_evict_claim_requeues_a_fetched_job(
    db: str, tmp_path: Path, hook_dir: Path, condor_config: Path,  # noqa: F811
) -> None:
    """EVICT_CLAIM is never called by HTCondor 25, but if it comes, the job goes back."""
    submit(db, _write(tmp_path, "a.sub", "executable = /bin/true\nqueue\n"))
    env = hook_env(db, condor_config)
    slot = (TRANSCRIPTS / "01-normal-job/01-FETCH_WORK.stdin").read_bytes()
    ad = run_hook(hook_dir, "fetch_job", slot, env=env).stdout
    assert b"JobstoreToken" in ad
    claim = b'ClaimId = "<127.0.0.1:1>#1#1#[Encryption="NO";]abc"\n'
    run_hook(hook_dir, "evict_claim", ad + b"-----\n" + slot + claim, env=env)
    (job,) = json.loads(cli(db, "q", "--json").stdout)
    assert job["status"] == "idle" and job["attempts"] == 0


def test_fetch_never_hangs_on_a_silent_database(
    hook_dir: Path, condor_config: Path,
) -> None:
    """A server that accepts TCP but never answers: fetch_job gives up, prints nothing."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        url = f"postgresql+psycopg://u:pw@127.0.0.1:{port}/x"
        slot = (TRANSCRIPTS / "01-normal-job/01-FETCH_WORK.stdin").read_bytes()
        started = time.monotonic()
        r = run_hook(hook_dir, "fetch_job", slot, env=hook_env(url, condor_config), timeout=60)
        took = time.monotonic() - started
    assert r.stdout == b""
    assert took < 15, f"fetch_job took {took:.1f} s"
    assert r.stderr.count(b"\n") <= 1 and b"Traceback" not in r.stderr


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_allowed_owners_at_submit_and_at_fetch(
    db: str, tmp_path: Path, hook_dir: Path, condor_config: Path,  # noqa: F811
) -> None:
    """JOBSTORE_ALLOWED_OWNERS is checked at submit, and again at fetch (config may change)."""
    sub = _write(tmp_path, "a.sub", "executable = /bin/true\nqueue\n")
    base = condor_config.read_text()
    condor_config.write_text(base + "JOBSTORE_ALLOWED_OWNERS = somebody_else\n")
    r = submit(db, sub)
    assert r.returncode == 1 and "ALLOWED_OWNERS" in r.stderr
    assert json.loads(cli(db, "q", "--json").stdout) == []

    condor_config.write_text(base + f"JOBSTORE_ALLOWED_OWNERS = somebody_else, {_owner()}\n")
    assert submit(db, sub).returncode == 0
    condor_config.write_text(base + "JOBSTORE_JOBSTORE_ALLOWED_OWNERS = somebody_else\n")
    slot = (TRANSCRIPTS / "01-normal-job/01-FETCH_WORK.stdin").read_bytes()
    fetched = run_hook(hook_dir, "fetch_job", slot, env=hook_env(db, condor_config))
    assert fetched.stdout == b""
    (job,) = json.loads(cli(db, "q", "--json", "-a").stdout)
    assert job["status"] == "held" and "ALLOWED_OWNERS" in job["reason"]


@pytest.mark.parametrize("owner", ["a@b", "-rf", "x y", "a\nb"])
def test_owner_must_be_an_account_name(db: str, tmp_path: Path, owner: str) -> None:  # noqa: F811
    sub = _write(tmp_path, "a.sub", "executable = /bin/true\nqueue\n")
    r = cli(db, "submit", str(sub), "--owner", owner)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1
    assert json.loads(cli(db, "q", "--json").stdout) == []


@BOTH_BACKENDS
def test_grant_prints_and_applies_least_privilege(db: str) -> None:  # noqa: F811
    """`jobstore grant ROLE`: the statements name the columns a hook may change and never the
    ones submit decides; a missing role or SQLite is one line, exit 1."""
    if not db.startswith("postgresql"):
        bad = cli(db, "grant", "jobstore_agent")
        assert bad.returncode == 1 and bad.stderr.strip() == (
            "jobstore: database roles exist on PostgreSQL only")
        return
    missing = cli(db, "grant", "no_such_role_jobstore")
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1
    assert "no_such_role_jobstore" in missing.stderr and "Traceback" not in missing.stderr
    shown = cli(db, "grant", "--print", "no_such_role_jobstore")
    assert shown.returncode == 0, shown.stderr
    update = next(ln for ln in shown.stdout.splitlines() if ln.startswith("GRANT UPDATE"))
    assert "status" in update and "exit_code" in update
    for decided in ("owner", "cmd", "queue", "user_log", "ad", "priority"):
        assert f"{decided}," not in update and f"{decided})" not in update


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_userprio_table_setfactor_and_reset(db: str, tmp_path: Path) -> None:  # noqa: F811
    """condor_userprio's table for the submitters of a submit file with accounting_group, a
    factor set by the admin, usage reset; bad input is one line and exit status 1."""
    from jobstore.db.store import JobStore
    from jobstore.testing.factories import claim

    grouped = _write(tmp_path, "g.sub", "executable = /bin/true\naccounting_group = physics\n"
                     "concurrency_limits = lic\nqueue 3\n")
    plain = _write(tmp_path, "p.sub", "executable = /bin/true\nqueue 2\n")
    assert submit(db, grouped).returncode == 0 and submit(db, plain).returncode == 0
    store = JobStore.from_url(db)
    try:
        job = claim(store, claim_lease=60, weight=2.0)
        assert job is not None
    finally:
        store.db.engine.dispose()
    owner = _owner()
    out = cli(db, "userprio")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("Last Priority Update: ")
    assert lines[1].split()[:3] == ["SUBMITTER", "EFFECTIVE", "PRIORITY"]
    rows = {line.split()[0]: line.split() for line in lines[2:] if line and line[0] != "N"}
    assert set(rows) == {f"physics.{owner}", owner}
    holder = rows[job.submitter]
    assert holder[1:5] == ["0.50", "0.50", "1.00", "2"] and holder[-1] == "<now"
    assert "Number of submitters: 2" in out.stdout
    assert cli(db, "userprio", "-setfactor", owner, "3").returncode == 0
    data = {d["Name"]: d for d in json.loads(cli(db, "userprio", "--json").stdout)}
    assert data[owner]["PriorityFactor"] == 3.0
    assert data[owner]["Priority"] == 1.5
    assert data[job.submitter]["WeightedResourcesUsed"] == 2.0
    reset = cli(db, "userprio", "-resetall")
    assert reset.returncode == 0 and "of 2 submitter(s) was reset" in reset.stdout
    for args, words in ((("-setfactor", owner, "0.5"), "bad priority factor"),
                        (("-setfactor", "nobody", "2"), "no submitter 'nobody'"),
                        (("-resetusage", "nobody"), "no submitter 'nobody'")):
        bad = cli(db, "userprio", *args)
        assert bad.returncode == 1 and words in bad.stderr and bad.stderr.count("\n") == 1
    auto = cli(db, "q", "-autocluster")
    assert "lic" in auto.stdout and f"physics.{owner}" in auto.stdout
    assert "Total: 5 jobs in 2 autoclusters" in auto.stdout
    af = cli(db, "q", "-af", "ConcurrencyLimits", "AccountingGroup").stdout.splitlines()
    assert sorted(af) == [f"lic physics.{owner}"] * 3 + ["undefined undefined"] * 2


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_q_hold_lists_held_jobs_with_their_codes(db: str, tmp_path: Path) -> None:  # noqa: F811
    """`jobstore hold` is HoldReasonCode 1 (UserRequest); a periodic_hold is 3 with the submit
    file's subcode and reason; `q -hold` shows both like condor_q -hold, `reap` runs the pass."""
    path = _write(tmp_path, "p.sub", "executable = /bin/true\nperiodic_hold = JobStatus == 1\n"
                  'periodic_hold_reason = "waits too long"\nperiodic_hold_subcode = 5\nqueue\n')
    plain = _write(tmp_path, "q.sub", "executable = /bin/true\nqueue\n")
    assert submit(db, path).returncode == 0 and submit(db, plain).returncode == 0
    assert cli(db, "hold", "2.0", "-reason", "by hand").returncode == 0
    reap = cli(db, "reap")
    assert reap.returncode == 0 and "1 job(s) changed by their periodic policy" in reap.stdout
    out = cli(db, "q", "-hold")
    assert out.returncode == 0, out.stderr
    rows = [line.split(None, 6) for line in out.stdout.splitlines()[1:] if line[:1].isdigit()]
    assert [(r[0], r[4], r[5], r[6].strip()) for r in rows] == [
        ("1.0", "3", "5", "waits too long"), ("2.0", "1", "0", "by hand")]
    assert out.stdout.splitlines()[-1].startswith("Total for query: 2 jobs;")
    af = cli(db, "q", "1.0", "-af", "HoldReasonCode", "HoldReasonSubCode", "NumHolds")
    assert af.stdout.split() == ["3", "5", "1"]


def test_emulate_stops_when_only_held_jobs_are_left(db: str, tmp_path: Path) -> None:  # noqa: F811
    """`jobstore emulate` with nothing runnable but a held job: it stops at once (not at its
    timeout) and says which job is held and why, with exit status 1."""
    submit(db, _write(tmp_path, "a.sub", "executable = /bin/true\nqueue\n"))
    assert cli(db, "hold", "1.0", "-r", "waiting for input").returncode == 0
    condor_user = ["--condor-user", _owner()] if os.geteuid() == 0 else []
    out = cli(db, "emulate", "--slots", "1", "--timeout", "600", *condor_user)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "job 1.0 is held: waiting for input" in out.stderr
    assert "release JOB" in out.stderr


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_emulate_gives_its_node_a_sandbox_root_of_its_own(db: str) -> None:  # noqa: F811
    """A job with file transfer runs on `jobstore emulate`'s node (its sandbox root in the
    node's own directory, not the system's), and its output comes back; one that cannot be
    written where it goes is one line."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="jobstore-emulate-"))  # every account may enter
    os.chmod(base, 0o755)
    try:
        if os.geteuid() == 0:
            os.chown(base, pwd.getpwnam(_owner()).pw_uid, -1)
        _write(base, "in.txt", "through the sandbox\n")
        path = _write(base, "t.sub", "executable = /bin/cat\ntransfer_executable = false\n"
                      "arguments = in.txt\nshould_transfer_files = YES\n"
                      "transfer_input_files = in.txt\noutput = out.txt\nqueue\n")
        assert submit(db, path, "-spool").returncode == 0
        out = cli(db, "emulate", "--slots", "1", "--timeout", "600")
        assert out.returncode == 0, out.stdout + out.stderr
        back = cli(db, "transfer-data", "1")
        assert back.returncode == 0, back.stderr
        assert (base / "out.txt").read_text() == "through the sandbox\n"
        if os.geteuid() == 0:  # as the owner, who may not write there now
            (base / "out.txt").unlink()
            os.chmod(base, 0o555)
            again = cli(db, "transfer-data", "1")
            assert again.returncode == 1 and again.stderr.count("\n") == 1, again.stderr
            assert f"not written as {_owner()}" in again.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_events_and_watch_keep_harmless_repeats_out_of_sight(db: str, tmp_path: Path) -> None:  # noqa: F811
    """A report of an ended attempt and a repeated accept are recorded (JSON, --all) but not
    shown by default; `watch` says what it waits for."""
    from jobstore.core.states import Event
    from jobstore.db.store import JobStore
    from jobstore.testing.factories import claim, report

    submit(db, _write(tmp_path, "a.sub", "executable = /bin/true\nqueue\n"))
    store = JobStore.from_url(db)
    try:
        job = claim(store, claim_lease=60)
        assert job is not None
        report(store, job, Event.ACCEPT)
        report(store, job, Event.ACCEPT)  # repeated
        report(store, job, Event.EXIT, changes={"exit_code": 0})
        report(store, job, Event.UPDATE)  # late
    finally:
        store.db.engine.dispose()
    shown = cli(db, "events", "1.0").stdout
    everything = cli(db, "events", "1.0", "--all").stdout
    assert "ignored in state" not in shown and "stale:" not in shown
    assert "ignored in state" in everything and "stale:" in everything
    assert len(cli(db, "events", "1.0", "--json").stdout.splitlines()) == 6
    watched = cli(db, "watch", "1.0", "--until-done", "--since", "0")
    assert watched.returncode == 0 and "stale:" not in watched.stdout
    assert "finished  completed  exit 0  ok" in watched.stdout
    waiting = cli(db, "watch", "1.0", "--until-done")
    assert "waiting for the transitions of 1.0" in waiting.stderr


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_ctrl_c_on_emulate_ends_its_jobs(condor_config: Path) -> None:
    """Interrupted, `jobstore emulate` evicts what runs, as a startd shut down: no attempt is
    left running in the store. As root the node is the jobs' owner's own
    (a SQLite store is one user's), in a directory open to her."""
    import pwd
    import shutil
    import signal
    import tempfile

    from jobstore.db.store import JobStore

    base = Path(tempfile.mkdtemp(prefix="jobstore-ctrlc-"))
    os.chmod(base, 0o777)
    db = f"sqlite:///{base / 'jobstore.db'}"  # noqa: F811
    env = {**{k: v for k, v in os.environ.items() if k != "JOBSTORE_DATABASE_URL"},
           "CONDOR_CONFIG": str(condor_config)}
    assert cli(db, "init", env=env).returncode == 0
    condor_user: list[str] = []
    if os.geteuid() == 0:
        user = pwd.getpwnam(_owner())
        os.chown(base / "jobstore.db", user.pw_uid, user.pw_gid)
        condor_user = ["--condor-user", _owner()]
    sub = _write(base, "s.sub", "executable = /bin/sleep\narguments = 120\n"
                 "initialdir = /tmp\ntransfer_executable = false\nqueue 2\n")
    assert submit(db, sub).returncode == 0
    # as from a terminal: SIGINT not ignored (a shell's background job ignores it, and a
    # Python started so raises no KeyboardInterrupt)
    proc = clirun.popen([*JOBSTORE, "--db", db, "emulate", "--slots", "2", "--timeout",
                             "600", *condor_user], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True, env=env,
                        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    store = JobStore.from_url(db)
    try:
        end = time.monotonic() + 60
        while {j.status for j in store.reads.list_jobs()} != {"running"}:
            assert time.monotonic() < end and proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, out + err
        assert "interrupted" in err and "Traceback" not in err
        assert {j.status for j in store.reads.list_jobs()} == {"idle"}
        assert all(j.num_starts == 1 for j in store.reads.list_jobs())
    finally:
        if proc.poll() is None:
            proc.kill()
        store.db.engine.dispose()
        shutil.rmtree(base, ignore_errors=True)
