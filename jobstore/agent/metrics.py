"""The agent's Prometheus metrics, served on a loopback port when JOBSTORE_AGENT_METRICS_PORT is
set (off by default): the hook calls it served by hook and result and their latency, the
database errors they met, the spool's depth and age, the attempts its watch follows; with
JOBSTORE_AGENT_METRICS_STORE, the store's view too (jobstore.api.metrics). docs/metrics.md lists
every name."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    make_wsgi_app,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jobstore.node import spool
from jobstore.node.hookcall import HookResponse

# The metrics server's threads at most (one per connection being answered; more connections
# are closed at once), and how long one may stay idle.
METRICS_THREADS = 4
METRICS_IDLE_TIMEOUT = 5.0

# Seconds: a direct fetch takes a few ms, a report one or two; the hooks' deadline is 10 s.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def result_of(hook: str, response: HookResponse) -> str:
    """The `result` label of a served call: job or none (fetch_job), ok, spooled, or error."""
    if response.spooled:
        return "spooled"
    if response.error:
        return "error"
    if hook == "fetch_job":
        return "job" if response.stdout else "none"
    return "ok"


class _SpoolCollector(Collector):
    def __init__(self, directories: Callable[[], list[Path]],
                 clock: Callable[[], float]) -> None:
        self.directories = directories
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        reports = GaugeMetricFamily("jobstore_spool_reports",
                                    "Hook reports waiting in the spool for the database",
                                    labels=["directory"])
        age = GaugeMetricFamily("jobstore_spool_oldest_report_age_seconds",
                                "Seconds since the oldest waiting report was written (0: none)",
                                labels=["directory"])
        now = self.clock()
        for directory in self.directories():
            found = spool.depth(directory)
            reports.add_metric([str(directory)], found.reports)
            age.add_metric([str(directory)],
                           max(now - found.oldest, 0.0) if found.oldest is not None else 0.0)
        yield reports
        yield age


class _GaugeCollector(Collector):
    def __init__(self, name: str, doc: str, value: Callable[[], float]) -> None:
        self.name, self.doc, self.value = name, doc, value

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.name, self.doc, value=self.value())


class AgentMetrics:
    """The agent's registry; `observe` is called once per served call, from any worker."""

    def __init__(self, spool_dirs: Callable[[], list[Path]], watched: Callable[[], int],
                 store_collectors: Callable[[], list[Collector]] | None = None,
                 waiting: Callable[[], int] = lambda: 0,
                 direct_noted: Callable[[], float] = lambda: 0.0) -> None:
        disable_created_metrics()  # no *_created series beside every counter and histogram
        self.registry = CollectorRegistry(auto_describe=False)
        self.calls = Counter("jobstore_hook_calls", "Hook calls the agent served",
                             ["hook", "result"], registry=self.registry)
        self.latency = Histogram("jobstore_hook_duration_seconds",
                                 "Time the agent took to serve a hook call", ["hook"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.waits = Counter("jobstore_agent_fetch_waits",
                             "FETCH_WORK calls that waited for work: after a claim found nothing"
                             " (claimed), or with no claim, nothing being new since the slot's "
                             "last one (quiet)", ["how"], registry=self.registry)
        self.claims = Counter("jobstore_agent_claims",
                              "Claims (one negotiation against the database) the agent made for "
                              "FETCH_WORK calls, woken waiting fetches included",
                              registry=self.registry)
        self.db_errors = Counter("jobstore_database_errors",
                                 "Hook calls that found the database away or refusing",
                                 ["hook"], registry=self.registry)
        self.registry.register(_SpoolCollector(spool_dirs, time.time))
        self.registry.register(_GaugeCollector(
            "jobstore_agent_attempts_watched",
            "Attempts on this node's slots the agent follows (to vacate stopped ones)", watched))
        self.registry.register(_GaugeCollector(
            "jobstore_agent_waiting_fetches",
            "FETCH_WORK calls waiting in the agent for work that fits their slot", waiting))
        self.registry.register(_GaugeCollector(
            "jobstore_hooks_direct_mode_noted_timestamp_seconds",
            "When a hook of this node last did its work itself, finding no agent at the socket "
            "the configuration names (0: never)", direct_noted))
        for collector in (store_collectors() if store_collectors else []):
            self.registry.register(collector)
        self._servers: list = []

    def observe(self, hook: str, response: HookResponse | None, seconds: float) -> None:
        """A served call: `response` None for a refused one."""
        result = "refused" if response is None else result_of(hook, response)
        self.calls.labels(hook, result).inc()
        self.latency.labels(hook).observe(seconds)
        if response is not None and response.database_error:
            self.db_errors.labels(hook).inc()

    def serve(self, address: str, port: int) -> None:
        server = make_server(address, port, make_wsgi_app(self.registry),
                             server_class=_BoundedServer, handler_class=_QuietHandler)
        thread = threading.Thread(target=server.serve_forever, name="jobstore-metrics",
                                  daemon=True)
        thread.start()
        self._servers.append((server, thread))

    def close(self) -> None:
        for server, thread in self._servers:
            server.shutdown()
            server.server_close()
            thread.join(5)
        self._servers.clear()


class _BoundedServer(ThreadingMixIn, WSGIServer):
    """A WSGI server with at most METRICS_THREADS connections answered at once (more are
    closed unanswered), each dropped after METRICS_IDLE_TIMEOUT idle seconds: idle or flooding
    clients cannot make the agent (root) start a thread each."""

    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(METRICS_THREADS)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            request.settimeout(METRICS_IDLE_TIMEOUT)
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out or went away: nothing to report


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass
