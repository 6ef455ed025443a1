"""`jobstore agent`: one per execute node; runs the hooks' handlers for the thin hook clients.

One thread reads requests from the unix socket (`listener`: non-blocking, with a deadline per
connection and size limits, so that a slow or hostile client holds nothing but its own
connection); a small pool of worker threads runs `handlers.handle` with the package imported
once and one pooled database connection per database (`node.services`), and holds the fetches
that wait for work (`fetchwait`); the periodic duties run in threads of their own (`duties`).
This module wires them together and serves each call.

Signals, as condor_master sends them to a daemon that is not a DaemonCore daemon: SIGHUP
(condor_reconfig) reloads the configuration; SIGTERM (graceful) and SIGQUIT (fast) stop it;
SIGINT too, in the foreground.
"""

from __future__ import annotations

import dataclasses
import logging
import logging.handlers
import os
import selectors
import signal
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING

from jobstore.agent import peers
from jobstore.agent.attempts import Attempt, Attempts
from jobstore.agent.duties import Duties
from jobstore.agent.fetchwait import FetchWaits, Parked, slot_name, wait_bound
from jobstore.agent.listener import WARN_EVERY, Conn, Listener, Throttle, Work, answer
from jobstore.agent.outbox import Outbox
from jobstore.agent.protocol import (
    HOLD,
    OK,
    REFUSED,
)
from jobstore.agent.slotads import SlotBoard
from jobstore.agent.startdnudge import FetchActivity, nudge_startd
from jobstore.agent.watch import AttemptWatch
from jobstore.agent.work import WorkQueue
from jobstore.node import bounded, config, directnote, fetching, handlers, sandboxcalls, sending
from jobstore.node.deferred import Deferred
from jobstore.node.hookcall import HookRequest, HookResponse, IdleSlot
from jobstore.node.hookproc import append_hook_log, log_entry, one_line
from jobstore.node.hooktable import DEADLINES
from jobstore.node.services import NodeServices

if TYPE_CHECKING:
    from jobstore.agent.metrics import AgentMetrics

log = logging.getLogger("jobstore.agent")
# Everything the package logs (the spool's repairs and quarantines too) goes to the agent's log.
_package_log = logging.getLogger("jobstore")
MIN_WAIT = 0.05  # seconds: a fetch with less left of its wait is answered now
LOG_CALLS_PER_UID = 200  # an ordinary account's calls logged per WARN_EVERY seconds


