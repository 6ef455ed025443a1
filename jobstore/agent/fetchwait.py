"""Waiting fetches: a FETCH_WORK that found nothing waits in the agent, its hook's
connection open, for work that fits its slot, up to JOBSTORE_FETCH_WAIT seconds, without holding
a worker thread.

On PostgreSQL the store says when work becomes claimable (channel `jobstore_work`, sent by the
jobs table's triggers in the transaction that makes it so, with the new work's queue and
requests); the agent LISTENs on one connection per database and wakes one waiting fetch that the
work fits per announced shape, and another each time a woken fetch finds a job. Where
notifications cannot arrive (SQLite, a pooler in transaction mode, a lost connection) it wakes
one waiting fetch per database every POLL seconds (SAFETY seconds where they can, against a lost
one), which reads whether its queue has an idle job and claims only then: one indexed read per
node per interval, not a claim per slot. A fetch whose hook is gone (killed, SIGTERM) is dropped
at once; one that waited its bound is answered with nothing.

A busy static slot's fetch (its starter named in the slot ad, alive) is held the same way,
woken by nothing but the end of that starter (a pidfd): when the startd has reaped it, the
fetch is served again for the slot as it is then, Claimed/Idle, so that it claims the next job
on the slot's claim or waits for one; an empty answer to a fetch that began while the job ran
would end the claim, and the slot would wait for the startd's timer.

Announced work that no waiting fetch can take (every slot is between two fetches: the startd
fetches for a slot at most once a second) is told to the agent (`starved`), which has the startd
evaluate its slots at once (agent.startdnudge): a slot whose job has just ended, Claimed/Idle,
then fetches without waiting for its timer.

Anyone who may connect can NOTIFY: the database signs what it sends (migration 0019), and the
listener drops what is not signed with its key, or is a replay. What is left is still a hint:
what arrives for a database is gathered and acted on at most once per CHECK interval, which
doubles (up to MAX_CHECK) each time the fetches it woke found nothing and falls back as soon as
one finds a job; once it has grown, a woken fetch reads whether its queue has an idle job
before it claims. So notifications cost a node a bounded number of reads, never a claim each,
and real work after a quiet spell is acted on at once.
"""

from __future__ import annotations

import logging
import os
import random
import re
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jobstore.db.channels import WORK, Listener
from jobstore.node import config
from jobstore.node.hookcall import IdleSlot
from jobstore.node.services import NodeServices

log = logging.getLogger("jobstore.agent")
POLL = 0.5  # seconds between two wake-ups of a database no notification can come from
SAFETY = 30.0  # and of one that notifies, should a notification be lost
QUIET = 600.0  # seconds a slot's fetch may wait without a claim since its last one found nothing
RELISTEN = 60.0  # seconds before trying LISTEN on a database again after it failed
CHECK = 0.05  # seconds between two acts on a database's notifications, at least
MAX_CHECK = 1.0  # ... and at most, while what they announce is never there
FORGED_LOG = 60.0  # seconds between two lines about dropped (unsigned, replayed) notifications
STAGGER = 0.25  # a wait's bound is drawn from the last quarter of JOBSTORE_FETCH_WAIT
REAPED = 2.0  # seconds an ended starter may take to be reaped by the startd, at most


def wait_bound(wait: float) -> float:
    """How long one fetch may wait: `wait` less up to STAGGER of it, at random, so that the
    slots of a node started together do not all come back to the startd at once (a job
    submitted while every slot is between two fetches would wait for the startd's timer)."""
    return wait * (1.0 - STAGGER * random.random())


@dataclass(frozen=True)
class Shape:
    """What new work asks for: its queue and requests (CPUs, MiB, KiB)."""

    queue: str
    cpus: int
    memory: int
    disk: int


MAX_SHAPES = 64  # distinct shapes gathered between two acts (more: any shape)


def parse_shapes(payload: str) -> list[Shape] | None:
    """The shapes a notification names (`queue cpus memory disk`, comma separated); None for
    "anything" (`*`, or what cannot be read)."""
    shapes = []
    for part in payload.split(","):
        words = part.split()
        if len(words) != 4 or not all(w.lstrip("-").isdigit() for w in words[1:]):
            return None
        shapes.append(Shape(words[0], int(words[1]), int(words[2]), int(words[3])))
    return shapes or None


def fits(idle: IdleSlot, shape: Shape | None) -> bool:
    """Could the slot that waits take work of `shape` (None: any)?"""
    if shape is None:
        return True
    return (shape.queue == idle.queue and shape.cpus <= idle.cpus
            and shape.memory <= idle.memory and shape.disk <= idle.disk)


