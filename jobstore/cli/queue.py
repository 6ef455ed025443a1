"""Reading the queue: condor_q, condor_history, condor_qedit and the queue's totals."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import click
from classad2 import ExprTree

from jobstore.api import query
from jobstore.cli.context import Context, guard, pass_ctx
from jobstore.core.jobs import Job
from jobstore.core.states import Status
from jobstore.errors import InvalidInput
from jobstore.formats import views

JOB_ID = re.compile(r"\d+(\.\d+)?")


def _print_jobs(ctx: Context, jobs: list[Job], as_json: bool, long: bool, *,
                run: bool = False, finished: bool = False, totals: bool = True,
                wide: bool = False) -> None:
    if as_json:
        click.echo(json.dumps([views.job_json(j) for j in jobs], indent=1))
    elif long:
        for job in jobs:
            click.echo(
                views.job_long(
                    job, keyword=ctx.settings.keyword, uid_domain=ctx.settings.uid_domain
                )
            )
    else:
        click.echo(views.format_table(*views.job_rows(jobs, run=run, finished=finished,
                                                      wide=wide)))
        if totals:
            click.echo("\n" + views.totals_line(jobs))


_FILTERS = [
    click.option(
        "--status",
        "-s",
        "statuses",
        multiple=True,
        type=click.Choice([s.value for s in Status]),
        help="Only jobs in status S (repeatable).",
    ),
    click.option("--owner", "owners", multiple=True, metavar="USER", help="Only USER's jobs."),
    click.option("--queue", "-q", "queues", multiple=True, metavar="Q", help="Only queue Q."),
    click.option("-json", "--json", "as_json", is_flag=True, help="JSON list of jobs."),
    click.option("-l", "-long", "--long", "long", is_flag=True, help="Full ClassAds."),
]


def _filters(fn: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(_FILTERS):
        fn = opt(fn)
    return fn


_QUERY = [
    click.option(
        "-constraint",
        "--constraint",
        "constraint",
        metavar="EXPR",
        help="Only jobs for which the ClassAd expression EXPR is true (evaluated in the "
        "database where it can be).",
    ),
    click.option(
        "-af",
        "-autoformat",
        "--autoformat",
        "autoformat",
        is_flag=True,
        help="Print the job attributes (or ClassAd expressions) given as arguments, one line "
        "per job, like condor_q -af.",
    ),
    click.option(
        "-format",
        "--format",
        "formats",
        nargs=2,
        multiple=True,
        metavar="FMT ATTR",
        help="Print ATTR with the printf-style FMT (%d %s %f %v; \\n for a newline), "
        "repeatable, like condor_q -format.",
    ),
    click.option("-limit", "--limit", "limit", type=click.IntRange(min=1), metavar="N",
                 help="At most N jobs."),
    # -af:FLAGS (condor_q's -af:jh, ...) arrives here as -af --af-options FLAGS (context.Group)
    click.option("--af-options", "af_flags", default="", hidden=True),
]


def _query_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(_QUERY):
        fn = opt(fn)
    return _filters(fn)


def ids_and_users(args: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """condor_rm's arguments: job ids (CLUSTER, CLUSTER.PROC) and user names."""
    ids = tuple(a for a in args if JOB_ID.fullmatch(a))
    users = tuple(a for a in args if a not in ids)
    for user in users:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.@-]*", user):
            raise InvalidInput(f"bad job id or user name {user!r}")
    return ids, users


def _split_args(args: tuple[str, ...], autoformat: bool,
                ) -> tuple[tuple[str, ...], tuple[str, ...], list[str]]:
    """Job ids, users and, with -af, the attributes to print: with -af whatever is not a job id
    is an attribute (users then go with --owner), else a user name, as condor_q reads them."""
    if not autoformat:
        return (*ids_and_users(args), [])
    ids = tuple(a for a in args if JOB_ID.fullmatch(a))
    rest = [a for a in args if a not in ids]
    if not rest:
        raise InvalidInput("-af needs at least one attribute name")
    return ids, (), rest


def _print_autoformat(ctx: Context, jobs: list[Job], attrs: list[str], flags: str = "") -> None:
    for line in views.autoformat_lines((ctx.shown.ad(job) for job in jobs), attrs,
                                       views.af_exprs(attrs), flags):
        click.echo(line)


def _print_formats(ctx: Context, jobs: list[Job], formats: tuple[tuple[str, str], ...]) -> None:
    parsed = []
    for fmt, attr in formats:
        try:
            parsed.append((fmt.encode().decode("unicode_escape"), ExprTree(attr)))
        except Exception:
            raise InvalidInput(f"-format: not a ClassAd attribute or expression: {attr}") from None
    for job in jobs:
        ad = ctx.shown.ad(job)
        click.echo("".join(views.printf(fmt, expr, ad) for fmt, expr in parsed), nl=False)


