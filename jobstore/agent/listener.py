"""The agent's door: its listening socket, and each connection up to a whole request, with
the limits that keep a slow or hostile client to its own connection (connections per account
and in all, request bytes in flight per account, a deadline to send the request). What it reads
goes to the work queue; `answer` sends a response back."""

from __future__ import annotations

import logging
import os
import selectors
import socket
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from jobstore.agent import peers
from jobstore.agent.fetchwait import Parked
from jobstore.agent.protocol import (
    BUSY,
    HEADER,
    MAX_REQUEST,
    REFUSED,
    body_length,
    decode_body,
    decode_env,
    encode,
)
from jobstore.agent.work import WorkQueue
from jobstore.errors import AgentError, ProtocolError
from jobstore.node import config, sandboxcalls
from jobstore.node.hooktable import NAMES

log = logging.getLogger("jobstore.agent")
SEND_TIMEOUT = 2.0
WARN_EVERY = 10.0  # seconds between two warnings of one kind about one uid


@dataclass(eq=False)
class Conn:
    sock: socket.socket
    peer: peers.Peer
    service: bool  # a service account's: its own budget, served first
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
    need: int | None = None  # body length, once the header is in
    charged: int = 0  # bytes counted against the uid's budget


@dataclass
class Work:
    conn: Conn
    hook: str
    env: dict[str, str]
    stdin: bytes
    argv: list[str]
    parked: Parked | None = None  # a waiting fetch woken: its wait
    received: float = field(default_factory=time.monotonic)