@dataclass(eq=False)
class Parked:
    """A fetch waiting: the server's work item (its connection open), its slot, its bound."""

    item: Any
    idle: IdleSlot
    until: float  # time.monotonic()
    shapes: list[Shape] | None = field(default=None)  # what woke it, if something did
    polled: bool = False  # woken by a timer (POLL, SAFETY), not by a notification
    pidfd: int = -1  # a held busy slot's fetch: its starter (idle.starter), watched
    ended: _StarterEnd | None = None  # ... and what the selector says when it ends


@dataclass(eq=False)
class _StarterEnd:
    parked: Parked


@dataclass
class _Database:
    listener: Listener | None = None
    retry_at: float = 0.0  # when to try LISTEN again
    next_wake: float = 0.0  # the next poll (or safety) wake-up
    notified: float = 0.0  # when announced work was last acted on
    pending: list[Shape | None] = field(default_factory=list)  # announced, not acted on yet
    next_check: float = 0.0  # when announced work may be acted on next
    check: float = CHECK  # the interval between two acts, while nothing is found
    forged_logged: int = 0  # the listener's dropped notifications already told of
    forged_log_at: float = 0.0  # when they may be told of again


# the slot ad's lines that say what a slot could take (its key in FetchWaits.quiet)
_SLOT_LINES = re.compile(rb"^(?:Name|Cpus|Memory|Disk|State|Activity|Start) = .*$", re.M)


_NAME = re.compile(rb'^Name = "([^"\\]*)"$', re.M)


def slot_name(stdin: bytes) -> str:
    """The Name of a FETCH_WORK's slot ad ("" when it has none)."""
    found = _NAME.search(stdin)
    return found.group(1).decode("utf-8", "replace") if found else ""


def slot_key(stdin: bytes) -> bytes:
    """What a FETCH_WORK's slot ad says of what the slot could take."""
    return b"\n".join(sorted(_SLOT_LINES.findall(stdin)))


