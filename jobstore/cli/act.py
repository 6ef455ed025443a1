"""Acting on jobs: condor_hold, condor_release, condor_rm, condor_vacate_job and
condor_transfer_data."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from jobstore.api import query
from jobstore.cli.context import Context, guard, pass_ctx
from jobstore.cli.queue import ids_and_users
from jobstore.core.jobs import parse_job_id
from jobstore.core.states import Event
from jobstore.errors import InvalidInput
from jobstore.formats import views

_DONE = {Event.HOLD: "held", Event.RELEASE: "released", Event.REMOVE: "removed",
         Event.VACATE: "vacated", Event.VACATE_FAST: "vacated"}
_VACATES = (Event.VACATE, Event.VACATE_FAST)


def _by(ctx: Context, done: str) -> str:
    """The reason an action records: by whom, as condor_rm's "via condor_rm (by user X)"."""
    return f"{done} by {ctx.store.db.identity().account}"


def _dag_actions(ctx: Context, args: tuple[str, ...], event: Event) -> tuple[str, ...]:
    """The DAGs named among `args` (a DAGManJobId), acted on as condor_rm, condor_hold and
    condor_release act on DAGMan's job: rm ends the DAG (what has not run never will), hold
    pauses it (no node released), release resumes it. The other arguments."""
    rest = []
    for arg in args:
        dag = ctx.store.dags.dag_of(int(arg)) if arg.isdigit() else None
        if dag is None:
            rest.append(arg)
            continue
        if event == Event.REMOVE:
            done = ctx.store.dags.remove_dag(dag.id, _by(ctx, "removed"))
        else:
            done = ctx.store.dags.pause_dag(dag.id, held=event == Event.HOLD)
        if done:
            click.echo(f"DAG {dag.id}: {_DONE[event]}")
        else:
            click.echo(f"jobstore: DAG {dag.id} is {dag.status}; cannot {event}", err=True)
            sys.exit(1)
    return tuple(rest)


def _admin(ctx: Context, args: tuple[str, ...], event: Event, reason: str | None,
           constraint: str | None = None, everyone: bool = False) -> None:
    """condor_rm's way: act on every job named that can be acted on, report the rest, and
    exit 1 if there was any."""
    from jobstore.errors import NotOwner

    verb = "vacate" if event in _VACATES else str(event)
    rest = args if event in _VACATES else _dag_actions(ctx, args, event)
    if args and not rest and constraint is None and not everyone:
        return  # only DAGs were named
    args = rest
    ids, users = ids_and_users(args)
    totals, missing = query.act(ctx.store, ctx.shown, event, reason, ids=ids, users=users,
                                constraint=constraint, everyone=everyone)
    failed = bool(missing or totals.denied or totals.bad_status or totals.already_done)
    for outcome in totals.outcomes:
        if outcome.changed:
            if totals.acted_on <= len(totals.outcomes):
                click.echo(f"Job {outcome.name}: {outcome.before} -> {outcome.after}")
        elif outcome.pending and event in _VACATES:
            click.echo(f"Job {outcome.name}: {outcome.before}, vacating (idle once its node "
                       "has stopped it)")
        elif outcome.pending:
            click.echo(f"Job {outcome.name}: {outcome.before} -> idle when its attempt has "
                       "ended (release pending)")
        else:
            click.echo(f"jobstore: job {outcome.name} is {outcome.before}; cannot {verb}",
                       err=True)
    if totals.acted_on and (totals.acted_on > len(totals.outcomes)
                            or users or constraint or everyone):
        click.echo(f"{totals.success} job(s) {_DONE[event]}"
                   + (f", {totals.acted_on - totals.success} left as they were"
                      if totals.acted_on > totals.success else ""))
    who = ctx.store.db.identity().account
    for name in totals.denied_names:
        click.echo(f"jobstore: {NotOwner(name, who, verb)}", err=True)  # type: ignore[arg-type]
    if totals.denied > len(totals.denied_names):
        click.echo(f"jobstore: and {totals.denied - len(totals.denied_names)} more jobs "
                   f"{who} may not {verb}", err=True)
    for text in missing:
        click.echo(f"jobstore: no unfinished job {text}", err=True)
    if not (ids or missing) and users and not totals.acted_on and not totals.denied:
        click.echo(f"jobstore: no unfinished jobs of {', '.join(users)}", err=True)
        failed = True
    if failed:
        sys.exit(1)


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


@click.command()
@_action_options
@click.option("-fast", "--fast", "fast", is_flag=True,
              help="Kill the job's processes at once (no KillSig, no grace period).")
@pass_ctx
@guard
def vacate(ctx: Context, args: tuple[str, ...], constraint: str | None, everyone: bool,
           fast: bool) -> None:
    """Vacate running jobs, like condor_vacate_job (JOB or USER, as hold): each goes back to
    idle and runs again where it is matched, from its last checkpoint if it has one.

    The node's agent vacates the slot within JOBSTORE_AGENT_WATCH_INTERVAL (at once on
    PostgreSQL): gracefully (the job gets its KillSig, and is killed if it has not ended
    min(JobMaxVacateTime, MACHINE_MAX_VACATE_TIME) seconds later) or with -fast at once. The
    eviction counts as one of the job's attempts, as any other does.
    """
    event = Event.VACATE_FAST if fast else Event.VACATE
    _admin(ctx, args, event, _by(ctx, "vacated"), constraint, everyone)


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
