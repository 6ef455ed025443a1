"""Keywords and per-keyword settings, read from HTCondor configuration and the environment.

Every setting `X` is looked up as `<KEYWORD>_JOBSTORE_X`, then `JOBSTORE_X`, then a default.
The database URL is special: the environment variable JOBSTORE_DATABASE_URL wins over the
configuration (an explicit `--db` wins over both, in the CLI).
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from jobstore.errors import JobstoreError
from jobstore.node.hooktable import FETCH_WAIT_LIMIT

DEFAULT_QUEUE = "default"
DEFAULT_KEYWORD = "JOBSTORE"


class ConfigError(JobstoreError, ValueError):
    """A setting that cannot be used."""


def _param(name: str) -> str | None:
    """One HTCondor configuration value (None when unset); htcondor2 is imported on first use."""
    import htcondor2

    value = htcondor2.param.get(name)
    if value is None:
        return None
    value = str(value).strip()  # htcondor2 gives known parameters typed (PRIORITY_HALFLIFE)
    return value or None


param = _param


def _attr_names(*params: str) -> tuple[str, ...]:
    """The attribute names HTCondor's configuration lists in `params` (ConfigError for one
    that is not a name)."""
    names: list[str] = []
    for param in params:
        for name in re.split(r"[\s,]+", _param(param) or ""):
            if not name:
                continue
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,99}", name):
                raise ConfigError(f"{param}: {name!r} is not an attribute name")
            names.append(name)
    return tuple(names)


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
    """What one keyword's hooks need to know."""

    keyword: str
    database_url: str = field(repr=False)  # may hold the database password
    queue: str = DEFAULT_QUEUE
    allowed_owners: tuple[str, ...] = ("*",)
    uid_domain: str = "localdomain"
    lease_duration: int = 900
    claim_lease: int = 120
    max_attempts: int = 5
    fetch_deadline: float = 10.0
    fetch_wait: float = 5.0  # agent mode: how long a fetch that found nothing waits for work
    connect_timeout: int = 3
    statement_timeout_ms: int = 5000
    hook_log: str | None = None
    job_lease_duration: int = 2400
    spool: str = "/var/lib/jobstore/spool"
    # JOBSTORE_SANDBOX_ROOT: where fetched jobs with file transfer get their sandboxes (a
    # root-owned directory, mode 1777, that the agent or `jobstore install-hooks` makes)
    sandbox_root: str = "/var/lib/jobstore/sandboxes"
    max_output_mb: int = 1024  # JOBSTORE_MAX_OUTPUT_FILE_MB: the largest output a job sends back
    input_cache_mb: int = 10240  # JOBSTORE_INPUT_CACHE_MB: the node's copies of inputs, at most
    max_input_file_mb: int = 1024  # JOBSTORE_MAX_INPUT_FILE_MB: `jobstore init` stores it
    max_input_mb: int = 4096  # JOBSTORE_MAX_INPUT_MB: a job's inputs, at most (the same)
    # JOBSTORE_MAX_OUTPUT_MB: what one attempt of a job may send back in all (0: its
    # RequestDisk); `jobstore init` stores it, the database enforces it
    max_job_output_mb: int = 0
    # HTCondor's IMMUTABLE_JOB_ATTRS and SECURE_JOB_ATTRS (never submitted, never edited) and
    # PROTECTED_JOB_ATTRS (edited by a queue super user only), as `jobstore init` stores them
    immutable_attrs: tuple[str, ...] = ()
    protected_attrs: tuple[str, ...] = ()
    fair_share: bool = True  # JOBSTORE_FAIR_SHARE
    concurrency_limits: bool = True  # JOBSTORE_CONCURRENCY_LIMITS: enforce them
    priority_halflife: float = 86400.0  # PRIORITY_HALFLIFE, as the negotiator's
    priority_update_interval: int = 60  # JOBSTORE_PRIORITY_UPDATE_INTERVAL: the accountant's
    periodic_expr_interval: int = 60  # PERIODIC_EXPR_INTERVAL: the jobs' periodic policy pass
    check_launch: bool = True  # JOBSTORE_CHECK_LAUNCH: PREPARE_JOB holds jobs that cannot start
    history_retention: float = 30 * 86400.0  # JOBSTORE_HISTORY_RETENTION; 0 keeps everything
    prune_interval: int = 300  # JOBSTORE_PRUNE_INTERVAL: how often the agents prune, pool-wide
    # Why the database password could not be read (e.g. a starter hook running as the job's
    # user): the store cannot be used, but reports can still be spooled for the agent.
    credentials_error: str | None = None
    # The accounts the agent serves as the startd (JOBSTORE_AGENT_STARTD_USERS, else condor):
    # a job never runs as one of them (node.accounts.owner_refusal).
    service_accounts: tuple[str, ...] = ("condor",)

    def owner_allowed(self, owner: str) -> bool:
        """Is `owner` on this keyword's allow-list? (System accounts are checked elsewhere.)"""
        return "*" in self.allowed_owners or owner in self.allowed_owners


