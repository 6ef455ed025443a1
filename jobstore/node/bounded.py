"""The expressions a job's user wrote, evaluated with a bound on their cost that the job cannot
escape: Requirements (both sides of a match), the periodic policy and the exit policy.

`Inline` evaluates them in this process (a hook run for one call: its deadline bounds it).
`Bounded` (the agent) sends each to a worker process (`node.evalworker`, unprivileged) and kills
the worker when the answer has taken `timeout` seconds of its CPU (or WALL_FACTOR times that on
the clock, should the node be too busy to give it the CPU): classad2 holds the GIL while it
evaluates, so in the agent a hostile expression would stop every other caller's fetch and
report, and a node busy with its jobs must not make an innocent expression look like one. A job
whose expression took too long is held, with a reason that says so (HoldReasonCode 5,
JobPolicyUndefined); everyone else's calls go on meanwhile.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

from classad2 import ClassAd

from jobstore.core import holds, policy
from jobstore.errors import Died, InvalidInput, JobstoreError, TooCostly, WorkerUnavailable
from jobstore.formats.matching import matches
from jobstore.node.evalworker import READY

DEFAULT_TIMEOUT = 2.0  # seconds: ordinary expressions take microseconds
WALL_FACTOR = 3.0  # an answer that took less CPU than the bound waits this many times it at most
DEFAULT_WORKERS = 3
STARTUP_TIMEOUT = 30.0
# The worker: isolated mode (no environment, no user site), the package where ours is.
_START = ("import sys; sys.path.insert(0, {root}); "
          "from jobstore.node.evalworker import main; sys.exit(main())")


def costly_hold(exc: TooCostly, what: str) -> policy.Action:
    """The policy's answer for a job whose `what` was TooCostly: hold it (HoldReasonCode 5,
    JobPolicyUndefined)."""
    return policy.Action(policy.HOLD, exc.reason(what), holds.JOB_POLICY_UNDEFINED)


class _WorkerDied(JobstoreError):
    """The worker's end of the pipe closed before its answer."""

    def __init__(self) -> None:
        super().__init__("the expression worker died before its answer")


class Evaluator(Protocol):
    """How the node evaluates a job's expressions."""

    def matches(self, job: ClassAd, slot: ClassAd) -> bool: ...

    def periodic_action(self, ad: ClassAd, now: float) -> policy.Action | None: ...

    def exit_verdict(self, terms: policy.HasExitTerms, exit_attrs: Mapping[str, Any],
                     ad: ClassAd | None) -> policy.ExitVerdict: ...


class Inline:
    """In this process, unbounded but for the caller's own deadline."""

    def matches(self, job: ClassAd, slot: ClassAd) -> bool:
        return matches(job, slot)

    def periodic_action(self, ad: ClassAd, now: float) -> policy.Action | None:
        return policy.periodic_action(ad, now)

    def exit_verdict(self, terms: policy.HasExitTerms, exit_attrs: Mapping[str, Any],
                     ad: ClassAd | None) -> policy.ExitVerdict:
        return policy.exit_verdict(terms, exit_attrs, ad)


