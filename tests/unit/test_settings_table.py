"""Every setting is declared once (node.settingtable): the configuration is read through it, the
dataclasses take their defaults from it, docs/settings.md is rendered from it, and nothing the
code or the shipped drop-ins name is missing from it. Read from a real HTCondor configuration
(htcondor2, `_CONDOR_<NAME>` variables)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import htcondor2
import pytest

from jobstore.errors import ConfigError
from jobstore.node import config
from jobstore.node.settingreaders import READERS
from jobstore.node.settingspage import render
from jobstore.node.settingtable import (
    AGENT_SETTINGS,
    ALL_SETTINGS,
    BY_PARAM,
    KEYWORD_SETTINGS,
    Setting,
)

REPO = Path(__file__).resolve().parents[2]
# Set by the tests' conftest for every test; a test of the defaults takes them away.
CONFTEST_PARAMS = ("JOBSTORE_FETCH_WAIT", "JOBSTORE_AGENT_NUDGE_COMMAND")
# A setting a drop-in sets, or shows in a comment: `JOBSTORE_X = value`, `# JOBSTORE_X = value`.
DROPIN = re.compile(r"^#?\s*(JOBSTORE_[A-Z0-9_]+)\s*=[ \t]*(.*)$", re.M)
# What an admin writes: renaming one silently drops her setting.
PARAMETERS = (
    "JOBSTORE_DATABASE_URL", "JOBSTORE_DATABASE_PASSWORD_FILE", "JOBSTORE_QUEUE",
    "JOBSTORE_ALLOWED_OWNERS", "JOBSTORE_SCHEDD_NAME", "JOBSTORE_UID_DOMAIN",
    "JOBSTORE_CLAIM_LEASE",
    "JOBSTORE_LEASE_DURATION", "JOBSTORE_MAX_ATTEMPTS", "JOBSTORE_JOB_LEASE_DURATION",
    "JOBSTORE_CONNECT_TIMEOUT", "JOBSTORE_STATEMENT_TIMEOUT_MS", "JOBSTORE_FETCH_DEADLINE",
    "JOBSTORE_FETCH_WAIT", "JOBSTORE_HOOK_LOG", "JOBSTORE_SPOOL", "JOBSTORE_SANDBOX_ROOT",
    "JOBSTORE_DAG_SCRIPTS",
    "JOBSTORE_MAX_OUTPUT_FILE_MB", "JOBSTORE_MAX_OUTPUT_MB", "JOBSTORE_MAX_INPUT_FILE_MB",
    "JOBSTORE_MAX_INPUT_MB", "JOBSTORE_INPUT_CACHE_MB", "JOBSTORE_FAIR_SHARE",
    "JOBSTORE_PRIORITY_HALFLIFE", "JOBSTORE_PRIORITY_UPDATE_INTERVAL",
    "JOBSTORE_CONCURRENCY_LIMITS", "JOBSTORE_PERIODIC_EXPR_INTERVAL", "JOBSTORE_CHECK_LAUNCH",
    "JOBSTORE_HISTORY_RETENTION", "JOBSTORE_PRUNE_INTERVAL", "IMMUTABLE_JOB_ATTRS",
    "PROTECTED_JOB_ATTRS", "JOBSTORE_AGENT_SOCKET", "JOBSTORE_AGENT_STARTD_USERS",
    "JOBSTORE_AGENT_LOG", "JOBSTORE_AGENT_WORKERS", "JOBSTORE_AGENT_SERVICE_WORKERS",
    "JOBSTORE_AGENT_MAX_SERVICE_CLIENTS", "JOBSTORE_AGENT_MAX_CLIENTS",
    "JOBSTORE_AGENT_MAX_CLIENTS_PER_UID", "JOBSTORE_AGENT_MAX_BYTES_PER_UID",
    "JOBSTORE_AGENT_READ_TIMEOUT", "JOBSTORE_AGENT_REPLAY_INTERVAL", "JOBSTORE_AGENT_DB_OVERFLOW",
    "JOBSTORE_AGENT_WATCH_INTERVAL", "JOBSTORE_AGENT_WATCH_LISTEN",
    "JOBSTORE_AGENT_VACATE_COMMAND", "JOBSTORE_AGENT_NUDGE_COMMAND", "JOBSTORE_AGENT_METRICS_PORT",
    "JOBSTORE_AGENT_METRICS_ADDRESS", "JOBSTORE_AGENT_METRICS_STORE",
    "JOBSTORE_AGENT_EXPRESSION_TIMEOUT", "JOBSTORE_AGENT_EXPRESSION_WORKERS",
    "JOBSTORE_AGENT_REPORT_DELAY", "MACHINE_MAX_VACATE_TIME", "UPDATE_INTERVAL",
    "CLASSAD_LIFETIME", "JOBSTORE_HOOK_MODE", "JOBSTORE_OUTPUT_SECONDS", "JOBSTORE_URL_TIMEOUT",
    "JOBSTORE_COMMAND_SERVER", "JOBSTORE_WATCH_POLL",
)
# Drop-in values that are the node's choice or an example, not the default.
NOT_DEFAULTS = {"JOBSTORE_FETCH_WAIT", "JOBSTORE_AGENT_METRICS_PORT", "JOBSTORE_DATABASE_URL",
                "JOBSTORE_DATABASE_PASSWORD_FILE"}
# The fields that are not settings of their own.
NOT_SETTINGS = {"keyword", "credentials_error", "service_accounts", "hook_log"}


@pytest.fixture
def condor(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Sets HTCondor configuration parameters for this test (and reloads it after)."""
    for name in CONFTEST_PARAMS:
        monkeypatch.delenv(f"_CONDOR_{name}", raising=False)
    for name in ("JOBSTORE_SPOOL", "JOBSTORE_HOOK_LOG", "JOBSTORE_AGENT_SOCKET",
                 "JOBSTORE_SANDBOX_ROOT", "JOBSTORE_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)

    def put(**params: str) -> None:
        for name, value in params.items():
            monkeypatch.setenv(f"_CONDOR_{name}", value)
        htcondor2.reload_config()

    put()
    yield put
    monkeypatch.undo()
    htcondor2.reload_config()


def test_the_settings_page_is_rendered_from_the_table() -> None:
    page = (REPO / "docs" / "settings.md").read_text()
    assert page == render(), "docs/settings.md differs from the table: run `make docs`"
    for setting in ALL_SETTINGS:
        assert f"`{setting.param}`" in page


def test_the_parameters_an_admin_writes_are_the_tables() -> None:
    assert sorted(s.param for s in ALL_SETTINGS) == sorted(PARAMETERS)


def test_the_dropins_show_the_defaults_the_table_declares() -> None:
    """What 50-jobstore.conf and 55-jobstore-agent.conf set or show in a comment is the
    default, but for the node's own choices and examples."""
    compared = 0
    for path in (REPO / "condor_config.d").glob("*.conf"):
        for name, value in DROPIN.findall(path.read_text()):
            setting = BY_PARAM.get(name)
            if setting is None or name in NOT_DEFAULTS or "$(" in value or not value.strip():
                continue
            read = READERS[setting.kind](setting, name, value.strip())
            default = setting.default
            if name == "JOBSTORE_AGENT_STARTD_USERS":
                default = ("condor",)
            assert read == default, (path.name, name, value, setting.default)
            compared += 1
    assert compared > 25


def test_each_field_has_one_row_and_its_default() -> None:
    for cls, rows in ((config.Settings, KEYWORD_SETTINGS), (config.AgentSettings, AGENT_SETTINGS)):
        fields = {f.name: f for f in dataclasses.fields(cls)}
        named = [s.field for s in rows if s.field]
        assert len(named) == len(set(named)), f"{cls.__name__}: a field with two rows"
        for setting in rows:
            if setting.field:
                assert setting.field in fields, (cls.__name__, setting.param)
        for name, f in fields.items():
            row = next((s for s in rows if s.field == name), None)
            if row is None:
                assert name in NOT_SETTINGS | {"database_url"}, f"{cls.__name__}.{name}: no row"
                continue
            if f.default is not dataclasses.MISSING:
                assert f.default == row.default, (cls.__name__, name)
    assert len({s.param for s in ALL_SETTINGS}) == len(ALL_SETTINGS), "a parameter twice"


def test_every_setting_the_code_and_the_dropins_name_is_in_the_table() -> None:
    named: dict[str, str] = {}
    for path in (REPO / "jobstore").rglob("*.py"):
        if "testing" in path.parts:
            continue
        for name in re.findall(r"[\"'](?:_CONDOR_)?(JOBSTORE_[A-Z0-9_]+)[\"']", path.read_text()):
            named.setdefault(name, str(path.relative_to(REPO)))
    for path in (REPO / "condor_config.d").iterdir():
        for name, _ in DROPIN.findall(path.read_text()):
            named.setdefault(name, str(path.relative_to(REPO)))
    # HTCondor's names for the hooks and for a daemon, and a marker that is no setting
    others = re.compile(r"JOBSTORE_(HOOK_(DIR|FETCH_WORK|REPLY_FETCH|EVICT_CLAIM|PREPARE_JOB|"
                        r"UPDATE_JOB_INFO|JOB_EXIT)|(AGENT|SCHEDD)(_ARGS)?|"
                        r"CLUSTER_ID_IS_NOT_KNOWN_\w+)$")
    missing = {n: where for n, where in named.items()
               if n not in BY_PARAM and not others.match(n)}
    assert not missing, f"settings outside the table: {missing}"
    assert len(named) > 40  # the scan found them


def _sample(setting: Setting) -> str:
    """A usable value of the setting other than its default."""
    samples = {
        "boolean": "false" if setting.default else "true",
        "names": "alice, bob",
        "attribute names": "FooBar Baz",
        "command": "/bin/nudge --now",
        "port": "9123",
        "loopback address": "::1",
        "seconds": "7",
        "duration": "2h",
        "vacate time": "3 * 60",
    }
    if setting.kind == "integer":
        assert isinstance(setting.default, int | float)
        return str(int(setting.default) + 1)
    return samples.get(setting.kind, "/elsewhere/x")


@pytest.mark.parametrize("setting", [s for s in KEYWORD_SETTINGS + AGENT_SETTINGS
                                     if s.field and s.kind != "database url"],
                         ids=lambda s: s.param)
def test_each_setting_is_read_into_its_field(setting: Setting, condor) -> None:
    settings, agent = config.load_settings(None), config.load_agent_settings()
    before = getattr(agent if setting in AGENT_SETTINGS else settings, setting.field)
    assert before == setting.default or setting.param in ("JOBSTORE_UID_DOMAIN",
                                                          "JOBSTORE_AGENT_STARTD_USERS")
    condor(**{setting.param: _sample(setting)})
    loaded = config.load_agent_settings() if setting in AGENT_SETTINGS else \
        config.load_settings(None)
    after = getattr(loaded, setting.field)
    assert after != before
    if setting.default is not None:
        assert type(after) is type(setting.default), (type(after), setting.default)
    if setting.kind == "integer":
        assert after == int(_sample(setting))
    if setting.kind == "names":
        assert after == ("alice", "bob")


def test_a_keywords_own_value_comes_first_then_the_shared_one_then_htcondors(condor) -> None:
    condor(JOBSTORE_QUEUE="shared", GPU_JOBSTORE_QUEUE="gpus",
           PRIORITY_HALFLIFE="7200", GPU_JOBSTORE_PRIORITY_HALFLIFE="600",
           PERIODIC_EXPR_INTERVAL="30.0", UID_DOMAIN="example.org",
           JOBSTORE_UID_DOMAIN="jobs.example.org")
    gpu, default = config.load_settings("gpu"), config.load_settings(None)
    assert (gpu.queue, default.queue) == ("gpus", "shared")
    assert (gpu.priority_halflife, default.priority_halflife) == (600.0, 7200.0)
    assert gpu.periodic_expr_interval == default.periodic_expr_interval == 30
    assert gpu.uid_domain == default.uid_domain == "jobs.example.org"
    condor(JOBSTORE_PRIORITY_HALFLIFE="3600")  # the shared one, over HTCondor's own
    assert config.load_settings(None).priority_halflife == 3600.0
    condor(JOBSTORE_UID_DOMAIN="")  # unset: HTCondor's own
    assert config.load_settings(None).uid_domain == "example.org"


def test_a_variable_of_its_own_wins_over_the_configuration(condor, monkeypatch) -> None:
    condor(JOBSTORE_SPOOL="/from/config", JOBSTORE_AGENT_SOCKET="/from/config.sock")
    assert config.load_settings(None).spool == "/from/config"
    monkeypatch.setenv("JOBSTORE_SPOOL", "/from/env")
    monkeypatch.setenv("JOBSTORE_AGENT_SOCKET", "/from/env.sock")
    assert config.load_settings(None).spool == "/from/env"
    assert config.load_agent_settings().socket == "/from/env.sock"
    assert config.load_agent_settings("/given.sock").socket == "/given.sock"


@pytest.mark.parametrize(("params", "message"), [
    ({"JOBSTORE_CLAIM_LEASE": "soon"}, "JOBSTORE_CLAIM_LEASE must be an integer, not 'soon'"),
    ({"GPU_JOBSTORE_CLAIM_LEASE": "2"}, "GPU_JOBSTORE_CLAIM_LEASE must be at least 5"),
    ({"JOBSTORE_FAIR_SHARE": "maybe"}, "JOBSTORE_FAIR_SHARE must be true or false, not 'maybe'"),
    ({"PRIORITY_HALFLIFE": "0"}, "PRIORITY_HALFLIFE must be more than 0 seconds"),
    ({"JOBSTORE_HISTORY_RETENTION": "a while"}, "JOBSTORE_HISTORY_RETENTION: "),
    ({"SECURE_JOB_ATTRS": "Owner 9lives"}, "SECURE_JOB_ATTRS: '9lives' is not an attribute name"),
    ({"JOBSTORE_PERIODIC_EXPR_INTERVAL": "often"},
     "JOBSTORE_PERIODIC_EXPR_INTERVAL must be an integer, not 'often'"),
])
def test_a_keywords_bad_value_names_the_parameter_it_came_from(params, message, condor) -> None:
    condor(**params)
    with pytest.raises(ConfigError) as caught:
        config.load_settings("gpu")
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("params", "message"), [
    ({"JOBSTORE_AGENT_WORKERS": "1"}, "JOBSTORE_AGENT_WORKERS must be at least 2"),
    ({"JOBSTORE_AGENT_SERVICE_WORKERS": "8"},
     "JOBSTORE_AGENT_SERVICE_WORKERS must be less than JOBSTORE_AGENT_WORKERS"),
    ({"JOBSTORE_AGENT_METRICS_PORT": "70000"},
     "JOBSTORE_AGENT_METRICS_PORT must be a TCP port (1-65535, or 0 for none)"),
    ({"JOBSTORE_AGENT_METRICS_ADDRESS": "0.0.0.0"},
     "JOBSTORE_AGENT_METRICS_ADDRESS must be a loopback address (127.0.0.1, ::1), not '0.0.0.0'"),
    ({"JOBSTORE_AGENT_REPORT_DELAY": "31"},
     "JOBSTORE_AGENT_REPORT_DELAY must be from 0 to 30 seconds"),
    ({"JOBSTORE_AGENT_EXPRESSION_TIMEOUT": "0"},
     "JOBSTORE_AGENT_EXPRESSION_TIMEOUT must be more than 0 and at most 3600 seconds"),
    ({"UPDATE_INTERVAL": "0"}, "UPDATE_INTERVAL must be at least 1"),
    ({"CLASSAD_LIFETIME": "inf"}, "CLASSAD_LIFETIME must be an integer, not 'inf'"),
    ({"CLASSAD_LIFETIME": "60.5"}, "CLASSAD_LIFETIME must be an integer, not '60.5'"),
])
def test_an_agent_settings_bad_value_names_it(params, message, condor) -> None:
    condor(**params)
    with pytest.raises(ConfigError, match=re.escape(message)):
        config.load_agent_settings()


def test_values_the_readers_take_as_htcondor_means_them(condor) -> None:
    condor(JOBSTORE_FETCH_WAIT="600", MACHINE_MAX_VACATE_TIME="10 * 60 + 5",
           JOBSTORE_AGENT_NUDGE_COMMAND="false", JOBSTORE_ALLOWED_OWNERS=" , ",
           IMMUTABLE_JOB_ATTRS="Foo", SECURE_JOB_ATTRS="Bar,Baz")
    settings, agent = config.load_settings(None), config.load_agent_settings()
    assert settings.fetch_wait == 120.0  # at most the hooks' limit
    assert settings.allowed_owners == ("*",)
    assert settings.immutable_attrs == ("Foo", "Bar", "Baz")
    assert agent.max_vacate_time == 605.0 and agent.nudge_command is None
    condor(CLASSAD_LIFETIME="60.0")  # an integer as HTCondor may write it
    assert config.load_agent_settings().classad_lifetime == 60
    for not_a_number in ("RemoteUserCpu + 1", "true", "error"):  # the startd's; its default
        condor(MACHINE_MAX_VACATE_TIME=not_a_number)
        assert config.load_agent_settings().max_vacate_time == 600.0
