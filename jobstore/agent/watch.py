"""The agent's watch over the attempts its slots run: when the job store stops one (the job held
or removed, or given to another slot), the slot is vacated so that the job's processes end.

On PostgreSQL the store notifies the agents of every hold or rm of a handed-out job (channel
`jobstore_stops`); the watch LISTENs and looks at once, and polls every LISTEN_POLL seconds to be
safe. Where notifications cannot arrive (SQLite, a pooler in transaction mode, several
databases, a lost connection) it polls every JOBSTORE_AGENT_WATCH_INTERVAL seconds: one indexed
query for all the node's attempts.

A held or removed job's slot is vacated gracefully (the job gets its KillSig), and fast if the
attempt has not ended min(JobMaxVacateTime, MACHINE_MAX_VACATE_TIME) seconds later, as condor_rm
does; so is the slot of a job its owner asked to vacate (condor_vacate_job; -fast: at once), and
the job goes back to idle as its JOB_EXIT evict reports. An attempt that was given to another
slot, or whose lease ran out, is vacated fast.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from jobstore.agent.attempts import Attempt, Attempts
from jobstore.core.states import FINAL, HANDED_OUT, Status
from jobstore.db.channels import STOPS, Listener
from jobstore.db.reads import AttemptState, NodeAttempt
from jobstore.errors import DatabaseError
from jobstore.node import config
from jobstore.node.services import NodeServices

log = logging.getLogger("jobstore.agent")
ENDED_VALUES = frozenset(s.value for s in (*FINAL, Status.HELD))
LISTEN_POLL = 30.0  # seconds between two polls while notifications arrive
NOTIFIED = 0.25  # seconds between two checks a notification asks for, at least (anyone may
# NOTIFY: what arrives meanwhile is one check)
RELISTEN = 60.0  # seconds before trying LISTEN again after it failed
FAST_TRIES = 3  # fast vacates of one attempt's slot tried, one per check, before it is forgotten
MAX_FAILURES = 10_000  # attempts whose failed vacates are counted

# vacate(attempt, fast, why) -> whether the startd took the request
Vacate = Callable[[Attempt, bool, str], bool]


@dataclass(frozen=True)
class Verdict:
    """What to do about one attempt: keep it, forget it, or vacate its slot."""

    action: str  # "keep" | "forget" | "graceful" | "fast"
    why: str = ""


def judge(a: Attempt, state: AttemptState | None, vacating_since: float | None, now: float,
          max_vacate_time: float, margin: float) -> Verdict:
    """The fate of attempt `a` of a slot, given its job's state in the store."""
    if state is None:
        return Verdict("fast", "gone")
    if state.claims != a.attempt:
        return Verdict("fast", f"attempt {state.claims} is current")
    if state.status in HANDED_OUT:
        if state.vacate == "fast":  # condor_vacate_job -fast
            return Verdict("fast", "vacated fast by its owner")
        if state.vacate is None:
            return Verdict("keep")
        return _graceful(a, "vacated by its owner", vacating_since, now, max_vacate_time,
                         margin)
    if state.winding_down:  # held or removed while it runs: as condor_rm
        return _graceful(a, state.status, vacating_since, now, max_vacate_time, margin)
    if state.status in ENDED_VALUES:  # its end was reported (not through this agent)
        return Verdict("forget")
    return Verdict("fast", state.status)  # idle again: its lease ran out


def _graceful(a: Attempt, why: str, vacating_since: float | None, now: float,
              max_vacate_time: float, margin: float) -> Verdict:
    """A graceful vacate, then a fast one if the attempt outlives its grace period."""
    if vacating_since is None:
        return Verdict("graceful", why)
    if now - vacating_since >= grace(a, max_vacate_time) + margin:
        return Verdict("fast", f"{why}, still running after the grace period")
    return Verdict("keep")


def grace(a: Attempt, max_vacate_time: float) -> float:
    """min(JobMaxVacateTime, MACHINE_MAX_VACATE_TIME), as the startd's graceful vacate."""
    if a.max_vacate_time is None or a.max_vacate_time < 0:
        return max_vacate_time
    return min(float(a.max_vacate_time), max_vacate_time)


def restored(found: list[NodeAttempt]) -> list[Attempt]:
    """The agent's attempts for the store's rows of this node."""
    out = []
    for n in found:
        value = n.ad.get("JobMaxVacateTime")
        out.append(Attempt(n.slot, n.job_id, n.attempt, n.keyword,
                           value if isinstance(value, int) else None, n.name, n.token))
    return out


