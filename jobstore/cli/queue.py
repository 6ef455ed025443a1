"""The job commands, as condor_submit, condor_q, condor_history, condor_rm and friends."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any

import click
from classad2 import ExprTree

from jobstore.api import query
from jobstore.cli.context import Context, guard, pass_ctx
from jobstore.core.jobs import Job, parse_job_id
from jobstore.core.states import Event, Status
from jobstore.errors import InvalidInput
from jobstore.formats import views

_JOB_ID = re.compile(r"\d+(\.\d+)?")


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--owner", metavar="USER", help="Run the jobs as USER (root only; default: you).")
@click.option(
    "--queue",
    "-q",
    metavar="Q",
    help="Queue to put the jobs in (default: the keyword's JOBSTORE_QUEUE).",
)
@pass_ctx
@guard
def submit(ctx: Context, file: str, owner: str | None, queue: str | None) -> None:
    """Queue the jobs of an HTCondor submit description (or a plain ClassAd file)."""
    from jobstore.api.submission import submit_path

    cluster, ids = submit_path(ctx.store, file, ctx.settings, owner=owner, queue=queue)
    click.echo(f"{len(ids)} job(s) submitted to cluster {cluster}.")


@click.command("submit-dag", context_settings={"ignore_unknown_options": False})
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("-maxjobs", "--maxjobs", "maxjobs", type=int, metavar="N",
              help="At most N nodes queued at once (DAGMAN_MAX_JOBS_SUBMITTED).")
@click.option("-maxidle", "--maxidle", "maxidle", type=int, metavar="N",
              help="No node released while the DAG has N idle jobs (DAGMAN_MAX_JOBS_IDLE).")
@click.option("-batch-name", "--batch-name", "batch_name", metavar="NAME",
              help="The nodes' JobBatchName (default: FILE+DAGID).")
@click.option("-rescue", "--rescue", "rescue", type=int, metavar="DAGID",
              help="Run the DAG again from where the ended DAG DAGID (of the same file) "
              "stopped: its done nodes are DONE, as in DAGMan's rescue DAG.")
@click.option("-append", "-insert_sub_file", "--append", "refused", metavar="X",
              help="condor_submit_dag's: refused (a node's submit description is read as it "
              "is; give its commands in the file or as VARS).")
@click.option("-force", "--force", "force", is_flag=True,
              help="Accepted as condor_submit_dag's: the job store writes no rescue or "
              "lib files to overwrite.")
@click.option("--owner", metavar="USER", help="Submit as USER (root, or a queue super user).")
@click.option("--queue", "-q", metavar="Q", help="Job store queue (default JOBSTORE_QUEUE).")
@pass_ctx
@guard
def submit_dag(ctx: Context, file: str, maxjobs: int | None, maxidle: int | None,
               batch_name: str | None, rescue: int | None, refused: str | None, force: bool,
               owner: str | None, queue: str | None) -> None:
    """Queue a DAG, like condor_submit_dag: its nodes wait in the job store until their
    parents are done, and the store releases them itself (no DAGMan process)."""
    from jobstore.api.dags import submit_dag as queue_dag
    from jobstore.errors import DagError

    if refused is not None:
        raise DagError("-append and -insert_sub_file are not supported: a node's submit "
                       "description is read as it is (give its commands there, or as VARS)")

    options: dict[str, object] = {"maxjobs": maxjobs, "maxidle": maxidle, "rescue": rescue}
    if batch_name:
        options["batch_name"] = batch_name
    done = queue_dag(ctx.store, file, ctx.settings, owner=owner, queue=queue,
                     options={k: v for k, v in options.items() if v is not None})
    click.echo(f"DAG {file} submitted as {done.dag_id}: {len(done.clusters)} node job "
               f"cluster(s).")


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


def _split_args(args: tuple[str, ...], autoformat: bool,
                ) -> tuple[tuple[str, ...], tuple[str, ...], list[str]]:
    """Job ids, users and, with -af, the attributes to print: with -af whatever is not a job id
    is an attribute (users then go with --owner), else a user name, as condor_q reads them."""
    if not autoformat:
        return (*_ids_and_users(args), [])
    ids = tuple(a for a in args if _JOB_ID.fullmatch(a))
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
        dags = [d for d in ctx.store.dag_batches() if not owners or d.owner in owners]
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
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event.")
@click.option("--all", "-a", "everything", is_flag=True,
              help="Also the harmless repeats (a report of an attempt that had already "
              "ended, an accept after the job was accepted), which change nothing.")
@pass_ctx
@guard
def events(ctx: Context, job: str, as_json: bool, everything: bool) -> None:
    """Show the recorded transitions and reports of JOB (--json: all of them)."""
    for row in query.select_jobs(ctx.store, (job,)):
        evs = ctx.store.events(row.id)
        if not (everything or as_json):
            evs = [e for e in evs if not views.is_repeat(e.to_status, e.reason)]
        if as_json:
            for e in evs:
                click.echo(json.dumps(views.event_json(e)))
        else:
            click.echo(f"Job {views.job_id(row)} ({row.status})")
            click.echo(views.format_table(*views.event_rows(evs)))


@click.command()
@click.argument("ids", nargs=-1, metavar="[JOB]...")
@click.option("--owner", "owners", multiple=True, metavar="USER", help="Only USER's jobs.")
@click.option("--queue", "-q", "queues", multiple=True, metavar="Q", help="Only queue Q.")
@click.option(
    "--status",
    "-s",
    "statuses",
    multiple=True,
    type=click.Choice([s.value for s in Status]),
    help="Only transitions into status S (repeatable); `finished` lines always show.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.option(
    "--until-done",
    is_flag=True,
    help="Exit when every named job (or every unfinished job matching --owner/--queue at "
    "start) has finished: status 0 if all completed with their success exit code, else 1.",
)
@click.option(
    "--since",
    metavar="EVENT_ID|AGE|TIME",
    help="Replay from after event EVENT_ID (0: everything), or from AGE ago (10m, 2h) or an "
    "ISO TIME, then follow.",
)
@click.option(
    "--poll",
    is_flag=True,
    envvar="JOBSTORE_WATCH_POLL",
    help="Poll instead of LISTEN (behind PgBouncer in transaction mode; also "
    "JOBSTORE_WATCH_POLL=1). Chosen anyway when notifications do not arrive.",
)
@click.option(
    "--interval", type=click.FloatRange(0.05), default=0.25, show_default=True,
    help="Seconds between polls (SQLite, --poll).",
)
@click.option("--catch-up", type=click.FloatRange(0.1), default=5.0, hidden=True)
@pass_ctx
@guard
def watch(
    ctx: Context,
    ids: tuple[str, ...],
    owners: tuple[str, ...],
    queues: tuple[str, ...],
    statuses: tuple[str, ...],
    as_json: bool,
    until_done: bool,
    since: str | None,
    poll: bool,
    interval: float,
    catch_up: float,
) -> None:
    """Print job transitions as they happen (JOB is CLUSTER or CLUSTER.PROC), then a
    `finished` line per job. PostgreSQL pushes them (LISTEN/NOTIFY); SQLite is polled.

    Exit status: 0, or with --until-done 0 only if all jobs completed successfully and 1 if
    any failed, was removed or exited with another code; 1 on errors, 2 on usage errors.
    """
    from jobstore.api.watch import parse_since, subscribe

    def note(message: str) -> None:
        click.echo(f"jobstore: watch: {message}", err=True)

    what = ", ".join(ids) if ids else "every job" + (
        f" of {', '.join(owners)}" if owners else "") + (
        f" in {', '.join(queues)}" if queues else "")
    if since is None:
        note(f"waiting for the transitions of {what} from now on"
             + (" until they have finished" if until_done else " (Ctrl-C to stop)")
             + "; --since 0 shows the history first")

    sub = subscribe(
        ctx.database_url,
        jobs=ids or None,
        owner=owners,
        queue=queues,
        statuses=statuses,
        since=None if since is None else parse_since(since),
        until_done=until_done,
        poll=True if poll else None,
        interval=interval,
        catch_up=catch_up,
        on_retry=note,
        repeats=True,  # --json shows them; the lines leave them out below
    )
    try:
        for record in sub:
            data = record.to_json()
            if not as_json and views.is_repeat(data.get("to_status", "-"), data.get("reason")):
                continue  # a harmless repeat: in --json and `jobstore events --all` only
            click.echo(json.dumps(data) if as_json else views.watch_line(data))
            sys.stdout.flush()
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.stderr.close()  # the reader left (e.g. `| head`): no complaint at exit
        sys.exit(0)
    finally:
        sub.close()
    if until_done and not sub.all_succeeded:
        sys.exit(1)


_DONE = {Event.HOLD: "held", Event.RELEASE: "released", Event.REMOVE: "removed"}


def _ids_and_users(args: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """condor_rm's arguments: job ids (CLUSTER, CLUSTER.PROC) and user names."""
    ids = tuple(a for a in args if _JOB_ID.fullmatch(a))
    users = tuple(a for a in args if a not in ids)
    for user in users:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.@-]*", user):
            raise InvalidInput(f"bad job id or user name {user!r}")
    return ids, users


