"""The pool's slots: the agent publishes the slot ads its startd gives
FETCH_WORK every UPDATE_INTERVAL, `jobstore status` lists them as condor_status does, `q
-better-analyze` counts the slots a job matches and the clause that rules the others out, and a
slot not heard of for CLASSAD_LIFETIME drops out of view."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import clirun
import pytest
from agentnode import Node, node, store  # noqa: F401 - fixtures
from hookseq import ordinary_owner, slot_ad, submit_jobs

from jobstore.agent.slotads import SlotBoard
from jobstore.core.jobs import JobSpec
from jobstore.db.engine import upgrade
from jobstore.db.store import JobStore

TRANSCRIPT = (Path(__file__).parents[1] / "fixtures" / "htcondor-transcripts" / "01-normal-job"
              / "01-FETCH_WORK.stdin")


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return clirun.run([sys.executable, "-m", "jobstore.cli", "--db", url, *args],
                      capture_output=True, text=True, timeout=60)


def test_slot_board_publishes_the_newest_ads_and_expires_stale_ones(db_url: str) -> None:
    upgrade(db_url)
    jobs_db = JobStore.from_url(db_url)
    try:
        board = SlotBoard(update_interval=300, lifetime=60)
        assert board.due()
        board.seen(TRANSCRIPT.read_bytes())
        board.seen(slot_ad("slot1@node02", "node02") + b'ClaimId = "secret#claim"\n')
        board.seen(slot_ad("slot1@node02", "node02") + b"GPUs = 2\n")  # the newest wins
        board.seen(b"not a classad")  # ignored
        assert board.publish([jobs_db], now=1000.0) == 2 and not board.due()
        rows = jobs_db.slots.live_slots(now=1001.0)
        assert [(r.name, r.machine) for r in rows] == [
            ("slot1@node02", "node02"), ("slot2@node01.example.org", "node01.example.org")]
        assert "GPUs = 2" in rows[0].ad and "secret" not in rows[0].ad
        assert jobs_db.slots.live_slots(now=1061.0) == []  # out of view after its lifetime
        assert jobs_db.slots.expire_slots(now=1061.0) == 2
    finally:
        jobs_db.db.engine.dispose()


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_status_and_better_analyze(db_url: str, tmp_path: Path) -> None:
    upgrade(db_url)
    jobs_db = JobStore.from_url(db_url)
    try:
        board = SlotBoard(update_interval=300, lifetime=600)
        board.seen(slot_ad("slot1@cpu1", "cpu1"))
        board.seen(slot_ad("slot1@gpu1", "gpu1") + b"GPUs = 2\n")
        board.seen(slot_ad("slot2@gpu1", "gpu1") + b"GPUs = 4\nStart = false\n")
        board.publish([jobs_db])
        spec = JobSpec(cmd="/bin/true", iwd="/tmp", requirements="(TARGET.GPUs >= 2)",
                       custom={"RequestGPUs": "2"})
        cluster, _ = jobs_db.submissions.submit([spec], owner=ordinary_owner(), queue="default",
                                  max_attempts=3)
    finally:
        jobs_db.db.engine.dispose()
    table = _cli(db_url, "status")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:5] == ["Name", "OpSys", "Arch", "State", "Activity"]
    assert [ln.split()[0] for ln in lines[1:4]] == ["slot1@cpu1", "slot1@gpu1", "slot2@gpu1"]
    assert lines[-1].split()[:2] == ["Total", "3"]
    af = _cli(db_url, "status", "-af", "Name", "GPUs", "-constraint", "GPUs >= 2")
    assert af.stdout.splitlines() == ["slot1@gpu1 2", "slot2@gpu1 4"]
    compact = _cli(db_url, "status", "-compact").stdout.splitlines()
    assert [ln.split()[:3] for ln in compact[1:]] == [["cpu1", "/", "1"], ["gpu1", "/", "2"]]
    assert _cli(db_url, "status", "-total").stdout.splitlines()[-1].split()[:2] == ["Total", "3"]
    why = _cli(db_url, "q", "-better-analyze", f"{cluster}.0")
    assert why.returncode == 0, why.stderr
    assert "[0]   2              TARGET.GPUs >= 2" in why.stdout
    assert "Of 3 known slots, 1 are rejected by your job's requirements" in why.stdout
    assert "1 reject your job because of their own requirements (START)" in why.stdout
    assert "1 match and can run it" in why.stdout


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_the_agent_publishes_its_slots(node: Node, store: JobStore) -> None:  # noqa: F811
    with open(node.config, "a") as fh:
        fh.write("PERIODIC_EXPR_INTERVAL = 1\nUPDATE_INTERVAL = 1\nCLASSAD_LIFETIME = 3\n")
    submit_jobs(store, 1, ordinary_owner())
    node.start()
    fetched = node.hook("fetch_job", slot_ad("slot7@node01"), JOBSTORE_HOOK_MODE="agent")
    assert fetched.returncode == 0 and b"JobstoreJobId" in fetched.stdout
    end = time.monotonic() + 20
    while not store.slots.live_slots():
        assert time.monotonic() < end, node.log.read_text()
        time.sleep(0.2)
    (row,) = store.slots.live_slots()
    assert (row.name, row.machine) == ("slot7@node01", "node01.example.org")
    assert node.stop() == 0
    time.sleep(3.5)  # CLASSAD_LIFETIME: a node that stopped publishing drops out of view
    assert store.slots.live_slots() == []


def test_slot_board_reads_an_ad_as_its_name_says(db_url: str) -> None:
    """The slot's Name is the one a ClassAd reader finds: an ad that sets it twice is
    published under the last, as HTCondor reads it; one that names no slot is not published."""
    upgrade(db_url)
    jobs_db = JobStore.from_url(db_url)
    try:
        board = SlotBoard(update_interval=300, lifetime=60)
        board.seen(slot_ad("slot1@node03", "node03") + b'Name = "slot9@node03"\n')
        board.seen(slot_ad("slot1@node03", "node03"))  # another slot's: both are kept
        board.seen(b'Machine = "node04"\nCpus = 1\n')
        assert board.publish([jobs_db], now=1000.0) == 2
        assert [r.name for r in jobs_db.slots.live_slots(now=1001.0)] == [
            "slot1@node03", "slot9@node03"]
    finally:
        jobs_db.db.engine.dispose()
