"""Jobs as the domain sees them: the typed rows of a job and of an event, and a job to submit."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Protocol, runtime_checkable

from jobstore.core import fairshare, limits
from jobstore.core.states import Status
from jobstore.errors import InvalidInput

INT32 = 2**31 - 1
INT64 = 2**63 - 1
# The job columns a report may set: name -> (type, lowest, highest). Nothing else, ever.
CHANGE_COLUMNS: dict[str, tuple[type, float, float]] = {
    "job_pid": (int, 1, INT32),
    "remote_user_cpu": (float, 0, 1e12),
    "remote_sys_cpu": (float, 0, 1e12),
    "image_size": (int, 0, INT64),
    "memory_usage": (int, 0, INT64),
    "exit_code": (int, -INT32 - 1, INT32),
    "exit_signal": (int, 0, 1024),
    "exit_by_signal": (bool, 0, 1),
}

# Submit defaults, as HTCondor's (request_memory in MiB, request_disk in KiB).
DEFAULT_REQUEST_MEMORY = 128
DEFAULT_REQUEST_DISK = 1024


@dataclass(frozen=True)
class InputFile:
    """A file a job takes into its sandbox (file transfer): its path there, the file it is
    read from at submit, and its mode."""

    name: str
    source: str
    mode: int = 0o644


@dataclass
class JobSpec:
    """One job to queue, from a submit description, a ClassAd file or a caller's code: the one
    spec type from submit to insert (the store renders its stored ad from it)."""

    cmd: str  # absolute path
    args: str = ""  # HTCondor's new argument syntax (the job ad's Arguments)
    args_v1: str | None = None  # given in the old syntax: that text, the job ad's Args
    env: str = ""  # HTCondor's new environment syntax, as the job ad's Environment
    iwd: str = ""
    input: str | None = None
    output: str | None = None
    error: str | None = None
    request_cpus: int = 1
    request_memory: int = DEFAULT_REQUEST_MEMORY
    request_disk: int = DEFAULT_REQUEST_DISK
    requirements: str | None = None  # ClassAd expression text
    priority: int = 0
    max_retries: int | None = None
    success_exit_code: int = 0
    retry_until: str | None = None  # ClassAd expression text
    user_log: str | None = None
    accounting_group: str | None = None  # the submitter is accounting_group.user
    accounting_group_user: str | None = None  # the user of that submitter (default the owner)
    concurrency_limits: str | None = None  # HTCondor's `NAME[:n], ...`
    custom: dict[str, str] = field(default_factory=dict)  # +Attr: name -> expression text
    proc_id: int = 0
    hold: bool = False  # submitted on hold (HoldReasonCode 15)
    inputs: tuple[InputFile, ...] = ()  # file transfer: what its sandbox starts with
    # a DAG node's transfer_input_files read when the node is submitted, not now: (the path
    # on the access point, its name in the sandbox; "" for a directory's contents)
    late_inputs: tuple[tuple[str, str], ...] = ()


# The JobSpec fields where a templated submit may put a per-proc macro: text the job ad carries
# as it is, and that no autocluster looks at.
TEMPLATED_FIELDS = ("args", "args_v1", "env", "iwd", "input", "output", "error")
# What every placeholder begins with: an item value that holds it is made proc by proc (the
# database refuses it in a template's items, where it could stand for another placeholder)
PLACEHOLDER_MARK = "JOBSTORE"


@dataclass(frozen=True)
class ProcTemplate:
    """All the procs of one cluster as one spec: where the submit description uses a per-proc
    macro ($(Process), $(Step), $(Row), $(ItemIndex), an item's variable), the spec's
    TEMPLATED_FIELDS hold a placeholder, and each proc's text is made where its row is written
    (a bulk submit on PostgreSQL makes the rows in the server)."""

    spec: JobSpec  # proc 0's, with the placeholders
    procs: int
    per_item: int  # procs per item row (the N of `queue N ...`)
    counters: dict[str, str]  # placeholder -> "proc", "step" or "row"
    items: dict[str, list[str]]  # placeholder -> its variable's value in each item row

    def values(self, proc: int) -> dict[str, str]:
        """Each placeholder's text in proc `proc`."""
        row, step = divmod(proc, self.per_item)
        return self._texts({"proc": proc, "step": step, "row": row},
                           {p: column[row] for p, column in self.items.items()})

    def widest(self) -> JobSpec:
        """A last proc whose ad is at least as large as any proc's: the counters of the last
        proc (each at its longest) and the values of the item row that take the most room."""
        text = "".join([*(getattr(self.spec, name) or "" for name in TEMPLATED_FIELDS),
                        *self.spec.custom.values()])
        uses = {p: text.count(p) for p in self.items}
        rows = len(next(iter(self.items.values()), [None]))
        row = max(range(rows), key=lambda r: sum(
            uses[p] * len(column[r]) for p, column in self.items.items()))
        texts = {**self.values(self.procs - 1),
                 **{p: column[row] for p, column in self.items.items()}}
        return replace(self.spec_with(texts), proc_id=self.procs - 1)

    def _texts(self, numbers: dict[str, int], items: dict[str, str]) -> dict[str, str]:
        return {**{p: str(numbers[kind]) for p, kind in self.counters.items()}, **items}

    def spec_with(self, texts: Mapping[str, str]) -> JobSpec:
        """The spec with each placeholder replaced by its text in `texts`."""

        def fill(value: str | None) -> str | None:
            for placeholder, text in texts.items():
                value = None if value is None else value.replace(placeholder, text)
            return value

        filled: dict[str, Any] = {name: fill(getattr(self.spec, name))
                                  for name in TEMPLATED_FIELDS}
        filled["custom"] = {name: fill(text) for name, text in self.spec.custom.items()}
        return replace(self.spec, **filled)

    def spec_of(self, proc: int) -> JobSpec:
        """Proc `proc`'s spec, as expanding its macros makes it."""
        return replace(self.spec_with(self.values(proc)), proc_id=proc)


@dataclass(frozen=True)
class NodeJobs:
    """The jobs of DAG nodes that one submit description makes, a cluster per node: each
    node's specs; and, when each node is one job that differs from the others only where
    `template` holds a placeholder, that template (node i is its item row i)."""

    names: Sequence[str]
    specs: Sequence[Sequence[JobSpec]]
    template: ProcTemplate | None = None


@runtime_checkable
class Templated(Protocol):
    """Specs that can say what all their procs are in one ProcTemplate (None: they cannot)."""

    def template(self) -> ProcTemplate | None: ...


@dataclass(slots=True)
class Job:
    """One row of the `jobs` table (jobstore.db.schema), as every layer above the store sees it.

    A value: nothing changes one once it is made (`but` makes the changed copy). Not a frozen
    dataclass, all the same: the store makes three per claim and report, and a frozen one's
    `__init__` sets its 53 fields through object.__setattr__, about eight times the cost."""

    id: int
    cluster_id: int
    proc_id: int
    queue: str
    status: str
    priority: int
    owner: str
    ad: dict[str, Any]  # the submitted attributes: name -> JSON value ({"expr": text} for one)
    cmd: str
    request_cpus: int
    request_memory: int
    request_disk: int
    requirements: str | None
    max_attempts: int
    success_exit_code: int
    retry_until: str | None
    max_retries: int | None
    user_log: str | None
    claims: int  # the fencing counter: attempts handed out
    attempts: int  # attempts counted against max_attempts
    token: str | None = field(repr=False)  # the current attempt's capability (a secret)
    lease_expires_at: float | None
    keyword: str | None
    slot: str | None
    host: str | None
    job_pid: int | None
    exit_code: int | None
    exit_signal: int | None
    exit_by_signal: bool | None
    remote_user_cpu: float | None
    remote_sys_cpu: float | None
    image_size: int | None
    memory_usage: int | None
    reason: str | None
    submitted_at: float
    fetched_at: float | None
    started_at: float | None
    finished_at: float | None
    updated_at: float
    submitter: str  # who fair share charges (jobstore.core.fairshare.submitter_name)
    concurrency_limits: str | None  # canonical `name[:n],...` (jobstore.core.limits)
    autocluster_id: int | None  # set by the store at submit
    slot_weight: float | None  # the weighted slots this attempt holds (SLOT_WEIGHT)
    hold_code: int | None  # HoldReasonCode while held (jobstore.core.holds)
    hold_subcode: int | None  # HoldReasonSubCode while held
    num_holds: int | None  # NumHolds: times the job was put on hold
    periodic: bool | None  # has periodic policy expressions (set by the store at submit)
    # An attempt stopped by the store (held, removed) may go on running on its slot until its
    # end is reported, at the latest until then; a release waits for it (release_pending).
    winding_down_until: float | None
    release_pending: bool | None
    # HTCondor's counters: NumJobStarts, JobStartDate (the first start), RemoteWallClockTime of
    # the attempts that ended (jobstore.formats.views adds the running one's).
    num_starts: int | None
    first_started_at: float | None
    wall_clock: float | None
    # A report that renews the lease of a job whose status stays sets only this (no index
    # names it, so PostgreSQL updates the row in place); lease_expires_at, which the reaper's
    # index orders, catches up when the status next changes or when the reaper gets to it.
    lease_renewed_until: float | None = None

    @property
    def lease_ends_at(self) -> float | None:
        """When the current attempt's lease runs out: the later of its two columns."""
        ends = [t for t in (self.lease_expires_at, self.lease_renewed_until) if t is not None]
        return max(ends) if ends else None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> Job:
        """The job of a database row (extra columns of a join are ignored)."""
        return cls(**{name: row[name] for name in JOB_COLUMNS})

    @classmethod
    def queued(
        cls,
        spec: JobSpec,
        *,
        id: int,  # noqa: A002 - the column's name
        cluster_id: int,
        owner: str,
        queue: str,
        ad: dict[str, Any],
        max_attempts: int,
        now: float,
        status: str = Status.IDLE.value,
    ) -> Job:
        """The job (idle, or `status`) `spec` becomes when it is queued; ValueError for bad
        concurrency limits."""
        attempts = spec.max_retries + 1 if spec.max_retries is not None else max_attempts
        return cls(
            id=id, cluster_id=cluster_id, proc_id=spec.proc_id, queue=queue,
            status=status, priority=spec.priority, owner=owner, ad=ad, cmd=spec.cmd,
            request_cpus=spec.request_cpus, request_memory=spec.request_memory,
            request_disk=spec.request_disk, requirements=spec.requirements,
            max_attempts=max(1, attempts), success_exit_code=spec.success_exit_code,
            retry_until=spec.retry_until, max_retries=spec.max_retries, user_log=spec.user_log,
            claims=0, attempts=0, token=None, lease_expires_at=None, keyword=None, slot=None,
            host=None, job_pid=None, exit_code=None, exit_signal=None, exit_by_signal=None,
            remote_user_cpu=None, remote_sys_cpu=None, image_size=None, memory_usage=None,
            reason=None, submitted_at=now, fetched_at=None, started_at=None, finished_at=None,
            updated_at=now,
            submitter=fairshare.submitter_name(
                owner, spec.accounting_group, spec.accounting_group_user
            ),
            concurrency_limits=limits.render(limits.parse(spec.concurrency_limits)),
            autocluster_id=None, slot_weight=None, hold_code=None, hold_subcode=None,
            num_holds=0, periodic=None, winding_down_until=None, release_pending=None,
            num_starts=0, first_started_at=None, wall_clock=None,
        )

    def but(self, **changes: Any) -> Job:
        """This job with `changes` applied (the row after an update)."""
        return replace(self, **changes)


class JobRecord:
    """What a record about one job has (JobEvent, a watch's JobFinished): the job's HTCondor id,
    and a JSON form."""

    __slots__ = ()
    cluster: int
    proc: int

    @property
    def job(self) -> str:
        """HTCondor's job id, `cluster.proc`."""
        return f"{self.cluster}.{self.proc}"

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job, **asdict(self)}  # type: ignore[call-overload]


