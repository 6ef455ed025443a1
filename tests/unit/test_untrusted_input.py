"""Fuzzing what the agent reads from other accounts: spooled reports (the checker, the reader,
and what the store lets them apply) and the agent's request parser. Thousands of cases each;
no traceback, no hang, nothing applied that a genuine report could not apply."""

from __future__ import annotations

import json
import os
import pwd
import socket
import tempfile
from pathlib import Path
from typing import Any

import pytest
from agentnode import WAIT, Node, node  # noqa: F401 - fixture
from examples import examples
from hookseq import slot_ad
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobstore.agent.protocol import (
    HEADER,
    MAGIC,
    MAX_REQUEST,
    body_length,
    decode_body,
    decode_env,
    encode,
)
from jobstore.core.jobs import Job, JobSpec
from jobstore.db.engine import upgrade
from jobstore.db.store import JobStore
from jobstore.errors import BadReport, ForeignReport, NotOwner, ProtocolError, UnknownJob
from jobstore.node import spool
from jobstore.node.hooktable import NAMES
from jobstore.node.reports import CHANGE_COLUMNS, SERVICE, STARTER_EVENTS, Caller, Report
from jobstore.node.sending import send_record, store_identity
from jobstore.node.services import direct
from jobstore.testing.factories import claim

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
FIELDS = ["keyword", "job_id", "event", "token", "attempt", "changes", "attrs", "slot", "host",
          "time", "store", "caller_uid", "owner", "user_log", "queue"]
