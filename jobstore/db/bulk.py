"""A templated bulk submit on PostgreSQL: the server makes every proc's row of a cluster from one
job row (jobstore.core.jobs.ProcTemplate) and appends each one's submit event, in one
statement; the client sends one row whatever the number of procs."""

from __future__ import annotations

import json
from functools import reduce
from typing import Any

from sqlalchemy import (
    ARRAY,
    JSON,
    ColumnElement,
    Connection,
    Select,
    Text,
    cast,
    func,
    insert,
    literal,
    select,
)
from sqlalchemy.sql.elements import Grouping

from jobstore.core.jobs import JOB_COLUMNS, Job, ProcTemplate
from jobstore.core.states import Event, Status
from jobstore.db.schema import job_events, jobs
from jobstore.db.transitions import event_row

CHUNK = 10_000  # procs per statement


def insert_procs(conn: Connection, job: Job, template: ProcTemplate, now: float) -> list[int]:
    """Insert `template.procs` jobs like `job` (its ad holds the template's placeholders), proc
    i with each placeholder's text for i, each with its submit event, CHUNK procs per
    statement (each well within a statement timeout); their ids in proc order."""
    ids: list[int] = []
    for first in range(0, template.procs, CHUNK):
        last = min(first + CHUNK, template.procs) - 1
        rows = conn.execute(_statement(job, template, now, first, last)).scalars()
        ids.extend(int(i) for i in rows)
    return ids


def _statement(job: Job, template: ProcTemplate, now: float, first: int,
               last: int) -> Select[Any]:
    """The insert of procs `first` to `last` and their events, selecting their ids."""
    proc = func.generate_series(first, last).column_valued("proc")
    numbers = {"proc": proc, "step": proc % template.per_item,
               "row": func.div(proc, template.per_item)}
    texts: list[tuple[str, ColumnElement[Any]]] = [
        (placeholder, cast(numbers[kind], Text)) for placeholder, kind in template.counters.items()
    ]
    top, bottom = first // template.per_item, last // template.per_item  # the item rows used
    texts += [
        (placeholder,
         Grouping(literal(column[top:bottom + 1], ARRAY(Text)))[numbers["row"] - top + 1])
        for placeholder, column in template.items.items()
    ]
    start: ColumnElement[Any] = cast(literal(json.dumps(job.ad)), Text)
    filled = reduce(lambda text, sub: func.replace(text, sub[0], sub[1]), texts, start)
    ad = cast(filled, JSON)
    same = [name for name in JOB_COLUMNS if name not in ("id", "proc_id", "ad")]
    rows = select(
        *(literal(getattr(job, name), jobs.c[name].type).label(name) for name in same),
        proc.label("proc_id"), ad.label("ad"),
    ).order_by(proc)
    made = insert(jobs).from_select([*same, "proc_id", "ad"], rows).returning(jobs.c.id).cte("made")
    submit = event_row(0, Event.SUBMIT, None, Status.IDLE, now, attempt=0)
    del submit["job_id"]
    events = insert(job_events).from_select(
        ["job_id", *submit],
        select(made.c.id, *(literal(value, job_events.c[name].type)
                            for name, value in submit.items())),
    ).cte("events")
    return select(made.c.id).add_cte(events).order_by(made.c.id)
