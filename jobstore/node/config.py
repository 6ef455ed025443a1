"""Keywords and their settings, and the agent's, read from HTCondor configuration and the
environment as `settingtable` declares them.

A keyword's setting `JOBSTORE_X` is looked up as `<KEYWORD>_JOBSTORE_X`, then `JOBSTORE_X`,
then the HTCondor parameter it falls back to, then its default; one that has an environment
variable of its own ($JOBSTORE_DATABASE_URL, ...) takes that first (an explicit `--db` wins over
all, in the CLI).
"""

from __future__ import annotations

import os
import socket
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobstore.errors import ConfigError
from jobstore.node.settingreaders import READERS, names
from jobstore.node.settingtable import (
    AGENT_BY_FIELD,
    BY_FIELD,
    BY_PARAM,
    KEYWORD,
    Setting,
    agent_default,
    default,
)

DEFAULT_QUEUE: str = default("queue")
DEFAULT_KEYWORD = "JOBSTORE"


def _param(name: str) -> str | None:
    """One HTCondor configuration value (None when unset); htcondor2 is imported on first use."""
    import htcondor2

    value = htcondor2.param.get(name)
    if value is None:
        return None
    value = str(value).strip()  # htcondor2 gives known parameters typed (PRIORITY_HALFLIFE)
    return value or None


param = _param


def slot_id_from_name(slot_name: str) -> str:
    """`slot1_2@host` -> `slot1_2`: the id string the startd uses for per-slot settings."""
    return slot_name.split("@", 1)[0]


def slot_keyword(slot_name: str, slot_type_id: int | None = None) -> str | None:
    """The hook keyword of a slot, resolved as `Resource::getHookKeyword` does (section 5.1)."""
    slot_id = slot_id_from_name(slot_name)
    names = [f"{slot_id}_JOB_HOOK_KEYWORD"]
    if slot_type_id:
        names.append(f"SLOT_TYPE_{slot_type_id}_STARTD_JOB_HOOK_KEYWORD")
    names.append("STARTD_JOB_HOOK_KEYWORD")
    for name in names:
        value = _param(name)
        if value:
            return value
    return None


def starter_keyword(job_hook_keyword: str | None) -> str | None:
    """The keyword of the starter hooks: STARTER_JOB_HOOK_KEYWORD, else the job's HookKeyword."""
    return _param("STARTER_JOB_HOOK_KEYWORD") or job_hook_keyword


def default_sqlite_url() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return "sqlite:///" + os.path.join(base, "htcondor-jobstore", "jobstore.db")



@dataclass(frozen=True)
class Settings:
    """What one keyword's hooks need to know (settingtable.KEYWORD_SETTINGS says what each
    is)."""

    keyword: str
    database_url: str = field(repr=False)  # may hold the database password
    queue: str = DEFAULT_QUEUE
    allowed_owners: tuple[str, ...] = default("allowed_owners")
    uid_domain: str = default("uid_domain")
    schedd_name: str | None = default("schedd_name")
    lease_duration: int = default("lease_duration")
    claim_lease: int = default("claim_lease")
    max_attempts: int = default("max_attempts")
    fetch_deadline: float = default("fetch_deadline")
    fetch_wait: float = default("fetch_wait")
    connect_timeout: int = default("connect_timeout")
    statement_timeout_ms: int = default("statement_timeout_ms")
    hook_log: str | None = default("hook_log")
    job_lease_duration: int = default("job_lease_duration")
    spool: str = default("spool")
    sandbox_root: str = default("sandbox_root")
    dag_scripts: str = default("dag_scripts")
    max_output_mb: int = default("max_output_mb")
    input_cache_mb: int = default("input_cache_mb")
    max_input_file_mb: int = default("max_input_file_mb")
    max_input_mb: int = default("max_input_mb")
    max_job_output_mb: int = default("max_job_output_mb")
    immutable_attrs: tuple[str, ...] = default("immutable_attrs")
    protected_attrs: tuple[str, ...] = default("protected_attrs")
    fair_share: bool = default("fair_share")
    concurrency_limits: bool = default("concurrency_limits")
    priority_halflife: float = default("priority_halflife")
    priority_update_interval: int = default("priority_update_interval")
    periodic_expr_interval: int = default("periodic_expr_interval")
    check_launch: bool = default("check_launch")
    history_retention: float = default("history_retention")
    prune_interval: int = default("prune_interval")
    # Why the database password could not be read (e.g. a starter hook running as the job's
    # user): the store cannot be used, but reports can still be spooled for the agent.
    credentials_error: str | None = None
    # JOBSTORE_AGENT_STARTD_USERS: a job never runs as one of them (node.accounts.owner_refusal)
    service_accounts: tuple[str, ...] = agent_default("startd_users")

    def access_point(self) -> str:
        """This access point's name (JOBSTORE_SCHEDD_NAME, else the host's name)."""
        return self.schedd_name or socket.gethostname()

    def owner_allowed(self, owner: str) -> bool:
        """Is `owner` on this keyword's allow-list? (System accounts are checked elsewhere.)"""
        return "*" in self.allowed_owners or owner in self.allowed_owners


