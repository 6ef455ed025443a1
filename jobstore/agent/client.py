"""The hot path of every hook executable: pass the call to the agent, print its answer, exit.

Standard library only, and only its cheapest modules (`_socket`, `_signal`): the hooks run with
`python -sS` and never import SQLAlchemy, psycopg, classad2 or htcondor2 here. When the agent
cannot be reached (no socket, connection refused, or it declined the call before doing
anything) the hook does the work itself with `jobstore.node.hookmain` (direct mode).

The hook trusts only a socket served by the agent's account (SO_PEERCRED of the listener: root,
or an account named at install time): it sends nothing to, and believes nothing from, a socket
that another account serves.
"""

from __future__ import annotations

import _signal
import _socket
import gc
import os
import sys
import time

from jobstore.agent.protocol import (
    BUSY,
    HEADER,
    HOLD,
    MAX_RESPONSE,
    OK,
    PASSED_ENV,
    REFUSED,
    body_length,
    decode_body,
    encode,
    encode_env,
)
from jobstore.errors import HandOff, JobstoreError, ProtocolError, SandboxError
from jobstore.node import directnote, siblings
from jobstore.node.hookproc import (
    DEFAULT_SOCKET,
    MAX_STDIN,
    STOP_JOB,
    append_hook_log,
    log_entry,
    one_line,
    prologue,
    read_stdin,
    stop_job,
    write_all,
)
from jobstore.node.hooktable import DEADLINES, DEFAULT_DEADLINE, FETCH_HOLD_LIMIT
from jobstore.node.launchcheck import annotate
from jobstore.node.sandbox import Files, attempt_of, failed, output_seconds, transfer

TYPE_CHECKING = False  # not `typing`'s: the hot path does not import typing
if TYPE_CHECKING:
    from typing import NoReturn

# How long one call of a sandbox's transfer may take (all of JOB_EXIT's sending is bounded by
# node.sandbox.output_seconds(): what is not sent by then is handed to the agent).
SANDBOX_CALL_SECONDS = 60.0

# Accounts whose socket the hooks trust when the installed hook names none (root only).
DEFAULT_AGENT_UIDS = (0,)


class _NoAnswer(JobstoreError):
    """The request may have reached the agent, but no answer came back."""


class _NotTheAgent(JobstoreError):
    """The socket is served by an account the hook does not trust; nothing was sent."""


def _say(hook: str, stderr_open: bool, error: str | None, *, logged: bool = False) -> None:
    """The error line on stderr, and in $JOBSTORE_HOOK_LOG when set and writable, unless the
    agent `logged` it already (it writes the hook log for the calls it serves)."""
    if not error:
        return
    line = one_line(error)
    if stderr_open:
        write_all(2, (line + "\n").encode("utf-8", "replace"))
    path = os.environ.get("JOBSTORE_HOOK_LOG")
    if path and not logged:
        append_hook_log(path, log_entry(hook, os.getpid(), line))


def _recv_exact(sock: _socket.socket, n: int, deadline: float) -> bytes:
    chunks, got = [], 0
    while got < n:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        data = sock.recv(min(n - got, 1 << 20))
        if not data:
            raise _NoAnswer("the agent closed the connection")
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


def _early_answer(sock: _socket.socket, deadline: float) -> list[bytes] | None:
    """What the agent answered before it closed a connection whose request it did not read
    whole (`busy`: its bound on the account's requests in flight; a bad request), if it did."""
    try:
        header = _recv_exact(sock, HEADER, deadline)
        answer = decode_body(_recv_exact(sock, body_length(header, MAX_RESPONSE), deadline),
                             big_item=2)
    except (OSError, _NoAnswer, ProtocolError):
        return None
    return answer if answer[:1] in ([BUSY], [REFUSED]) else None


def server_uid(sock: _socket.socket) -> int:
    """The uid of the account that made the listening socket `sock` is connected to."""
    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # pid, uid, gid
    return int.from_bytes(raw[4:8], sys.byteorder)


