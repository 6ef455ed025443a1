"""Settings and service accounts are read where they enter: a report the agent serves
takes the keyword's settings and the service accounts' uids the agent read at start (and again
on SIGHUP), and reads neither the configuration nor the account database itself; a hook process
in direct mode, which serves one call, reads both once. In process, on real databases."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobstore.db.store import JobStore
from jobstore.formats.jobads import render_job
from jobstore.node import config, handlers
from jobstore.node.hookcall import HookRequest
from jobstore.node.services import direct
from jobstore.testing.factories import claim, claim_request, submit

REQ = claim_request(shape="s")


@pytest.fixture
def node(store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("JOBSTORE_DATABASE_URL", store.db.engine.url.render_as_string(False))
    monkeypatch.setenv("JOBSTORE_SANDBOX_ROOT", str(tmp_path / "sandboxes"))
    monkeypatch.setenv("JOBSTORE_SPOOL", str(tmp_path / "spool"))
    direct().drop_stores()
    yield
    direct().drop_stores()


def _exit_ad(store: JobStore) -> tuple[int, bytes]:
    """A claimed job of this account and its JOB_EXIT ad."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    submit(store, owner=me)
    job = claim(store, REQ)
    assert job is not None
    ad = render_job(job, sandbox="/tmp", keyword="JOBSTORE", uid_domain="localdomain",
                    job_lease_duration=2400)
    return job.id, (ad + "ExitCode = 0\nExitBySignal = false\n").encode()


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the reads of the configuration and of the service accounts."""
    calls = {"settings": 0, "services": 0}
    load, resolve = config.load_settings, config.service_uids

    def counted_load(keyword: str | None) -> Any:
        calls["settings"] += 1
        return load(keyword)

    def counted_resolve(names: tuple[str, ...]) -> frozenset[int]:
        calls["services"] += 1
        return resolve(names)

    monkeypatch.setattr(config, "load_settings", counted_load)
    monkeypatch.setattr(config, "service_uids", counted_resolve)
    return calls


def test_a_report_the_agent_serves_reads_neither_settings_nor_accounts(
        store: JobStore, node: None, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id, ad = _exit_ad(store)
    cache = config.SettingsCache()
    cache.get("JOBSTORE")  # the agent's reading at start
    calls = _counting(monkeypatch)
    response = handlers.handle(HookRequest(hook="job_exit", argv=["exit"], stdin=ad,
                                           settings=cache.get, services=frozenset({0}),
                                           node=direct()))
    assert response.error is None, response.error
    assert store.reads.get_job(job_id).status == "completed"
    assert calls == {"settings": 0, "services": 0}


def test_a_hook_process_reads_them_once_for_its_one_call(
        store: JobStore, node: None, monkeypatch: pytest.MonkeyPatch) -> None:
    job_id, ad = _exit_ad(store)
    calls = _counting(monkeypatch)
    response = handlers.handle(HookRequest(hook="job_exit", argv=["exit"], stdin=ad,
                                           node=direct()))
    assert response.error is None, response.error
    assert store.reads.get_job(job_id).status == "completed"
    assert calls["services"] == 1 and calls["settings"] >= 1


def test_the_environment_wins_over_the_configuration(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One precedence rule (README): $JOBSTORE_<X> over JOBSTORE_<X> in the configuration, for
    each setting that has a variable of its own; the configuration where the variable is unset."""
    import htcondor2

    configured = {name: str(tmp_path / f"configured-{name.lower()}")
                  for name in ("SPOOL", "SANDBOX_ROOT", "HOOK_LOG")}
    path = tmp_path / "condor_config"
    path.write_text("".join(f"JOBSTORE_{k} = {v}\n" for k, v in configured.items())
                    + f"JOBSTORE_DATABASE_URL = sqlite:///{tmp_path}/configured.db\n")
    monkeypatch.setenv("CONDOR_CONFIG", str(path))
    for name in (*configured, "DATABASE_URL"):
        monkeypatch.delenv(f"JOBSTORE_{name}", raising=False)
    htcondor2.reload_config()
    try:
        read = config.load_settings(None)
        assert (read.spool, read.sandbox_root, read.hook_log) == tuple(configured.values())
        assert read.database_url == f"sqlite:///{tmp_path}/configured.db"
        for name in configured:
            monkeypatch.setenv(f"JOBSTORE_{name}", f"/from/environment/{name.lower()}")
        monkeypatch.setenv("JOBSTORE_DATABASE_URL", f"sqlite:///{tmp_path}/environment.db")
        read = config.load_settings(None)
        assert (read.spool, read.sandbox_root, read.hook_log) == (
            "/from/environment/spool", "/from/environment/sandbox_root",
            "/from/environment/hook_log")
        assert read.database_url == f"sqlite:///{tmp_path}/environment.db"
    finally:
        monkeypatch.undo()
        htcondor2.reload_config()
