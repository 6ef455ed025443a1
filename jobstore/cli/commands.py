"""The `jobstore` commands: a thin layer over the package (jobstore.api, jobstore.db, ...)."""

from __future__ import annotations

import click

from jobstore.cli import act, admin, dags, queue, schedd, status, submit, userprio, watch
from jobstore.cli.context import Context, Group
from jobstore.cli.demo import demo, emulate


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
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


for command in (
    admin.init, admin.grant, admin.grant_user, admin.revoke_user, submit.submit,
    submit.submit_dag, dags.dag, queue.q,
    queue.history, queue.qedit, watch.events, watch.watch, act.hold, act.release, act.rm,
    act.vacate, queue.stats, act.transfer_data, status.status, userprio.userprio,
    admin.reap, admin.prune, admin.metrics, admin.replay, admin.install_hooks_cmd, admin.agent,
    schedd.schedd,
    demo, emulate,
):
    main.add_command(command)

__all__ = ["main"]
