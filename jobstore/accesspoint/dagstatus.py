"""A DAG's NODE_STATUS_FILE on the access point, kept current as DAGMan keeps it: rewritten
whole (a new file renamed over the old, as DAGMan writes it) at most every minimumUpdateTime
seconds while the DAG runs, and once more as it ends, as the DAG's owner."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from jobstore.accesspoint.service import SaidOnce, refusal, serving_account
from jobstore.api.dags import node_status_file
from jobstore.api.ownerwrite import Wanted, write_as
from jobstore.db.dagfiles import DagFile
from jobstore.db.store import JobStore
from jobstore.errors import DatabaseError
from jobstore.node import config

BUDGET = 30.0  # seconds root's writer has for one status file
RETRY = 300.0  # seconds before a status file that could not be written is tried again
PASS_BUDGET = 2.0  # seconds a pass may spend writing status files (the rest: the next pass)
PER_OWNER = 10  # status files of one owner a pass writes at most


@dataclass
class DagStatusFiles:
    """Writes the node status files of the DAGs whose home is `name`; as root, every
    owner's (each as herself), else only this account's."""

    store: JobStore
    name: str
    settings: config.Settings
    clock: Callable[[], float] = time.time
    _owner: str | None = field(default=None, init=False)
    _said: SaidOnce = field(default_factory=SaidOnce, init=False)

    def __post_init__(self) -> None:
        self._owner = serving_account()

    def pass_once(self) -> int:
        """Write the status files due now, least lately written first, within PASS_BUDGET
        and PER_OWNER; returns how many were written."""
        now = self.clock()
        until = time.monotonic() + PASS_BUDGET
        mine: Counter[str] = Counter()
        done = 0
        for dag in self.store.dag_files.due(self.name, now, owner=self._owner):
            if time.monotonic() >= until:
                break
            if mine[dag.owner] >= PER_OWNER:
                continue
            mine[dag.owner] += 1
            done += self._write(dag, now)
        return done

    def _write(self, dag: DagFile, now: float) -> bool:
        """Write `dag`'s status file and record it: one that cannot be written is said once
        and tried again RETRY seconds later (or, for an ended DAG, not again)."""
        why = refusal(dag.owner, self._owner, self.settings)
        if why is None:
            try:
                text = node_status_file(self.store, dag.dag_id).encode()
                write_as(dag.owner, [Wanted(dag.path, 0o644, len(text), lambda: [text])],
                         BUDGET)
            except DatabaseError:
                raise
            except Exception as exc:  # noqa: BLE001 - whatever her directory holds, the next DAG
                why = " ".join(str(exc).split())[:300] or type(exc).__name__
        if why is not None:
            self._said.warn(dag.dag_id, f"DAG {dag.dag_id}: its node status file {dag.path} "
                                        f"is not written: {why}")
        self.store.dag_files.written(dag, now if why is None else now + RETRY)
        return why is None


__all__ = ["DagStatusFiles"]
