"""The `jobstore` command: submit, watch and manage the jobs that execute nodes fetch."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from . import config, views
from .db import DatabaseError, safe_url, upgrade
from .demo import demo, emulate
from .states import Event
from .store import JobStore, UnknownJob
from .submit import SubmitError


class Context:
    def __init__(self, db: str | None, keyword: str | None) -> None:
        self.db = db
        self.keyword = keyword
        self._settings: config.Settings | None = None
        self._store: JobStore | None = None

    @property
    def settings(self) -> config.Settings:
        if self._settings is None:
            self._settings = config.load_settings(self.keyword, self.db)
        return self._settings

    @property
    def store(self) -> JobStore:
        if self._store is None:
            self._store = JobStore.from_url(self.settings.database_url)
        return self._store


pass_ctx = click.make_pass_decorator(Context)


def _fail(message: str) -> None:
    click.echo(f"jobstore: {message}", err=True)
    sys.exit(1)


def _guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn expected failures into one line on stderr and exit status 1."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (DatabaseError, SubmitError, config.ConfigError, ValueError) as exc:
            _fail(str(exc))
        except UnknownJob as exc:
            _fail(f"no such job: {exc.args[0]}")

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db",
    metavar="URL",
    help="SQLAlchemy database URL (default: $JOBSTORE_DATABASE_URL, "
    "then <KEYWORD>_JOBSTORE_DATABASE_URL / JOBSTORE_DATABASE_URL in HTCondor "
    "configuration, then a SQLite file under ~/.local/share/htcondor-jobstore).",
)
@click.option(
    "--keyword", "-k", metavar="KW", help="Hook keyword whose settings to use (default JOBSTORE)."
)
@click.version_option(package_name="htcondor-jobstore")
@click.pass_context
def main(ctx: click.Context, db: str | None, keyword: str | None) -> None:
    """Job store for HTCondor fetch-work hooks: execute nodes pull these jobs."""
    ctx.obj = Context(db, keyword)


@main.command()
@pass_ctx
@_guard
def init(ctx: Context) -> None:
    """Create or upgrade the job database schema (runs the Alembic migrations)."""
    upgrade(ctx.settings.database_url)
    click.echo(f"job store ready: {safe_url(ctx.settings.database_url)}")


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--owner", metavar="USER", help="Run the jobs as USER (root only; default: you).")
@click.option(
    "--queue",
    "-q",
    metavar="Q",
    help="Queue to put the jobs in (default: the keyword's JOBSTORE_QUEUE).",
)
@pass_ctx
@_guard
def submit(ctx: Context, file: str, owner: str | None, queue: str | None) -> None:
    """Queue the jobs of an HTCondor submit description (or a plain ClassAd file)."""
    from .submission import submit_path

    cluster, ids = submit_path(ctx.store, file, ctx.settings, owner=owner, queue=queue)
    click.echo(f"{len(ids)} job(s) submitted to cluster {cluster}.")


def _select(ctx: Context, ids: tuple[str, ...]) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = []
    for text in ids:
        cluster, _, proc = text.partition(".")
        try:
            c, p = int(cluster), (int(proc) if proc else None)
        except ValueError:
            raise ValueError(f"bad job id {text!r} (use CLUSTER or CLUSTER.PROC)") from None
        found = ctx.store.find_jobs(c, p)
        if not found:
            raise UnknownJob(text)
        jobs.extend(found)
    return jobs


def _print_jobs(ctx: Context, jobs: list[dict[str, Any]], as_json: bool, long: bool) -> None:
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
        click.echo(views.format_table(*views.job_rows(jobs)))
        counts: dict[str, int] = {}
        for job in jobs:
            counts[job["status"]] = counts.get(job["status"], 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        click.echo(f"\nTotal: {len(jobs)} jobs" + (f"; {summary}" if summary else ""))


_FILTERS = [
    click.option(
        "--status",
        "-s",
        "statuses",
        multiple=True,
        metavar="S",
        help="Only jobs in status S (repeatable).",
    ),
    click.option("--owner", "owners", multiple=True, metavar="USER", help="Only USER's jobs."),
    click.option("--queue", "-q", "queues", multiple=True, metavar="Q", help="Only queue Q."),
    click.option("--json", "as_json", is_flag=True, help="JSON list of jobs."),
    click.option("-l", "--long", "long", is_flag=True, help="Full ClassAds."),
]


def _filters(fn: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(_FILTERS):
        fn = opt(fn)
    return fn


@main.command()
@click.argument("ids", nargs=-1, metavar="[JOB]...")
@click.option("--all", "-a", "include_final", is_flag=True, help="Include finished jobs.")
@_filters
@pass_ctx
@_guard
def q(
    ctx: Context,
    ids: tuple[str, ...],
    include_final: bool,
    statuses: tuple[str, ...],
    owners: tuple[str, ...],
    queues: tuple[str, ...],
    as_json: bool,
    long: bool,
) -> None:
    """List the jobs not yet finished, like condor_q (JOB is CLUSTER or CLUSTER.PROC)."""
    if ids:
        jobs = _select(ctx, ids)
    else:
        jobs = ctx.store.list_jobs(
            statuses=statuses, owners=owners, queues=queues, include_final=include_final
        )
    _print_jobs(ctx, jobs, as_json, long)


@main.command()
@_filters
@pass_ctx
@_guard
def history(
    ctx: Context,
    statuses: tuple[str, ...],
    owners: tuple[str, ...],
    queues: tuple[str, ...],
    as_json: bool,
    long: bool,
) -> None:
    """List finished jobs (completed, failed, removed), like condor_history."""
    jobs = ctx.store.list_jobs(statuses=statuses, owners=owners, queues=queues, final_only=True)
    _print_jobs(ctx, jobs, as_json, long)


@main.command()
@click.argument("job")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event.")
@pass_ctx
@_guard
def events(ctx: Context, job: str, as_json: bool) -> None:
    """Show every recorded transition and report of JOB."""
    for row in _select(ctx, (job,)):
        evs = ctx.store.events(row["id"])
        if as_json:
            for e in evs:
                click.echo(json.dumps(views.event_json(e)))
        else:
            click.echo(f"Job {views.job_id(row)} ({row['status']})")
            click.echo(views.format_table(*views.event_rows(evs)))


def _admin(ctx: Context, ids: tuple[str, ...], event: Event, reason: str | None) -> None:
    failed = False
    for job in _select(ctx, ids):
        outcome = ctx.store.admin(job["id"], event, reason)
        if outcome.changed:
            click.echo(f"Job {views.job_id(job)}: {outcome.before} -> {outcome.after}")
        else:
            failed = True
            click.echo(
                f"jobstore: job {views.job_id(job)} is {outcome.before}; cannot {event}", err=True
            )
    if failed:
        sys.exit(1)


@main.command()
@click.argument("ids", nargs=-1, required=True, metavar="JOB...")
@click.option("--reason", "-r", default="held by the administrator", help="Hold reason.")
@pass_ctx
@_guard
def hold(ctx: Context, ids: tuple[str, ...], reason: str) -> None:
    """Put jobs on hold: they are not handed out until released.

    A job already running on a node keeps running there (there is no schedd to stop it), but
    its reports no longer change it, and a job not yet started is refused by PREPARE_JOB.
    """
    _admin(ctx, ids, Event.HOLD, reason)


@main.command()
@click.argument("ids", nargs=-1, required=True, metavar="JOB...")
@pass_ctx
@_guard
def release(ctx: Context, ids: tuple[str, ...]) -> None:
    """Release held jobs back to idle."""
    _admin(ctx, ids, Event.RELEASE, "released by the administrator")


@main.command()
@click.argument("ids", nargs=-1, required=True, metavar="JOB...")
@pass_ctx
@_guard
def rm(ctx: Context, ids: tuple[str, ...]) -> None:
    """Remove jobs (like condor_rm). The same caveat as `hold` applies to running jobs."""
    _admin(ctx, ids, Event.REMOVE, "removed by the administrator")


@main.command()
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@_guard
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


@main.command()
@pass_ctx
@_guard
def reap(ctx: Context) -> None:
    """Send jobs whose lease ran out back to idle now (fetch_job also does it now and then)."""
    outcomes = ctx.store.reap()
    for o in outcomes:
        click.echo(f"job {o.job_id}: {o.before} -> {o.after} ({o.reason})")
    click.echo(f"{len(outcomes)} expired lease(s) recovered.")


@main.command()
@click.option(
    "--spool",
    "spool_dir",
    metavar="DIR",
    help="Spool directory (default: the keyword's JOBSTORE_SPOOL).",
)
@pass_ctx
@_guard
def replay(ctx: Context, spool_dir: str | None) -> None:
    """Send the hook reports kept in the local spool while the database was away."""
    from pathlib import Path

    from .handlers import send_record
    from .spool import replay as replay_spool

    directory = Path(spool_dir or ctx.settings.spool)
    sent, left = replay_spool(directory, send_record, limit=1_000_000)
    click.echo(f"{sent} report(s) sent, {left} left in {directory}")
    if left:
        sys.exit(1)


@main.command("install-hooks")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--python", metavar="PATH", help="Interpreter for the hooks (default: this one).")
@_guard
def install_hooks_cmd(directory: str, python: str | None) -> None:
    """Write the six hook executables into DIRECTORY, for <KEYWORD>_HOOK_* settings."""
    from .hooktemplates import install_hooks

    for name, path in install_hooks(directory, python).items():
        click.echo(f"JOBSTORE_HOOK_{name} = {path}")


main.add_command(demo)
main.add_command(emulate)


if __name__ == "__main__":
    main()