def _setting(keyword: str, name: str) -> str | None:
    return _param(f"{keyword}_JOBSTORE_{name}") or _param(f"JOBSTORE_{name}")


# The settings an environment variable of their own may give (a node without HTCondor's
# configuration: the tests, a personal store); it wins over the configuration, as HTCondor's
# own _CONDOR_<NAME> variables win over its files (htcondor2.param reads those).
FROM_ENVIRONMENT = ("DATABASE_URL", "SPOOL", "SANDBOX_ROOT", "HOOK_LOG", "AGENT_SOCKET")


def _environment_first(keyword: str, name: str) -> str | None:
    """$JOBSTORE_<name>, else the setting (`<KEYWORD>_JOBSTORE_<name>`, `JOBSTORE_<name>`)."""
    assert name in FROM_ENVIRONMENT
    return os.environ.get(f"JOBSTORE_{name}") or _setting(keyword, name)


def _fetch_wait(keyword: str) -> float:
    """JOBSTORE_FETCH_WAIT, at most FETCH_WAIT_LIMIT: the agent moves the waiting hook's
    deadline on by as much (its `hold`)."""
    return float(min(_int(keyword, "FETCH_WAIT", 5, minimum=0), FETCH_WAIT_LIMIT))


def _int(keyword: str, name: str, default: int, minimum: int = 1) -> int:
    return _checked_int(f"{keyword}_JOBSTORE_{name}", _setting(keyword, name), default, minimum)


def _bool(keyword: str, name: str, default: bool) -> bool:
    return _checked_bool(f"{keyword}_JOBSTORE_{name}", _setting(keyword, name), default)


def _flag(param: str, default: bool) -> bool:
    return _checked_bool(param, _param(param), default)


def _checked_bool(param: str, raw: str | None, default: bool) -> bool:
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"{param} must be true or false, not {raw!r}")


def _int_text(raw: str | None) -> str | None:
    """An HTCondor integer parameter as htcondor2 gives it (`60` or `60.0`) as integer text."""
    if raw is None:
        return None
    try:
        return str(int(float(raw)))
    except ValueError:
        return raw


def _duration(keyword: str, name: str, default: float) -> float:
    """A duration setting (`2592000`, `30d`; jobstore.core.durations) in seconds."""
    raw = _setting(keyword, name)
    if raw is None:
        return default
    from jobstore.core.durations import parse_duration

    try:
        return parse_duration(raw)
    except ValueError as exc:
        raise ConfigError(f"{keyword}_JOBSTORE_{name}: {exc}") from None


def _halflife(keyword: str) -> float:
    """<KEYWORD>_JOBSTORE_PRIORITY_HALFLIFE, else the negotiator's PRIORITY_HALFLIFE (seconds)."""
    param = f"{keyword}_JOBSTORE_PRIORITY_HALFLIFE"
    raw = _param(param)
    if raw is None:
        param, raw = "PRIORITY_HALFLIFE", _param("PRIORITY_HALFLIFE")
    if raw is None:
        return 86400.0
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{param} must be a number of seconds, not {raw!r}") from None
    if not value > 0:
        raise ConfigError(f"{param} must be more than 0")
    return value