class Bounded:
    """In worker processes, each answer within `timeout` seconds or the worker is killed (and
    TooCostly, or a hold for the policy). At most `workers` at once; started when first needed."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, workers: int = DEFAULT_WORKERS) -> None:
        self.timeout = timeout
        self._idle: list[_Worker] = []
        self._free = threading.BoundedSemaphore(workers)
        self._lock = threading.Lock()

    def matches(self, job: ClassAd, slot: ClassAd) -> bool:
        return bool(self._ask({"op": "match", "job": str(job), "slot": str(slot)}))

    def periodic_action(self, ad: ClassAd, now: float) -> policy.Action | None:
        try:
            return _action(self._ask({"op": "periodic", "ad": str(ad), "now": now}))
        except TooCostly as exc:
            if ad.get("JobStatus") == policy.HELD:
                return None  # held already: nothing more to do
            return costly_hold(exc, "Its periodic policy")

    def exit_verdict(self, terms: policy.HasExitTerms, exit_attrs: Mapping[str, Any],
                     ad: ClassAd | None) -> policy.ExitVerdict:
        request = {"op": "exit", "ad": None if ad is None else str(ad),
                   "attrs": {k: v for k, v in exit_attrs.items()
                             if isinstance(v, int | float | str | bool | None)},
                   "terms": {"success_exit_code": terms.success_exit_code,
                             "max_retries": terms.max_retries,
                             "retry_until": terms.retry_until}}
        try:
            succeeded, retry, hold = self._ask(request)
        except TooCostly as exc:
            return policy.ExitVerdict(False, False, costly_hold(exc, "Its exit policy"))
        return policy.ExitVerdict(bool(succeeded), bool(retry), _action(hold))

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()

    def _ask(self, request: dict[str, Any]) -> Any:
        self._free.acquire()
        try:
            for last in (False, True):  # a worker that died is replaced and asked once more
                with self._lock:
                    worker = self._idle.pop() if self._idle else None
                if worker is None or not worker.alive():
                    worker = _Worker()
                try:
                    answer = worker.ask(request, self.timeout)
                except _WorkerDied:
                    worker.kill()
                    if last:
                        raise Died(self.timeout) from None
                    continue
                except TooCostly:
                    worker.kill()
                    raise TooCostly(self.timeout) from None
                except BaseException:
                    worker.kill()
                    raise
                with self._lock:
                    self._idle.append(worker)
                return answer
            raise AssertionError("unreachable: the last try returns or raises")
        finally:
            self._free.release()


def _action(value: Any) -> policy.Action | None:
    if value is None:
        return None
    kind, reason, code, subcode = value
    return policy.Action(str(kind), str(reason), int(code), int(subcode))


class _Worker:
    """One `jobstore.node.evalworker` process, ready (it said so) before it is asked."""

    def __init__(self) -> None:
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _START.format(root=repr(_package_root()))],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                close_fds=True, cwd="/", env={"PATH": "/usr/bin:/bin"})
        except OSError as exc:  # no process, no pipe: the node's limits, never a job's doing
            raise WorkerUnavailable(f"the expression worker cannot be started: {exc}") from None
        try:
            self._read(len(READY), _Bound(self.proc.pid, STARTUP_TIMEOUT, time.monotonic()))
        except (TooCostly, _WorkerDied):
            self.kill()
            raise WorkerUnavailable("the expression worker (jobstore.node.evalworker) did not "
                                    "start") from None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ask(self, request: dict[str, Any], timeout: float) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        data = json.dumps(request).encode()
        started, cpu = time.monotonic(), _cpu_seconds(self.proc.pid)
        self.proc.stdin.write(len(data).to_bytes(4, "big") + data)
        self.proc.stdin.flush()
        bound = _Bound(self.proc.pid, timeout, started, cpu)
        size = int.from_bytes(self._read(4, bound), "big")
        reply = json.loads(self._read(size, bound))
        if "error" in reply:
            raise InvalidInput(f"expression evaluation failed: {reply['error']}")
        return reply["ok"]

    def _read(self, n: int, bound: _Bound) -> bytes:
        assert self.proc.stdout is not None
        fd, data = self.proc.stdout.fileno(), b""
        while len(data) < n:
            left = bound.left()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                if bound.left() > 0:
                    continue
                raise TooCostly
            chunk = os.read(fd, n - len(data))
            if not chunk:
                raise _WorkerDied  # it died evaluating it
            data += chunk
        return data

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


class _Bound:
    """What is left of an answer's time: `seconds` of the worker's CPU from `cpu` on (measured
    by the clock where the CPU cannot be read, and on the clock for its start), and never more
    than WALL_FACTOR times that on the clock."""

    def __init__(self, pid: int, seconds: float, started: float, cpu: float | None = None) -> None:
        self.pid, self.seconds, self.started, self.cpu = pid, seconds, started, cpu

    def left(self) -> float:
        now = time.monotonic()
        on_clock = self.seconds - (now - self.started)
        if on_clock > 0 or self.cpu is None:
            return on_clock
        used = _cpu_seconds(self.pid)
        if used is None:
            return on_clock
        by_cpu = self.seconds - (used - self.cpu)
        return min(max(by_cpu, 0.0), self.seconds * WALL_FACTOR - (now - self.started))


def _cpu_seconds(pid: int) -> float | None:
    """The CPU seconds process `pid` has used (Linux's /proc), None when they cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _package_root() -> str:
    """Where this process found the package (the worker imports the same one)."""
    import jobstore

    return os.path.dirname(os.path.dirname(os.path.abspath(jobstore.__file__)))
