"""Jobs through the real startd: the README's node runs a submitter's jobs as her, on the
PostgreSQL keyword's static slots and on the SQLite keyword's partitionable slot."""

from __future__ import annotations

import re
import statistics
import subprocess
import time

from .conftest import MEASURED, Live


def test_a_job_runs_as_its_owner_on_a_static_slot(live: Live) -> None:
    (job,) = live.submit("executable = /bin/sh\narguments = \"-c 'id -un > who.out; exit 3'\"\n"
                         "queue\n")
    done = live.wait_status(job, "completed")
    assert done["exit_code"] == 3
    assert (live.work / "who.out").read_text().strip() == "alice"
    assert done["slot"].startswith(("slot1@", "slot2@")), done


def test_the_sqlite_keyword_runs_jobs_in_dynamic_slots_of_the_partitionable_slot(live: Live
                                                                                   ) -> None:
    db = f"sqlite:///{live.sqlite}"
    jobs = live.submit("executable = /bin/sh\nrequest_cpus = 1\nrequest_memory = 256\n"
                       "arguments = \"-c 'date +%s.%N > lite.$(Process); sleep 3; "
                       "date +%s.%N >> lite.$(Process)'\"\nqueue 2\n", db=db)
    assert len(jobs) == 2
    done = [live.wait_status(j, "completed", db=db) for j in jobs]
    assert all(j["slot"].startswith("slot3") for j in done), done
    (s0, e0), (s1, e1) = (map(float, (live.work / f"lite.{i}").read_text().split())
                          for i in (0, 1))
    assert s1 < e0 and s0 < e1, "the two jobs ran one after the other, not side by side"


def test_a_job_submitted_to_an_idle_pool_starts_at_once(live: Live) -> None:
    """The waiting fetch: from `jobstore submit` to the job's own process, one job at a time
    into an idle pool (reported, not asserted)."""
    took = []
    for i in range(8):
        stamp = live.work / f"started.{i}"
        started = time.time()
        (job,) = live.submit(f"executable = /bin/sh\narguments = \"-c 'date +%s.%N > {stamp}'\"\n"
                             "queue\n", name="one.sub")
        live.wait_status(job, "completed")
        took.append(float(stamp.read_text()) - started)
    MEASURED.append(f"submit -> the job's process, idle pool, {len(took)} jobs: p50 "
                    f"{statistics.median(took) * 1000:.0f} ms, max {max(took) * 1000:.0f} ms "
                    "(the `jobstore submit` process's start included)")
    assert all(t > 0 for t in took)


def test_the_hooks_find_the_agent_where_the_configuration_says(live: Live) -> None:
    """JOBSTORE_AGENT_SOCKET is set in the HTCondor configuration only (the pool's own socket,
    not the default): the startd's environment hands it to every hook."""
    done = subprocess.run([str(live.venv / "bin" / "jobstore"), "agent", "--check"],
                          env=live.pool.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    sock = live.pool.base / "run" / "agent.sock"
    for keyword in ("JOBSTORE", "LITE"):
        assert any(line.startswith(f"{keyword}: hooks ")
                   and line.endswith(f"at {sock} (STARTD_ENVIRONMENT): agent mode (served by "
                                     "uid 0)") for line in done.stdout.splitlines()), done.stdout
    # a hook that fell back (while a test killed the agent) looked where the agent listens
    looked = re.findall(r"no jobstore agent at (\S+) ", live.pool.log("JobstoreHookLog"))
    assert set(looked) <= {str(sock)}, looked
