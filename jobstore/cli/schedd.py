"""`jobstore schedd`: the access point's service."""

from __future__ import annotations

import click

from jobstore.cli.context import Context, fail, guard, pass_ctx


@click.command("schedd")
@click.option("--name", metavar="NAME",
              help="This access point's name (default: JOBSTORE_SCHEDD_NAME, else the host's "
              "name), as the jobs submitted here record it.")
@click.option("--once", is_flag=True,
              help="Write home what is due now and log what was committed, then exit.")
@click.option("--log", "log", metavar="PATH", type=click.Path(dir_okay=False),
              help="Append the log to PATH (default: stderr).")
@pass_ctx
@guard
def schedd(ctx: Context, name: str | None, once: bool, log: str | None) -> None:
    """Write the outputs of the jobs submitted on this access point (not with -spool) into
    their Iwd as they complete, with their remaps, append their transitions to their job
    event logs (and each DAG's to its DAGMan log), run the DAGs' PRE and POST scripts, read
    the inputs of the nodes they submit and keep their node status files current, each as
    its owner, as the schedd, its shadows and DAGMan do. As root, every owner's jobs; as an
    ordinary account, her own."""
    import logging
    import os
    import signal
    import sys

    from jobstore.accesspoint.dagmanlogs import DagmanLogs
    from jobstore.accesspoint.dagscripts import DagScripts
    from jobstore.accesspoint.dagstatus import DagStatusFiles
    from jobstore.accesspoint.eventlogs import EventLogs
    from jobstore.accesspoint.outputs import OutputsHome, become
    from jobstore.accesspoint.service import serve
    from jobstore.db.localdoor import ACCESS_POINT

    home = name or ctx.settings.access_point()
    if not ACCESS_POINT.fullmatch(home):
        fail(f"{home!r} is not the name of an access point")
    if os.geteuid() == 0:
        owner = ctx.store.db.backend.local_owner()
        if owner is not None:  # her SQLite file: whoever may write it may write any row
            become(owner)
    where = logging.FileHandler(log) if log else logging.StreamHandler(sys.stderr)
    logging.basicConfig(handlers=[where], level=logging.INFO,
                        format="%(asctime)s jobstore schedd: %(message)s")
    outputs = OutputsHome(ctx.store, home, ctx.settings)
    logs = EventLogs(ctx.store, home, ctx.settings)
    dagman = DagmanLogs(ctx.store, home, ctx.settings)
    scripts = DagScripts(ctx.store, home, ctx.settings)
    status = DagStatusFiles(ctx.store, home, ctx.settings)
    if once:
        done = outputs.pass_once()
        click.echo(f"{done} job(s)' outputs written home, {outputs.failed} not.")
        click.echo(f"{logs.pass_once() + dagman.pass_once()} event(s) appended to job event "
                   "logs.")
        click.echo(f"{scripts.pass_once()} DAG node script(s) ended or started.")
        click.echo(f"{status.pass_once()} DAG node status file(s) written.")
        return
    stopping: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    logging.getLogger("jobstore.schedd").info("serving the jobs of %s", home)
    serve(ctx.store, ctx.settings, [outputs, logs, dagman, scripts, status],
          lambda: bool(stopping))