class FetchWaits:
    """The waiting fetches of one agent, watched by one thread (`run`)."""

    def __init__(self, requeue: Callable[[Parked], None], answer: Callable[[Parked], None],
                 drop: Callable[[Parked], None], connect_timeout: int = 3,
                 databases: Callable[[], list[config.Settings]] = list,
                 starved: Callable[[], None] = lambda: None, *, stores: NodeServices) -> None:
        self._stores = stores
        self._requeue, self._answer, self._drop = requeue, answer, drop
        self._starved = starved  # announced work that no waiting fetch could take
        self._connect_timeout = connect_timeout
        self._databases = databases  # the node's: listened to from the start
        self._known: dict[str, config.Settings] = {}
        self._lock = threading.Lock()
        self._parked: list[Parked] = []
        self._dbs: dict[str, _Database] = {}
        self._empty: dict[bytes, tuple[IdleSlot, float]] = {}  # slot -> last nothing
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._parked)

    def park(self, parked: Parked) -> None:
        """Let `parked` wait (its answer not sent yet); a busy slot's, until its starter ends."""
        if parked.idle.starter:
            try:
                parked.pidfd = os.pidfd_open(parked.idle.starter)
            except OSError:  # ended already
                self._after_job(parked)
                return
            parked.ended = _StarterEnd(parked)
        with self._lock:
            self._parked.append(parked)
            self._dbs.setdefault(parked.idle.database_url,
                                 _Database(next_wake=time.monotonic() + POLL))
        self._poke()

    def nothing(self, stdin: bytes, idle: IdleSlot) -> None:
        """A claim for the slot of `stdin` found nothing."""
        with self._lock:
            self._empty[slot_key(stdin)] = (idle, time.monotonic())

    def quiet(self, stdin: bytes) -> tuple[IdleSlot, bool] | None:
        """The slot's last fetch that found nothing, when nothing can have changed since: its
        database announces new work (and has not, nor has its LISTEN been re-made). Such a
        fetch waits without a claim: an idle node makes none while the queue is empty. With
        it, whether that was less than QUIET seconds ago (else, against a lost notification,
        the fetch waits only if its queue has no idle job at all)."""
        with self._lock:
            last = self._empty.get(slot_key(stdin))
            if last is None:
                return None
            idle, when = last
            db = self._dbs.get(idle.database_url)
            if db is None or db.listener is None or db.notified >= when:
                return None
            return idle, time.monotonic() - when < QUIET

    def found(self, parked: Parked) -> None:
        """A woken fetch found a job: there may be more of what woke it; wake another (and
        act on the next notification at once)."""
        with self._lock:
            db = self._dbs.get(parked.idle.database_url)
            if db is not None:
                db.check = CHECK
        shapes: list[Shape | None] = [*parked.shapes] if parked.shapes else [None]
        self._wake(parked.idle.database_url, shapes)

    def run(self, stopping: Callable[[], bool]) -> None:
        """Watch the waiting fetches until `stopping()`; then answer them all (nothing)."""
        try:
            known = self._databases()
        except Exception as exc:  # the configuration: the parked fetches' databases only
            log.warning("waiting fetches: the node's databases are not known: %s", exc)
            known = []
        with self._lock:
            for settings in known:
                self._known[settings.database_url] = settings
                self._dbs.setdefault(settings.database_url, _Database())
        sel = selectors.DefaultSelector()
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        watched: dict[int, Any] = {}  # fd -> Parked or database url
        try:
            while not stopping():
                try:
                    self._turn(sel, watched)
                except Exception as exc:  # never let one turn end the waits: log, go on
                    log.error("waiting fetches: %s: %s", type(exc).__name__, exc)
                    time.sleep(0.1)
        finally:
            with self._lock:
                left, self._parked = self._parked, []
                dbs, self._dbs = list(self._dbs.values()), {}
            for parked in left:
                _unwatch(parked)
                self._answer(parked)
            for db in dbs:
                if db.listener is not None:
                    db.listener.close()
            sel.close()

    # ---- the thread's work ----------------------------------------------------------------

    def _turn(self, sel: selectors.BaseSelector, watched: dict[int, Any]) -> None:
        self._watch(sel, watched)
        for key, _ in sel.select(timeout=self._timeout()):
            if key.data is None:
                self._drain_wake()
            elif isinstance(key.data, Parked):
                self._hook_gone(key.data)
            elif isinstance(key.data, _StarterEnd):
                self._starter_ended(key.data.parked)
            else:
                self._notified(key.data)
        self._expire()
        self._act()
        self._poll()

    def _watch(self, sel: selectors.BaseSelector, watched: dict[int, Any]) -> None:
        """Select on each waiting hook's socket (readable: it hung up) and each listener."""
        with self._lock:
            want: dict[int, Any] = {p.item.conn.sock.fileno(): p for p in self._parked}
            want.update({p.pidfd: p.ended for p in self._parked if p.pidfd >= 0})
            settings = {**self._known,
                        **{p.idle.database_url: p.idle.settings for p in self._parked}}
            dbs = [(url, db) for url, db in self._dbs.items() if url in settings]
        for url, db in dbs:  # (a new LISTEN and its probe take a moment: not under the lock)
            self._listen(url, db, settings[url])
            fileno = None if db.listener is None else db.listener.fileno()
            if fileno is not None:
                want[fileno] = url
        for fd in [fd for fd in watched if fd not in want or watched[fd] is not want[fd]]:
            sel.unregister(fd)
            del watched[fd]
        for fd, data in want.items():
            if fd not in watched and fd >= 0:
                sel.register(fd, selectors.EVENT_READ, data)
                watched[fd] = data

    def _listen(self, url: str, db: _Database, settings: config.Settings) -> None:
        """Listen on `url`'s work channel, if it can be had."""
        if db.listener is not None or time.monotonic() < db.retry_at:
            return
        db.retry_at = time.monotonic() + RELISTEN
        try:
            store = self._stores.store_for(settings)
        except Exception as exc:
            log.warning("waiting fetches: cannot LISTEN: %s: polling", exc)
            return
        if not store.db.can_listen:
            return
        since = time.monotonic()  # what came before it was not heard: claim again
        try:
            listener = store.db.listener(WORK, self._connect_timeout)
            listener.open()
            if not listener.probe():
                listener.close()
                log.info("waiting fetches: no notifications from %s (a pooler?): polling",
                         store.db.engine.url.render_as_string(hide_password=True))
                return
        except Exception as exc:
            log.warning("waiting fetches: cannot LISTEN: %s: polling", exc)
            return
        db.notified = since
        db.listener = listener

    def _timeout(self) -> float:
        now = time.monotonic()
        with self._lock:
            times = [p.until for p in self._parked]
            urls = {p.idle.database_url for p in self._parked}
            times += [db.next_wake for url, db in self._dbs.items() if url in urls]
            times += [db.next_check for db in self._dbs.values() if db.pending]
        return max(0.01, min([t - now for t in times], default=POLL))

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(512):
                pass
        except BlockingIOError:
            pass

    def _hook_gone(self, parked: Parked) -> None:
        """Its socket is readable: the hook hung up (or sent more than it should): drop it."""
        if self._unpark(parked):
            self._drop(parked)

    def _starter_ended(self, parked: Parked) -> None:
        """A held busy slot's starter ended: once the startd has reaped it (the slot is then
        Claimed/Idle), serve the fetch again for the slot as it is now."""
        if self._unpark(parked):
            self._after_job(parked)

    def _unpark(self, parked: Parked) -> bool:
        """Take `parked` out of the waits, if it still waits there; whether it did."""
        with self._lock:
            if parked not in self._parked:
                return False
            self._parked.remove(parked)
        _unwatch(parked)
        return True

    def _after_job(self, parked: Parked) -> None:
        threading.Thread(target=self._when_reaped, args=(parked,), name="fetch-after-job",
                         daemon=True).start()

    def _when_reaped(self, parked: Parked) -> None:
        pid, end = parked.idle.starter, time.monotonic() + REAPED
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < end:
            time.sleep(0.002)
        parked.item.stdin = re.sub(rb'^Activity = "Busy"$', b'Activity = "Idle"',
                                   parked.item.stdin, count=1, flags=re.M)
        parked.shapes, parked.polled = None, False
        self._requeue(parked)

    def _notified(self, url: str) -> None:
        db = self._dbs.get(url)
        if db is None or db.listener is None:
            return
        try:
            payloads = db.listener.wait(0.001)
        except Exception as exc:
            log.warning("waiting fetches: notifications lost (%s): polling", exc)
            db.listener.close()
            db.listener = None
            return
        forged = db.listener.forged
        if forged > db.forged_logged and time.monotonic() >= db.forged_log_at:
            log.warning("waiting fetches: %d notification(s) on %s dropped: not signed by the "
                        "database, or replayed (someone who may connect sends them)",
                        forged - db.forged_logged, WORK)
            db.forged_logged, db.forged_log_at = forged, time.monotonic() + FORGED_LOG
        with self._lock:
            for payload in payloads:
                if payload.startswith("probe:"):
                    continue
                found = parse_shapes(payload)
                for shape in [None] if found is None else found:
                    if shape not in db.pending:  # a few distinct shapes, however many arrive
                        db.pending.append(shape)
                if len(db.pending) > MAX_SHAPES:
                    db.pending = [None]
        self._act()

    def _act(self) -> None:
        """Act on the notifications of each database that is due: wake the fetches the
        announced work fits; the next act no sooner than its interval, which doubles until a
        woken fetch finds a job (`found`)."""
        now = time.monotonic()
        due = []
        with self._lock:
            for url, db in self._dbs.items():
                if db.pending and db.next_check <= now:
                    shapes, db.pending = db.pending, []
                    verify = db.check > CHECK  # what came before was not there: read first
                    db.notified = now
                    db.next_check = now + db.check
                    db.check = min(db.check * 2, MAX_CHECK)
                    due.append((url, shapes, verify))
        for url, shapes, verify in due:
            self._wake(url, shapes, polled=verify)

    def _wake(self, url: str, shapes: list[Shape | None], polled: bool = False) -> None:
        """Wake one waiting fetch of `url` per shape that it fits (no herd)."""
        woken, missed = [], False
        with self._lock:
            for shape in shapes:
                parked = next((p for p in self._parked if p.idle.database_url == url
                               and not p.idle.starter and p not in woken
                               and fits(p.idle, shape)), None)
                if parked is not None:
                    woken.append(parked)
                    parked.shapes = None if shape is None else [shape]
                    parked.polled = polled
                else:
                    missed = True
            for parked in woken:
                self._parked.remove(parked)
        for parked in woken:
            self._requeue(parked)
        if missed and not polled:
            self._starved()

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            over = [p for p in self._parked if p.until <= now]
            self._parked = [p for p in self._parked if p.until > now]
        for parked in over:
            _unwatch(parked)
            self._answer(parked)

    def _poll(self) -> None:
        """Wake one fetch of each database that is due (none can notify, or for safety)."""
        now = time.monotonic()
        due = []
        with self._lock:
            urls = {p.idle.database_url for p in self._parked}
            for url, db in self._dbs.items():
                if url in urls and db.next_wake <= now:
                    db.next_wake = now + (SAFETY if db.listener is not None else POLL)
                    due.append(url)
        for url in due:
            self._wake(url, [None], polled=True)

    def _poke(self) -> None:
        try:
            self._wake_w.send(b"x")
        except BlockingIOError:
            pass


def _unwatch(parked: Parked) -> None:
    """Close a held fetch's watch of its starter, if it has one."""
    if parked.pidfd >= 0:
        os.close(parked.pidfd)
        parked.pidfd = -1
