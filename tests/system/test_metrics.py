"""Metrics: the store's view (`jobstore metrics`, the agent with JOBSTORE_AGENT_METRICS_STORE)
and the agent's own (hook calls, latency, database errors, the spool), in Prometheus' format."""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from pathlib import Path

import clirun
import pytest
from agentnode import Node, node, store  # noqa: F401 - fixtures
from backends import BOTH_BACKENDS
from hookseq import ordinary_owner, run_sequence, slot_ad, submit_jobs
from metricsread import free_port, samples
from prometheus_client.parser import text_string_to_metric_families

from jobstore.api.metrics import store_metrics
from jobstore.db.store import JobStore
from jobstore.node import spool
from jobstore.testing.factories import claim, job_spec, submit


@BOTH_BACKENDS
def test_store_view(store: JobStore) -> None:  # noqa: F811
    specs = [job_spec(i) for i in range(3)]
    store.submissions.submit(specs, owner="alice", queue="default", max_attempts=3,
                             now=time.time() - 100)
    store.submissions.submit(specs[:1], owner="bob", queue="gpu", max_attempts=3)
    assert claim(store, slot="slot1@node1", shape="s") is not None
    store.negotiator.update_priorities(interval=0)
    got = samples(store_metrics(store).decode())
    assert got[("jobstore_store_up", ())] == 1
    assert got[("jobstore_jobs", (("queue", "default"), ("status", "idle")))] == 2
    assert got[("jobstore_jobs", (("queue", "default"), ("status", "fetched")))] == 1
    assert got[("jobstore_jobs", (("queue", "gpu"), ("status", "idle")))] == 1
    age = got[("jobstore_oldest_job_age_seconds", (("queue", "default"), ("status", "idle")))]
    assert 100 <= age < 200
    assert got[("jobstore_claims_per_second", ())] == pytest.approx(1 / 60)
    assert got[("jobstore_job_events_total", ())] == 5  # 4 submits and a fetch
    assert got[("jobstore_submitter_resources_in_use", (("submitter", "alice"),))] == 1
    assert ("jobstore_submitter_priority", (("submitter", "alice"),)) in got
    if store.db.engine.dialect.name == "postgresql":
        assert ("jobstore_jobs_table_rows_estimate", ()) in got


def test_spool_depth(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    os.mkdir(directory, 0o700)
    before = time.time()
    first = spool.put(directory, {"x": 1})
    spool.put(directory, {"x": 2})
    spool.hold(directory, {"x": 3})  # being sent: still waiting
    (directory / "junk.report").write_text("not a report name")
    (directory / "README").write_text("")
    found = spool.depth(directory)
    assert found.reports == 3
    assert found.oldest == int(first.name.split("-")[0]) / 1e9
    assert before - 1 < found.oldest <= time.time()
    assert spool.depth(tmp_path / "missing") == (0, None)



def test_agent_serves_its_metrics_on_loopback(node: Node, store: JobStore) -> None:  # noqa: F811
    port = free_port()
    with open(node.config, "a") as fh:
        fh.write(f"JOBSTORE_AGENT_METRICS_PORT = {port}\nJOBSTORE_AGENT_METRICS_STORE = true\n")
    (job_id,) = submit_jobs(store, 1, ordinary_owner())
    node.start()
    node.wait_log(f"metrics served on http://127.0.0.1:{port}/metrics (with the store's view)")
    seq = run_sequence(node.hooks, node.env(JOBSTORE_HOOK_MODE="agent"), "slot1@node01")
    assert seq.job_id == job_id
    none = node.hook("fetch_job", slot_ad("slot2@node01"), JOBSTORE_HOOK_MODE="agent")
    assert none.stdout == b""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        got = samples(answer.read().decode())
    calls = {dict(k[1])["hook"] + "/" + dict(k[1])["result"]: v for k, v in got.items()
             if k[0] == "jobstore_hook_calls_total"}
    assert calls == {"fetch_job/job": 1, "fetch_job/none": 1, "reply_fetch/ok": 1,
                     "update_job_info/ok": 2, "prepare_job/ok": 1, "job_exit/ok": 1}
    assert got[("jobstore_hook_duration_seconds_count", (("hook", "update_job_info"),))] == 2
    spooled = str(node.base / "spool")
    assert got[("jobstore_spool_reports", (("directory", spooled),))] == 0
    assert got[("jobstore_agent_attempts_watched", ())] == 0  # its JOB_EXIT came
    assert got[("jobstore_store_up", ())] == 1
    # submit, fetch, accept, start, exit (the early update and PREPARE_JOB of the accepted job
    # only renewed the lease)
    assert got[("jobstore_job_events_total", ())] == 5
    assert not [k for k in got if k[0] == "jobstore_database_errors_total"]
    assert node.stop() == 0


def test_agent_metrics_only_on_loopback(node: Node) -> None:  # noqa: F811
    with open(node.config, "a") as fh:
        fh.write("JOBSTORE_AGENT_METRICS_PORT = 9100\nJOBSTORE_AGENT_METRICS_ADDRESS = 0.0.0.0\n")
    env = dict(node.env(), PATH=os.environ.get("PATH", "/usr/bin:/bin"))
    started = clirun.run([sys.executable, "-m", "jobstore.cli", "agent", "-f", "--socket",
                              node.socket], env=env, capture_output=True, text=True, timeout=60)
    assert started.returncode == 1
    assert started.stderr.strip() == ("jobstore: JOBSTORE_AGENT_METRICS_ADDRESS must be a loopback"
                                      " address (127.0.0.1, ::1), not '0.0.0.0'")


def test_metrics_command(store: JobStore) -> None:  # noqa: F811
    url = store.db.engine.url.render_as_string(hide_password=False)
    submit(store)
    env = {k: v for k, v in os.environ.items() if k != "JOBSTORE_DATABASE_URL"}
    done = clirun.run([sys.executable, "-m", "jobstore.cli", "--db", url, "metrics"],
                      capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert samples(done.stdout)[("jobstore_jobs", (("queue", "default"), ("status", "idle")))] == 1


def test_documented_names_are_the_served_ones(store: JobStore, tmp_path: Path) -> None:  # noqa: F811
    """docs/metrics.md lists exactly the names served, and the dashboard uses only those."""
    import json
    import re

    from prometheus_client import generate_latest

    from jobstore.agent.metrics import AgentMetrics
    from jobstore.node.hookcall import HookResponse

    submit(store)
    store.negotiator.update_priorities(interval=0)
    agent = AgentMetrics(lambda: [tmp_path], lambda: 0)
    spooled = HookResponse(error="x kept in the spool: y", database_error=True, spooled=True)
    agent.observe("job_exit", spooled, 0.01)
    served = {f.name for text in (store_metrics(store).decode(),
                                  generate_latest(agent.registry).decode())
              for f in text_string_to_metric_families(text)}
    docs = Path(__file__).resolve().parents[2] / "docs"
    documented = {re.sub(r"_total$", "", n) for n in
                  re.findall(r"^\| `(jobstore_\w+)`", (docs / "metrics.md").read_text(), re.M)}
    if store.db.engine.dialect.name != "postgresql":
        documented.discard("jobstore_jobs_table_rows_estimate")
    assert served == documented
    dashboard = json.loads((docs / "grafana-dashboard.json").read_text())
    used = {re.sub(r"_(bucket|count|sum|total)$", "", n)
            for p in dashboard["panels"] for t in p["targets"]
            for n in re.findall(r"jobstore_\w+", t["expr"])}
    assert used <= documented | {"jobstore_jobs_table_rows_estimate"}