def ask(
    path: str, request: bytes, deadline: float, trusted: tuple[int, ...] = DEFAULT_AGENT_UIDS,
    fds: list[int] | None = None, hold_limit: float | None = None,
) -> list[bytes] | None:
    """Send `request` to the agent at `path`; its answer items (and in `fds` the open file the
    answer carries, if any; an agent that closed before it read the whole request may have
    answered `busy` or `refused` first). None: not connected, or closed unanswered (nothing
    was done). Raises _NotTheAgent
    (nothing sent) when another account than `trusted` serves the socket, _NoAnswer (or
    TimeoutError) once the request may have been delivered. The agent's `hold` moves the
    deadline (and the alarm) on, never past `hold_limit` (None: a hold is not accepted)."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            sock.connect(path)
            uid = server_uid(sock)
        except OSError:
            return None
        if uid not in trusted:
            raise _NotTheAgent(f"{path} is served by uid {uid}, not by the jobstore agent")
        try:
            sock.sendall(request)
        except TimeoutError:
            raise
        except OSError:  # closed before it had the whole request: it did nothing
            return _early_answer(sock, deadline)
        if fds is None:
            while True:
                header = _recv_exact(sock, HEADER, deadline)
                body = _recv_exact(sock, body_length(header, MAX_RESPONSE), deadline)
                items = decode_body(body, big_item=2)
                if items[:1] != [HOLD] or hold_limit is None:
                    return items
                deadline = _held(items, hold_limit)
        else:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            first, ancillary, _flags, _addr = sock.recvmsg(
                HEADER, _socket.CMSG_SPACE(4), _socket.MSG_CMSG_CLOEXEC)
            for level, kind, data in ancillary:
                if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                    fds.extend(int.from_bytes(data[i:i + 4], sys.byteorder)
                               for i in range(0, len(data) - 3, 4))
            if not first:
                raise _NoAnswer("the agent closed the connection")
            header = first + _recv_exact(sock, HEADER - len(first), deadline)
        body = _recv_exact(sock, body_length(header, MAX_RESPONSE), deadline)
        return decode_body(body, big_item=2)
    finally:
        sock.close()


def _held(items: list[bytes], limit: float) -> float:
    """The deadline a `hold` (items: status, seconds) asks for, within `limit`; the alarm too."""
    try:
        seconds = float(items[1]) if len(items) > 1 else -1.0
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= FETCH_HOLD_LIMIT:
        raise ProtocolError("a hold without a valid number of seconds")
    now = time.monotonic()
    deadline = min(now + seconds, limit)
    _signal.alarm(int(deadline - now) + 2)
    return deadline


def _direct(hook: str, stdin: bytes, started: float, stderr_open: bool) -> NoReturn:
    """Do the work in this process (the agent is not running); never returns."""
    gc.disable()  # the imports make objects that live as long as the process: never collected
    try:
        if sys.flags.no_site:  # started with -S: a venv's site-packages are not on sys.path yet
            import site

            site.main()
        from jobstore.node.hookmain import main as direct_main
    except BaseException as exc:  # noqa: BLE001 - one line, never a traceback
        _say(hook, stderr_open, f"jobstore hook: cannot import jobstore ({exc})")
        os._exit(0)
    gc.freeze()
    gc.enable()
    direct_main(hook, stdin=stdin, started=started)


class _AgentFiles(Files):
    """A sandbox's files through the agent (jobstore.node.sandboxcalls serves the calls)."""

    def __init__(self, path: str, agent_uids: tuple[int, ...], ad: bytes) -> None:
        super().__init__(ad)
        self.path, self.agent_uids = path, agent_uids
        self.stop_at: float | None = None  # a bound on all the calls (JOB_EXIT's sending)

    def open_input(self, sha: str) -> int | None:
        """The agent's open descriptor of its node copy of input `sha`."""
        fds: list[int] = []
        try:
            self.call("sandbox_open", [sha], fds=fds)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        for extra in fds[1:]:
            os.close(extra)
        return fds[0] if fds else None

    def call(self, name: str, argv: list[str], data: bytes = b"",
             fds: list[int] | None = None) -> bytes:
        deadline = time.monotonic() + SANDBOX_CALL_SECONDS
        if self.stop_at is not None:
            if time.monotonic() >= self.stop_at:
                raise HandOff()
            deadline = min(deadline, self.stop_at)
        request = encode([name.encode(), b"", data,
                          *[a.encode("utf-8", "surrogateescape") for a in [*self.who, *argv]]])
        pause = 0.02
        while True:
            try:
                answer = ask(self.path, request, deadline, self.agent_uids, fds)
            except TimeoutError:
                if self.stop_at is not None and time.monotonic() >= self.stop_at:
                    raise HandOff() from None
                raise SandboxError("the jobstore agent did not answer in time") from None
            except (_NoAnswer, _NotTheAgent, ProtocolError, OSError) as exc:
                raise SandboxError(f"the jobstore agent did not answer ({exc})") from None
            if not answer or answer[0] != BUSY:
                break
            if time.monotonic() + pause >= deadline:  # the agent is there, and busy: wait
                if self.stop_at is not None and deadline >= self.stop_at:
                    raise HandOff()
                raise SandboxError("the jobstore agent stayed busy")
            time.sleep(pause)
            pause = min(pause * 2, 0.5)
        if answer is None or not answer or answer[0] != OK:
            raise _NoAgentForFiles()
        error = answer[3] if len(answer) > 3 else b""
        if error:
            raise SandboxError(error.decode("utf-8", "replace"))
        return answer[2]


class _NoAgentForFiles(JobstoreError):
    """No agent served the call: the hook does the transfer itself (direct mode)."""

    def __init__(self) -> None:
        super().__init__("no jobstore agent served the call")