def limit_maximum(name: str) -> float:
    """A concurrency limit's maximum from the configuration (jobstore.core.limits.maximum)."""
    from jobstore.core.limits import maximum

    try:
        return maximum(name, _param)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _checked_int(param: str, raw: str | None, default: int, minimum: int) -> int:
    """`raw` (the value of configuration `param`) as an integer >= minimum; default if unset."""
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{param} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{param} must be at least {minimum}")
    return value


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
    url = override or _environment_first(kw, "DATABASE_URL")
    url = url or default_sqlite_url()
    password_file = _setting(kw, "DATABASE_PASSWORD_FILE")
    if password_file and url.startswith("postgresql"):
        from sqlalchemy.engine import make_url

        try:
            password = _read_password_file(password_file)
        except ConfigError as exc:
            return url, str(exc)
        url = make_url(url).set(password=password).render_as_string(hide_password=False)
    return url, None


def load_settings(keyword: str | None, db_override: str | None = None) -> Settings:
    """All settings of `keyword` (the default keyword when None)."""
    kw = (keyword or DEFAULT_KEYWORD).upper()
    owners = _setting(kw, "ALLOWED_OWNERS")
    allowed = tuple(o for o in re.split(r"[\s,]+", owners or "*") if o)
    url, credentials_error = _database_url(kw, db_override)
    return Settings(
        keyword=kw,
        database_url=url,
        credentials_error=credentials_error,
        queue=_setting(kw, "QUEUE") or DEFAULT_QUEUE,
        allowed_owners=allowed or ("*",),
        uid_domain=_setting(kw, "UID_DOMAIN") or _param("UID_DOMAIN") or "localdomain",
        lease_duration=_int(kw, "LEASE_DURATION", 900, minimum=10),
        claim_lease=_int(kw, "CLAIM_LEASE", 120, minimum=5),
        max_attempts=_int(kw, "MAX_ATTEMPTS", 5),
        fetch_deadline=float(_int(kw, "FETCH_DEADLINE", 10)),
        fetch_wait=_fetch_wait(kw),
        connect_timeout=_int(kw, "CONNECT_TIMEOUT", 3),
        statement_timeout_ms=_int(kw, "STATEMENT_TIMEOUT_MS", 5000, minimum=100),
        hook_log=_environment_first(kw, "HOOK_LOG"),
        job_lease_duration=_int(kw, "JOB_LEASE_DURATION", 2400, minimum=60),
        spool=_environment_first(kw, "SPOOL") or Settings.spool,
        sandbox_root=_environment_first(kw, "SANDBOX_ROOT") or Settings.sandbox_root,
        max_output_mb=_int(kw, "MAX_OUTPUT_FILE_MB", Settings.max_output_mb),
        input_cache_mb=_int(kw, "INPUT_CACHE_MB", Settings.input_cache_mb, minimum=0),
        max_input_file_mb=_int(kw, "MAX_INPUT_FILE_MB", Settings.max_input_file_mb, minimum=0),
        max_input_mb=_int(kw, "MAX_INPUT_MB", Settings.max_input_mb, minimum=0),
        max_job_output_mb=_int(kw, "MAX_OUTPUT_MB", 0, minimum=0),
        immutable_attrs=_attr_names("IMMUTABLE_JOB_ATTRS", "SECURE_JOB_ATTRS"),
        protected_attrs=_attr_names("PROTECTED_JOB_ATTRS"),
        fair_share=_bool(kw, "FAIR_SHARE", True),
        concurrency_limits=_bool(kw, "CONCURRENCY_LIMITS", True),
        priority_halflife=_halflife(kw),
        priority_update_interval=_int(kw, "PRIORITY_UPDATE_INTERVAL", 60),
        check_launch=_bool(kw, "CHECK_LAUNCH", True),
        history_retention=_duration(kw, "HISTORY_RETENTION", Settings.history_retention),
        prune_interval=_int(kw, "PRUNE_INTERVAL", 300, minimum=10),
        periodic_expr_interval=_checked_int(
            "PERIODIC_EXPR_INTERVAL",
            _setting(kw, "PERIODIC_EXPR_INTERVAL") or _int_text(_param("PERIODIC_EXPR_INTERVAL")),
            60,
            1,
        ),
        service_accounts=configured_startd_users() or ("condor",),
    )