def _raw(setting: Setting, keyword: str | None) -> tuple[str, str | None]:
    """(the parameter the setting's text came from, that text; None when unset): its
    environment variable first where it has one, then `<KEYWORD>_<param>` for a keyword's
    setting, the parameter, and the HTCondor parameter it falls back to."""
    if setting.environment and os.environ.get(setting.param):
        return setting.param, os.environ[setting.param]
    params = [setting.param]
    if setting.scope == KEYWORD and keyword:
        params.insert(0, f"{keyword}_{setting.param}")
    if setting.fallback:
        params.append(setting.fallback)
    for name in params:
        raw = _param(name)
        if raw is not None:
            return name, raw
    return params[-1 if setting.fallback else 0], None


def read(setting: Setting, keyword: str | None = None) -> Any:
    """The value of one setting (of `keyword`'s, for a keyword's setting); ConfigError naming
    the parameter when its text cannot be used."""
    param, raw = _raw(setting, keyword)
    value = READERS[setting.kind](setting, param, raw)
    for more in setting.joined:  # lists read together (IMMUTABLE_JOB_ATTRS, SECURE_JOB_ATTRS)
        value = (*value, *READERS[setting.kind](setting, more, _param(more)))
    return value


def limit_maximum(name: str) -> float:
    """A concurrency limit's maximum from the configuration (jobstore.core.limits.maximum)."""
    from jobstore.core.limits import maximum

    try:
        return maximum(name, _param)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _read_password_file(path: str) -> str:
    """The first line of the password file; ConfigError when it cannot be read, or when others
    than its owner may read or write it (libpq refuses such a .pgpass too)."""
    try:
        with open(path, encoding="utf-8") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            if mode & 0o077:
                raise ConfigError(f"the database password file {path} has mode "
                                  f"{stat.S_IMODE(mode):04o}: others than its owner may read or "
                                  "change it (chmod 600 it)")
            return fh.readline().strip()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the database password file {path}: {exc.strerror}"
        ) from None


def database_url(keyword: str | None = None, override: str | None = None) -> str:
    """The URL: `override`, else $JOBSTORE_DATABASE_URL, else configuration, else SQLite; with
    the password of DATABASE_PASSWORD_FILE (ConfigError when it cannot be read)."""
    url, error = _database_url(keyword, override)
    if error:
        raise ConfigError(error)
    return url


def _database_url(keyword: str | None, override: str | None) -> tuple[str, str | None]:
    """(URL, None), or (URL without the password, why the password file cannot be read)."""
    kw = keyword or DEFAULT_KEYWORD
    url = override or _raw(BY_FIELD["database_url"], kw)[1] or default_sqlite_url()
    password_file = _raw(PASSWORD_FILE, kw)[1]
    if password_file and url.startswith("postgresql"):
        from sqlalchemy.engine import make_url

        try:
            password = _read_password_file(password_file)
        except ConfigError as exc:
            return url, str(exc)
        url = make_url(url).set(password=password).render_as_string(hide_password=False)
    return url, None


PASSWORD_FILE = BY_PARAM["JOBSTORE_DATABASE_PASSWORD_FILE"]


def load_settings(keyword: str | None, db_override: str | None = None) -> Settings:
    """All settings of `keyword` (the default keyword when None)."""
    kw = (keyword or DEFAULT_KEYWORD).upper()
    url, credentials_error = _database_url(kw, db_override)
    values = {name: read(setting, kw) for name, setting in BY_FIELD.items()
              if setting.kind != "database url"}
    return Settings(
        keyword=kw,
        database_url=url,
        credentials_error=credentials_error,
        service_accounts=configured_startd_users() or Settings.service_accounts,
        **values,
    )


# ---- the per-node agent ---------------------------------------------------------------------