class AttemptWatch:
    """Runs in its own thread (`run`) until `stopped()`."""

    def __init__(self, attempts: Attempts, vacate: Vacate,
                 settings: Callable[[], config.AgentSettings], stores: NodeServices) -> None:
        self.stores = stores
        self.attempts = attempts
        self.vacate = vacate
        self.settings = settings
        self.mode = "poll"
        self._listener: Listener | None = None
        self._listen_url: str | None = None
        self._relisten_at = 0.0
        self._restored: set[str] = set()
        self._failures: dict[int, int] = {}  # fast vacates the startd did not take, by job

    def run(self, stopped: Callable[[], bool]) -> None:
        last = float("-inf")
        try:
            while not stopped():
                stores = self._stores()
                self._restore(stores)
                self._follow(stores)
                interval = self._interval()
                woke = False
                left = last + interval - time.monotonic()
                if left > 0:
                    if self._listener is not None:
                        woke = self._wait(left)
                    else:
                        time.sleep(left)
                if woke and (early := last + NOTIFIED - time.monotonic()) > 0:
                    time.sleep(early)
                if woke or time.monotonic() >= last + interval:
                    last = time.monotonic()
                    self.check(stores)
        finally:
            self._unlisten()

    def _interval(self) -> float:
        """Seconds between two polls: LISTEN_POLL while notifications arrive, unless a graceful
        vacate is under way (its grace period is checked at every watch interval)."""
        if self._listener is not None and not self.attempts.vacating_any():
            return LISTEN_POLL
        return self.settings().watch_interval

    # ---- the databases --------------------------------------------------------------------

    def _stores(self) -> dict[str | None, config.Settings]:
        """The settings of each keyword in use: this node's, and its attempts'."""
        return config.node_settings(a.keyword for a in self.attempts.snapshot())

    def _restore(self, stores: dict[str | None, config.Settings]) -> None:
        """Once per database: the attempts the store says this node's slots run (after a
        restart: the ones handed out, and the stopped ones still winding down)."""
        todo = [s for s in stores.values() if s.database_url not in self._restored]
        hosts = [h for h in [config._param("FULL_HOSTNAME")] if h] if todo else []
        if not hosts:
            return
        for settings in todo:
            url = settings.database_url
            if url in self._restored:  # two keywords, one database
                continue
            try:
                found = self.stores.store_for(settings).reads.attempts_on(hosts)
            except (config.ConfigError, DatabaseError) as exc:
                log.warning("watch: cannot look up this node's attempts yet: %s", exc)
                continue
            self._restored.add(url)
            added = self.attempts.restore(restored(found))
            if added:
                log.info("watch: %d attempt(s) of this node found in the job store", added)

    # ---- notifications --------------------------------------------------------------------

    def _follow(self, stores: dict[str | None, config.Settings]) -> None:
        """Follow the stops channel when all keywords use one PostgreSQL database and a probe
        notification arrives."""
        urls = {s.database_url for s in stores.values()}
        url = next(iter(urls)) if len(urls) == 1 and self.settings().watch_listen else None
        if self._listener is not None and self._listen_url == url:
            return
        self._unlisten()
        if url is None or time.monotonic() < self._relisten_at:
            return
        settings = next(iter(stores.values()))
        try:
            store = self.stores.store_for(settings)
        except config.ConfigError:
            return
        if not store.db.can_listen:
            return
        self._relisten_at = time.monotonic() + RELISTEN
        listener = store.db.listener(STOPS, settings.connect_timeout)
        try:
            listener.open()
            ok = listener.probe()
        except Exception as exc:  # noqa: BLE001 - any failure to LISTEN means: poll
            listener.close()
            log.warning("watch: cannot LISTEN (%s); polling", one_line(exc))
            return
        if not ok:
            listener.close()
            log.warning("watch: notifications do not arrive (a pooler in transaction mode?); "
                        "polling")
            return
        self._listener, self._listen_url, self.mode = listener, url, "listen"
        log.info("watch: listening for stopped attempts")

    def _wait(self, timeout: float) -> bool:
        """Wait for notifications; whether one is about an attempt of this node."""
        assert self._listener is not None
        try:
            payloads = self._listener.wait(timeout)
        except Exception as exc:  # noqa: BLE001 - the connection broke: poll until it is back
            log.warning("watch: LISTEN connection lost (%s); polling", one_line(exc))
            self._unlisten()
            self._relisten_at = time.monotonic() + RELISTEN
            return True
        ours = {str(a.job_id) for a in self.attempts.snapshot()}
        return any(p in ours for p in payloads)

    def _unlisten(self) -> None:
        if self._listener is not None:
            self._listener.close()
        self._listener, self._listen_url, self.mode = None, None, "poll"

    # ---- the check ------------------------------------------------------------------------

    def check(self, stores: dict[str | None, config.Settings] | None = None) -> None:
        """Look up the node's attempts in the store (one query per database) and act."""
        running = self.attempts.snapshot()
        if not running:
            return
        stores = stores if stores is not None else self._stores()
        s = self.settings()
        by_keyword: dict[str | None, list[Attempt]] = {}
        for a in running:
            by_keyword.setdefault(a.keyword, []).append(a)
        for keyword, attempts in by_keyword.items():
            try:
                settings = stores.get(keyword) or config.load_settings(keyword)
                states = self.stores.store_for(settings).reads.attempt_states(
                    [a.job_id for a in attempts])
            except (config.ConfigError, DatabaseError) as exc:
                log.warning("watch: %s", exc)
                continue
            now = time.monotonic()
            for a in attempts:
                since = self.attempts.vacating_since(a.job_id)
                v = judge(a, states.get(a.job_id), since, now, s.max_vacate_time,
                          s.watch_interval)
                if v.action == "keep":
                    continue
                if v.action != "forget" and (later := self.attempts.superseded(a)) is not None:
                    # its JOB_EXIT never came (or was refused): the slot runs another job now
                    log.warning("job %s attempt %d is %s, but slot %s was given job %s since: "
                                "not vacated", a.name, a.attempt, v.why, a.slot, later.name)
                    self.attempts.drop(a.job_id)
                    continue
                if v.action == "graceful":
                    if self.vacate(a, False, v.why):
                        self.attempts.vacating(a.job_id, now)
                    continue
                if v.action == "forget" or self.vacate(a, True, v.why) or self._gave_up(a):
                    self.attempts.drop(a.job_id)
                    self._failures.pop(a.job_id, None)


    def _gave_up(self, a: Attempt) -> bool:
        """A fast vacate of `a`'s slot failed: whether it is the last one tried
        (FAST_TRIES), the attempt then forgotten."""
        tries = self._failures[a.job_id] = self._failures.get(a.job_id, 0) + 1
        if len(self._failures) > MAX_FAILURES:
            self._failures.clear()
        return tries >= FAST_TRIES


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