class _LogBudget:
    """The lines of at most LOG_CALLS_PER_UID calls of one ordinary account every WARN_EVERY
    seconds are logged (the service accounts' are not limited), so that no caller can fill
    root's logs; the first call logged after some were dropped says how many."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: dict[int, tuple[float, int, int]] = {}  # uid -> (start, lines, dropped)

    def take(self, uid: int) -> tuple[bool, int]:
        """Whether the lines of one more call of `uid` may be logged, and how many calls'
        were dropped before it."""
        now = time.monotonic()
        with self._lock:
            start, lines, dropped = self._windows.get(uid, (now, 0, 0))
            if now - start >= WARN_EVERY:
                start, lines = now, 0
            if lines >= LOG_CALLS_PER_UID:
                self._windows[uid] = (start, lines, dropped + 1)
                return False, 0
            if len(self._windows) > 10_000:
                self._windows.clear()
            self._windows[uid] = (start, lines + 1, 0)
            return True, dropped


class Agent:
    """The service. `run()` blocks until SIGTERM/SIGQUIT/SIGINT and returns the exit status."""

    def __init__(self, socket_override: str | None = None, *, foreground: bool = False) -> None:
        self.socket_override = socket_override
        self.foreground = foreground
        self.settings = config.load_agent_settings(socket_override)
        self.path = self.settings.socket
        self.services = config.service_uids(self.settings.startd_users)
        self._stop = False
        self._reload = False
        self._attempts = Attempts()
        # what serves the hooks' calls here: the kept stores, the evaluator, the outbox, ...
        self.node_services = NodeServices()
        self._slots = SlotBoard(self.settings.update_interval, self.settings.classad_lifetime)
        self._metrics: AgentMetrics | None = None
        self._throttle = Throttle()
        self._door = Listener(lambda: self.settings, lambda: self.services, self._throttle)
        self._hook_log_lock = threading.Lock()
        self._log_budget = _LogBudget()
        self._waits: FetchWaits | None = None
        self._settings = config.SettingsCache()  # each keyword's, read once (again on SIGHUP)
        self._outbox = Outbox(self.node_services, self._settings.get, lambda: self.services)
        self._duties = Duties(self._node, self._settings, lambda: self.settings,
                              lambda: self.services, self.node_services, self._slots,
                              self._outbox)
        self._fetches = FetchActivity(lambda: len(self._waits or ()))  # for the nudge

    # ---- set-up ---------------------------------------------------------------------------

    def _setup_logging(self) -> None:
        handler: logging.Handler
        if self.foreground or not self.settings.log:
            handler = logging.StreamHandler(sys.stderr)
        else:
            handler = logging.handlers.WatchedFileHandler(self.settings.log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        for old in list(_package_log.handlers):
            _package_log.removeHandler(old)
            old.close()
        _package_log.addHandler(handler)
        _package_log.setLevel(logging.INFO)
        _package_log.propagate = False

    # ---- main loop ------------------------------------------------------------------------

    def run(self) -> int:
        self._setup_logging()
        served = self.node_services
        served.use_pool(self.settings.db_overflow)
        evaluator = bounded.Bounded(self.settings.expression_timeout,
                                    self.settings.expression_workers)
        served.use_evaluator(evaluator)
        served.outbox = self._outbox.hand_off
        kept_back = Deferred(self.settings.report_delay) if self.settings.report_delay else None
        served.deferred = kept_back
        self._duties.start()
        listener = self._door.open(self.path)
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
        conns: dict[int, Conn] = {}
        work: WorkQueue[Work] = WorkQueue(self.settings.workers - self.settings.service_workers)
        workers = [
            threading.Thread(target=self._work, args=(work,), name=f"hook-{i}", daemon=True)
            for i in range(self.settings.workers)
        ]
        for t in workers:
            t.start()
        log.info("jobstore agent %d listening on %s (service uids %s)", os.getpid(), self.path,
                 sorted(self.services))
        self._start_metrics()
        waits = self._waits = FetchWaits(
            lambda parked: work.put(dataclasses.replace(parked.item, parked=parked), None),
            self._answer_nothing, self._hang_up,
            databases=lambda: [s for s in self._node() if s.fetch_wait > 0],
            starved=self._fetches.starved, stores=served)
        waiter = threading.Thread(target=waits.run, args=(lambda: self._stop,), name="waits",
                                  daemon=True)
        waiter.start()
        if self.settings.nudge_command:
            threading.Thread(target=nudge_startd, args=(
                self.settings.nudge_command, time.time(), self._fetches, lambda: self._stop),
                name="nudge", daemon=True).start()
        watch = AttemptWatch(self._attempts, self._vacate, lambda: self.settings, served)
        watcher = threading.Thread(target=watch.run, args=(lambda: self._stop,), name="watch",
                                   daemon=True)
        watcher.start()
        if kept_back is not None:
            threading.Thread(target=self._apply_kept_back, args=(kept_back,), name="kept-back",
                             daemon=True).start()
        try:
            while not self._stop:
                self._duties.tick()
                for key, _ in sel.select(timeout=0.5):
                    if key.data == "listen":
                        self._door.accept(listener, sel, conns)
                    elif key.data == "wake":
                        try:
                            while wake_r.recv(512):
                                pass
                        except BlockingIOError:
                            pass
                    else:
                        self._door.read(key.data, sel, conns, work)
                now = time.monotonic()
                for conn in [c for c in conns.values() if c.deadline < now]:
                    self._throttle.warn(
                        "slow", conn.peer.uid, "uid %d pid %d: request not complete after %g s,"
                        " dropped", conn.peer.uid, conn.peer.pid, self.settings.read_timeout)
                    self._door.drop(conn, sel, conns)
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
                self._door.drop(conn, sel, conns)
            waiter.join()  # the waiting fetches answered (nothing)
            for item in work.close():  # queued, never started: the hooks fall back or retry
                item.conn.sock.close()
                self._door.release(item.conn)
            for t in workers:
                t.join()
            served.deferred = None
            if kept_back is not None:  # what the hooks were told was taken goes in now
                self._log_kept_back(sending.apply_kept_back(kept_back.drain(), node=served))
            self._duties.join()
            if self._metrics is not None:
                self._metrics.close()
            served.drop_stores()
            journal, served.inflight = served.inflight, None
            if journal is not None:
                journal.clear()  # an orderly stop: whatever was being read did not crash it
            served.use_evaluator(bounded.Inline())
            evaluator.close()
            signal.set_wakeup_fd(old_wakeup)
            wake_r.close()
            wake_w.close()
            sel.close()
        log.info("jobstore agent %d stopped", os.getpid())
        return 0

    def _node(self) -> list[config.Settings]:
        """The settings of each keyword this node uses, as read at start (or the last SIGHUP)."""
        return list(config.node_settings(load=self._settings.get).values())

    def _on_stop(self, signum: int, _frame: object) -> None:
        self._stop = True

    def _on_hup(self, signum: int, _frame: object) -> None:
        self._reload = True

    def _do_reload(self) -> None:
        import htcondor2

        try:
            htcondor2.reload_config()
            self.settings = config.load_agent_settings(self.socket_override)
            self._settings.clear()
        except Exception as exc:  # a broken configuration must not stop the service
            log.error("configuration not reloaded: %s", exc)
            return
        self.services = config.service_uids(self.settings.startd_users)
        self._setup_logging()
        self.node_services.drop_stores()
        if self.settings.socket != self.path:
            log.warning("JOBSTORE_AGENT_SOCKET changed; the agent keeps %s until restarted",
                        self.path)
        log.info("configuration reloaded (service uids %s)", sorted(self.services))

    # ---- work (worker threads) ------------------------------------------------------------

    def _work(self, work: WorkQueue[Work]) -> None:
        while True:
            got = work.get()
            if got is None:
                return
            item, uid = got
            try:
                self._serve(item)
            finally:
                work.done(uid)

    def _serve(self, item: Work) -> None:
        conn, hook, peer = item.conn, item.hook, item.conn.peer
        started = item.received
        response: HookResponse | None = None
        waiting = False
        try:
            refused = peers.refusal(hook, peer, self.services)
            if refused:
                self._throttle.warn("refused", peer.uid, "uid %d pid %d: refused: %s",
                                    peer.uid, peer.pid, refused)
                answer(conn.sock, [REFUSED, b"0", b"", refused.encode()])
                return
            if hook == "fetch_job" and conn.service and item.parked is None:
                self._fetches.seen(slot_name(item.stdin))
                try:  # the startd's slot ad, for jobstore status: never at the fetch's cost
                    self._slots.seen(item.stdin)
                except Exception as exc:
                    log.warning("slot ad not kept: %s: %s", type(exc).__name__, exc)
                if self._quiet_wait(item):
                    waiting = True  # nothing new since this slot's last claim: none now
                    return
            if (hook == "fetch_job" and item.parked is not None and item.parked.polled
                    and self._nothing_idle(item)):
                waiting = True  # woken by a timer, and its queue has no idle job: no claim
                return
            serve = sandboxcalls.handle if hook in sandboxcalls.CALLS else handlers.handle
            response = serve(HookRequest(
                hook=hook, argv=item.argv, stdin=item.stdin, env=item.env,
                caller=peers.caller(peer, self.services), settings=self._settings.get,
                services=self.services, node=self.node_services,
            ))
            claimed = hook == "fetch_job" and bool(
                response.stdout or (response.idle is not None and not response.idle.starter))
            if claimed and self._metrics is not None:
                self._metrics.claims.inc()
            logged, dropped = (True, 0) if conn.service else self._log_budget.take(peer.uid)
            if dropped:
                log.warning("uid %d: the lines of %d of its calls were not logged (more than %d"
                            " in %g s)", peer.uid, dropped, LOG_CALLS_PER_UID, WARN_EVERY)
            if logged:
                for note in response.log:
                    log.info("%s uid %d pid %d: %s", hook, peer.uid, peer.pid, one_line(note))
                if response.error:
                    log.warning("%s uid %d pid %d: %s", hook, peer.uid, peer.pid,
                                one_line(response.error))
                self._hook_log(hook, peer, response)
            if hook == "fetch_job" and conn.service and self._wait(item, response):
                waiting = True
                return
            if item.parked is not None and response.stdout and self._waits is not None:
                self._waits.found(item.parked)
            try:
                sent = answer(conn.sock, [
                    OK,
                    str(response.exit_code).encode(),
                    response.stdout,
                    (response.error or "").encode("utf-8", "replace"),
                    *[n.encode("utf-8", "replace") for n in response.log],
                ], fd=response.fd)
            finally:
                if response.fd is not None:
                    os.close(response.fd)
            if not sent and hook == "fetch_job" and response.stdout:
                self._give_back(item.stdin, response)
            elif hook == "fetch_job" and response.stdout:
                self._attempts.fetched(item.stdin, response.stdout)
            elif response.error and not response.spooled:
                pass  # a report refused or not sent changes nothing, the watch included
            elif hook == "job_exit":
                ended = self._attempts.ended(item.stdin, trusted=conn.service)
                if ended is not None:
                    self._fetches.freed(ended.slot)
            elif hook == "reply_fetch" and item.argv == ["reject"]:
                self._attempts.ended(item.stdin, reply_fetch=True, trusted=conn.service)
        except Exception as exc:  # never let one call take the service down
            log.error("%s uid %d pid %d: internal error: %s: %s", hook, peer.uid, peer.pid,
                      type(exc).__name__, exc)
        finally:
            if not waiting:
                conn.sock.close()
                self._door.release(conn)
            if self._metrics is not None and not waiting:  # a waiting call: when answered
                self._metrics.observe(hook, response, time.monotonic() - started)

    def _quiet_wait(self, item: Work) -> bool:
        """Let the fetch wait without a claim when nothing is new since its slot's last claim
        (FetchWaits.quiet), doing the upkeep a fetch does now and then all the same; whether
        it waits."""
        found = None if self._waits is None else self._waits.quiet(item.stdin)
        if found is None:
            return False
        quiet, recent = found
        if not recent:  # long ago: claim unless the queue has no idle job at all
            if not self._no_idle_job(quiet):
                return False
            assert self._waits is not None
            self._waits.nothing(item.stdin, quiet)
        try:
            store = self.node_services.store_for(quiet.settings)
            for note in fetching.upkeep(store, quiet.settings):
                log.warning("fetch_job: %s", one_line(note))
        except Exception as exc:  # as in a fetch: the upkeep never costs the call
            log.warning("fetch_job: upkeep failed: %s: %s", type(exc).__name__, exc)
        return self._wait(item, HookResponse(idle=quiet), claimed=False)

    def _nothing_idle(self, item: Work) -> bool:
        """A waiting fetch woken by a timer (no notification) parks again without a claim when
        its queue has no idle job (one indexed read instead); whether it does."""
        assert item.parked is not None
        if not self._no_idle_job(item.parked.idle):
            return False
        item.parked.polled = False
        return self._wait(item, HookResponse(idle=item.parked.idle), claimed=False)

    def _no_idle_job(self, idle: IdleSlot) -> bool:
        """Does the slot's queue have no idle job at all? (A failed read says it may have.)"""
        try:
            return not self.node_services.store_for(idle.settings).reads.has_idle(idle.queue)
        except Exception as exc:
            log.warning("fetch_job: idle jobs not counted: %s: %s", type(exc).__name__, exc)
            return False

    def _wait(self, item: Work, response: HookResponse, claimed: bool = True) -> bool:
        """Let a fetch that found nothing (`claimed`: by a claim, else known to find nothing)
        wait for work that fits its slot (JOBSTORE_FETCH_WAIT from its first try;
        jobstore.agent.fetchwait); whether it waits."""
        idle = response.idle
        if self._waits is None or idle is None or response.stdout or response.error:
            return False
        now = time.monotonic()
        until = (item.parked.until if item.parked is not None
                 else now + wait_bound(idle.settings.fetch_wait))
        if claimed and not idle.starter:
            self._waits.nothing(item.stdin, idle)
        if until - now < MIN_WAIT:
            return False
        if item.parked is None:  # the hook's deadline moves on by the wait and a claim's time
            more = until - now + min(idle.settings.fetch_deadline, DEADLINES["fetch_job"])
            if not answer(item.conn.sock, [HOLD, f"{more:.3f}".encode()]):
                return False
        self._waits.park(Parked(item, idle, until))
        if self._metrics is not None and item.parked is None:
            self._metrics.waits.labels(
                "busy" if idle.starter else "claimed" if claimed else "quiet").inc()
        return True

    def _answer_nothing(self, parked: Parked) -> None:
        """A waiting fetch's bound came: no work (a small answer: never blocks the waits)."""
        answer(parked.item.conn.sock, [OK, b"0", b"", b""], wait=False)
        self._hang_up(parked)
        if self._metrics is not None:
            self._metrics.observe("fetch_job", HookResponse(),
                                  time.monotonic() - parked.item.received)

    def _hang_up(self, parked: Parked) -> None:
        parked.item.conn.sock.close()
        self._door.release(parked.item.conn)

    def _start_metrics(self) -> None:
        """Serve the metrics on JOBSTORE_AGENT_METRICS_PORT (a loopback address), if set; a
        port that cannot be bound is logged, and the hooks are served all the same."""
        if not self.settings.metrics_port:
            return
        from jobstore.agent.metrics import AgentMetrics

        def store_collectors() -> list:
            from jobstore.api.metrics import StoreCollector

            # the default keyword's, then STARTD_JOB_HOOK_KEYWORD's: the latter when it is set
            keywords = self._node()
            if not keywords:
                return []
            return [StoreCollector(self.node_services.store_for(keywords[-1]))]

        address, port = self.settings.metrics_address, self.settings.metrics_port
        try:
            metrics = AgentMetrics(self._duties.spool_dirs, lambda: len(self._attempts),
                                   store_collectors if self.settings.metrics_store else None,
                                   lambda: 0 if self._waits is None else len(self._waits),
                                   self._direct_noted)
            metrics.serve(address, port)
        except Exception as exc:
            log.error("metrics not served on %s port %d: %s", address, port, one_line(str(exc)))
            return
        self._metrics = metrics
        log.info("metrics served on http://%s:%d/metrics%s", address, port,
                 " (with the store's view)" if self.settings.metrics_store else "")

    def _apply_kept_back(self, kept_back: Deferred) -> None:
        """Apply the reports kept back for their delay (node.deferred), until the agent stops
        (then what is left is applied by `run`)."""
        step = min(0.1, kept_back.delay / 4)
        while not self._stop:
            time.sleep(step)
            due = kept_back.due()
            if not due:
                continue
            try:
                self._log_kept_back(sending.apply_kept_back(due, node=self.node_services))
            except Exception as exc:  # the spool has them; the replay sends them
                log.error("reports kept back not applied: %s", one_line(str(exc)))

    def _log_kept_back(self, lines: list[str]) -> None:
        for line in lines:
            log.info("kept back: %s", line)

    def _direct_noted(self) -> float:
        noted = directnote.last(self.settings.hook_log)
        return noted[0] if noted else 0.0

    def _hook_log(self, hook: str, peer: peers.Peer, response: HookResponse) -> None:
        """The hook log lines of a call this agent served, written here (as root) because the
        job users whose starter hooks call may not write the hook log themselves."""
        path = self.settings.hook_log
        lines = [f"{hook}: {x}" for x in response.log]
        if response.error:
            lines.append(response.error)
        if not path or not lines:
            return
        via = f"(agent, uid {peer.uid}) "
        text = "".join(log_entry(hook, peer.pid, one_line(x), via) for x in lines)
        with self._hook_log_lock:
            if not append_hook_log(path, text):
                self._throttle.warn("hooklog", 0, "hook log %s cannot be written", path)

    def _give_back(self, slot_ad: bytes, fetched: HookResponse) -> None:
        """The fetching hook is gone (deadline): put its job back at once, as a REJECT would,
        instead of waiting for the claim lease."""
        job = fetched.stdout if fetched.stdout.endswith(b"\n") else fetched.stdout + b"\n"
        back = handlers.handle(HookRequest(
            hook="reply_fetch", argv=["reject"], stdin=job + b"-----\n" + slot_ad, env={},
            settings=self._settings.get, services=self.services, node=self.node_services,
        ))
        log.warning("fetch_job: the hook left before its answer; job given back (%s)",
                    back.error or "; ".join(back.log))

    def _vacate(self, attempt: Attempt, fast: bool, why: str) -> bool:
        """Ask the startd to vacate the slot of `attempt`: fast (the job's processes are
        killed) or graceful (the job gets its KillSig first). Whether the startd took it."""
        how = "fast" if fast else "graceful"
        try:
            if self.settings.vacate_command:
                import subprocess

                subprocess.run([self.settings.vacate_command, f"-{how}", attempt.slot],
                               timeout=10, check=True, capture_output=True)
            else:
                import htcondor2

                kind = htcondor2.VacateType.Fast if fast else htcondor2.VacateType.Graceful
                htcondor2.Startd().vacateSlot(attempt.slot, kind)
        except Exception as exc:
            log.error("job %s attempt %d (%s): cannot vacate slot %s: %s", attempt.name,
                      attempt.attempt, why, attempt.slot, one_line(str(exc)))
            return False
        log.info("job %s attempt %d is %s: slot %s vacated (%s)", attempt.name,
                 attempt.attempt, why, attempt.slot, how)
        return True

def run_agent(socket_override: str | None = None, *, foreground: bool = False) -> int:
    """`jobstore agent`: run until stopped; the exit status."""
    return Agent(socket_override, foreground=foreground).run()
