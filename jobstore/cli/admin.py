"""The administrator's commands: the database, the node's hooks and agent, the spool."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

import click

from jobstore.cli.context import Context, fail, guard, pass_ctx
from jobstore.db.backends import UserRights, server_warnings
from jobstore.db.engine import safe_url, upgrade
from jobstore.db.sandbox import MAX_INPUT_FILE_MB, MAX_INPUT_MB, MAX_OUTPUT_MB
from jobstore.node import config


@click.command()
@pass_ctx
@guard
def init(ctx: Context) -> None:
    """Create or upgrade the job database schema (runs the Alembic migrations), and store the
    configured limits on a submit's inputs and a job's outputs (JOBSTORE_MAX_INPUT_FILE_MB,
    JOBSTORE_MAX_INPUT_MB, JOBSTORE_MAX_OUTPUT_MB) and the admin's rules on job attributes
    (IMMUTABLE_JOB_ATTRS, SECURE_JOB_ATTRS, PROTECTED_JOB_ATTRS), which the database enforces
    from then on."""
    upgrade(ctx.database_url)
    settings = ctx.settings
    ctx.store.files.set_input_limits({MAX_INPUT_FILE_MB: settings.max_input_file_mb,
                                      MAX_INPUT_MB: settings.max_input_mb,
                                      MAX_OUTPUT_MB: settings.max_job_output_mb})
    ctx.store.admin_settings.set_attr_rules(immutable=settings.immutable_attrs,
                                            protected=settings.protected_attrs)
    click.echo(f"job store ready: {safe_url(ctx.database_url)} (inputs: at most "
               f"{settings.max_input_file_mb} MB a file, {settings.max_input_mb} MB a job)")
    for warning in server_warnings(ctx.store.db.engine):
        click.echo(f"jobstore: warning: {warning}", err=True)


@click.command()
@click.argument("role")
@click.option("--print", "print_only", is_flag=True, help="Only print the statements.")
@pass_ctx
@guard
def grant(ctx: Context, role: str, print_only: bool) -> None:
    """Give PostgreSQL role ROLE only what the agent and the hooks need (run as the owner).

    ROLE may read the job store, append events and change the columns a claim, a transition or a
    report changes; never a job's owner, command, queue, submitted ad or user log. Point the
    agent's JOBSTORE_DATABASE_URL at ROLE."""
    roles = ctx.store.db.backend.roles()
    _show_grants(role, lambda: (roles.hook_statements if print_only else roles.grant_hook)(role))


def _show_grants(role: str, make: Callable[[], list[str]]) -> None:
    """Print the statements `make` ran (or only made), or one line on why it could not."""
    from sqlalchemy.exc import DBAPIError

    try:
        statements = make()
    except DBAPIError as exc:
        fail(f"cannot grant to {role}: {str(exc.orig).strip().splitlines()[0]}")
        return
    for sql in statements:
        click.echo(f"{sql};")


@click.command("grant-user")
@click.argument("roles", nargs=-1, required=True, metavar="ROLE...")
@click.option("--account", metavar="NAME",
              help="The OS account the role's members submit as (default: the role's name), "
                   "as pg_ident.conf maps it.")
@click.option("--super-user", is_flag=True,
              help="A queue super user (QUEUE_SUPER_USERS): may hold, release, remove and edit "
                   "every job.")
@click.option("--may-impersonate", metavar="REGEX",
              help="With --super-user: the accounts it may submit as, a regular expression that "
                   "must match the whole name (QUEUE_SUPER_USER_MAY_IMPERSONATE).")
@click.option("--admin", is_flag=True,
              help="May change the submitters' factors and usage (condor_userprio -setfactor, "
                   "-resetusage).")
@click.option("--accounting-group", "groups", multiple=True, metavar="GROUP",
              help="An accounting group the account's jobs may be charged to (accounting_group "
                   "= GROUP; repeat for more): HTCondor's is free text, the job store's is "
                   "what the admin grants.")