# ---- the per-node agent ---------------------------------------------------------------------


@dataclass(frozen=True)
class AgentSettings:
    """What `jobstore agent` reads from the configuration (JOBSTORE_AGENT_*)."""

    socket: str
    startd_users: tuple[str, ...]
    log: str | None
    hook_log: str | None = None  # where the agent logs the calls it serves (JOBSTORE_HOOK_LOG)
    workers: int = 8
    service_workers: int = 2  # workers kept for the service accounts' calls
    max_service_clients: int = 512  # connections of the service accounts, in all
    max_clients: int = 128  # connections of all other accounts together
    max_clients_per_uid: int = 16  # ... and of each of them
    max_bytes_per_uid: int = 8 * 1024 * 1024  # request bytes in flight per other account
    read_timeout: float = 5.0
    replay_interval: int = 60
    db_overflow: int = 0
    watch_interval: float = 2.0  # seconds between two looks at the attempts this node runs
    watch_listen: bool = True  # LISTEN for stopped attempts on PostgreSQL (else: poll only)
    vacate_command: str | None = None  # instead of the startd's vacateSlot (an emulator)
    nudge_command: str | None = "condor_update_machine_ad"  # makes a new startd fetch at once
    max_vacate_time: float = 600.0  # MACHINE_MAX_VACATE_TIME: a graceful vacate's longest grace
    metrics_port: int = 0  # JOBSTORE_AGENT_METRICS_PORT: Prometheus metrics (0: not served)
    metrics_address: str = "127.0.0.1"  # JOBSTORE_AGENT_METRICS_ADDRESS: a loopback address
    metrics_store: bool = False  # JOBSTORE_AGENT_METRICS_STORE: the store's view too
    # JOBSTORE_AGENT_EXPRESSION_TIMEOUT: the longest a job's expression may take (node.bounded)
    expression_timeout: float = 2.0
    expression_workers: int = 3  # JOBSTORE_AGENT_EXPRESSION_WORKERS: its worker processes
    update_interval: int = 300  # UPDATE_INTERVAL: how often the startd's slot ads are published
    classad_lifetime: int = 900  # CLASSAD_LIFETIME: how long a published slot ad is shown
    # JOBSTORE_AGENT_REPORT_DELAY: the longest REPLY_FETCH's and UPDATE_JOB_INFO's reports wait
    # for the attempt's next one (node.deferred); 0: each applied as it comes
    report_delay: float = 1.0


def agent_socket(override: str | None = None) -> str:
    """`override`, else $JOBSTORE_AGENT_SOCKET, else JOBSTORE_AGENT_SOCKET, else the default."""
    from jobstore.node.hookproc import DEFAULT_SOCKET

    return (
        override
        or os.environ.get("JOBSTORE_AGENT_SOCKET")
        or _param("JOBSTORE_AGENT_SOCKET")
        or DEFAULT_SOCKET
    )