def _print_autoclusters(
    ctx: Context, ids: tuple[str, ...], constraint: str | None, as_json: bool, **filters: Any
) -> None:
    groups = query.autoclusters(ctx.store, ctx.shown, ids, constraint, **filters)
    if as_json:
        click.echo(json.dumps(groups, indent=1))
        return
    click.echo(views.format_table(*views.autocluster_rows(groups)))
    total = sum(g["jobs"] for g in groups)
    click.echo(f"\nTotal: {total} jobs in {len(groups)} autoclusters")


@click.command()
@click.argument("ids", nargs=-1, metavar="[JOB]... [ATTR]...")
@click.option("--all", "-a", "include_final", is_flag=True, help="Include finished jobs.")
@click.option("-batch", "--batch", "batch", is_flag=True,
              help="condor_q's batch view: a line per DAG and per cluster (OWNER BATCH_NAME "
              "SUBMITTED DONE RUN IDLE HOLD TOTAL JOB_IDS).")
@click.option("-dag", "--dag", "dag", is_flag=True,
              help="Each DAG with its nodes' jobs under it, named ( |-NODE).")
@click.option("-nobatch", "--nobatch", "nobatch", is_flag=True,
              help="One line per job (the default here: there are no DAG batches).")
@click.option("-totals", "--totals", "totals_only", is_flag=True,
              help="Only the closing line: jobs by status.")
@click.option("-run", "--run", "running", is_flag=True,
              help="Only running jobs, with the slot each runs in (condor_q -run).")
@click.option(
    "-autocluster",
    "--autocluster",
    "autocluster",
    is_flag=True,
    help="Count jobs by autocluster (what the claim matches as one) and status.",
)
@click.option("-better-analyze", "-better-analyse", "-analyze", "--better-analyze", "analyze",
              is_flag=True, help="For each job named: how many known slots (jobstore status) "
              "match it, and which clause of its Requirements rules the others out.")
@click.option("-wide", "--wide", "wide", is_flag=True,
              help="Do not shorten the CMD column (condor_q -wide).")
@click.option(
    "-hold",
    "--hold",
    "held",
    is_flag=True,
    help="Only held jobs, with when and why (HoldReasonCode, HoldReasonSubCode, HoldReason).",
)
@_query_options
@pass_ctx
@guard
def q(
    ctx: Context,
    ids: tuple[str, ...],
    include_final: bool,
    batch: bool,
    dag: bool,
    nobatch: bool,
    totals_only: bool,
    running: bool,
    autocluster: bool,
    analyze: bool,
    wide: bool,
    held: bool,
    constraint: str | None,
    autoformat: bool,
    formats: tuple[tuple[str, str], ...],
    limit: int | None,
    af_flags: str,
    statuses: tuple[str, ...],
    owners: tuple[str, ...],
    queues: tuple[str, ...],
    as_json: bool,
    long: bool,
) -> None:
    """List the jobs not yet finished, like condor_q (JOB is CLUSTER or CLUSTER.PROC).

    The table has condor_q's columns (ID OWNER SUBMITTED RUN_TIME ST PRI SIZE CMD; ST is I R H
    C X) and its closing line. With -af, the arguments that are not job ids are the attributes
    to print.
    """
    ids, users, attrs = _split_args(ids, autoformat)
    if held:
        statuses = (Status.HELD.value,)
    if running:
        statuses = (Status.RUNNING.value,)
    filters: dict[str, Any] = dict(statuses=statuses, owners=owners, queues=queues,
                                   include_final=include_final, users=users)
    if autocluster:
        _print_autoclusters(ctx, ids, constraint, as_json, **filters)
        return
    if totals_only:
        click.echo(views.totals_line_of(query.status_counts(ctx.store, ctx.shown, ids,
                                                             constraint, **filters)))
        return
    if ids and not include_final and not statuses:
        _check_found(ctx, ids)
    if analyze:
        _print_analysis(ctx, query.query_jobs(ctx.store, ctx.shown, ids, constraint, limit=limit,
                                              **filters))
        return
    jobs = query.query_jobs(ctx.store, ctx.shown, ids, constraint, limit=limit,
                            projection=attrs, **filters)
    if (batch or dag) and not (attrs or formats or as_json or long):
        dags = [d for d in ctx.store.dags.dag_batches() if not owners or d.owner in owners]
        if batch:
            click.echo(views.format_table(views.BATCH_HEADER, views.batch_rows(dags, jobs)))
        else:
            click.echo(views.format_table(*views.dag_job_rows(dags, jobs)))
        click.echo("\n" + views.totals_line(jobs))
        return
    if attrs:
        _print_autoformat(ctx, jobs, attrs, af_flags)
    elif formats:
        _print_formats(ctx, jobs, formats)
    elif held and not (as_json or long):
        click.echo(views.format_table(*views.hold_rows(jobs)))
        click.echo("\n" + views.totals_line(jobs))
    else:
        _print_jobs(ctx, jobs, as_json, long, run=running, wide=wide)


