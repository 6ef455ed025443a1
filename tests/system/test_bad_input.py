"""Every hook, run as a separate process like HTCondor runs it, given input HTCondor would never
send (or a broken pipe would): no traceback, at most one line on stderr per error, FETCH_WORK
prints nothing or a valid job ad, exit status 0, and the database is unchanged unless the input
was a valid report. Secrets (ClaimId, database password) never reach stderr or the hook log."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import classad2
import pytest
import sqlalchemy as sa
from examples import examples
from hookrun import HookResult, hook_env, run_hook
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from testdata import TRANSCRIPTS

from jobstore.core.jobs import JobSpec
from jobstore.core.states import Event
from jobstore.db.schema import job_events, jobs
from jobstore.db.store import JobStore
from jobstore.formats import classads
from jobstore.testing.factories import claim, report
from jobstore.testing.support import insert_identity

T = TRANSCRIPTS
HOOKS = [
    ("fetch_job", []),
    ("reply_fetch", ["accept"]),
    ("reply_fetch", ["reject"]),
    ("evict_claim", []),
    ("prepare_job", []),
    ("update_job_info", []),
    ("job_exit", ["exit"]),
    ("job_exit", ["evict"]),
]
HOOK_IDS = [" ".join([h, *a]) for h, a in HOOKS]
# A recorded stdin per hook: what HTCondor really sends it.
SAMPLES = {
    ("fetch_job", ()): "01-normal-job/01-FETCH_WORK.stdin",
    ("reply_fetch", ("accept",)): "01-normal-job/02-REPLY_FETCH.stdin",
    ("reply_fetch", ("reject",)): "07c-pslot-no-request-attrs/02-REPLY_FETCH.stdin",
    ("evict_claim", ()): "01-normal-job/02-REPLY_FETCH.stdin",  # same format as REPLY_FETCH
    ("prepare_job", ()): "01-normal-job/04-PREPARE_JOB.stdin",
    ("update_job_info", ()): "01-normal-job/05-UPDATE_JOB_INFO.stdin",
    ("job_exit", ("exit",)): "01-normal-job/08-JOB_EXIT.stdin",
    ("job_exit", ("evict",)): "03-vacate/08-JOB_EXIT.stdin",
}
FOREIGN_JOB_AD = (
    b'Args = "10"\nClusterId = 7\nCmd = "/bin/sleep"\nGlobalJobId = "schedd.example.org#7.0#1"\n'
    b'JobStatus = 2\nJobUniverse = 5\nOwner = "alice"\nProcId = 0\nUser = "alice@localdomain"\n'
)
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \w+\[\d+\] ")


def sample(hook: str, argv: list[str]) -> bytes:
    return (T / SAMPLES[(hook, tuple(argv))]).read_bytes()


def dump(store: JobStore) -> tuple[list[tuple], list[tuple]]:
    with store.db.engine.connect() as conn:
        j = [tuple(r) for r in conn.execute(sa.select(jobs).order_by(jobs.c.id))]
        e = [tuple(r) for r in conn.execute(sa.select(job_events).order_by(job_events.c.id))]
    return j, e


@dataclass
class World:
    store: JobStore
    hook_dir: Path
    env: dict[str, str]
    log: Path
    identity: list[bytes]  # of an accepted job: a report with these lines would be valid
    idle_job: int

    def run(self, hook: str, stdin: bytes, argv: list[str]) -> HookResult:
        return run_hook(self.hook_dir, hook, stdin, argv=argv, env=self.env)

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def check(self, hook: str, result: HookResult, before, log_from: int = 0) -> None:
        """The common promise for input that is not a valid report."""
        err = result.stderr.decode("utf-8", "replace")
        assert "Traceback" not in err, err
        assert len(err.splitlines()) <= 1, err
        assert result.returncode == 0, (result, err)
        log = self.log.read_bytes()[log_from:].decode("utf-8", "replace")
        assert "Traceback" not in log, log
        for line in log.splitlines():
            assert LOG_LINE.match(line), line
        after = dump(self.store)
        if hook == "fetch_job" and result.stdout:
            # A slot ad that is still good enough: a valid job ad for our idle job, and the
            # only change is that job going to `fetched` (with its event).
            ad = classad2.parseOne(result.stdout.decode(), classad2.ParserType.Old)
            assert len(result.stdout) <= classads.MAX_JOB_AD_BYTES
            assert ad.eval("JobstoreJobId") == self.idle_job
            assert ad.eval("User") == "alice@localdomain"
            for name in ("Cmd", "JobstoreAttempt", "JobstoreToken", "RequestCpus"):
                assert name in ad
            assert self.store.reads.get_job(self.idle_job).status == "fetched"
            assert len(after[1]) == len(before[1]) + 1
            assert after[1][: len(before[1])] == before[1]
            assert [r for r in after[0] if r[0] != self.idle_job] == [
                r for r in before[0] if r[0] != self.idle_job
            ]
            self.reset_idle_job()
        else:
            assert result.stdout == b"", result.stdout[:200]
            assert after == before, "the database changed"

    def reset_idle_job(self) -> None:
        job = self.store.reads.get_job(self.idle_job)
        report(self.store, job, Event.REJECT)


@pytest.fixture
def world(store: JobStore, hook_dir: Path, condor_config: Path, db_url: str, tmp_path: Path):
    new = [JobSpec(cmd="/bin/sleep", args="10", iwd="/tmp", request_memory=64)]
    store.submissions.submit(new, owner="alice", queue="default", max_attempts=5)
    _, (idle_job,) = store.submissions.submit(new, owner="alice", queue="default", max_attempts=5)
    job = claim(store, slot="slot1@node01.example.org", keyword="TEST")  # the samples' keyword
    assert job is not None and job.id != idle_job
    report(store, job, Event.ACCEPT, lease=600)
    identity = [
        f"JobstoreAttempt = {job.claims}".encode(),
        f"JobstoreJobId = {job.id}".encode(),
        f'JobstoreToken = "{job.token}"'.encode(),
    ]
    log = tmp_path / "hooks.log"
    with condor_config.open("a") as fh:  # bad bytes in a path are about the hooks, not the job
        fh.write("JOBSTORE_CHECK_LAUNCH = false\n")
    env = hook_env(db_url, condor_config, JOBSTORE_HOOK_LOG=str(log), _CONDOR_SLOT="slot1")
    return World(store, hook_dir, env, log, identity, idle_job)


def bad_inputs(hook: str, argv: list[str], identity: list[bytes]) -> dict[str, tuple]:
    """name -> (stdin, argv): inputs that are not a valid report for this hook."""
    rec = sample(hook, argv)
    ours = insert_identity(rec, identity) if hook != "fetch_job" else rec
    reply = insert_identity(sample("reply_fetch", ["accept"]), identity)
    mid = len(rec) // 2
    cases: dict[str, tuple] = {
        "empty": (b"", argv),
        "garbage": (b"this is not a classad\n{ garbage ]]\n", argv),
        "non-utf8": (rec.replace(b'"/bin/sleep"', b'"/bin/sl\xff\xfeep"')
                     .replace(b'"slot2@', b'"slot\xe92@'), argv),
        "nul": (ours[:mid] + b"\x00" + ours[mid:], argv),
        "huge": (ours + b'Huge = "' + b"x" * (5 * 1024 * 1024) + b'"\n', argv),
        "foreign-ad": (FOREIGN_JOB_AD, argv),
        "unknown-job": (FOREIGN_JOB_AD + b'JobstoreAttempt = 1\nJobstoreJobId = 999999\n'
                        b'JobstoreToken = "0123456789abcdef0123456789abcdef"\n', argv),
        "extra-arg": (ours, [*argv, "extra"]),
    }
    if hook in ("reply_fetch", "evict_claim"):
        cases["no-separator"] = (ours.replace(b"\n-----\n", b"\n"), argv)
        cases["foreign-ad"] = (FOREIGN_JOB_AD + b"-----\n" + rec.split(b"-----\n", 1)[1], argv)
        cases["unknown-job"] = (cases["unknown-job"][0] + b"-----\n"
                                + rec.split(b"-----\n", 1)[1], argv)
        cases["two-separators"] = (ours.replace(b"\n-----\n", b"\n-----\n-----\n"), argv)
    else:
        # a REPLY_FETCH-shaped stdin (job ad, `-----`, slot ad) is not a job or slot ad
        cases["separator"] = (reply, argv)
    if hook == "reply_fetch":
        cases["no-argv"] = (ours, [])
        cases["bad-reason"] = (ours, ["maybe"])
    if hook == "job_exit":
        cases["no-argv"] = (ours, [])
        cases["bad-reason"] = (ours, ["vacate"])
        cases["empty-reason"] = (ours, [""])
    return cases


@pytest.mark.slow  # (make test's time: runs with make test-slow)
@pytest.mark.parametrize(("hook", "argv"), HOOKS, ids=HOOK_IDS)
def test_bad_input(world: World, hook: str, argv: list[str]) -> None:
    cases = bad_inputs(hook, argv, world.identity)
    if hook == "fetch_job":  # fetch_job may legitimately change the database: one at a time
        for name, (stdin, args) in cases.items():
            before, pos = dump(world.store), world.log_size()
            result = world.run(hook, stdin, args)
            try:
                world.check(hook, result, before, pos)
            except AssertionError as exc:
                raise AssertionError(f"case {name}: {exc}") from exc
        return
    before, pos = dump(world.store), world.log_size()
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(
            zip(cases, pool.map(lambda c: world.run(hook, c[0], c[1]), cases.values()),
                strict=True)
        )
    for name, result in results.items():
        try:
            world.check(hook, result, before, pos)
        except AssertionError as exc:
            raise AssertionError(f"case {name}: {exc}") from exc


def test_valid_reports_still_work(world: World) -> None:
    """The control: the same sample with our identity lines is a valid report."""
    stdin = insert_identity(sample("update_job_info", []), world.identity)
    result = world.run("update_job_info", stdin, [])
    assert result.returncode == 0
    job_id = int(world.identity[1].split(b" = ")[1])
    assert world.store.reads.get_job(job_id).status == "running"
    # fetch_job with the recorded slot ad hands out the idle job
    before = dump(world.store)
    result = world.run("fetch_job", sample("fetch_job", []), [])
    assert result.stdout, result
    world.check("fetch_job", result, before)


def test_non_utf8_job_ad_is_still_a_report(world: World) -> None:
    """HTCondor passes job ad bytes as they are; a non-UTF-8 argument must not lose the report."""
    stdin = insert_identity(sample("job_exit", ["exit"]), world.identity)
    stdin = stdin.replace(b'Args = "10"', b'Args = "10 caf\xe9"')
    result = world.run("job_exit", stdin, ["exit"])
    assert result.returncode == 0 and result.stderr == b"", result
    job_id = int(world.identity[1].split(b" = ")[1])
    job = world.store.reads.get_job(job_id)
    assert job.status == "completed" and job.exit_code == 0


SETTINGS = settings(
    max_examples=examples(20),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.slow  # (make test's time: runs with make test-slow)
@SETTINGS
@given(which=st.sampled_from(HOOKS), data=st.binary(max_size=3000))
def test_random_bytes(world: World, which: tuple[str, list[str]], data: bytes) -> None:
    hook, argv = which
    before, pos = dump(world.store), world.log_size()
    world.check(hook, world.run(hook, data, argv), before, pos)


@pytest.mark.slow  # (make test's time: runs with make test-slow)
@SETTINGS
@given(which=st.sampled_from(HOOKS), cut=st.floats(min_value=0.0, max_value=1.0),
       ours=st.booleans())
def test_truncated_transcripts(world: World, which: tuple[str, list[str]], cut: float,
                               ours: bool) -> None:
    """A recorded stdin cut short (a writer that died). Without our identity lines it is never
    our report; REPLY_FETCH with them, cut before the `-----` line, is not a report either."""
    hook, argv = which
    stdin = sample(hook, argv)
    if ours and hook in ("reply_fetch", "evict_claim"):
        stdin = insert_identity(stdin, world.identity)
        stdin = stdin[: int(cut * stdin.index(b"\n-----\n"))]
    else:
        stdin = stdin[: int(cut * len(stdin))]
    before, pos = dump(world.store), world.log_size()
    world.check(hook, world.run(hook, stdin, argv), before, pos)


# ---- secrets ------------------------------------------------------------------------------

BAD_PG_URL = "postgresql+psycopg://jobstore_no_such_user:s3cret-pw@127.0.0.1:5432/postgres"


def claim_id_parts(stdin: bytes) -> list[bytes]:
    last = stdin.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    assert last.startswith(b'ClaimId = "')
    value = last[len(b'ClaimId = "') : last.rindex(b'"')]
    rest = stdin.replace(last, b"")
    parts = [p for p in re.split(rb"[^A-Za-z0-9]+", value) if len(p) >= 6 and p not in rest]
    assert parts
    return [value, *parts]


@pytest.mark.slow  # (make test's time: runs with make test-slow)
@pytest.mark.parametrize(
    "transcript", ["01-normal-job/02-REPLY_FETCH.stdin",
                   "10c-rank-accept-never-runs/02-REPLY_FETCH.stdin"]
)
def test_secrets_stay_out_of_logs(hook_dir: Path, condor_config: Path, tmp_path: Path,
                                  transcript: str) -> None:
    """The connection fails (no such role): the error names the database, never the password,
    and nothing of the ClaimId reaches the hook log or stderr."""
    log = tmp_path / "hooks.log"
    env = hook_env(BAD_PG_URL, condor_config, JOBSTORE_HOOK_LOG=str(log))
    rec = (T / transcript).read_bytes()
    secrets = [b"s3cret-pw", *claim_id_parts(rec)]
    stdin = (b'JobstoreAttempt = 1\nJobstoreJobId = 1\n'
             b'JobstoreToken = "00112233445566778899aabbccddeeff"\n' + rec)
    results = [
        run_hook(hook_dir, "reply_fetch", stdin, argv=["accept"], env=env),
        run_hook(hook_dir, "evict_claim", stdin, env=env),
        # cut inside the ClaimId line, and with lines after it: the ClaimId is then not the
        # last line, but it must still not be echoed
        run_hook(hook_dir, "reply_fetch", rec[:-40], argv=["accept"], env=env),
        run_hook(hook_dir, "reply_fetch", stdin + b"Extra = 1\n", argv=["accept"], env=env),
        run_hook(hook_dir, "fetch_job", sample("fetch_job", []), env=env),
        run_hook(hook_dir, "job_exit", stdin, argv=["exit"], env=env),
    ]
    text = log.read_bytes()
    assert b"jobstore_no_such_user" in text  # the error was logged ...
    assert b"***" in text  # ... with the password masked
    for result in results:
        assert result.returncode == 0
        assert result.stdout == b""
        assert b"Traceback" not in result.stderr
        for secret in secrets:
            assert secret not in result.stderr, secret
    fetch_err = results[4].stderr
    assert fetch_err.count(b"\n") == 1 and b"jobstore_no_such_user" in fetch_err
    assert b"Traceback" not in text
    for secret in secrets:
        assert secret not in text, secret
