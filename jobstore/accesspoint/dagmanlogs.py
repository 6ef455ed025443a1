"""DAGMan's own job event log on the access point: for each DAG submitted here, the log that
condor_submit_dag gives DAGMan's job (`<dag file>.dagman.log`), written as a schedd writes it:
submitted and executing as the DAG starts, terminated with the DAG's exit code (or aborted, if
it was removed) as it ends, under the DAG's DAGManJobId, as its owner."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from jobstore.accesspoint.service import refusal, serving_account
from jobstore.db.eventlogs import DAG_DONE, DAG_ENDED, DAG_STARTED, DagLog
from jobstore.db.store import JobStore
from jobstore.formats import userlog
from jobstore.node import config

LOG = logging.getLogger("jobstore.schedd")
SUFFIX = ".dagman.log"
SLACK = 60.0  # a DAG's start or end may be this much older than its commit
RESCAN = 3600.0  # seconds between looks at every DAG of this access point
OWNER_BUDGET = 5.0  # seconds of a page one owner's failed logs may take (she may lock them)


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
            spent: dict[str, float] = {}
            for dag in dags:  # each recorded, written or not: the next page is new ones
                done += self._write(dag, spent)
        self._since = start - SLACK
        if full:
            self._full_at = start + RESCAN
        return done

    def _write(self, dag: DagLog, spent: dict[str, float]) -> int:
        """Append `dag`'s entries not written yet, and record them as written: those that
        cannot be (one line says why) are never tried again, and an owner whose failed logs
        took OWNER_BUDGET seconds of this page has the rest of hers left out of it."""
        ended = dag.status in DAG_ENDED
        entries = _entries(dag, ended)
        why = refusal(dag.owner, self._owner, self.settings)
        if why is None and not dag.path.startswith("/"):
            why = "its DAG file is not an absolute path"
        if why is None and spent.get(dag.owner, 0.0) > OWNER_BUDGET:
            why = f"{dag.owner}'s logs took more than {OWNER_BUDGET:g} s of this pass"
        start = time.monotonic()
        written = why is None and userlog.append(dag.path + SUFFIX, "".join(
            e.text() for e in entries), owner=dag.owner)
        if not written:
            spent[dag.owner] = spent.get(dag.owner, 0.0) + time.monotonic() - start
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
