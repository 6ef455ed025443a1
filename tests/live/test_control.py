"""condor_rm, condor_hold, condor_vacate, condor_vacate_job and a job's periodic_* policy acting
on jobs that run on the real startd: the job's processes end, its slot goes back to work, the
store says why."""

from __future__ import annotations

import json
import time

from jobstore.testing.livepool import wait_for

from .conftest import MEASURED, PG_URL, Live


def _sleeper(live: Live, extra: str = "", db: str = PG_URL) -> tuple[str, str]:
    """A job that sleeps for an hour under a marker of its own, once it runs."""
    marker = live.marker(3600)
    (job,) = live.submit(f"executable = /bin/sleep\narguments = {marker}\n{extra}queue\n",
                         db=db)
    live.wait_process(marker)
    live.wait_status(job, "running", db=db)
    return job, marker


def _gone(live: Live, marker: str) -> None:
    live.wait_gone(marker)


def test_condor_rm_of_a_running_job_ends_it(live: Live) -> None:
    job, marker = _sleeper(live)
    done = live.jobstore("rm", job)
    assert done.returncode == 0, done.stderr
    assert live.wait_status(job, "removed")["status"] == "removed"
    _gone(live, marker)


def test_condor_hold_of_a_running_job_ends_it_and_release_runs_it_again(live: Live) -> None:
    job, marker = _sleeper(live)
    assert live.jobstore("hold", job).returncode == 0
    held = live.wait_status(job, "held")
    assert held["hold_code"] == 1
    _gone(live, marker)
    assert live.jobstore("release", job).returncode == 0
    live.wait_process(marker)
    assert live.jobstore("rm", job).returncode == 0
    _gone(live, marker)


def test_condor_vacate_sends_the_job_back_and_it_runs_again(live: Live) -> None:
    job, marker = _sleeper(live)
    slot = live.job(job)["slot"]
    done = live.pool.tool("condor_vacate", "-fast", slot)
    assert done.returncode == 0, done.stderr
    again = wait_for("the vacated job starts a second time",
                     lambda: (lambda j: j if j["NumJobStarts"] >= 2 else None)(live.job(job)),
                     90)
    assert again["status"] in ("running", "accepted", "fetched")
    assert live.jobstore("rm", job).returncode == 0
    _gone(live, marker)


def _events(live: Live, job: str, event: str, attempt: int) -> list[dict]:
    """The events `event` of `job`'s attempt `attempt`, as `jobstore events --json` gives them."""
    done = live.jobstore("events", "--json", job)
    assert done.returncode == 0, done.stderr
    return [e for e in map(json.loads, done.stdout.splitlines())
            if e["event"] == event and e["attempt"] == attempt]


def test_condor_vacate_job_sends_the_job_back_and_it_runs_again(live: Live) -> None:
    """`jobstore vacate` (condor_vacate_job) and `-fast`: the agent vacates the slot, the
    starter's JOB_EXIT evict sends the job back to idle, and it starts again."""
    job, marker = _sleeper(live, "kill_sig = SIGTERM\n")
    took = []
    for attempt, args in ((1, ("vacate", job)), (2, ("vacate", "-fast", job))):
        before = live.running(f"sleep {marker}")
        started = time.time()
        done = live.jobstore(*args)
        assert done.returncode == 0, done.stderr
        assert "vacating" in done.stdout

        def started_again(n: int = attempt) -> dict | None:
            ad = live.job(job)
            return ad if ad["NumJobStarts"] > n else None

        again = wait_for(f"the vacated job starts a {attempt + 1}. time", started_again, 90)
        assert again["status"] in ("running", "accepted", "fetched")
        live.wait_process(marker)
        live.wait_status(job, "running")
        def evicted_now(n: int = attempt) -> list[dict]:
            return _events(live, job, "evict", n)

        evicted = wait_for("the attempt's JOB_EXIT evict", evicted_now, 30)
        took.append(evicted[0]["time"] - started)
        now = live.running(f"sleep {marker}")
        assert before and now and not set(before) & set(now), (before, now)  # never two
    MEASURED.append(f"jobstore vacate -> its JOB_EXIT evict: {took[0] * 1000:.0f} ms; "
                    f"vacate -fast: {took[1] * 1000:.0f} ms (the command's start included)")
    assert live.jobstore("rm", job).returncode == 0
    _gone(live, marker)


def test_periodic_remove_and_periodic_hold_act_on_running_jobs(live: Live) -> None:
    removed, marker_r = _sleeper(live, "periodic_remove = (time() - JobCurrentStartDate) > 2\n")
    held, marker_h = _sleeper(live, "periodic_hold = (time() - JobCurrentStartDate) > 2\n")
    assert live.wait_status(removed, "removed", timeout=60)["status"] == "removed"
    h = live.wait_status(held, "held", timeout=60)
    assert h["hold_code"] == 3  # HTCondor's JobPolicy
    _gone(live, marker_r)
    _gone(live, marker_h)
    assert live.jobstore("rm", held).returncode == 0


def test_condor_hold_ends_a_job_in_a_dynamic_slot_and_not_its_neighbour(live: Live) -> None:
    db = f"sqlite:///{live.sqlite}"
    held, marker = _sleeper(live, "request_cpus = 1\n", db=db)
    other, other_marker = _sleeper(live, "request_cpus = 1\n", db=db)
    assert live.jobstore("hold", held, db=db).returncode == 0
    live.wait_status(held, "held", db=db)
    _gone(live, marker)
    assert live.running(f"sleep {other_marker}"), "the hold ended the other dynamic slot's job"
    assert live.job(other, db=db)["status"] == "running"
    for job in (held, other):
        assert live.jobstore("rm", job, db=db).returncode == 0
    _gone(live, other_marker)
