"""The `jobstore` command: submit, watch and manage the jobs that execute nodes fetch."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any

import click
from classad2 import ExprTree

from jobstore.cli.demo import demo, emulate
from jobstore.core.states import Event, Status
from jobstore.db.engine import DatabaseError, safe_url, upgrade
from jobstore.db.store import Job, JobStore, UnknownJob
from jobstore.formats import views
from jobstore.node import config
from jobstore.submit.language import SubmitError

ADMIN_STATEMENT_TIMEOUT_MS = 300_000


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
    def database_url(self) -> str:
        """The URL with its password; ConfigError when the password file cannot be read."""
        if self.settings.credentials_error:
            raise config.ConfigError(self.settings.credentials_error)
        return self.settings.database_url

    @property
    def store(self) -> JobStore:
        if self._store is None:
            # Admin queries scan whole queues (q -autocluster over 1M jobs takes seconds); the
            # hooks' tight statement timeout protects slots, not an admin's terminal.
            self._store = JobStore.from_url(
                self.database_url, statement_timeout_ms=ADMIN_STATEMENT_TIMEOUT_MS
            )
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


class _UsageLine(click.ClickException):
    """A usage error shown as one line (click's own form takes four), exit status 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"jobstore: {self.message}", err=True)


def _usage_line(exc: click.UsageError) -> _UsageLine:
    sub = exc.ctx is not None and exc.ctx.parent is not None
    where = f"{exc.ctx.info_name}: " if sub and exc.ctx is not None else ""
    return _UsageLine(f"{where}{exc.format_message()} (see --help)")


class _Group(click.Group):
    """The `jobstore` group: usage errors of the group and its commands in one line."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:
            raise _usage_line(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise _usage_line(exc) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
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
    upgrade(ctx.database_url)
    click.echo(f"job store ready: {safe_url(ctx.database_url)}")


@main.command()
@click.argument("role")
@click.option("--print", "print_only", is_flag=True, help="Only print the statements.")
@pass_ctx
@_guard
def grant(ctx: Context, role: str, print_only: bool) -> None:
    """Give PostgreSQL role ROLE only what the agent and the hooks need (run as the owner).

    ROLE may read the job store, append events and change the columns a claim, a transition or a
    report changes; never a job's owner, command, queue, submitted ad or user log. Point the
    agent's JOBSTORE_DATABASE_URL at ROLE."""
    from sqlalchemy.exc import DBAPIError

    from jobstore.db.grants import grant_hook_role, hook_role_statements

    engine = ctx.store.engine
    try:
        if print_only:
            statements = hook_role_statements(engine, role)
        else:
            statements = grant_hook_role(engine, role)
    except DBAPIError as exc:
        _fail(f"cannot grant to {role}: {str(exc.orig).strip().splitlines()[0]}")
        return
    for sql in statements:
        click.echo(f"{sql};")


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
    from jobstore.api.submission import submit_path

    cluster, ids = submit_path(ctx.store, file, ctx.settings, owner=owner, queue=queue)
    click.echo(f"{len(ids)} job(s) submitted to cluster {cluster}.")


def _select(ctx: Context, ids: tuple[str, ...]) -> list[Job]:
    jobs: list[Job] = []
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


def _print_jobs(ctx: Context, jobs: list[Job], as_json: bool, long: bool) -> None:
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
        type=click.Choice([s.value for s in Status]),
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
]


def _query_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for opt in reversed(_QUERY):
        fn = opt(fn)
    return _filters(fn)


def _split_args(args: tuple[str, ...], autoformat: bool) -> tuple[tuple[str, ...], list[str]]:
    """Job ids and, with -af, the attributes to print (anything that is not a job id)."""
    if not autoformat:
        return args, []
    ids = tuple(a for a in args if re.fullmatch(r"\d+(\.\d+)?", a))
    attrs = [a for a in args if a not in ids]
    if not attrs:
        raise ValueError("-af needs at least one attribute name")
    return ids, attrs


def _query(
    ctx: Context, ids: tuple[str, ...], constraint: str | None, **filters: Any
) -> list[Job]:
    """The jobs that `q`/`history` show: constraint conjuncts that translate filter in SQL,
    the rest is evaluated by classad2 on each job's ad."""
    from jobstore.db.constraint import matches, plan

    p = plan(constraint) if constraint else None
    if ids:
        jobs = _select(ctx, ids)
        residual = ExprTree(p.text) if p else None
    else:
        jobs = ctx.store.list_jobs(where=p.where if p else None, **filters)
        residual = p.residual if p else None
    if residual is not None:
        jobs = [j for j in jobs if matches(residual, _ad(ctx, j))]
    return jobs


def _ad(ctx: Context, job: Job) -> Any:
    return views.job_ad(job, keyword=ctx.settings.keyword, uid_domain=ctx.settings.uid_domain)


def _print_autoformat(ctx: Context, jobs: list[Job], attrs: list[str]) -> None:
    exprs = []
    for a in attrs:
        try:
            exprs.append(ExprTree(a))
        except Exception:  # classad2 raises ClassAdException
            raise ValueError(f"-af: not a ClassAd attribute or expression: {a}") from None
    for job in jobs:
        click.echo(views.autoformat(_ad(ctx, job), exprs))