FUZZ = settings(max_examples=examples(2000), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def genuine(job_id: int = 1, token: str = "t" * 32, attempt: int = 1,
            store: str = "0123456789abcdef") -> dict[str, Any]:
    return {"keyword": "JOBSTORE", "job_id": job_id, "event": "exit", "token": token,
            "attempt": attempt, "changes": {"exit_code": 0, "exit_by_signal": False},
            "attrs": {"ExitCode": 0}, "slot": "slot1", "host": None, "time": 1.7e9,
            "store": store}


def mutated(base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A genuine record with some fields replaced by anything JSON can say."""
    return st.dictionaries(st.sampled_from(FIELDS), json_values | st.sampled_from(
        ["accept", "release", "submit", "owner", "user_log", 0, -1, 2**70]), max_size=4
    ).map(lambda changes: {**base, **changes})


def check(report: Report, writer: Caller) -> None:
    """What a report that passed the checker may ever do."""
    assert set(report.changes) <= set(CHANGE_COLUMNS)
    if not writer.trusted:
        assert report.event in STARTER_EVENTS and report.caller_uid is None


@pytest.mark.slow  # (make test's time: runs with make test-slow)
@FUZZ
@given(record=json_values | mutated(genuine()), trusted=st.booleans())
def test_report_checker_accepts_only_what_a_hook_could_write(record: Any, trusted: bool) -> None:
    writer = SERVICE if trusted else Caller(1234)
    try:
        report = Report.parse(record, writer)
    except BadReport:
        return
    check(report, writer)
    assert Report.parse(report.record(), writer) == report  # what is spooled reads back


@FUZZ
@given(data=st.binary(max_size=300))
def test_request_parser_never_raises_anything_else(data: bytes) -> None:
    try:
        n = body_length((data + b"\0" * HEADER)[:HEADER], MAX_REQUEST)
        assert 0 <= n <= MAX_REQUEST
    except ProtocolError:
        pass
    try:
        items = decode_body(data, big_item=2)
        assert sum(len(i) for i in items) <= len(data)
    except ProtocolError:
        pass
    env = decode_env(data)
    assert set(env) <= {"_CONDOR_SLOT"}


@settings(max_examples=examples(500), deadline=None)
@given(files=st.lists(st.tuples(st.sampled_from(["a.report", "1-2-ab.report", ".1-2-ab.tmp",
                                                 ".1-2-ab.report.1.taking", "x"]),
                                st.binary(max_size=200) | json_values.map(
                                    lambda v: json.dumps(v).encode())),
                      max_size=6))
def test_spool_reader_survives_any_file(files: list[tuple[str, bytes]]) -> None:
    """Whatever lies in the spool: the replay ends, and what it hands over is JSON it read."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "spool"
        spool.ensure_dir(d)
        for i, (name, data) in enumerate(files):
            (d / name.replace("1-2", f"{i}-2")).write_bytes(data)
        seen: list[Any] = []

        def send(record: Any, uid: int) -> None:
            seen.append(record)
            if not isinstance(record, dict):
                raise BadReport("not an object")

        done = spool.replay(d, send, limit=100)
        assert done.left == 0
        assert done.sent == sum(isinstance(r, dict) for r in seen)
        leftover = [n for n in os.listdir(d) if n.endswith(spool.SUFFIX) and not
                    n.startswith(".")]
        assert leftover == [n for n in leftover if not n[0].isdigit()]


# ---- what the store applies -----------------------------------------------------------------

PROTECTED = ("owner", "cmd", "queue", "user_log", "ad", "priority", "max_attempts",
             "request_cpus", "requirements", "cluster_id", "proc_id")
ME = pwd.getpwuid(os.geteuid()).pw_name


@pytest.fixture(scope="module")
def claimed(tmp_path_factory: pytest.TempPathFactory) -> tuple[JobStore, Job, str]:
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'jobstore.db'}"
    upgrade(url)
    s = JobStore.from_url(url)
    s.submissions.submit([JobSpec(cmd="/bin/true", request_memory=64)], owner=ME, queue="default",
                         max_attempts=1_000_000)
    job = claim(s, slot="slot1@node01")
    assert job is not None
    return s, job, url


@pytest.mark.slow  # (make test's time: runs with make test-slow)
@settings(max_examples=examples(200), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_nothing_applied_that_a_genuine_report_could_not_apply(
    claimed: tuple[JobStore, Job, str], data: st.DataObject,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mutated reports of the job's owner and of another account, sent through the same path
    as a replay: the job's decided columns never change; a refusal is all that can come back."""
    s, job, url = claimed
    monkeypatch.setenv("JOBSTORE_DATABASE_URL", url)
    assert job.token is not None
    base = genuine(job.id, job.token, job.claims, store_identity(url))
    record = data.draw(mutated(base))
    other = 0 if os.geteuid() else 65534  # root, or nobody: not the owner either way
    writer = Caller(data.draw(st.sampled_from([os.geteuid(), other])))
    before = {k: getattr(s.reads.get_job(job.id), k) for k in PROTECTED}
    try:
        send_record(record, writer, node=direct())
    except (BadReport, ForeignReport, NotOwner, UnknownJob):
        pass
    after = {k: getattr(s.reads.get_job(job.id), k) for k in PROTECTED}
    assert after == before


# ---- the live agent -------------------------------------------------------------------------

HOOK_NAMES = st.sampled_from([n.encode() for n in NAMES] + [b"nope", b""])
framed = st.builds(
    lambda hook, env, stdin, argv: encode([hook, env, stdin, *argv]),
    HOOK_NAMES, st.binary(max_size=60), st.binary(max_size=400),
    st.lists(st.sampled_from([b"accept", b"reject", b"exit", b"evict", b"x" * 70_000]),
             max_size=3),
)
raw = st.binary(max_size=200) | st.builds(
    lambda n, body: MAGIC + n.to_bytes(4, "big") + body,
    st.integers(0, 2**32 - 1), st.binary(max_size=200))


@pytest.mark.slow  # (make test's time: runs with make test-slow)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@settings(max_examples=examples(200), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(payload=framed | raw)
def test_live_agent_answers_anything_and_stays_up(node: Node, payload: bytes) -> None:  # noqa: F811
    """Whatever a client sends, the agent answers with a well-formed message or closes, and
    stays up; a genuine FETCH_WORK is still served afterwards."""
    if node.agent is None:
        node.start()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(WAIT)
    try:
        s.connect(node.socket)
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    finally:
        s.close()
    if answer:
        items = decode_body(answer[HEADER:], big_item=2)
        assert answer[:4] == MAGIC and items[0] in (b"ok", b"busy", b"refused")
    assert node.agent is not None and node.agent.poll() is None
    good = node.hook("fetch_job", slot_ad("slot1@node01"), JOBSTORE_HOOK_MODE="agent")
    assert good.returncode == 0 and good.stdout == b"" and good.stderr == b"", good.stderr
