"""The agent's periodic duties, each in a thread of its own when it is due (`tick`): the
spools' replay (every JOBSTORE_AGENT_REPLAY_INTERVAL), and the pass that runs the jobs'
periodic policy and the lease reaper where they are due pool-wide, prunes the history, sweeps
the sandboxes of ended attempts and publishes the slot ads; and what the agent does once at its
start (`start`: the sandbox roots, the jobs that crashed it)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobstore.agent.outbox import Outbox
from jobstore.agent.pruner import Pruner
from jobstore.agent.slotads import SlotBoard
from jobstore.errors import JobstoreError
from jobstore.node import config, sending, spool
from jobstore.node.inflight import CRASHES_BEFORE_HOLD, InFlight
from jobstore.node.sandboxroot import INFLIGHT, ensure_private, ensure_root, sweep
from jobstore.node.services import NodeServices

log = logging.getLogger("jobstore.agent")
# Seconds between two looks at whether the periodic policy pass is due (it runs once per
# PERIODIC_EXPR_INTERVAL in the whole pool, Maintenance.police_due).
POLICE_TICK = 10.0
# Seconds between two recoveries of expired leases in the whole pool (Maintenance.reap_due), so that
# a job whose startd died comes back even when no slot fetches.
REAP_INTERVAL = 10.0


class Duties:
    """The periodic duties of one agent (see the module's docstring)."""

    def __init__(self, node: Callable[[], list[config.Settings]],
                 settings: config.SettingsCache, agent: Callable[[], config.AgentSettings],
                 services: Callable[[], frozenset[int]], stores: NodeServices,
                 slots: SlotBoard, outbox: Outbox) -> None:
        """`node`: the settings of this node's keywords; `settings`: each keyword's, as the
        agent read them; `agent`: its own; `services`: the service accounts' uids; `stores`:
        what serves its calls; `slots`: the slot ads it publishes; `outbox`: the outputs handed
        to it."""
        self._node, self._settings, self._agent = node, settings, agent
        self._services, self._stores = services, stores
        self._slots, self._outbox = slots, outbox
        self._pruner = Pruner(stores)
        self._replaying = threading.Event()
        self._policing = threading.Event()
        self._next_replay = self._next_police = 0.0
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """What the agent does once, before it serves: the sandbox roots (and the outputs
        handed to it before it stopped), and holding the jobs that crashed it."""
        self.sandbox_roots()
        self.hold_what_crashed_it()

    def tick(self) -> None:
        """Start each duty that is due in a thread of its own, unless it still runs."""
        now = time.monotonic()
        if now >= self._next_replay:
            self._next_replay = now + self._agent().replay_interval
            self._start(self._replaying, self.replay, "replay")
        if now >= self._next_police:
            self._next_police = now + self.police_tick()
            self._start(self._policing, self.police, "police")

    def join(self) -> None:
        """Wait for the duties that run (the agent stops)."""
        for thread in self._threads:
            thread.join()

    def _start(self, running: threading.Event, duty: Callable[[], None], name: str) -> None:
        if running.is_set():
            return
        running.set()

        def run() -> None:
            try:
                duty()
            finally:
                running.clear()

        self._threads = [t for t in self._threads if t.is_alive()]
        thread = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def hold_what_crashed_it(self) -> None:
        """Keep a journal of the jobs whose stored ads this process reads (node.inflight);
        hold those a run before this one died reading, twice."""
        node = self._node()
        if not node:
            return
        try:
            journal = InFlight(ensure_private(node[0].sandbox_root, INFLIGHT))
            due = journal.crashed()
        except OSError as exc:
            log.error("the journal of jobs read cannot be kept: %s", exc)
            return
        self._stores.inflight = journal
        for keyword, job_id in due:
            why = (f"the jobstore agent died {CRASHES_BEFORE_HOLD} times while it read this "
                   "job's ad (its expressions): held so that no node reads it again")
            try:
                settings = self._settings.get(keyword)
                held = self._stores.store_for(settings).maintenance.hold_unreadable(job_id, why)
            except (JobstoreError, config.ConfigError) as exc:
                log.error("job id %d, which the agent died reading, cannot be held: %s",
                          job_id, exc)
                continue
            if held is not None and held.changed:
                log.warning("job %s held: %s", held.name, why)

    def police_tick(self) -> float:
        """How often to ask whether the policy pass is due: PERIODIC_EXPR_INTERVAL, at most
        POLICE_TICK seconds."""
        try:
            return float(min(POLICE_TICK, self._settings.get(None).periodic_expr_interval))
        except config.ConfigError:
            return POLICE_TICK

    def police(self) -> None:
        """The jobs' periodic policy pass, for the databases of this node's keywords, when it is
        due pool-wide (Maintenance.police_due: one agent runs it per PERIODIC_EXPR_INTERVAL); then
        the history's prune when it is due (Pruner)."""
        node: list[config.Settings] = []
        try:
            node = self._node()
            for settings in node:
                try:
                    store = self._stores.store_for(settings)
                except config.ConfigError:
                    continue
                acted = store.maintenance.police_due(settings.periodic_expr_interval)
                for o in acted or ():
                    log.info("job %s: periodic policy: %s %s -> %s (%s)", o.name, o.event,
                             o.before, o.after, o.reason)
                for o in store.maintenance.reap_due(REAP_INTERVAL) or ():
                    log.info("job %s: lease ran out: %s -> %s", o.name, o.before, o.after)
        except Exception as exc:
            log.error("periodic policy pass failed: %s: %s", type(exc).__name__, exc)
        try:
            self._pruner.tick(node)
        except Exception as exc:
            log.error("history prune failed: %s: %s", type(exc).__name__, exc)
        try:
            self.sweep_sandboxes(node)
        except Exception as exc:
            log.error("sandbox sweep failed: %s: %s", type(exc).__name__, exc)
        try:
            if self._slots.due():
                self._slots.publish(self.node_stores(node))
        except Exception as exc:
            log.error("slot ads not published: %s: %s", type(exc).__name__, exc)

    def sweep_sandboxes(self, node: list[config.Settings]) -> None:
        """Remove the sandboxes of attempts that ended without their JOB_EXIT (a crash, a
        killed starter), once no slot can still run them (LEASE_DURATION)."""
        for settings in node:
            root = settings.sandbox_root
            if not os.path.isdir(root):
                continue
            current = _current_attempt(self._stores.store_for(settings))
            for name in sweep(root, current, settings.lease_duration):
                log.info("sandbox %s of an ended attempt removed", name)

    def node_stores(self, node: list[config.Settings]) -> list[Any]:
        """One store per database of this node's keywords."""
        stores: dict[str, Any] = {}
        for settings in node:
            try:
                stores.setdefault(settings.database_url, self._stores.store_for(settings))
            except config.ConfigError:
                continue
        return list(stores.values())

    def replay(self) -> None:
        """Send the reports left in this node's spools (their databases were away, a hook or
        the agent died before they went in)."""
        try:
            send = sending.spool_sender(self._services(), node=self._stores)
            for directory in self.spool_dirs():
                done = spool.replay(directory, send, limit=10_000, group=sending.record_group)
                if done.sent or done.left or done.bad:
                    log.info("spool %s: %d report(s) replayed, %d left, %d quarantined%s",
                             directory, done.sent, done.left, done.bad,
                             "".join(f"; {n} left: {why}" for why, n in done.why_left))
        except Exception as exc:
            log.error("spool replay failed: %s: %s", type(exc).__name__, exc)

    def sandbox_roots(self) -> None:
        """Make the sandbox roots of the keywords this node uses (file transfer), and go on
        sending the outputs handed to the agent there before it stopped."""
        roots = []
        for root in sorted({s.sandbox_root for s in self._node()}):
            try:
                for note in ensure_root(root):
                    log.warning("%s", note)
                roots.append(root)
            except OSError as exc:
                log.error("sandbox root %s cannot be made: %s", root, exc)
        self._outbox.start(roots)

    def spool_dirs(self) -> list[Path]:
        """The spool directories of the keywords this node uses, made safe (created, or
        repaired when another account made them) so that reports can wait there."""
        dirs: list[Path] = []
        for settings in self._node():
            directory = Path(settings.spool)
            if directory in dirs:
                continue
            try:
                spool.ensure_dir(directory)
            except spool.SpoolError as exc:
                log.error("%s", exc)
                continue
            dirs.append(directory)
        return dirs


def _current_attempt(store: Any) -> Callable[[int, int], int | None]:
    """The attempt of job CLUSTER.PROC that is handed out now (it has a token), else None."""
    def current(cluster: int, proc: int) -> int | None:
        jobs = store.reads.find_jobs(cluster, proc)
        return jobs[0].claims if jobs and jobs[0].token else None

    return current