@click.option("--print", "print_only", is_flag=True, help="Only print the grants.")
@pass_ctx
@guard
def grant_user(ctx: Context, roles: tuple[str, ...], account: str | None, super_user: bool,
               may_impersonate: str | None, admin: bool, groups: tuple[str, ...],
               print_only: bool) -> None:
    """Let PostgreSQL roles submit, read the queue, and act on their own jobs (run as the owner).

    The database decides who a session is: a job's owner is the account of the role that
    submitted it (peer authentication on the local socket makes the role the OS user), and only
    that owner, or a queue super user, may hold, release, remove or edit it. ROLE may be a group
    role: its members submit as themselves."""
    if account is not None and len(roles) > 1:
        raise click.UsageError("--account names the account of one role")
    rights = UserRights(account=account, super_user=super_user,
                        may_impersonate=may_impersonate, admin=admin, accounting_groups=groups)
    granted = ctx.store.db.backend.roles()
    make = granted.user_statements if print_only else granted.grant_user
    for role in roles:
        _show_grants(role, functools.partial(make, role, rights))


@click.command("revoke-user")
@click.argument("roles", nargs=-1, required=True, metavar="ROLE...")
@pass_ctx
@guard
def revoke_user(ctx: Context, roles: tuple[str, ...]) -> None:
    """Take from PostgreSQL roles every right `jobstore grant-user` gave them (run as the
    owner). Their jobs stay in the queue."""
    from sqlalchemy.exc import DBAPIError

    granted = ctx.store.db.backend.roles()
    for role in roles:
        try:
            granted.revoke_user(role)
        except DBAPIError as exc:
            fail(f"cannot revoke from {role}: {str(exc.orig).strip().splitlines()[0]}")
            return
        click.echo(f"revoked: {role}")


@click.command()
@pass_ctx
@guard
def reap(ctx: Context) -> None:
    """Send jobs whose lease ran out back to idle, evaluate every job's periodic policy
    (periodic_hold, periodic_release, periodic_remove, allowed_*_duration) and update the
    submitters' priorities when due, now (fetch_job and the agent also do it now and then)."""
    outcomes = ctx.store.maintenance.reap()
    for o in outcomes:
        click.echo(f"job {o.name}: {o.before} -> {o.after} ({o.reason})")
    click.echo(f"{len(outcomes)} expired lease(s) recovered.")
    acted = ctx.store.maintenance.police()
    for o in acted:
        click.echo(f"job {o.name}: {o.event} {o.before} -> {o.after} ({o.reason})")
    click.echo(f"{len(acted)} job(s) changed by their periodic policy.")
    s = ctx.settings
    updated = ctx.store.negotiator.update_priorities(
        halflife=s.priority_halflife, interval=s.priority_update_interval
    )
    click.echo(f"{updated} submitter priorities updated.")


@click.command()
@click.option("--older-than", "older_than", metavar="DURATION",
              help="Remove what finished longer ago than this: seconds, or 12h, 30d "
              "(default: the keyword's JOBSTORE_HISTORY_RETENTION, 30d).")
@click.option("--batch", type=click.IntRange(1, 100_000), default=500, show_default=True,
              help="Jobs removed per transaction.")
@click.option("--dry-run", is_flag=True, help="Only count what would be removed.")
@pass_ctx
@guard
def prune(ctx: Context, older_than: str | None, batch: int, dry_run: bool) -> None:
    """Remove the history older than the retention: completed, removed and failed jobs that
    finished before it, with their events and the clusters left empty, in small transactions.

    The agent does the same every JOBSTORE_PRUNE_INTERVAL when its database role may delete
    (with `jobstore grant`, it may not: run this as the tables' owner, from cron). User logs are
    files of their own and are kept. JOBSTORE_HISTORY_RETENTION = 0 keeps everything."""
    import time

    from jobstore.core.durations import describe, parse_duration

    if older_than is None:
        retention = ctx.settings.history_retention
        if retention <= 0:
            click.echo("JOBSTORE_HISTORY_RETENTION is 0: the history is kept; nothing removed.")
            return
    else:
        try:
            retention = parse_duration(older_than)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--older-than") from None
    done = ctx.store.retention.prune(time.time() - retention, batch=batch, dry_run=dry_run)
    age = describe(retention)
    if dry_run:
        click.echo(f"{done.jobs} job(s) finished over {age} ago would be removed, with"
                   f" {done.events} event(s).")
    else:
        click.echo(f"{done.jobs} job(s) finished over {age} ago removed, with {done.events}"
                   f" event(s) and {done.clusters} emptied cluster(s).")