def _admin(ctx: Context, args: tuple[str, ...], event: Event, reason: str | None,
           constraint: str | None = None, everyone: bool = False) -> None:
    """condor_rm's way: act on every job named that can be acted on, report the rest, and
    exit 1 if there was any."""
    from jobstore.errors import NotOwner

    rest = _dag_actions(ctx, args, event)
    if args and not rest and constraint is None and not everyone:
        return  # only DAGs were named
    args = rest
    ids, users = _ids_and_users(args)
    totals, missing = query.act(ctx.store, ctx.shown, event, reason, ids=ids, users=users,
                                constraint=constraint, everyone=everyone)
    failed = bool(missing or totals.denied or totals.bad_status or totals.already_done)
    for outcome in totals.outcomes:
        if outcome.changed:
            if totals.acted_on <= len(totals.outcomes):
                click.echo(f"Job {outcome.name}: {outcome.before} -> {outcome.after}")
        elif outcome.pending:
            click.echo(f"Job {outcome.name}: {outcome.before} -> idle when its attempt has "
                       "ended (release pending)")
        else:
            click.echo(f"jobstore: job {outcome.name} is {outcome.before}; cannot {event}",
                       err=True)
    if totals.acted_on and (totals.acted_on > len(totals.outcomes)
                            or users or constraint or everyone):
        click.echo(f"{totals.success} job(s) {_DONE[event]}"
                   + (f", {totals.acted_on - totals.success} left as they were"
                      if totals.acted_on > totals.success else ""))
    who = ctx.store.identity().account
    for name in totals.denied_names:
        click.echo(f"jobstore: {NotOwner(name, who, str(event))}", err=True)  # type: ignore[arg-type]
    if totals.denied > len(totals.denied_names):
        click.echo(f"jobstore: and {totals.denied - len(totals.denied_names)} more jobs "
                   f"{who} may not {event}", err=True)
    for text in missing:
        click.echo(f"jobstore: no unfinished job {text}", err=True)
    if not (ids or missing) and users and not totals.acted_on and not totals.denied:
        click.echo(f"jobstore: no unfinished jobs of {', '.join(users)}", err=True)
        failed = True
    if failed:
        sys.exit(1)


