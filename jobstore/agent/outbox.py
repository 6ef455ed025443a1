"""The outputs a JOB_EXIT could not send in its time, sent by the agent after the
hook has gone.

The hook stops sending when its time is up and says so (JobstoreHandOff); the agent then moves
the attempt's sandbox into its outbox under the sandbox root (a rename, never a copy, and out of
the job's user's reach), sends what the hook had not sent, as the hook would have, and only then
records the exit the hook reported. The report waits beside the sandbox, so an agent that
restarts goes on where it stopped; both are removed once the exit is recorded. While it sends,
the agent renews the attempt's lease, so that the job is not given to another slot meanwhile.

The hook's input is the job's user's: the agent takes from it only which attempt (checked
against the job's row: its token, its keyword, its owner's uid) and the exit's values. Which
files are sent, their names, the sandbox and where outputs go come from the job's row as the
store holds it; a job whose outputs go to output_destination is never handed over (its JOB_EXIT
sends them, as the job's user).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import pwd
import queue
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from classad2 import ClassAd

from jobstore.db.sandbox import CHECKPOINT, OUT
from jobstore.errors import (
    AdError,
    DatabaseError,
    HookError,
    JobstoreError,
    SandboxError,
    UnknownJob,
)
from jobstore.formats.classads import get_int, get_str
from jobstore.formats.jobads import ATTR_ATTEMPT, ATTR_JOB_ID, ATTR_TOKEN, render_job
from jobstore.node import config, handlers, sandboxcalls
from jobstore.node.fetching import sandbox_dir
from jobstore.node.hookcall import HookRequest, HookResponse
from jobstore.node.reports import SERVICE, Caller
from jobstore.node.sandbox import ATTR_HAND_OFF, Files, failed, transfer
from jobstore.node.sandboxroot import ensure_outbox
from jobstore.node.services import NodeServices

log = logging.getLogger("jobstore.agent")
RETRY_SECONDS = 30.0  # after the database was away
EXIT_SUFFIX = ".exit"


class _DatabaseAway(JobstoreError):
    """The database is away: the sending is tried again later."""


class Outbox:
    """Takes hand-offs (the agent's NodeServices.outbox) and sends them, one at a time, in a
    thread."""

    def __init__(self, node: NodeServices,
                 settings: Callable[[str | None], config.Settings] | None = None,
                 services: Callable[[], frozenset[int]] | None = None) -> None:
        """`node`: what serves its calls (the agent's); `settings` and `services`: the agent's
        readings (HookRequest), None to read them at each call."""
        self._node = node
        self._queue: queue.Queue[Path] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._settings = settings
        self._services = services

    def _read(self) -> dict[str, Any]:
        """What a HookRequest of this outbox carries of the agent's readings."""
        return {"settings": self._settings,
                "services": None if self._services is None else self._services(),
                "node": self._node}

    def start(self, roots: Iterable[str]) -> None:
        """Go on with what a previous run left in the outboxes of `roots`, and serve."""
        for root in roots:
            try:
                box = ensure_outbox(root)
            except OSError as exc:
                log.error("outbox under %s cannot be made: %s", root, exc)
                continue
            for record in sorted(box.glob("*" + EXIT_SUFFIX)):
                self._queue.put(record)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="outbox", daemon=True)
            self._thread.start()

    def hand_off(self, request: HookRequest, ad: ClassAd) -> HookResponse:
        """JOB_EXIT's hand-off: move the attempt's sandbox into the outbox and keep the report
        for after the sending. What cannot be taken over is reported now, as outputs that could
        not be sent (the job is held, code 12)."""
        stdin = _without(request.stdin, (ATTR_HAND_OFF,))
        try:
            record = self._take(request, ad, stdin)
        except (HookError, SandboxError, OSError, config.ConfigError, UnknownJob,
                DatabaseError) as exc:
            why = f"not sent in JOB_EXIT's time, and not handed to the agent: {exc}"
            return handlers.handle(HookRequest(
                hook="job_exit", argv=request.argv, stdin=failed("job_exit", stdin, why),
                env=request.env, caller=request.caller, settings=request.settings,
                services=request.services, node=request.node))
        self._queue.put(record)
        return HookResponse(log=[f"job {get_int(ad, 'ClusterId')}.{get_int(ad, 'ProcId')}: "
                                 "outputs not all sent in JOB_EXIT's time, handed to the agent"])

    def _take(self, request: HookRequest, ad: ClassAd, stdin: bytes) -> Path:
        keyword = config.starter_keyword(get_str(ad, "HookKeyword"))
        who = [keyword or "", str(get_int(ad, ATTR_JOB_ID)), str(get_int(ad, ATTR_ATTEMPT)),
               get_str(ad, ATTR_TOKEN) or ""]
        settings, _store, job = sandboxcalls.current_attempt(HookRequest(
            hook="sandbox_list", argv=who, stdin=b"", caller=request.caller,
            settings=request.settings, node=request.node))
        if any(name.lower() == "outputdestination" for name in job.ad or {}):
            raise HookError("its outputs go to its output_destination, which JOB_EXIT sends "
                            "them to as the job's user: they are never handed to the agent")
        sandbox = sandbox_dir(job, settings)
        if sandbox is None:
            raise HookError("the job has no sandbox")
        target = ensure_outbox(settings.sandbox_root) / os.path.basename(sandbox)
        try:
            os.rename(sandbox, target)  # the name comes from the job's row, not from the hook
        except FileNotFoundError:
            raise HookError(f"its sandbox {sandbox} is not there") from None
        st = os.lstat(target)
        owner = _uid_of(job.owner)
        if not stat.S_ISDIR(st.st_mode) or (os.geteuid() == 0 and st.st_uid != owner):
            _remove(target)
            raise HookError(f"{sandbox} is not a directory of {job.owner}'s")
        record = target.with_name(target.name + EXIT_SUFFIX)
        text = json.dumps({
            "argv": request.argv, "stdin": base64.b64encode(stdin).decode(),
            "slot": request.env.get("_CONDOR_SLOT"), "caller": request.caller.uid,
            "owner": owner, "who": who, "renew": settings.lease_duration / 3})
        temp = record.with_name(record.name + ".new")
        temp.write_text(text)
        os.replace(temp, record)
        return record

    def _run(self) -> None:
        while True:
            record = self._queue.get()
            try:
                self._send(record)
            except _DatabaseAway as exc:
                log.warning("outbox %s: database away (%s); again in %g s", record.name, exc,
                            RETRY_SECONDS)
                threading.Timer(RETRY_SECONDS, self._queue.put, args=(record,)).start()
            except Exception as exc:  # one bad record must not stop the others
                log.error("outbox %s: %s: %s", record.name, type(exc).__name__, exc)

    def _send(self, record: Path) -> None:
        """Send one hand-off's outputs, as the job's row says them, record its exit, remove
        both."""
        try:
            kept = json.loads(record.read_text())
        except FileNotFoundError:
            return  # done already
        sandbox = record.with_name(record.name[:-len(EXIT_SUFFIX)])
        stdin = _without(base64.b64decode(kept["stdin"]), _SENDING)
        try:
            ad = self._row_ad(kept["who"], sandbox, stdin)
        except (HookError, UnknownJob, config.ConfigError, AdError) as exc:
            stdin = failed("job_exit", stdin, f"its attempt is not the job's current one: {exc}")
        except DatabaseError as exc:
            raise _DatabaseAway(str(exc)) from None
        else:
            files = _OutboxFiles(ad, kept["who"], kept["owner"], kept["renew"], self._read())
            if sandbox.is_dir():
                sent = transfer("job_exit", ad, kept["argv"], files)
                stdin += sent[len(ad):]  # what the sending says: an output error, a checkpoint
            else:
                stdin = failed("job_exit", stdin, f"{sandbox} vanished from the agent's outbox")
        caller = SERVICE if kept["caller"] is None else Caller(kept["caller"])
        env = {"_CONDOR_SLOT": kept["slot"]} if kept["slot"] else {}
        response = handlers.handle(HookRequest(hook="job_exit", argv=kept["argv"], stdin=stdin,
                                               env=env, caller=caller, **self._read()))
        if response.database_error and not response.spooled:
            raise _DatabaseAway(response.error)
        for note in response.log:
            log.info("job_exit (outbox) %s", note)
        if response.error:
            log.warning("job_exit (outbox) %s", response.error)
        _remove(sandbox)
        record.unlink(missing_ok=True)

    def _row_ad(self, who: list[str], sandbox: Path, stdin: bytes) -> bytes:
        """The job ad the sending reads: the job's current attempt as its row says it (what
        it sends, under which names, in the sandbox the agent holds), and the exit code the
        hook reported (which says whether the exit was a checkpoint)."""
        settings, _store, job = sandboxcalls.current_attempt(HookRequest(
            hook="sandbox_list", argv=who, stdin=b"", caller=SERVICE, **self._read()))
        text = render_job(job, sandbox=os.fsdecode(sandbox), keyword=settings.keyword,
                          uid_domain=settings.uid_domain,
                          job_lease_duration=settings.job_lease_duration)
        code = _int_attr(stdin, b"exitcode")
        return text.encode("utf-8", "surrogateescape") + (
            b"" if code is None else b"ExitCode = %d\n" % code)


# What the sending adds to a JOB_EXIT's ad (and a hook's ad may not say for it)
_SENDING = (b"Iwd", b"JobstoreOutputError", b"JobstoreOutputErrorCode", b"JobstoreCheckpointed",
            ATTR_HAND_OFF)


def _int_attr(ad: bytes, name: bytes) -> int | None:
    """An integer attribute of an old-syntax ad (None when it is not one)."""
    for line in ad.split(b"\n"):
        key, sep, value = line.partition(b"=")
        if sep and key.strip().lower() == name:
            text = value.strip()
            if text.lstrip(b"-").isdigit() and len(text) < 12:
                return int(text)
    return None


class _OutboxFiles(Files):
    """A handed-off sandbox's transport: the calls served in the agent's own process, for the
    attempt the hook named; only the job owner's own files are sent, none already stored."""

    def __init__(self, ad: bytes, who: list[str], owner: int | None, renew: float,
                 read: dict[str, Any]) -> None:
        super().__init__(ad)
        self.who, self.ad, self.owner, self.renew = who, ad, owner, renew
        self.readings = read  # the agent's readings (Outbox._read)
        self.renewed = time.monotonic()
        self.stored: dict[str, set[str]] | None = None

    def call(self, name: str, argv: list[str], data: bytes = b"") -> bytes:
        if time.monotonic() - self.renewed > self.renew:
            self._renew_lease()
        response = sandboxcalls.handle(HookRequest(hook=name, argv=[*self.who, *argv],
                                                   stdin=data, caller=SERVICE, **self.readings))
        if response.database_error:
            raise _DatabaseAway(response.error)
        if response.error:
            raise SandboxError(response.error)
        return response.stdout

    def _send(self, name: str, fd: int, mode: int, kind: list[str]) -> None:
        direction = CHECKPOINT if kind else OUT
        if name in self._stored(direction):
            return
        if os.geteuid() == 0 and os.fstat(fd).st_uid != self.owner:
            raise SandboxError(f"{name}: not a file of the job owner's")
        super()._send(name, fd, mode, kind)

    def _stored(self, direction: str) -> set[str]:
        if self.stored is None:
            try:
                _settings, store, job = sandboxcalls.current_attempt(HookRequest(
                    hook="sandbox_list", argv=self.who, stdin=b"", caller=SERVICE,
                    **self.readings))
                self.stored = {d: store.files.sent_names(job, d) for d in (OUT, CHECKPOINT)}
            except DatabaseError as exc:
                raise _DatabaseAway(str(exc)) from None
            except (HookError, UnknownJob, config.ConfigError) as exc:
                raise SandboxError(str(exc)) from None
        return self.stored[direction]

    def _renew_lease(self) -> None:
        self.renewed = time.monotonic()
        handlers.handle(HookRequest(hook="update_job_info", argv=[],
                                    stdin=_without(self.ad, (b"JobPid",)), caller=SERVICE,
                                    **self.readings))


def _without(ad: bytes, names: tuple[bytes, ...]) -> bytes:
    """An old-syntax ad without the attributes `names`."""
    drop = {n.lower() for n in names}
    lines = [line for line in ad.split(b"\n")
             if line.strip() and line.partition(b"=")[0].strip().lower() not in drop]
    return b"\n".join(lines) + b"\n"


def _uid_of(owner: str) -> int | None:
    try:
        return pwd.getpwnam(owner).pw_uid
    except KeyError:
        return None


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