@click.command()
@pass_ctx
@guard
def metrics(ctx: Context) -> None:
    """Print the job store's metrics in Prometheus' text format: unfinished jobs by queue and
    status, the oldest one's age, claims per second, the submitters' priorities and usage
    (docs/metrics.md). For a scrape through node_exporter's textfile collector, or see the
    agent's JOBSTORE_AGENT_METRICS_PORT and JOBSTORE_AGENT_METRICS_STORE."""
    from jobstore.api.metrics import store_metrics

    sys.stdout.write(store_metrics(ctx.store).decode())


@click.command()
@click.option(
    "--spool",
    "spool_dir",
    metavar="DIR",
    help="Spool directory (default: the keyword's JOBSTORE_SPOOL).",
)
@pass_ctx
@guard
def replay(ctx: Context, spool_dir: str | None) -> None:
    """Send the hook reports kept in the local spool while the database was away.

    As root: every account's reports, each checked as its owner's (an ordinary account's only
    about its own jobs); reports that cannot be applied are quarantined (renamed .bad)."""
    from pathlib import Path

    from jobstore.errors import SpoolError
    from jobstore.node.sending import record_group, spool_sender
    from jobstore.node.services import direct
    from jobstore.node.spool import replay as replay_spool

    directory = Path(spool_dir or ctx.settings.spool)
    send = spool_sender(config.service_uids(config.startd_users()), node=direct())
    try:
        done = replay_spool(directory, send, limit=1_000_000, group=record_group)
    except SpoolError as exc:
        fail(str(exc))
    click.echo(f"{done.sent} report(s) sent, {done.left} left, {done.bad} quarantined in "
               f"{directory}")
    for reason, n in done.why_left:
        click.echo(f"  {n} left: {reason}")
    if done.busy:
        click.echo("  another replay of this spool is under way (it sends them, in order)")
    if done.left:
        sys.exit(1)


@click.command("install-hooks")
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
@guard
def install_hooks_cmd(
    directory: str, python: str | None, agent_socket: str | None, agent_users: tuple[str, ...]
) -> None:
    """Write the six hook executables into DIRECTORY, for <KEYWORD>_HOOK_* settings."""
    from jobstore.agent.hooktemplates import install_hooks

    for name, path in install_hooks(directory, python, agent_socket, agent_users).items():
        click.echo(f"JOBSTORE_HOOK_{name} = {path}")


@click.command()
@click.option("--socket", "socket_path", metavar="PATH",
              help="Unix socket to listen on (default: JOBSTORE_AGENT_SOCKET).")
@click.option("-f", "--foreground", is_flag=True,
              help="Log to stderr, not to JOBSTORE_AGENT_LOG.")
@click.option("--check", is_flag=True,
              help="Say which mode (agent or direct) each keyword's hooks are in, and why; "
                   "exit 1 when any does not reach the agent.")
@guard
def agent(socket_path: str | None, foreground: bool, check: bool) -> None:
    """Run the per-node agent that serves the hooks (condor_master starts it)."""
    if check:
        from jobstore.agent.check import check as check_node

        lines, ok = check_node()
        click.echo("\n".join(lines))
        sys.exit(0 if ok else 1)
    from jobstore.agent.server import run_agent
    from jobstore.errors import AgentError

    try:
        code = run_agent(socket_path, foreground=foreground)
    except AgentError as exc:
        fail(str(exc))
    sys.exit(code)


