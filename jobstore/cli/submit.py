"""Submitting: condor_submit and condor_submit_dag."""

from __future__ import annotations

import click

from jobstore.cli.context import Context, guard, pass_ctx


@click.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--owner", metavar="USER", help="Run the jobs as USER (root only; default: you).")
@click.option(
    "--queue",
    "-q",
    metavar="Q",
    help="Queue to put the jobs in (default: the keyword's JOBSTORE_QUEUE).",
)
@click.option("-spool", "--spool", "spool", is_flag=True,
              help="condor_submit -spool: the outputs wait in the job store for "
              "`jobstore transfer-data` (default: this access point's `jobstore schedd` "
              "writes them into each job's Iwd).")
@pass_ctx
@guard
def submit(ctx: Context, file: str, owner: str | None, queue: str | None, spool: bool) -> None:
    """Queue the jobs of an HTCondor submit description (or a plain ClassAd file)."""
    from jobstore.api.submission import submit_path

    cluster, ids = submit_path(ctx.store, file, ctx.settings, owner=owner, queue=queue,
                               spool=spool)
    click.echo(f"{len(ids)} job(s) submitted to cluster {cluster}.")


@click.command("submit-dag", context_settings={"ignore_unknown_options": False})
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("-maxjobs", "--maxjobs", "maxjobs", type=int, metavar="N",
              help="At most N nodes queued at once (DAGMAN_MAX_JOBS_SUBMITTED).")
@click.option("-maxidle", "--maxidle", "maxidle", type=int, metavar="N",
              help="No node released while the DAG has N idle jobs (DAGMAN_MAX_JOBS_IDLE).")
@click.option("-maxpre", "--maxpre", "maxpre", type=int, metavar="N",
              help="At most N of its PRE scripts run at once (0: no limit of its own; "
              "DAGMAN_MAX_PRE_SCRIPTS, 20).")
@click.option("-maxpost", "--maxpost", "maxpost", type=int, metavar="N",
              help="At most N of its POST scripts run at once (0: no limit of its own; "
              "DAGMAN_MAX_POST_SCRIPTS, 20).")
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
               maxpre: int | None, maxpost: int | None, batch_name: str | None,
               rescue: int | None, refused: str | None, force: bool, owner: str | None,
               queue: str | None) -> None:
    """Queue a DAG, like condor_submit_dag: its nodes wait in the job store until their
    parents are done, and the store releases them itself (no DAGMan process)."""
    from jobstore.api.dags import submit_dag as queue_dag
    from jobstore.errors import DagError

    if refused is not None:
        raise DagError("-append and -insert_sub_file are not supported: a node's submit "
                       "description is read as it is (give its commands there, or as VARS)")

    options: dict[str, object] = {"maxjobs": maxjobs, "maxidle": maxidle, "maxpre": maxpre,
                                  "maxpost": maxpost, "rescue": rescue}
    if batch_name:
        options["batch_name"] = batch_name
    done = queue_dag(ctx.store, file, ctx.settings, owner=owner, queue=queue,
                     options={k: v for k, v in options.items() if v is not None})
    click.echo(f"DAG {file} submitted as {done.dag_id}: {len(done.clusters)} node job "
               f"cluster(s).")