def configured_startd_users() -> tuple[str, ...]:
    """JOBSTORE_AGENT_STARTD_USERS as configured (empty when it is not)."""
    users = _param("JOBSTORE_AGENT_STARTD_USERS") or ""
    return tuple(u for u in re.split(r"[\s,]+", users) if u)


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
    startd = startd_users()

    def number(name: str, default: int, minimum: int = 1) -> int:
        param = f"JOBSTORE_AGENT_{name}"
        return _checked_int(param, _param(param), default, minimum)

    workers = number("WORKERS", 8, minimum=2)
    service_workers = number("SERVICE_WORKERS", 2)
    if service_workers >= workers:
        raise ConfigError("JOBSTORE_AGENT_SERVICE_WORKERS must be less than JOBSTORE_AGENT_WORKERS")
    return AgentSettings(
        socket=agent_socket(socket_override),
        startd_users=startd,
        log=_param("JOBSTORE_AGENT_LOG"),
        hook_log=os.environ.get("JOBSTORE_HOOK_LOG") or _param("JOBSTORE_HOOK_LOG"),
        workers=workers,
        service_workers=service_workers,
        max_service_clients=number("MAX_SERVICE_CLIENTS", 512),
        max_clients=number("MAX_CLIENTS", 128),
        max_clients_per_uid=number("MAX_CLIENTS_PER_UID", 16),
        max_bytes_per_uid=number("MAX_BYTES_PER_UID", 8 * 1024 * 1024, minimum=64 * 1024),
        read_timeout=float(number("READ_TIMEOUT", 5)),
        replay_interval=number("REPLAY_INTERVAL", 60),
        db_overflow=number("DB_OVERFLOW", 0, minimum=0),
        watch_interval=float(number("WATCH_INTERVAL", 2)),
        watch_listen=_flag("JOBSTORE_AGENT_WATCH_LISTEN", True),
        vacate_command=_param("JOBSTORE_AGENT_VACATE_COMMAND"),
        nudge_command=_nudge_command(),
        max_vacate_time=_max_vacate_time(),
        metrics_port=_port("JOBSTORE_AGENT_METRICS_PORT"),
        metrics_address=_loopback(_param("JOBSTORE_AGENT_METRICS_ADDRESS") or "127.0.0.1"),
        metrics_store=_flag("JOBSTORE_AGENT_METRICS_STORE", False),
        expression_timeout=_seconds("JOBSTORE_AGENT_EXPRESSION_TIMEOUT", 2.0),
        expression_workers=number("EXPRESSION_WORKERS", 3),
        update_interval=_checked_int("UPDATE_INTERVAL", _param("UPDATE_INTERVAL"), 300, 1),
        classad_lifetime=_checked_int("CLASSAD_LIFETIME", _param("CLASSAD_LIFETIME"), 900, 1),
        # at most 30: a kept-back accept must go in well within the claim lease
        report_delay=_seconds("JOBSTORE_AGENT_REPORT_DELAY", AgentSettings.report_delay,
                              maximum=30, zero=True),
    )


def _nudge_command() -> str | None:
    """JOBSTORE_AGENT_NUDGE_COMMAND: what sends the startd UPDATE_MACHINE_AD (default
    condor_update_machine_ad; false or empty: the agent does not)."""
    raw = _param("JOBSTORE_AGENT_NUDGE_COMMAND")
    if raw is None:
        return AgentSettings.nudge_command
    return None if raw.strip().lower() in ("", "false", "no", "none", "0") else raw.strip()


def _seconds(param: str, default: float, *, maximum: float = 3600, zero: bool = False) -> float:
    """A positive number of seconds (fractions allowed), at most `maximum`; with `zero`, 0
    too."""
    raw = _param(param)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{param} must be a number of seconds, not {raw!r}") from None
    above_lowest = value >= 0 if zero else value > 0
    if not (above_lowest and value <= maximum):
        bounds = f"from 0 to {maximum:g}" if zero else f"more than 0 and at most {maximum:g}"
        raise ConfigError(f"{param} must be {bounds} seconds")
    return value


def _port(param: str) -> int:
    port = _checked_int(param, _param(param), 0, 0)
    if port > 65535:
        raise ConfigError(f"{param} must be a TCP port (1-65535, or 0 for none)")
    return port


def _loopback(address: str) -> str:
    """JOBSTORE_AGENT_METRICS_ADDRESS: a loopback address only (the metrics name owners and
    queues; a scraper on another host goes through a proxy the admin chooses)."""
    import ipaddress

    try:
        loopback = address == "localhost" or ipaddress.ip_address(address).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ConfigError(f"JOBSTORE_AGENT_METRICS_ADDRESS must be a loopback address"
                          f" (127.0.0.1, ::1), not {address!r}")
    return address


def _max_vacate_time() -> float:
    """MACHINE_MAX_VACATE_TIME (the startd's; an expression such as `10 * 60`), 600 when it is
    unset or not a constant number."""
    raw = _param("MACHINE_MAX_VACATE_TIME")
    if raw is None:
        return 600.0
    import classad2

    try:
        value = classad2.ExprTree(raw).eval()
    except Exception:  # noqa: BLE001 - the startd's setting; not ours to refuse
        return 600.0
    return float(value) if isinstance(value, int | float) and value >= 0 else 600.0