class Throttle:
    """At most one warning of a kind about one uid every WARN_EVERY seconds, so that a flood
    of refused connections cannot fill the log; the next one says how many were left out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int], tuple[float, int]] = {}

    def warn(self, kind: str, uid: int, message: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            last, skipped = self._seen.get((kind, uid), (-WARN_EVERY, 0))
            if now - last < WARN_EVERY:
                self._seen[(kind, uid)] = (last, skipped + 1)
                return
            if len(self._seen) > 10_000:
                self._seen.clear()
            self._seen[(kind, uid)] = (now, 0)
        if skipped:
            message += f" ({skipped} more like it in the last {WARN_EVERY:g} s not logged)"
        log.warning(message, *args)


class Listener:
    """The connections of one agent: admitted within their budgets, read until a request is
    whole (then queued as Work), dropped and released."""

    def __init__(self, settings: Callable[[], config.AgentSettings],
                 services: Callable[[], frozenset[int]], throttle: Throttle) -> None:
        """`settings`: the agent's (its limits); `services`: the service accounts' uids;
        `throttle`: its warnings."""
        self._settings, self._services, self._throttle = settings, services, throttle
        self._lock = threading.Lock()
        # Open connections (reading, queued or being served) and their bytes: the service
        # accounts' in all, everybody else's in all and per uid.
        self._service_conns = 0
        self._other_conns = 0
        self._conns: dict[int, int] = {}
        self._bytes: dict[int, int] = {}

    def open(self, path_name: str) -> socket.socket:
        """The listening socket at `path_name` (AgentError when another agent serves it)."""
        path = Path(path_name)
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise AgentError(f"{path} exists and is not a socket")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()  # left behind by an agent that died
            else:
                raise AgentError(f"another jobstore agent is listening on {path}")
            finally:
                probe.close()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(path))
        except OSError as exc:
            listener.close()
            raise AgentError(f"cannot listen on {path}: {exc.strerror}") from None
        # Everybody may connect (job users run the starter hooks); peers.refusal decides.
        os.chmod(path, 0o666)
        listener.listen(1024)
        listener.setblocking(False)
        return listener

    def admit(self, peer: peers.Peer, service: bool) -> bool:
        """Count a new connection against its budget; False when the budget is spent."""
        s = self._settings()
        with self._lock:
            if service:
                if self._service_conns >= s.max_service_clients:
                    return False
                self._service_conns += 1
                return True
            mine = self._conns.get(peer.uid, 0)
            if self._other_conns >= s.max_clients or mine >= s.max_clients_per_uid:
                return False
            self._other_conns += 1
            self._conns[peer.uid] = mine + 1
            return True

    def charge(self, conn: Conn, size: int) -> bool:
        """Count the announced size of a request against its uid's byte budget."""
        if conn.service:
            return True
        with self._lock:
            held = self._bytes.get(conn.peer.uid, 0)
            if held + size > self._settings().max_bytes_per_uid:
                return False
            self._bytes[conn.peer.uid] = held + size
            conn.charged = size
            return True

    def release(self, conn: Conn) -> None:
        with self._lock:
            if conn.service:
                self._service_conns -= 1
                return
            self._other_conns -= 1
            uid = conn.peer.uid
            left = self._conns.get(uid, 1) - 1
            if left > 0:
                self._conns[uid] = left
            else:
                self._conns.pop(uid, None)
            if conn.charged:
                held = self._bytes.get(uid, 0) - conn.charged
                if held > 0:
                    self._bytes[uid] = held
                else:
                    self._bytes.pop(uid, None)
                conn.charged = 0

    def accept(self, listener: socket.socket, sel: selectors.BaseSelector,
                conns: dict[int, Conn]) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: try again later
                self._throttle.warn("accept", -1, "accept failed: %s", exc)
                return
            try:
                peer = peers.peer_of(sock)
            except OSError:
                sock.close()
                continue
            service = peer.uid in self._services()
            if not self.admit(peer, service):
                self._throttle.warn("busy", peer.uid, "uid %d pid %d: too many connections, "
                                    "declined", peer.uid, peer.pid)
                answer(sock, [BUSY, b"0", b"", b"the jobstore agent is busy"], wait=False)
                sock.close()
                continue
            sock.setblocking(False)
            conn = Conn(sock, peer, service, time.monotonic() + self._settings().read_timeout)
            conns[sock.fileno()] = conn
            sel.register(sock, selectors.EVENT_READ, conn)

    def drop(self, conn: Conn, sel: selectors.BaseSelector, conns: dict[int, Conn]) -> None:
        sel.unregister(conn.sock)
        conns.pop(conn.sock.fileno(), None)
        conn.sock.close()
        self.release(conn)

    def read(self, conn: Conn, sel: selectors.BaseSelector, conns: dict[int, Conn],
              work: WorkQueue[Work]) -> None:
        try:
            data = conn.sock.recv(256 * 1024)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.drop(conn, sel, conns)
            return
        conn.buf += data
        try:
            if conn.need is None and len(conn.buf) >= HEADER:
                conn.need = body_length(bytes(conn.buf[:HEADER]), MAX_REQUEST)
                if not self.charge(conn, conn.need):
                    self._throttle.warn("bytes", conn.peer.uid, "uid %d pid %d: more than %d "
                                        "bytes of requests in flight, declined", conn.peer.uid,
                                        conn.peer.pid, self._settings().max_bytes_per_uid)
                    sel.unregister(conn.sock)
                    conns.pop(conn.sock.fileno(), None)
                    answer(conn.sock, [BUSY, b"0", b"", b"the jobstore agent is busy"],
                                 wait=False)
                    conn.sock.close()
                    self.release(conn)
                    return
            if conn.need is None or len(conn.buf) < HEADER + conn.need:
                return
            if len(conn.buf) > HEADER + conn.need:
                raise ProtocolError("data after the request")
            items = decode_body(bytes(conn.buf[HEADER:]), big_item=2)
            if len(items) < 3:
                raise ProtocolError("request without hook, environment and stdin")
            hook = items[0].decode("ascii")
            if hook not in NAMES and hook not in sandboxcalls.CALLS:  # before anything logs it
                raise ProtocolError("unknown hook")
        except (ProtocolError, UnicodeDecodeError) as exc:
            self._throttle.warn("bad", conn.peer.uid, "uid %d pid %d: bad request refused: %s",
                                conn.peer.uid, conn.peer.pid, exc)
            sel.unregister(conn.sock)
            conns.pop(conn.sock.fileno(), None)
            answer(conn.sock, [REFUSED, b"0", b"", f"bad request: {exc}".encode()],
                         wait=False)
            conn.sock.close()
            self.release(conn)
            return
        sel.unregister(conn.sock)
        conns.pop(conn.sock.fileno(), None)
        conn.buf = bytearray()
        argv = [os.fsdecode(a) for a in items[3:]]
        item = Work(conn, hook, decode_env(items[1]), items[2], argv)
        work.put(item, None if conn.service else conn.peer.uid)


def answer(sock: socket.socket, items: list[bytes], *, wait: bool = True,
       fd: int | None = None) -> bool:
    """Send a response (with the open file `fd` attached to its first bytes); the selector
    thread (`wait=False`) never blocks on a client that does not read: what does not fit in
    the socket buffer at once is dropped."""
    try:
        if wait:
            sock.setblocking(True)
            sock.settimeout(SEND_TIMEOUT)
            data = encode(items)
            if fd is not None:
                data = data[socket.send_fds(sock, [data], [fd]):]
            sock.sendall(data)
        else:
            sock.setblocking(False)
            sock.send(encode(items))
    except OSError:
        return False
    return True