def _dag_actions(ctx: Context, args: tuple[str, ...], event: Event) -> tuple[str, ...]:
    """The DAGs named among `args` (a DAGManJobId), acted on as condor_rm, condor_hold and
    condor_release act on DAGMan's job: rm ends the DAG (what has not run never will), hold
    pauses it (no node released), release resumes it. The other arguments."""
    rest = []
    for arg in args:
        dag = ctx.store.dag_of(int(arg)) if arg.isdigit() else None
        if dag is None:
            rest.append(arg)
            continue
        if event == Event.REMOVE:
            done = ctx.store.remove_dag(dag.id, _by(ctx, "removed"))
        else:
            done = ctx.store.pause_dag(dag.id, held=event == Event.HOLD)
        if done:
            click.echo(f"DAG {dag.id}: {_DONE[event]}")
        else:
            click.echo(f"jobstore: DAG {dag.id} is {dag.status}; cannot {event}", err=True)
            sys.exit(1)
    return tuple(rest)


_ACTION = [
    click.argument("args", nargs=-1, metavar="[JOB|USER]..."),
    click.option("-constraint", "--constraint", "constraint", metavar="EXPR",
                 help="The jobs for which the ClassAd expression EXPR is true."),
    click.option("-all", "--all", "-a", "everyone", is_flag=True,
                 help="Every job you may act on (a queue super user: every job)."),
]