def _print_autoclusters(
    ctx: Context, ids: tuple[str, ...], constraint: str | None, as_json: bool, **filters: Any
) -> None:
    from jobstore.db.constraint import plan
    from jobstore.db.store import AUTOCLUSTER_KEY

    p = plan(constraint) if constraint else None
    if ids or (p and p.residual is not None):  # not all in SQL: group what _query found
        jobs = _query(ctx, ids, constraint, **filters)
        groups = views.group_jobs(jobs, AUTOCLUSTER_KEY)
    else:
        groups = ctx.store.autoclusters(where=p.where if p else None, **filters)
    if as_json:
        click.echo(json.dumps(groups, indent=1))
        return
    click.echo(views.format_table(*views.autocluster_rows(groups)))
    total = sum(g["jobs"] for g in groups)
    click.echo(f"\nTotal: {total} jobs in {len(groups)} autoclusters")


@main.command()
@click.argument("ids", nargs=-1, metavar="[JOB]... [ATTR]...")
@click.option("--all", "-a", "include_final", is_flag=True, help="Include finished jobs.")
@click.option(
    "-autocluster",
    "--autocluster",
    "autocluster",
    is_flag=True,
    help="Count jobs by autocluster (owner, queue, requests, Requirements) and status.",
)
@_query_options
@pass_ctx
@_guard
def q(
    ctx: Context,
    ids: tuple[str, ...],
    include_final: bool,
    autocluster: bool,
    constraint: str | None,
    autoformat: bool,
    statuses: tuple[str, ...],
    owners: tuple[str, ...],
    queues: tuple[str, ...],
    as_json: bool,
    long: bool,
) -> None:
    """List the jobs not yet finished, like condor_q (JOB is CLUSTER or CLUSTER.PROC).

    With -af, the arguments that are not job ids are the attributes to print.
    """
    ids, attrs = _split_args(ids, autoformat)
    filters = dict(statuses=statuses, owners=owners, queues=queues, include_final=include_final)
    if autocluster:
        _print_autoclusters(ctx, ids, constraint, as_json, **filters)
        return
    jobs = _query(ctx, ids, constraint, **filters)
    if attrs:
        _print_autoformat(ctx, jobs, attrs)
    else:
        _print_jobs(ctx, jobs, as_json, long)


@main.command()
@click.argument("attrs", nargs=-1, metavar="[ATTR]...")
@_query_options
@pass_ctx
@_guard
def history(
    ctx: Context,
    attrs: tuple[str, ...],
    constraint: str | None,
    autoformat: bool,
    statuses: tuple[str, ...],
    owners: tuple[str, ...],
    queues: tuple[str, ...],
    as_json: bool,
    long: bool,
) -> None:
    """List finished jobs (completed, failed, removed), like condor_history."""
    if attrs and not autoformat:
        raise ValueError("attribute names need -af")
    jobs = _query(
        ctx, (), constraint, statuses=statuses, owners=owners, queues=queues, final_only=True
    )
    if autoformat:
        if not attrs:
            raise ValueError("-af needs at least one attribute name")
        _print_autoformat(ctx, jobs, list(attrs))
    else:
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


@main.command()
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
@_guard
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
    )
    try:
        for record in sub:
            data = record.to_json()
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
    """Send the hook reports kept in the local spool while the database was away.

    As root: every account's reports, each checked as its owner's (an ordinary account's only
    about its own jobs); reports that cannot be applied are quarantined (renamed .bad)."""
    from pathlib import Path

    from jobstore.node.handlers import record_group, spool_sender
    from jobstore.node.spool import SpoolError
    from jobstore.node.spool import replay as replay_spool

    directory = Path(spool_dir or ctx.settings.spool)
    send = spool_sender(config.service_uids(config.startd_users()))
    try:
        done = replay_spool(directory, send, limit=1_000_000, group=record_group)
    except SpoolError as exc:
        _fail(str(exc))
    click.echo(f"{done.sent} report(s) sent, {done.left} left, {done.bad} quarantined in "
               f"{directory}")
    if done.left:
        sys.exit(1)


@main.command("install-hooks")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--python", metavar="PATH", help="Interpreter for the hooks (default: this one).")
@click.option(
    "--agent-socket",
    metavar="PATH",
    help="The agent's socket baked into the hooks ($JOBSTORE_AGENT_SOCKET still wins).",
)
@click.option(
    "--agent-user",
    "agent_users",
    metavar="USER",
    multiple=True,
    help="An account the agent may run as besides root (repeatable); the hooks trust no "
    "socket served by any other account.",
)
@_guard
def install_hooks_cmd(
    directory: str, python: str | None, agent_socket: str | None, agent_users: tuple[str, ...]
) -> None:
    """Write the six hook executables into DIRECTORY, for <KEYWORD>_HOOK_* settings."""
    from jobstore.agent.hooktemplates import install_hooks

    for name, path in install_hooks(directory, python, agent_socket, agent_users).items():
        click.echo(f"JOBSTORE_HOOK_{name} = {path}")


@main.command()
@click.option("--socket", "socket_path", metavar="PATH",
              help="Unix socket to listen on (default: JOBSTORE_AGENT_SOCKET).")
@click.option("-f", "--foreground", is_flag=True,
              help="Log to stderr, not to JOBSTORE_AGENT_LOG.")
@_guard
def agent(socket_path: str | None, foreground: bool) -> None:
    """Run the per-node agent that serves the hooks (condor_master starts it)."""
    from jobstore.agent.server import AgentError, run_agent

    try:
        code = run_agent(socket_path, foreground=foreground)
    except AgentError as exc:
        _fail(str(exc))
    sys.exit(code)


main.add_command(demo)
main.add_command(emulate)