@dataclass(frozen=True, slots=True)
class JobEvent(JobRecord):
    """One row of `job_events` (a transition, or a report that changed nothing), with its job's
    cluster and proc: what `jobstore events` prints and a watch delivers."""

    id: int
    job_id: int
    cluster: int
    proc: int
    time: float
    event: str
    from_status: str | None
    to_status: str | None  # None: recorded, no transition
    attempt: int | None
    slot: str | None
    host: str | None
    reason: str | None
    attrs: dict[str, Any] | None

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> JobEvent:
        """From a `job_events` row joined with its job's `cluster_id` and `proc_id`."""
        return cls(
            cluster=row["cluster_id"],
            proc=row["proc_id"],
            **{name: row[name] for name in EVENT_COLUMNS},
        )


@dataclass(frozen=True, slots=True)
class FeedEvent:
    """An event as a follower of the event feed reads it: the event and its job's outcome."""

    event: JobEvent
    owner: str
    queue: str
    job_status: str
    exit_code: int | None
    exit_signal: int | None
    exit_by_signal: bool | None
    success_exit_code: int

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> FeedEvent:
        return cls(JobEvent.from_row(row), **{name: row[name] for name in FEED_COLUMNS})


def parse_job_id(text: str | int) -> tuple[int, int | None]:
    """`12` or `12.3` (HTCondor's cluster[.proc]) -> (cluster, proc or None)."""
    cluster, _, proc = str(text).partition(".")
    try:
        return int(cluster), (int(proc) if proc else None)
    except ValueError:
        raise InvalidInput(f"bad job id {text!r} (use CLUSTER or CLUSTER.PROC)") from None


JOB_COLUMNS = tuple(f.name for f in fields(Job))
EVENT_COLUMNS = tuple(f.name for f in fields(JobEvent) if f.name not in ("cluster", "proc"))
FEED_COLUMNS = tuple(f.name for f in fields(FeedEvent) if f.name != "event")
