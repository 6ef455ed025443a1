"""The agent's share of retention: every JOBSTORE_PRUNE_INTERVAL, prune the history of each
database this node uses, when no other agent of the pool did within that interval
(Maintenance.prune_due)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from jobstore.core.durations import describe
from jobstore.node import config
from jobstore.node.hookproc import one_line
from jobstore.node.services import NodeServices

log = logging.getLogger("jobstore.agent")
BUDGET = 30.0  # seconds one prune may take; what is left waits for the next interval
REFUSED_EVERY = 3600.0  # seconds between two warnings that a database refuses to prune


class Pruner:
    """Called from the agent's periodic thread; keeps when each database is next due."""

    def __init__(self, stores: NodeServices) -> None:
        self._stores = stores
        self._next: dict[str, float] = {}
        self._refused: dict[str, float] = {}

    def tick(self, node: Iterable[config.Settings], now: float | None = None) -> None:
        """Prune the databases of `node` (the settings of this node's keywords) that are due."""
        now = time.monotonic() if now is None else now
        for settings in node:
            url = settings.database_url
            if settings.history_retention <= 0 or now < self._next.get(url, 0.0):
                continue
            self._next[url] = now + settings.prune_interval
            try:
                store = self._stores.store_for(settings)
                done = store.maintenance.prune_due(settings.history_retention,
                                                   settings.prune_interval, budget=BUDGET)
            except config.ConfigError:
                continue
            except Exception as exc:  # e.g. a role without DELETE (jobstore grant): say so
                if now >= self._refused.get(url, 0.0):
                    self._refused[url] = now + REFUSED_EVERY
                    log.warning("history of %s not pruned: %s (run `jobstore prune` as the"
                                " tables' owner)", settings.keyword, one_line(str(exc)))
                continue
            if done and (done.jobs or done.more):
                log.info("history of %s pruned: %d job(s) finished over %s ago, %d event(s),"
                         " %d cluster(s)%s", settings.keyword, done.jobs,
                         describe(settings.history_retention), done.events, done.clusters,
                         "; more left for the next interval" if done.more else "")