def _action_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(_ACTION):
        fn = opt(fn)
    return fn


@click.command()
@_action_options
@click.option("-reason", "--reason", "-r", "reason", default=None,
              help="Hold reason (HoldReason; HoldReasonCode is 1, UserRequest).")
@pass_ctx
@guard
def hold(ctx: Context, args: tuple[str, ...], constraint: str | None, everyone: bool,
         reason: str | None) -> None:
    """Put jobs on hold (HoldReasonCode 1), like condor_hold: JOB is CLUSTER or CLUSTER.PROC,
    USER all of that user's jobs; they are not handed out until released.

    A job running on a node is ended there: within JOBSTORE_AGENT_WATCH_INTERVAL by the
    node's agent, which vacates its slot; without an agent by its next UPDATE_JOB_INFO (every
    STARTER_UPDATE_INTERVAL), which runs as the job's user. One not yet started is refused by
    PREPARE_JOB.
    """
    _admin(ctx, args, Event.HOLD, reason or _by(ctx, "held"), constraint, everyone)


@click.command()
@_action_options
@pass_ctx
@guard
def release(ctx: Context, args: tuple[str, ...], constraint: str | None,
            everyone: bool) -> None:
    """Release held jobs back to idle, like condor_release (JOB or USER, as hold).

    A job whose stopped attempt is still ending on its slot becomes idle when that attempt's
    JOB_EXIT comes (or its lease would have run out), so that it never runs twice at once.
    """
    _admin(ctx, args, Event.RELEASE, _by(ctx, "released"), constraint, everyone)


@click.command()
@_action_options
@pass_ctx
@guard
def rm(ctx: Context, args: tuple[str, ...], constraint: str | None, everyone: bool) -> None:
    """Remove jobs, like condor_rm (JOB or USER, as hold). A running job ends as with hold;
    a finished one is left in the history."""
    _admin(ctx, args, Event.REMOVE, _by(ctx, "removed"), constraint, everyone)


def _by(ctx: Context, done: str) -> str:
    """The reason an action records: by whom, as condor_rm's "via condor_rm (by user X)"."""
    return f"{done} by {ctx.store.identity().account}"


@click.command()
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@guard
def stats(ctx: Context, as_json: bool) -> None:
    """Count jobs by queue and status."""
    rows = ctx.store.stats()
    if as_json:
        out: dict[str, dict[str, int]] = {}
        for queue, status, n in rows:
            out.setdefault(queue, {})[status] = n
        click.echo(json.dumps(out, indent=1))
    else:
        click.echo(
            views.format_table(["QUEUE", "STATUS", "JOBS"], [[q_, s, str(n)] for q_, s, n in rows])
        )


@click.command("transfer-data")
@click.argument("ids", nargs=-1, metavar="[JOB]...")
@click.option("-constraint", "--constraint", "constraint", metavar="EXPR",
              help="The jobs for which the ClassAd expression EXPR is true.")
@pass_ctx
@guard
def transfer_data(ctx: Context, ids: tuple[str, ...], constraint: str | None) -> None:
    """Write the outputs of jobs with file transfer on this side, like condor_transfer_data
    (JOB is CLUSTER or CLUSTER.PROC): each output where transfer_output_remaps, output or
    error sends it, else into the job's initialdir."""
    from jobstore.api.retrieve import retrieve

    if not (ids or constraint):
        raise InvalidInput("name the jobs: JOB or -constraint EXPR")
    for text in ids:
        parse_job_id(text)  # ValueError for a malformed one
    done = retrieve(ctx.store, ctx.shown, ids, constraint)
    for got in done:
        click.echo(f"Job {views.job_id(got.job)}: {len(got.written)} output file(s)")
        for name, dest in got.written:
            click.echo(f"  {name} -> {dest}")
    if not done:
        click.echo("jobstore: none of these jobs has outputs in the job store", err=True)
        sys.exit(1)
