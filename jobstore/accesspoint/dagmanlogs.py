"""DAGMan's own job event log on the access point: for each DAG submitted here, the log that
condor_submit_dag gives DAGMan's job (`<dag file>.dagman.log`), written as a schedd writes it:
submitted and executing as the DAG starts, terminated with the DAG's exit code (or aborted, if
it was removed) as it ends, under the DAG's DAGManJobId, as its owner."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from jobstore.accesspoint.service import LogWriter, refusal, serving_account
from jobstore.db.eventlogs import DAG_DONE, DAG_ENDED, DAG_STARTED, DagLog
from jobstore.db.store import JobStore
from jobstore.formats import userlog
from jobstore.node import config

LOG = logging.getLogger("jobstore.schedd")
SUFFIX = ".dagman.log"
SLACK = 60.0  # a DAG's start or end may be this much older than its commit
RESCAN = 3600.0  # seconds between looks at every DAG of this access point


@dataclass
class DagmanLogs:
    """Writes the own logs of the DAGs whose home is `name`; as root, every owner's (each as
    herself), else only this account's."""

    store: JobStore
    name: str
    settings: config.Settings
    clock: Callable[[], float] = time.time
    _owner: str | None = field(default=None, init=False)
    _since: float = field(default=0.0, init=False)
    _full_at: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self._owner = serving_account()

    def pass_once(self) -> int:
        """Append what the DAGs did since their logs were last written; returns how many
        entries."""
        start = self.clock()
        full = start >= self._full_at
        done = 0
        while dags := self.store.event_logs.dags_due(self.name, owner=self._owner,
                                                     since=0.0 if full else self._since):
            writer = LogWriter()
            for dag in dags:  # each recorded, written or not: the next page is new ones
                done += self._write(dag, writer)
        self._since = start - SLACK
        if full:
            self._full_at = start + RESCAN
        return done

    def _write(self, dag: DagLog, writer: LogWriter) -> int:
        """Append `dag`'s entries not written yet (by the page's `writer`), and record them
        as written: those that cannot be (one line says why) are never tried again."""
        ended = dag.status in DAG_ENDED
        entries = _entries(dag, ended)
        why = refusal(dag.owner, self._owner, self.settings)
        if why is None and not dag.path.startswith("/"):
            why = "its DAG file is not an absolute path"
        why = why or writer.over(dag.owner)
        written = why is None and writer.append(dag.path + SUFFIX, "".join(
            e.text() for e in entries), dag.owner)
        if not written:
            LOG.warning("DAG %s: its own log is not written: %s", dag.dag_id, why or
                        "see above")
        self.store.event_logs.dag_logged(dag.dag_id, DAG_DONE if ended else DAG_STARTED,
                                         self.clock())
        return len(entries) if written else 0


def _entries(dag: DagLog, ended: bool) -> list[userlog.LogEvent]:
    """What DAGMan's job's log gets that `dag.written` has not: submitted and executing (on
    this access point, where DAGMan runs), then its end."""
    out: list[userlog.LogEvent] = []

    def add(number: int, at: float, body: str) -> None:
        out.append(userlog.LogEvent(number, dag.dag_id, 0, at, body))

    here = userlog.local_address()
    if dag.written < DAG_STARTED:
        add(userlog.SUBMIT, dag.created_at, userlog.submit_body(here))
        add(userlog.EXECUTE, dag.created_at, userlog.execute_body(here, None))
    if ended:
        at = dag.finished_at or dag.created_at
        if dag.status == "removed":
            add(userlog.ABORTED, at, userlog.aborted_body("the DAG was removed"))
        else:
            add(userlog.TERMINATED, at, userlog.terminated_body(False, dag.exit_code or 0,
                                                                (0.0, 0.0)))
    return out


__all__ = ["DagmanLogs"]
