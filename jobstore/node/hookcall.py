"""A hook call as the handlers take it (HookRequest) and what they answer (HookResponse);
nothing here knows who calls: a hook process, the agent, a test."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from jobstore.node import config
from jobstore.node.reports import SERVICE, Caller
from jobstore.node.services import NodeServices


@dataclass
class HookRequest:
    hook: str
    argv: list[str]
    stdin: bytes
    env: Mapping[str, str] = field(default_factory=dict)
    set_deadline: Callable[[float], None] | None = None  # a process caller's hard time limit
    # Who asks: the agent names an ordinary account (SO_PEERCRED); a hook process in direct
    # mode is trusted as far as its database credentials go.
    caller: Caller = SERVICE
    # A keyword's settings as the caller read them (the agent: once, and again on SIGHUP);
    # None: read them now (a hook process serves one call).
    settings: Callable[[str | None], config.Settings] | None = None
    # The service accounts' uids as the caller resolved them (the agent: at start and on
    # SIGHUP); None: resolve them now.
    services: frozenset[int] | None = None
    # What serves the call: the caller's stores, evaluator, outbox, kept-back reports
    node: NodeServices = field(kw_only=True)

    def settings_for(self, keyword: str | None) -> config.Settings:
        """The settings of `keyword`, from the caller's reading if it made one."""
        return (self.settings or config.load_settings)(keyword)

    def service_uids(self) -> frozenset[int]:
        """The service accounts' uids, from the caller's reading if it made one."""
        if self.services is not None:
            return self.services
        return config.service_uids(config.startd_users())


@dataclass(frozen=True)
class IdleSlot:
    """A fetch that found nothing: its slot's keyword settings, queue and what it has free
    (CPUs, MiB, KiB), as a waiting fetch waits on them (jobstore.agent.fetchwait)."""

    settings: config.Settings
    queue: str
    cpus: int
    memory: int
    disk: int
    starter: int = 0  # a busy static slot's starter: the fetch waits for its end (agent)

    @property
    def database_url(self) -> str:
        return self.settings.database_url


@dataclass
class HookResponse:
    stdout: bytes = b""
    error: str | None = None
    exit_code: int = 0
    log: list[str] = field(default_factory=list)
    stale: bool = False  # the report was about a superseded attempt
    database_error: bool = False  # the database was away or refused
    spooled: bool = False  # the report could not be sent and waits in the spool
    fd: int | None = None  # an open file handed over with the answer (the caller closes it)
    idle: IdleSlot | None = None  # a fetch that found nothing for a slot that could take work