@dataclass(frozen=True)
class AgentSettings:
    """What `jobstore agent` reads from the configuration (settingtable.AGENT_SETTINGS says
    what each is)."""

    socket: str
    startd_users: tuple[str, ...]
    log: str | None
    hook_log: str | None = None  # where the agent logs the calls it serves (JOBSTORE_HOOK_LOG)
    workers: int = agent_default("workers")
    service_workers: int = agent_default("service_workers")
    max_service_clients: int = agent_default("max_service_clients")
    max_clients: int = agent_default("max_clients")
    max_clients_per_uid: int = agent_default("max_clients_per_uid")
    max_bytes_per_uid: int = agent_default("max_bytes_per_uid")
    read_timeout: float = agent_default("read_timeout")
    replay_interval: int = agent_default("replay_interval")
    db_overflow: int = agent_default("db_overflow")
    watch_interval: float = agent_default("watch_interval")
    watch_listen: bool = agent_default("watch_listen")
    vacate_command: str | None = agent_default("vacate_command")
    nudge_command: str | None = agent_default("nudge_command")
    max_vacate_time: float = agent_default("max_vacate_time")
    metrics_port: int = agent_default("metrics_port")
    metrics_address: str = agent_default("metrics_address")
    metrics_store: bool = agent_default("metrics_store")
    expression_timeout: float = agent_default("expression_timeout")
    expression_workers: int = agent_default("expression_workers")
    update_interval: int = agent_default("update_interval")
    classad_lifetime: int = agent_default("classad_lifetime")
    report_delay: float = agent_default("report_delay")


def agent_socket(override: str | None = None) -> str:
    """`override`, else $JOBSTORE_AGENT_SOCKET, else JOBSTORE_AGENT_SOCKET, else the default."""
    return override or str(read(AGENT_BY_FIELD["socket"]))


def configured_startd_users() -> tuple[str, ...]:
    """JOBSTORE_AGENT_STARTD_USERS as configured (empty when it is not)."""
    return names(_param("JOBSTORE_AGENT_STARTD_USERS"))


def startd_users() -> tuple[str, ...]:
    """JOBSTORE_AGENT_STARTD_USERS: the service accounts (the startd's hooks run as one of
    them); default this process's own account and `condor`."""
    import pwd

    return configured_startd_users() or tuple(
        dict.fromkeys([pwd.getpwuid(os.getuid()).pw_name, "condor"]))


def service_uids(names: tuple[str, ...]) -> frozenset[int]:
    """The uids of the service accounts `names` (unknown names skipped), and root's."""
    import pwd

    uids = {0}
    for name in names:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            if name.isdigit():
                uids.add(int(name))
    return frozenset(uids)


class SettingsCache:
    """Each keyword's settings read once (a long-lived caller: the agent), until `clear` (its
    SIGHUP); a keyword whose settings do not load is read again at its next use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read: dict[str | None, Settings] = {}

    def get(self, keyword: str | None) -> Settings:
        with self._lock:
            found = self._read.get(keyword)
        if found is None:
            found = load_settings(keyword)
            with self._lock:
                self._read[keyword] = found
        return found

    def clear(self) -> None:
        with self._lock:
            self._read.clear()


def node_settings(
    extra: Iterable[str | None] = (),
    load: Callable[[str | None], Settings] = load_settings,
) -> dict[str | None, Settings]:
    """The settings of each keyword this node uses (the default one, STARTD_JOB_HOOK_KEYWORD,
    and `extra`), by keyword, read by `load`; a keyword whose settings do not load is left
    out."""
    out: dict[str | None, Settings] = {}
    for keyword in dict.fromkeys([None, _param("STARTD_JOB_HOOK_KEYWORD"), *extra]):
        try:
            out[keyword] = load(keyword)
        except ConfigError:
            continue
    return out


def load_agent_settings(socket_override: str | None = None) -> AgentSettings:
    """The agent's settings."""
    values = {name: read(setting) for name, setting in AGENT_BY_FIELD.items()
              if name not in ("socket", "startd_users")}
    if values["service_workers"] >= values["workers"]:
        raise ConfigError("JOBSTORE_AGENT_SERVICE_WORKERS must be less than JOBSTORE_AGENT_WORKERS")
    return AgentSettings(
        socket=agent_socket(socket_override),
        startd_users=startd_users(),
        hook_log=read(BY_FIELD["hook_log"]),
        **values,
    )
