"""Following jobs: their events, and `watch` as they happen."""

from __future__ import annotations

import json
import sys

import click

from jobstore.api import query
from jobstore.cli.context import Context, guard, pass_ctx
from jobstore.core.states import Status
from jobstore.formats import views


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
        evs = ctx.store.reads.events(row.id)
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
