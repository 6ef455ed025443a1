"""`jobstore agent`: one per execute node; runs the hooks' handlers for the thin hook clients.

One thread reads requests from the unix socket (non-blocking, with a deadline per connection
and size limits, so that a slow or hostile client holds nothing but its own connection); a
small pool of worker threads runs `handlers.handle` with the package imported once and one
pooled database connection per database. Reports kept in the spool are replayed at start and
every JOBSTORE_AGENT_REPLAY_INTERVAL seconds.

Signals, as condor_master sends them to a daemon that is not a DaemonCore daemon: SIGHUP
(condor_reconfig) reloads the configuration; SIGTERM (graceful) and SIGQUIT (fast) stop it;
SIGINT too, in the foreground.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import selectors
import signal
import socket
import stat
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .. import config, handlers, spool
from ..handlers import HookRequest, HookResponse
from . import peers
from .protocol import (
    BUSY,
    HEADER,
    MAX_REQUEST,
    OK,
    REFUSED,
    ProtocolError,
    body_length,
    decode_body,
    decode_env,
    encode,
)

log = logging.getLogger("jobstore.agent")
SEND_TIMEOUT = 2.0


class AgentError(RuntimeError):
    """The agent cannot start; the message is one line for the user."""


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    peer: peers.Peer
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
    need: int | None = None  # body length, once the header is in


class Agent:
    """The service. `run()` blocks until SIGTERM/SIGQUIT/SIGINT and returns the exit status."""

    def __init__(self, socket_override: str | None = None, *, foreground: bool = False) -> None:
        self.socket_override = socket_override
        self.foreground = foreground
        self.settings = config.load_agent_settings(socket_override)
        self.path = self.settings.socket
        self.services = peers.service_uids(self.settings.startd_users)
        self._lock = threading.Lock()
        self._active: dict[int, int] = {}  # uid -> open connections (reading or being served)
        self._stop = False
        self._reload = False
        self._replaying = threading.Event()

    # ---- set-up ---------------------------------------------------------------------------

    def _setup_logging(self) -> None:
        handler: logging.Handler
        if self.foreground or not self.settings.log:
            handler = logging.StreamHandler(sys.stderr)
        else:
            handler = logging.handlers.WatchedFileHandler(self.settings.log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        for old in list(log.handlers):
            log.removeHandler(old)
            old.close()
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False

    def _listen(self) -> socket.socket:
        path = Path(self.path)
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
        listener.listen(128)
        listener.setblocking(False)
        return listener

    # ---- main loop ------------------------------------------------------------------------

    def run(self) -> int:
        self._setup_logging()
        handlers.use_pool(self.settings.db_overflow)
        listener = self._listen()
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        old_wakeup = signal.set_wakeup_fd(wake_w.fileno())
        for sig in (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT):
            signal.signal(sig, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])  # condor_master may start us blocked
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ, "listen")
        sel.register(wake_r, selectors.EVENT_READ, "wake")
        conns: dict[int, _Conn] = {}
        pool = ThreadPoolExecutor(self.settings.workers, thread_name_prefix="hook")
        log.info("jobstore agent %d listening on %s (service uids %s)", os.getpid(), self.path,
                 sorted(self.services))
        next_replay = 0.0
        try:
            while not self._stop:
                now = time.monotonic()
                if now >= next_replay:
                    next_replay = now + self.settings.replay_interval
                    if not self._replaying.is_set():
                        self._replaying.set()
                        pool.submit(self._replay)
                for key, _ in sel.select(timeout=0.5):
                    if key.data == "listen":
                        self._accept(listener, sel, conns)
                    elif key.data == "wake":
                        try:
                            while wake_r.recv(512):
                                pass
                        except BlockingIOError:
                            pass
                    else:
                        self._read(key.data, sel, conns, pool)
                now = time.monotonic()
                for conn in [c for c in conns.values() if c.deadline < now]:
                    log.warning("uid %d pid %d: request not complete after %g s, dropped",
                                conn.peer.uid, conn.peer.pid, self.settings.read_timeout)
                    self._drop(conn, sel, conns)
                if self._reload:
                    self._reload = False
                    self._do_reload()
        finally:
            log.info("jobstore agent %d stopping", os.getpid())
            sel.unregister(listener)
            listener.close()
            try:
                os.unlink(self.path)
            except OSError:
                pass
            for conn in list(conns.values()):
                self._drop(conn, sel, conns)
            pool.shutdown(wait=True, cancel_futures=True)
            handlers.drop_stores()
            signal.set_wakeup_fd(old_wakeup)
            wake_r.close()
            wake_w.close()
            sel.close()
        log.info("jobstore agent %d stopped", os.getpid())
        return 0

    def _on_stop(self, signum: int, _frame: object) -> None:
        self._stop = True

    def _on_hup(self, signum: int, _frame: object) -> None:
        self._reload = True

    def _do_reload(self) -> None:
        import htcondor2

        try:
            htcondor2.reload_config()
            self.settings = config.load_agent_settings(self.socket_override)
        except Exception as exc:  # a broken configuration must not stop the service
            log.error("configuration not reloaded: %s", exc)
            return
        self.services = peers.service_uids(self.settings.startd_users)
        self._setup_logging()
        handlers.drop_stores()
        if self.settings.socket != self.path:
            log.warning("JOBSTORE_AGENT_SOCKET changed; the agent keeps %s until restarted",
                        self.path)
        log.info("configuration reloaded (service uids %s)", sorted(self.services))

    # ---- connections ----------------------------------------------------------------------

    def _accept(self, listener: socket.socket, sel: selectors.BaseSelector,
                conns: dict[int, _Conn]) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: try again later
                log.error("accept failed: %s", exc)
                return
            try:
                peer = peers.peer_of(sock)
            except OSError:
                sock.close()
                continue
            with self._lock:
                total = sum(self._active.values())
                mine = self._active.get(peer.uid, 0)
                full = (total >= self.settings.max_clients
                        or mine >= self.settings.max_clients_per_uid)
                if not full:
                    self._active[peer.uid] = mine + 1
            if full:
                log.warning("uid %d pid %d: too many connections, declined", peer.uid, peer.pid)
                self._answer(sock, [BUSY, b"0", b"", b"the jobstore agent is busy"])
                sock.close()
                continue
            sock.setblocking(False)
            conn = _Conn(sock, peer, time.monotonic() + self.settings.read_timeout)
            conns[sock.fileno()] = conn
            sel.register(sock, selectors.EVENT_READ, conn)

    def _release(self, conn: _Conn) -> None:
        with self._lock:
            left = self._active.get(conn.peer.uid, 1) - 1
            if left > 0:
                self._active[conn.peer.uid] = left
            else:
                self._active.pop(conn.peer.uid, None)

    def _drop(self, conn: _Conn, sel: selectors.BaseSelector, conns: dict[int, _Conn]) -> None:
        sel.unregister(conn.sock)
        conns.pop(conn.sock.fileno(), None)
        conn.sock.close()
        self._release(conn)

    def _read(self, conn: _Conn, sel: selectors.BaseSelector, conns: dict[int, _Conn],
              pool: ThreadPoolExecutor) -> None:
        try:
            data = conn.sock.recv(256 * 1024)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn, sel, conns)
            return
        conn.buf += data
        try:
            if conn.need is None and len(conn.buf) >= HEADER:
                conn.need = body_length(bytes(conn.buf[:HEADER]), MAX_REQUEST)
            if conn.need is None or len(conn.buf) < HEADER + conn.need:
                return
            if len(conn.buf) > HEADER + conn.need:
                raise ProtocolError("data after the request")
            items = decode_body(bytes(conn.buf[HEADER:]), big_item=2)
            if len(items) < 3:
                raise ProtocolError("request without hook, environment and stdin")
            hook = items[0].decode("ascii")
        except (ProtocolError, UnicodeDecodeError) as exc:
            log.warning("uid %d pid %d: bad request refused: %s", conn.peer.uid, conn.peer.pid,
                        exc)
            sel.unregister(conn.sock)
            conns.pop(conn.sock.fileno(), None)
            self._answer(conn.sock, [REFUSED, b"0", b"", f"bad request: {exc}".encode()])
            conn.sock.close()
            self._release(conn)
            return
        sel.unregister(conn.sock)
        conns.pop(conn.sock.fileno(), None)
        conn.buf = bytearray()
        argv = [os.fsdecode(a) for a in items[3:]]
        pool.submit(self._serve, conn, hook, decode_env(items[1]), items[2], argv)

    def _answer(self, sock: socket.socket, items: list[bytes]) -> bool:
        try:
            sock.setblocking(True)
            sock.settimeout(SEND_TIMEOUT)
            sock.sendall(encode(items))
        except OSError:
            return False
        return True

    # ---- work (worker threads) ------------------------------------------------------------

    def _serve(self, conn: _Conn, hook: str, env: dict[str, str], stdin: bytes,
               argv: list[str]) -> None:
        peer = conn.peer
        try:
            refused = peers.refusal(hook, peer, stdin, self.services)
            if refused:
                log.warning("uid %d pid %d: refused: %s", peer.uid, peer.pid, refused)
                self._answer(conn.sock, [REFUSED, b"0", b"", refused.encode()])
                return
            response = handlers.handle(HookRequest(hook=hook, argv=argv, stdin=stdin, env=env))
            for note in response.log:
                log.info("%s uid %d pid %d: %s", hook, peer.uid, peer.pid, note)
            if response.error:
                log.warning("%s uid %d pid %d: %s", hook, peer.uid, peer.pid, response.error)
            sent = self._answer(conn.sock, [
                OK,
                str(response.exit_code).encode(),
                response.stdout,
                (response.error or "").encode("utf-8", "replace"),
                *[n.encode("utf-8", "replace") for n in response.log],
            ])
            if not sent and hook == "fetch_job" and response.stdout:
                self._give_back(stdin, response)
        except Exception as exc:  # never let one call take the service down
            log.error("%s uid %d pid %d: internal error: %s: %s", hook, peer.uid, peer.pid,
                      type(exc).__name__, exc)
        finally:
            conn.sock.close()
            self._release(conn)

    def _give_back(self, slot_ad: bytes, fetched: HookResponse) -> None:
        """The fetching hook is gone (deadline): put its job back at once, as a REJECT would,
        instead of waiting for the claim lease."""
        job = fetched.stdout if fetched.stdout.endswith(b"\n") else fetched.stdout + b"\n"
        back = handlers.handle(HookRequest(
            hook="reply_fetch", argv=["reject"], stdin=job + b"-----\n" + slot_ad, env={}
        ))
        log.warning("fetch_job: the hook left before its answer; job given back (%s)",
                    back.error or "; ".join(back.log))

    def _replay(self) -> None:
        try:
            for directory in self._spool_dirs():
                sent, left = spool.replay(directory, handlers.send_record, limit=10_000)
                if sent or left:
                    log.info("spool %s: %d report(s) replayed, %d left", directory, sent, left)
        except Exception as exc:
            log.error("spool replay failed: %s: %s", type(exc).__name__, exc)
        finally:
            self._replaying.clear()

    def _spool_dirs(self) -> list[Path]:
        keywords = [None, config._param("STARTD_JOB_HOOK_KEYWORD")]
        dirs: list[Path] = []
        for keyword in keywords:
            try:
                directory = Path(config.load_settings(keyword).spool)
            except config.ConfigError:
                continue
            if directory not in dirs and directory.is_dir():
                dirs.append(directory)
        return dirs


def run_agent(socket_override: str | None = None, *, foreground: bool = False) -> int:
    """`jobstore agent`: run until stopped; the exit status."""
    return Agent(socket_override, foreground=foreground).run()
