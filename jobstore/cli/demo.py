"""`jobstore demo` and `jobstore emulate`: an emulated execute node running the real hooks."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from jobstore.formats import views

DEMO_SUBMIT = """\
# A small cluster: each job says where it ran, and job N exits with code N.
executable = /bin/sh
arguments  = "-c 'echo job $(Process) ran as $(id -un) in $PWD; sleep 0.$(Process); \
exit $(Process)'"
output     = out.$(Process)
error      = err.$(Process)
request_cpus   = 1
request_memory = 64MB
request_disk   = 10MB
+Project   = "demo"
queue 6
"""
KEYWORD = "JOBSTORE"


def write_node_config(directory: Path, db_url: str, keyword: str = KEYWORD) -> Path:
    """An HTCondor configuration naming our keyword and database, as a real node would have."""
    path = directory / "condor_config"
    path.write_text(
        f"UID_DOMAIN = localdomain\nSTARTD_JOB_HOOK_KEYWORD = {keyword}\n"
        f"{keyword}_JOBSTORE_DATABASE_URL = {db_url}\n"
        f"JOBSTORE_HOOK_LOG = {directory / 'JobstoreHookLog'}\n"
    )
    os.chmod(path, 0o644)
    return path


def _ordinary_account() -> str | None:
    for entry in sorted(pwd.getpwall(), key=lambda e: e.pw_uid):
        if 1000 <= entry.pw_uid < 65534 and entry.pw_name != "root":
            return entry.pw_name
    return None


def demo_owner(requested: str | None) -> str:
    """Jobs never run as root: as root, use (or create) an ordinary account for the demo."""
    if requested:
        return requested
    if os.geteuid() != 0:
        return pwd.getpwuid(os.getuid()).pw_name
    found = _ordinary_account()
    if found:
        return found
    click.echo(
        "jobstore demo: no ordinary account on this machine; creating 'jobstore-demo' "
        "(jobs never run as root)"
    )
    subprocess.run(["useradd", "--create-home", "jobstore-demo"], check=True)
    return "jobstore-demo"


def _run_emulator(
    hooks: dict[str, str],
    work: Path,
    db_url: str,
    condor_config: Path,
    *,
    slots: int,
    partitionable: bool,
    cpus: int,
    memory: int,
    timeout: float,
    condor_user: str | None,
    until_done: bool,
):  # type: ignore[no-untyped-def]
    from jobstore.db.store import JobStore
    from jobstore.emulator import Emulator, EmulatorConfig

    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/"),
        "CONDOR_CONFIG": str(condor_config),
        "JOBSTORE_DATABASE_URL": db_url,
    }
    cfg = EmulatorConfig(
        hooks=hooks,
        work_dir=str(work),
        keyword=KEYWORD,
        static_slots=slots,
        partitionable=partitionable,
        cpus=cpus,
        memory=memory,
        initial_update_interval=1.0,
        update_interval=5.0,
        fetch_work_delay='ifThenElse(State == "Claimed" && Activity == "Idle",0,1)',
        env=env,
        condor_user=condor_user,
    )
    store = JobStore.from_url(db_url)

    def all_done() -> bool:
        return not store.list_jobs()

    report = Emulator(cfg).run(
        until=all_done if until_done else None,
        timeout=timeout,
        idle_exit_after=None if until_done else 5.0,
        wait_for_jobs=True,
    )
    return report, store


def _check_traversable(path: Path, who: str) -> None:
    """As root the hooks run as `who`: every parent directory must let others through."""
    for parent in path.parents:
        if not parent.stat().st_mode & 0o001:
            raise click.ClickException(
                f"{parent} is not searchable by other accounts, so {who} cannot reach the demo "
                f"node in {path}; use --dir somewhere else (for example under /tmp)"
            )


@click.command()
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False),
    help="Where to keep the demo node (default: a new temporary directory).",
)
@click.option("--slots", default=2, show_default=True, help="Static slots of the node.")
@click.option("--owner", metavar="USER", help="Account the demo jobs run as.")
def demo(directory: str | None, slots: int, owner: str | None) -> None:
    """Run a few jobs end to end: embedded SQLite job store, emulated node, the real hooks."""
    from jobstore.agent.hooktemplates import install_hooks
    from jobstore.api.submission import submit_path
    from jobstore.db.engine import upgrade
    from jobstore.db.store import JobStore

    base = Path(directory or tempfile.mkdtemp(prefix="jobstore-demo-")).absolute()
    base.mkdir(parents=True, exist_ok=True)
    who = demo_owner(owner)
    account = pwd.getpwnam(who)
    db_url = f"sqlite:///{base / 'jobstore.db'}"
    condor_config = write_node_config(base, db_url)
    (base / "submit").mkdir(exist_ok=True)
    submit_file = base / "submit" / "demo.sub"
    submit_file.write_text(DEMO_SUBMIT)
    hook_dir = base / "hooks"
    hooks = install_hooks(hook_dir, sys.executable)
    upgrade(db_url)
    as_root = os.geteuid() == 0
    if as_root:
        _check_traversable(base, who)
        # The hooks and jobs run as `who` (HTCondor never runs them as root): give it the node.
        for path in (base, base / "submit", base / "jobstore.db"):
            os.chown(path, account.pw_uid, account.pw_gid)
        os.chmod(base, 0o755)
    os.environ["CONDOR_CONFIG"] = str(condor_config)
    from jobstore.node import config

    settings = config.load_settings(KEYWORD, db_url)
    store = JobStore.from_url(db_url)
    cluster, ids = submit_path(store, submit_file, settings, owner=who if as_root else None)
    click.echo(f"Submitted {len(ids)} jobs (cluster {cluster}) as {who} to {db_url}")
    click.echo(
        f"Running an emulated execute node with {slots} static slots and the real hooks "
        f"from {hook_dir} ..."
    )
    started = time.monotonic()
    report, store = _run_emulator(
        hooks,
        base / "node",
        db_url,
        condor_config,
        slots=slots,
        partitionable=False,
        cpus=slots,
        memory=1024 * slots,
        timeout=120,
        condor_user=who if as_root else None,
        until_done=True,
    )
    jobs = store.list_jobs(include_final=True)
    click.echo("")
    click.echo(views.format_table(*views.job_rows(jobs)))
    calls = len(report.hook_calls)
    click.echo(
        f"\n{sum(j.status == 'completed' for j in jobs)} of {len(jobs)} jobs completed "
        f"in {time.monotonic() - started:.1f} s; {calls} hook calls."
    )
    click.echo(
        f"Job output: {base / 'submit'}/out.N   events: jobstore --db {db_url} events {cluster}.0"
    )
    if any(j.status != "completed" for j in jobs):
        sys.exit(1)


@click.command()
@click.option("--slots", default=4, show_default=True, help="Static slots.")
@click.option("--partitionable", is_flag=True, help="One partitionable slot instead.")
@click.option("--cpus", default=4, show_default=True, help="CPUs of the node.")
@click.option("--memory", default=4096, show_default=True, help="Memory of the node, MiB.")
@click.option("--timeout", default=600.0, show_default=True, help="Stop after this many seconds.")
@click.option("--condor-user", metavar="USER", help="As root: run the startd hooks as USER.")
@click.option("--keep", is_flag=True, help="Keep the node's work directory.")
@click.pass_obj
def emulate(
    obj,
    slots: int,
    partitionable: bool,
    cpus: int,
    memory: int,
    timeout: float,
    condor_user: str | None,
    keep: bool,
) -> None:  # type: ignore[no-untyped-def]
    """Run an emulated execute node against the job store until no job is left."""
    from jobstore.agent.hooktemplates import install_hooks

    db_url = obj.settings.database_url
    work = Path(tempfile.mkdtemp(prefix="jobstore-node-"))
    os.chmod(work, 0o755)
    try:
        hooks = install_hooks(work / "hooks", sys.executable)
        condor_config = write_node_config(work, db_url)
        report, store = _run_emulator(
            hooks,
            work / "node",
            db_url,
            condor_config,
            slots=slots,
            partitionable=partitionable,
            cpus=cpus,
            memory=memory,
            timeout=timeout,
            condor_user=condor_user,
            until_done=True,
        )
        click.echo(f"{len(report.jobs)} job runs, {len(report.hook_calls)} hook calls")
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            click.echo(f"node kept in {work}")