def _with_sandbox(hook: str, stdin: bytes, argv: list[str], path: str,
                  agent_uids: tuple[int, ...], mode: str) -> bytes:
    """PREPARE_JOB and JOB_EXIT of a job with file transfer: fill its sandbox, or send its
    outputs back and remove it, through the agent or (direct mode, no agent) the database.
    Returns the ad the hook goes on with (with what went wrong in it, for the handler)."""
    if mode != "direct":
        files = _AgentFiles(path, agent_uids, stdin)
        if hook == "job_exit":
            files.stop_at = time.monotonic() + output_seconds()
        try:
            return transfer(hook, stdin, argv, files)
        except _NoAgentForFiles:
            if mode == "agent":
                raise SandboxError("the jobstore agent is not available") from None
    if sys.flags.no_site:
        import site

        site.main()
    from jobstore.node.sandboxdirect import DirectFiles

    return transfer(hook, stdin, argv, DirectFiles(stdin))


def main(
    hook: str, socket_path: str | None = None, agent_uids: tuple[int, ...] = DEFAULT_AGENT_UIDS
) -> None:
    """Entry point of the hook executables: `agent_uids` are the accounts whose socket is
    trusted to be the agent's."""
    started = time.monotonic()
    stderr_open = prologue()
    stdin = read_stdin()
    mode = os.environ.get("JOBSTORE_HOOK_MODE", "")
    path = os.environ.get("JOBSTORE_AGENT_SOCKET") or socket_path or DEFAULT_SOCKET
    if hook in ("prepare_job", "job_exit") and len(stdin) <= MAX_STDIN and attempt_of(stdin):
        try:  # as the job's user: the sandbox of a job with file transfer
            stdin = _with_sandbox(hook, stdin, sys.argv[1:], path, agent_uids, mode)
        except BaseException as exc:  # noqa: BLE001 - one line, never a traceback
            _say(hook, stderr_open, f"{hook}: sandbox: {exc}")
            stdin = failed(hook, stdin, str(exc))
    if hook == "prepare_job" and len(stdin) <= MAX_STDIN:  # as the job's user, before the exec
        stdin = annotate(stdin)
    if hook == "job_exit":
        siblings.wait_for("update_job_info")
    if mode == "direct":
        _direct(hook, stdin, started, stderr_open)
    if len(stdin) > MAX_STDIN:
        _say(hook, stderr_open, f"{hook}: stdin larger than {MAX_STDIN} bytes, ignored")
        os._exit(0)
    seconds = DEADLINES.get(hook, DEFAULT_DEADLINE)
    deadline = started + seconds
    _signal.signal(_signal.SIGALRM, _signal.SIG_DFL)
    _signal.alarm(int(seconds) + 2)  # backstop, should the process itself get stuck
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    argv = [os.fsencode(a) for a in sys.argv[1:]]
    request = encode([hook.encode(), encode_env(env), stdin, *argv])
    why = "nothing listens there"
    try:
        answer = ask(path, request, deadline, agent_uids,
                     hold_limit=started + FETCH_HOLD_LIMIT if hook == "fetch_job" else None)
    except _NotTheAgent as exc:
        _say(hook, stderr_open, f"{hook}: {exc}; not used")
        answer, why = None, str(exc)
    except (_NoAnswer, ProtocolError, OSError) as exc:
        if hook != "fetch_job" and not isinstance(exc, TimeoutError):
            # The agent died mid-call. A report is safe to send again (the attempt token makes
            # a repeat harmless); a fetch is not (it could hand out a second job).
            _direct(hook, stdin, started, stderr_open)
        what = "gave up after the deadline" if isinstance(exc, TimeoutError) else str(exc)
        _say(hook, stderr_open, f"{hook}: no answer from the jobstore agent ({what})")
        os._exit(0)
    if answer is None or (answer and answer[0] == BUSY):
        if mode == "agent":
            _say(hook, stderr_open, f"{hook}: the jobstore agent at {path} is not available")
            os._exit(0)
        if answer is None and os.environ.get("JOBSTORE_AGENT_SOCKET"):  # the node names one
            directnote.note(os.environ.get("JOBSTORE_HOOK_LOG"), hook, path, why)
        _direct(hook, stdin, started, stderr_open)
    status, code, stdout, error, *_log = answer + [b""] * max(0, 4 - len(answer))
    _say(hook, stderr_open, error.decode("utf-8", "replace") or None, logged=status == OK)
    if status == OK and stdout:
        write_all(1, stdout)
    exit_code = int(code or b"0") if status == OK and code.isdigit() else 0
    if hook == "update_job_info" and exit_code == STOP_JOB:  # with this user's rights, here
        _say(hook, False, f"{hook}: {stop_job(stdin)}")
        exit_code = 0
    os._exit(exit_code)
