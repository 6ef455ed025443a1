"""`jobstore dag`: a DAG as DAGMan shows it, made from the store when asked (no DAGMan process
writes files): its own job ad, its node status file and its jobstate log."""

from __future__ import annotations

import click

from jobstore.cli.context import Context, Group, fail, guard, pass_ctx


@click.group("dag", cls=Group)
def dag() -> None:
    """A DAG's own ad, node status file and jobstate log, in DAGMan's formats."""


@dag.command("ad")
@click.argument("dag_id", type=int, metavar="DAGID")
@pass_ctx
@guard
def ad(ctx: Context, dag_id: int) -> None:
    """The DAG's own job ad, as condor_q -l shows DAGMan's job: DAG_NodesTotal, DAG_NodesDone,
    DAG_NodesQueued, DAG_NodesFailed, DAG_Status, ... and SET_JOB_ATTR's attributes."""
    from jobstore.api.dags import dag_ads
    from jobstore.formats.classads import sprint_ad

    found = dag_ads(ctx.store, [dag_id])
    if not found:
        fail(f"no DAG {dag_id}")
    click.echo(_shown(sprint_ad(found[0])), nl=False)


@dag.command("node-status")
@click.argument("dag_id", type=int, metavar="DAGID")
@pass_ctx
@guard
def node_status(ctx: Context, dag_id: int) -> None:
    """The DAG's node status file, as DAGMan writes it for NODE_STATUS_FILE."""
    from jobstore.api.dags import node_status_file

    click.echo(_shown(node_status_file(ctx.store, dag_id)), nl=False)


@dag.command("jobstate-log")
@click.argument("dag_id", type=int, metavar="DAGID")
@pass_ctx
@guard
def jobstate_log(ctx: Context, dag_id: int) -> None:
    """The DAG's jobstate log, as DAGMan writes it for JOBSTATE_LOG."""
    from jobstore.api.dags import jobstate_log as log

    click.echo(_shown(log(ctx.store, dag_id)), nl=False)


def _shown(text: str) -> str:
    """`text`, each line as a terminal may show it (node names and attributes are the
    owners', whatever client stored them): what is not printable as `?`."""
    from jobstore.formats.views import shown

    return "".join(shown(line) + "\n" for line in text.splitlines())
