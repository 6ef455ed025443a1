"""Configuration and report types of the emulator."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from jobstore.emulator.spawn import HookCall, ProcessRegistry
from jobstore.node.hooktable import CONDOR_NAMES
from jobstore.node.hooktable import STARTD_HOOKS as _STARTD
from jobstore.node.hooktable import STARTER_HOOKS as _STARTER

# The emulator speaks HTCondor's names ("FETCH_WORK", ...).
STARTD_HOOKS = frozenset(CONDOR_NAMES[h] for h in _STARTD)
STARTER_HOOKS = frozenset(CONDOR_NAMES[h] for h in _STARTER)

# (index of the job among the jobs that started running, job ad as a dict) -> seconds or None
VacateCallback = Callable[[int, dict[str, object]], float | None]


@dataclass
class EmulatorConfig:
    """What would be the node's HTCondor configuration."""

    hooks: dict[str, str]  # hook name ("FETCH_WORK", ...) -> executable path
    work_dir: str  # log/ and execute/ are made under it
    keyword: str = "JOBSTORE"
    static_slots: int = 4  # ignored when partitionable
    partitionable: bool = False
    cpus: int = 4
    memory: int = 4096  # MiB, machine total
    disk: int = 10_000_000  # KiB, machine total
    fetch_work_delay: str = 'ifThenElse(State == "Claimed" && Activity == "Idle",0,2)'
    min_rearm: float = 1.0  # the startd's max(FetchWorkDelay, 1) re-arm floor
    initial_update_interval: float = 8.0
    update_interval: float = 300.0
    job_exit_timeout: float = 30.0
    uid_domain: str = "localdomain"
    host: str = "node01.example.org"
    env: dict[str, str] = field(default_factory=dict)  # the condor_master's environment
    condor_user: str | None = None  # with euid 0: run as root (startd hooks as this account)
    start: str = "true"
    rank: str = "0"
    call_evict_claim: bool = False  # True: the documented (never observed) EVICT_CLAIM call
    reproduce_keyword_bug: bool = True  # 5.2: unknown HookKeyword -> no starter hooks at all
    claim_lease: float = 1200.0  # default JobLeaseDuration of a fetch claim in Claimed/Idle
    vacate_after: dict[int, float] | VacateCallback | None = None  # dict keys: ClusterId
    vacate_fast: bool = False  # automatic vacates use SIGKILL
    keep_sandboxes: bool = False
    # A directory where a file `vacate-<slot name>` asks the startd to vacate that slot, as
    # `condor_vacate` or the agent's Startd.vacateSlot would: fast when the file says `-fast`
    # (or nothing), else graceful (the startd removes the file). Write it under another name
    # (a leading dot) and rename it: a file read while it is being written says nothing yet.
    control_dir: str | None = None
    # MachineMaxVacateTime: a graceful vacate sends the job its KillSig, then SIGKILL after
    # min(JobMaxVacateTime, this) seconds.
    max_vacate_time: float = 600.0
    # The startd's first FETCH_WORK comes at its first UPDATE_INTERVAL (300 s on a real one,
    # docs/live-startd.md), or at once on UPDATE_MACHINE_AD: a file `update-machine-ad` in
    # control_dir (the startd removes it). 0: at once, for runs that do not test a start.
    first_fetch_after: float = 0.0


@dataclass
class JobRun:
    """One job the startd handed to a starter."""

    slot: str
    ad: str  # the job ad the starter received (sPrintAd text)
    cluster_id: int | None = None
    proc_id: int | None = None
    outcome: str = "pending"  # starter_failed | prepare_failed | spawn_failed | exited | evicted
    error: str | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    evicted: bool = False
    started: float | None = None  # when the job process was spawned
    ended: float | None = None
    final_ad: str | None = None  # JOB_EXIT stdin, or the starter's ad when no JOB_EXIT ran
    done: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)


@dataclass
class EmulatorReport:
    hook_calls: list[HookCall] = field(default_factory=list)
    jobs: list[JobRun] = field(default_factory=list)
    dropped_replies: int = 0  # FETCH_WORK outputs thrown away as invalid
    lost_accepts: int = 0  # rank-accepted fetched jobs that never ran (10c)
    refused_hooks: dict[str, str] = field(default_factory=dict)  # hook -> reason

    def calls(self, hook: str | None = None, slot: str | None = None) -> list[HookCall]:
        """Hook calls in start order, optionally filtered."""
        return [
            c
            for c in list(self.hook_calls)
            if (hook is None or c.hook == hook) and (slot is None or c.slot == slot)
        ]


class StartdSide(Protocol):
    """What a starter uses of the startd that made it (jobstore.emulator.startd.Emulator)."""

    config: EmulatorConfig
    registry: ProcessRegistry
    root_mode: bool
    execute_dir: str

    def record(self, call: HookCall) -> None: ...

    def track(self, thread: threading.Thread) -> None: ...

    def next_starter_pid(self) -> int: ...

    def job_started(self, starter: Any) -> None: ...