def _print_analysis(ctx: Context, jobs: list[Job]) -> None:
    """condor_q -better-analyze, against the slots the nodes' agents published."""
    from jobstore.api.pool import analyze, slot_ads

    slots = list(slot_ads(ctx.store))
    for job in jobs:
        ad = ctx.shown.ad(job)
        name = views.job_id(job)
        a = analyze(ad, slots)
        click.echo(f"-- Job {name} ({job.status})\nThe Requirements expression for job {name} is"
                   f"\n    {ad.lookup('Requirements') if 'Requirements' in ad else 'true'}\n")
        if a.clauses:
            rows = [[f"[{i}]", str(n), clause] for i, (clause, n) in enumerate(a.clauses)]
            click.echo(views.format_table(["Step", "Slots Matched", "Condition"], rows) + "\n")
        click.echo(f"{name}: Of {a.slots} known slots, {a.rejected_by_job} are rejected by "
                   f"your job's requirements,\n    {a.rejected_by_slot} reject your job because"
                   f" of their own requirements (START),\n    {a.too_small} have less than the"
                   f" job requests (RequestCpus, RequestMemory, RequestDisk),\n    {a.matched}"
                   " match and can run it.\n")


def _check_found(ctx: Context, ids: tuple[str, ...]) -> None:
    """condor_q of a job id that names no job at all: say so (UnknownJob)."""
    from jobstore.errors import UnknownJob

    for text in ids:
        if not query.status_counts(ctx.store, ctx.shown, (text,), include_final=True):
            raise UnknownJob(text)


@click.command()
@click.argument("args", nargs=-1, metavar="[JOB]... [ATTR]...")
@click.option("-match", "match", type=click.IntRange(min=1), metavar="N",
              help="At most N jobs (as -limit).")
@_query_options
@pass_ctx
@guard
def history(
    ctx: Context,
    args: tuple[str, ...],
    match: int | None,
    constraint: str | None,
    autoformat: bool,
    formats: tuple[tuple[str, str], ...],
    limit: int | None,
    af_flags: str,
    statuses: tuple[str, ...],
    owners: tuple[str, ...],
    queues: tuple[str, ...],
    as_json: bool,
    long: bool,
) -> None:
    """List finished jobs (completed, failed, removed), the most recently finished first, like
    condor_history (JOB is CLUSTER or CLUSTER.PROC; with -af the other arguments are
    attributes)."""
    ids, users, attrs = _split_args(args, autoformat)
    jobs = query.history_jobs(ctx.store, ctx.shown, ids, constraint, limit=match or limit,
                              statuses=statuses, owners=owners, queues=queues, users=users,
                              projection=attrs)
    if attrs:
        _print_autoformat(ctx, jobs, attrs, af_flags)
    elif formats:
        _print_formats(ctx, jobs, formats)
    else:
        _print_jobs(ctx, jobs, as_json, long, finished=True, totals=False)


@click.command()
@click.argument("job_spec", metavar="JOB|CONSTRAINT")
@click.argument("attr")
@click.argument("value")
@pass_ctx
@guard
def qedit(ctx: Context, job_spec: str, attr: str, value: str) -> None:
    """Set attribute ATTR of idle or held jobs to the ClassAd expression VALUE, like condor_qedit
    (JOB is CLUSTER or CLUSTER.PROC, else a constraint). Never Owner, the job ids, the
    attributes the job store computes (JobStatus, NumJobStarts, ...) or its own."""
    from jobstore.api.schedd import Schedd

    edited = Schedd(store=ctx.store, keyword=ctx.keyword, url=ctx.db).edit(job_spec, attr, value)
    if not edited:
        raise InvalidInput(f"no idle or held job of {job_spec} to edit")
    click.echo(f"Set attribute \"{attr}\" for {edited} job(s).")


@click.command()
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@guard
def stats(ctx: Context, as_json: bool) -> None:
    """Count jobs by queue and status."""
    rows = ctx.store.reads.stats()
    if as_json:
        out: dict[str, dict[str, int]] = {}
        for queue, status, n in rows:
            out.setdefault(queue, {})[status] = n
        click.echo(json.dumps(out, indent=1))
    else:
        click.echo(
            views.format_table(["QUEUE", "STATUS", "JOBS"], [[q_, s, str(n)] for q_, s, n in rows])
        )
