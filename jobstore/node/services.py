"""What serves the hooks' calls in one process, as one object the handlers are given: its job
stores (one per database, kept), how it evaluates the jobs' expressions, and in the agent its
journal of the jobs it reads, its outbox and the reports it keeps back.

A hook process (direct mode, one call) has the plain one (`direct`): a short connection per
call, expressions evaluated inline (its deadline bounds them), nothing kept back. The agent makes
its own and sets what it has (`use_pool`, `use_evaluator`, `inflight`, `outbox`, `deferred`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import TYPE_CHECKING

from jobstore.errors import ConfigError
from jobstore.node import bounded
from jobstore.node.config import Settings
from jobstore.node.deferred import Deferred
from jobstore.node.inflight import InFlight

if TYPE_CHECKING:  # the store (SQLAlchemy) is imported only when a call needs the database
    from classad2 import ClassAd

    from jobstore.db.store import JobStore
    from jobstore.node.hookcall import HookRequest, HookResponse


class NodeServices:
    """The services of one process's hook calls (see the module's docstring)."""

    def __init__(self) -> None:
        self._stores: dict[str, JobStore] = {}
        self._lock = threading.Lock()
        # None: one short connection per call. An int: a long-running caller keeps one pooled
        # connection per database plus this many overflow ones, closed as soon as returned.
        self._pool_overflow: int | None = None
        self.evaluator: bounded.Evaluator = bounded.Inline()
        # Where the agent marks the job whose stored ad a thread reads: a job that made the
        # agent die twice is held at its next start.
        self.inflight: InFlight | None = None
        # Who takes the outputs JOB_EXIT could not send in its time (the agent's outbox); None:
        # such outputs hold the job.
        self.outbox: Callable[[HookRequest, ClassAd], HookResponse] | None = None
        # The reports the agent keeps back to apply with the attempt's next one; None: each is
        # applied as it comes.
        self.deferred: Deferred | None = None

    def use_evaluator(self, evaluator: bounded.Evaluator) -> None:
        """Evaluate the jobs' expressions with `evaluator` from now on (the agent's bound)."""
        self.evaluator = evaluator
        with self._lock:
            for store in self._stores.values():
                store.maintenance.periodic_policy = evaluator.periodic_action

    def use_pool(self, overflow: int) -> None:
        """Keep one pooled connection per database from now on (for the agent)."""
        self._pool_overflow = overflow
        self.drop_stores()

    def reading(self, keyword: str, job_id: int) -> AbstractContextManager[None]:
        """While the block runs, this thread reads job `job_id`'s stored values (`inflight`)."""
        journal = self.inflight
        return nullcontext() if journal is None else journal.reading(keyword, job_id)

    def store_for(self, settings: Settings) -> JobStore:
        """The job store of `settings`' database, made on first use and kept."""
        if settings.credentials_error:
            raise ConfigError(settings.credentials_error)
        from jobstore.db.store import JobStore

        with self._lock:
            store = self._stores.get(settings.database_url)
            if store is None:
                store = JobStore.from_url(
                    settings.database_url,
                    connect_timeout=settings.connect_timeout,
                    statement_timeout_ms=settings.statement_timeout_ms,
                    pool=self._pool_overflow is not None,
                    max_overflow=self._pool_overflow or 0,
                )
                store.maintenance.periodic_policy = self.evaluator.periodic_action
                store.maintenance.reading = partial(self.reading, settings.keyword)
                self._stores[settings.database_url] = store
            return store

    def drop_stores(self) -> None:
        """Forget the kept stores and close their connections (configuration reloaded)."""
        with self._lock:
            stores = list(self._stores.values())
            self._stores.clear()
        for store in stores:
            store.db.engine.dispose()


_direct: NodeServices | None = None


def direct() -> NodeServices:
    """The plain services of a process that serves calls without an agent's (a hook process,
    `jobstore replay`), made once."""
    global _direct
    if _direct is None:
        _direct = NodeServices()
    return _direct
