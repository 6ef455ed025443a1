"""A templated bulk submit on PostgreSQL: the server makes every proc's row of a cluster from one
job row (jobstore.core.jobs.ProcTemplate) and appends each one's submit event, one statement per
CHUNK procs; the client sends one row (and the item values) whatever the number of procs."""

from __future__ import annotations

from collections.abc import Mapping
from functools import reduce
from typing import Any

from sqlalchemy import (
    ARRAY,
    JSON,
    BigInteger,
    ColumnElement,
    Connection,
    FromClause,
    Insert,
    Integer,
    Label,
    Table,
    Text,
    cast,
    func,
    insert,
    literal,
    select,
)

from jobstore.core.jobs import JOB_COLUMNS, Job, ProcTemplate
from jobstore.core.states import Event, Status
from jobstore.db.jsontext import json_text
from jobstore.db.rows import event_row
from jobstore.db.schema import job_events, jobs

CHUNK = 10_000  # procs per statement


def typed(table: Table, values: Mapping[str, Any]) -> list[Label[Any]]:
    """`values` as bound literals of `table`'s column types, each labelled with its column (a
    row for INSERT ... SELECT)."""
    return [literal(value, table.c[name].type).label(name) for name, value in values.items()]


def insert_procs(conn: Connection, job: Job, template: ProcTemplate, now: float, *,
                 events_after: bool = False, clusters: list[int] | None = None) -> list[int]:
    """Insert `template.procs` jobs like `job` (its ad holds the template's placeholders), proc
    i with each placeholder's text for i, each with its submit event, CHUNK procs per
    statement (each well within a statement timeout); their ids in proc order.
    `events_after`: the events in a statement of their own, after the jobs' (a session under
    row-level security: its policy on the events must see the jobs, which a statement's own
    inserts are not). `clusters`: each proc a cluster of its own, proc i's cluster
    `clusters[i]`, and its proc id 0 (a DAG's nodes)."""
    ids: list[int] = []
    status = Status(job.status)
    for first in range(0, template.procs, CHUNK):
        last = min(first + CHUNK, template.procs) - 1
        made = _procs(job, template, first, last, clusters)
        if events_after:
            chunk = [int(i) for i in conn.execute(made).scalars()]
            listed = func.unnest(literal(chunk, ARRAY(BigInteger))).table_valued("id")
            conn.execute(_events(listed.render_derived(name="made"), now, status))
        else:
            made_cte = made.cte("made")
            chunk = [int(i) for i in conn.execute(
                select(made_cte.c.id).add_cte(_events(made_cte, now, status).cte("events"))
            ).scalars()]
        ids.extend(chunk)
    return sorted(ids)  # the procs' order: ids are drawn from the sequence as rows are made


def _events(made: FromClause, now: float, status: Status) -> Insert:
    """The submit events of the jobs whose ids `made` lists, queued as `status`."""
    submit = event_row(0, Event.SUBMIT, None, status, now, attempt=0)
    del submit["job_id"]
    return insert(job_events).from_select(
        ["job_id", *submit],
        select(made.c.id, *typed(job_events, submit)),
    )


def _procs(job: Job, template: ProcTemplate, first: int, last: int,
           clusters: list[int] | None) -> Insert:
    """The insert of procs `first` to `last` (in their clusters, when each has its own),
    returning their ids."""
    per_item = template.per_item
    procs = func.generate_series(first, last).table_valued("proc").render_derived(name="procs")
    proc: ColumnElement[Any] = procs.c.proc
    step, row = proc % per_item, proc.op("/", return_type=Integer)(per_item)  # integers
    texts: list[tuple[str, ColumnElement[Any]]] = []
    source: FromClause = procs
    ad_text = json_text(job.ad)
    top, bottom = first // per_item, last // per_item  # the item rows of these procs
    columns: list[Any] = []  # the arrays unnested side by side, a row per item row
    if template.items and top == bottom and clusters is None:  # one item row: the same in all
        for placeholder, column in template.items.items():
            ad_text = ad_text.replace(placeholder, column[top])
    elif template.items:
        columns = [literal(column[top:bottom + 1], ARRAY(Text))
                   for column in template.items.values()]
    if clusters is not None:  # one proc per item row (per_item is 1)
        columns.append(literal(clusters[first:last + 1], ARRAY(BigInteger)))
    if columns:  # the values of the item rows, joined by row number
        item = func.unnest(*columns).table_valued(
            *(f"v{i}" for i in range(len(columns))), with_ordinality="n"
        ).render_derived(name="item")
        source = procs.join(item, item.c.n == row - top + 1)
        texts += [(placeholder, item.c[f"v{i}"])
                  for i, placeholder in enumerate(template.items)]
    numbers = {"proc": proc, "step": step, "row": row}
    texts[:0] = [(placeholder, cast(numbers[kind], Text))
                 for placeholder, kind in template.counters.items()]
    texts = [(placeholder, text) for placeholder, text in texts if placeholder in ad_text]
    start: ColumnElement[Any] = cast(literal(ad_text), Text)
    filled = reduce(lambda text, sub: func.replace(text, sub[0], sub[1]), texts, start)
    ad = cast(filled, JSON)
    own: list[ColumnElement[Any]] = [proc.label("proc_id"), ad.label("ad")]
    if clusters is not None:
        own = [item.c[f"v{len(columns) - 1}"].label("cluster_id"),
               literal(0, Integer).label("proc_id"), ad.label("ad")]
    named = [c.name for c in own]
    same = [name for name in JOB_COLUMNS if name not in ("id", *named)]
    rows = select(
        *typed(jobs, {name: getattr(job, name) for name in same}), *own,
    ).select_from(source).order_by(proc)
    return insert(jobs).from_select([*same, *named], rows).returning(jobs.c.id)
