"""The store's view in Prometheus' text format (`jobstore metrics`, and the agent's endpoint with
JOBSTORE_AGENT_METRICS_STORE): unfinished jobs by queue and status and the age of the oldest,
claims per second, the events written, the submitters' priorities and usage. Every value comes
from Gauges.gauges, whose statements do not scan the history."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jobstore.db.store import JobStore


class StoreCollector(Collector):
    """Collects the store's gauges at each scrape; a database that is away gives
    jobstore_store_up 0 and nothing else."""

    def __init__(self, store: JobStore, clock: Callable[[], float] = time.time,
                 *, strict: bool = False) -> None:
        self.store = store
        self.clock = clock
        self.strict = strict  # let a DatabaseError through (a command's one-line error)

    def collect(self) -> Iterator[Metric]:
        from jobstore.errors import DatabaseError

        up = GaugeMetricFamily("jobstore_store_up",
                               "1 when the job store answered this scrape, else 0")
        now = self.clock()
        try:
            g = self.store.metrics.gauges(now)
        except DatabaseError:
            if self.strict:
                raise
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        jobs = GaugeMetricFamily("jobstore_jobs", "Unfinished jobs by queue and status",
                                 labels=["queue", "status"])
        oldest = GaugeMetricFamily(
            "jobstore_oldest_job_age_seconds",
            "Seconds since the earliest submit among the unfinished jobs of a queue and status",
            labels=["queue", "status"])
        for q in g.queues:
            jobs.add_metric([q.queue, q.status], q.jobs)
            if q.oldest_submitted is not None:
                oldest.add_metric([q.queue, q.status], max(now - q.oldest_submitted, 0.0))
        yield jobs
        yield oldest
        claims = GaugeMetricFamily(
            "jobstore_claims_per_second",
            f"Jobs handed to slots per second over the last {g.window:g} s")
        claims.add_metric([], g.claims / g.window)
        yield claims
        events = CounterMetricFamily("jobstore_job_events",
                                     "Job events written (the newest event's id)")
        events.add_metric([], g.last_event_id)
        yield events
        if g.rows_estimate is not None:
            rows = GaugeMetricFamily("jobstore_jobs_table_rows_estimate",
                                     "Rows of the jobs table, history included, as PostgreSQL's"
                                     " planner estimates them")
            rows.add_metric([], g.rows_estimate)
            yield rows
        families = {
            "priority": GaugeMetricFamily("jobstore_submitter_priority",
                                          "Effective priority (condor_userprio)",
                                          labels=["submitter"]),
            "factor": GaugeMetricFamily("jobstore_submitter_priority_factor",
                                        "Priority factor", labels=["submitter"]),
            "usage": GaugeMetricFamily("jobstore_submitter_usage_seconds",
                                       "Accumulated usage, decayed with PRIORITY_HALFLIFE",
                                       labels=["submitter"]),
            "in_use": GaugeMetricFamily("jobstore_submitter_resources_in_use",
                                        "Weighted slots the submitter's jobs hold now",
                                        labels=["submitter"]),
        }
        for s in g.submitters:
            for field, family in families.items():
                family.add_metric([s.name], getattr(s, field))
        yield from families.values()


def store_metrics(store: JobStore) -> bytes:
    """The store's view, once, in Prometheus' text format (DatabaseError when it is away)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, strict=True))
    return generate_latest(registry)
