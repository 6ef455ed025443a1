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


def write_node_config(directory: Path, db_url: str, keyword: str = KEYWORD, *,
                      sandboxes: bool = False) -> Path:
    """An HTCondor configuration naming our keyword and database, as a real node would have;
    with `sandboxes`, a sandbox root of the node's own in `directory`, made now."""
    path = directory / "condor_config"
    text = (f"UID_DOMAIN = localdomain\nSTARTD_JOB_HOOK_KEYWORD = {keyword}\n"
            f"{keyword}_JOBSTORE_DATABASE_URL = {db_url}\n"
            f"JOBSTORE_HOOK_LOG = {directory / 'JobstoreHookLog'}\n")
    if sandboxes:
        from jobstore.node.sandboxroot import ensure_root

        ensure_root(str(directory / "sandboxes"))
        text += f"JOBSTORE_SANDBOX_ROOT = {directory / 'sandboxes'}\n"
    path.write_text(text)
    os.chmod(path, 0o644)
    return path


DEMO_ACCOUNT = "jobstore-demo"


def demo_owner(requested: str | None) -> str:
    """Jobs never run as root: as root, the demo's own account (made if missing), never a
    person's."""
    if requested:
        return requested
    if os.geteuid() != 0:
        return pwd.getpwuid(os.getuid()).pw_name
    try:
        pwd.getpwnam(DEMO_ACCOUNT)
    except KeyError:
        click.echo(f"jobstore demo: creating the account {DEMO_ACCOUNT!r} for its jobs (jobs "
                   "never run as root, nor as a person's account)")
        subprocess.run(["useradd", "--create-home", "--shell", "/usr/sbin/nologin",
                        DEMO_ACCOUNT], check=True)
    return DEMO_ACCOUNT


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
    progress: bool = False,
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
    line = _Progress() if progress else None

    def all_done() -> bool:
        """Nothing left that can run: every job finished or held."""
        counts = _counts(store)
        if line is not None:
            line.show(counts)
        return not any(n for status, n in counts.items() if status != "held"
                       and status not in FINISHED)

    report = Emulator(cfg).run(
        until=all_done if until_done else None,
        timeout=timeout,
        idle_exit_after=None if until_done else 5.0,
        wait_for_jobs=True,
    )
    if line is not None:
        line.end()
    return report, store


FINISHED = ("completed", "removed", "failed")


def _counts(store) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Jobs by status (one GROUP BY, JobReads.stats)."""
    out: dict[str, int] = {}
    for _queue, status, n in store.reads.stats():
        out[status] = out.get(status, 0) + n
    return out


class _Progress:
    """A live line of jobs done, running and waiting (a new line per change when stdout is not
    a terminal)."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.last = ""

    def show(self, counts: dict[str, int]) -> None:
        done = sum(counts.get(s, 0) for s in FINISHED)
        total = sum(counts.values())
        running = sum(counts.get(s, 0) for s in ("fetched", "accepted", "running"))
        text = (f"  {done} of {total} jobs done, {running} running, "
                f"{counts.get('idle', 0)} idle, {counts.get('held', 0)} held")
        if text == self.last:
            return
        self.last = text
        click.echo(f"\r{text}   " if self.tty else text, nl=not self.tty)

    def end(self) -> None:
        if self.tty and self.last:
            click.echo("")


def left_over(store, me: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Lines about the jobs a run left unfinished (held ones with their reason)."""
    left = [j for j in store.reads.list_jobs()]
    lines = []
    for job in left:
        why = f": {job.reason}" if job.status == "held" and job.reason else ""
        lines.append(f"  job {views.job_id(job)} is {job.status}{why}")
    if any(j.status == "held" for j in left):
        lines.append(f"  ({me} release JOB runs a held job again; {me} q -hold lists them)")
    return lines


def command_name() -> str:
    """How to call this `jobstore` from a shell: its name when it is on PATH, else its path."""
    argv0 = Path(sys.argv[0])
    found = shutil.which("jobstore")
    if argv0.name == "jobstore":
        if found and Path(found).resolve() == argv0.resolve():
            return "jobstore"
        return str(argv0.absolute())
    return f"{sys.executable} -m jobstore.cli"


def _check_interpreter(who: str) -> None:
    """As root the hooks run as `who` with this Python (their #! line) and this package: it
    must be able to run and read them, which a virtualenv, or an editable install, under a
    mode-700 home (/root) does not allow."""
    import jobstore

    python = Path(sys.executable)
    package = Path(jobstore.__file__).resolve().parent
    for what, path, fix in (
            (f"with {python}", python, "make the virtualenv where they can reach it"),
            (f"with the package in {package}", package,
             "install the package where they can read it")):
        for parent in path.parents:
            if not parent.stat().st_mode & 0o001:
                raise click.ClickException(
                    f"the hooks run as {who} {what}, but {parent} is not searchable by other "
                    f"accounts: {fix} (`make demo VENV=/opt/jobstore-venv` copies the package "
                    "into that venv) or clone under /tmp"
                )


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

    who = demo_owner(owner)
    if os.geteuid() == 0:
        _check_interpreter(who)
    base = Path(directory or tempfile.mkdtemp(prefix="jobstore-demo-")).absolute()
    base.mkdir(parents=True, exist_ok=True)
    account = pwd.getpwnam(who)
    db_url = f"sqlite:///{base / 'jobstore.db'}"
    condor_config = write_node_config(base, db_url, sandboxes=True)
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
        f"from {hook_dir}; the jobs run as {who} ..."
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
        progress=True,
    )
    jobs = store.reads.list_jobs(include_final=True)
    click.echo("")
    click.echo(views.format_table(*views.job_rows(jobs)))
    calls = len(report.hook_calls)
    click.echo(
        f"\n{sum(j.status == 'completed' for j in jobs)} of {len(jobs)} jobs completed "
        f"in {time.monotonic() - started:.1f} s; {calls} hook calls."
    )
    me = command_name()
    click.echo(f"Job output: {base / 'submit'}/out.N")
    click.echo(f"Events:     {me} --db {db_url} events {cluster}.0")
    if me != "jobstore":
        click.echo(f"({me} is not on PATH: run it by that path, or "
                   f"`export PATH={Path(me.split()[0]).parent}:$PATH` first)")
    if any(j.status != "completed" for j in jobs):
        for text in left_over(store, me):
            click.echo(text)
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
    """Run an emulated execute node against the job store until every job has finished or is
    held; exit status 1 (with the jobs and why) when some did not finish."""
    from jobstore.agent.hooktemplates import install_hooks

    db_url = obj.settings.database_url
    work = Path(tempfile.mkdtemp(prefix="jobstore-node-"))
    os.chmod(work, 0o755)
    try:
        hooks = install_hooks(work / "hooks", sys.executable)
        condor_config = write_node_config(work, db_url, sandboxes=True)
        try:
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
        except KeyboardInterrupt:
            click.echo("jobstore emulate: interrupted; the jobs that were running were evicted"
                       " (back to idle, as a startd shut down)", err=True)
            sys.exit(130)
        click.echo(f"{len(report.jobs)} job runs, {len(report.hook_calls)} hook calls")
        lines = left_over(store, command_name())
        if lines:
            click.echo(f"jobstore emulate: {len([x for x in lines if x.startswith('  job')])} "
                       "job(s) not finished:", err=True)
            for text in lines:
                click.echo(text, err=True)
            sys.exit(1)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            click.echo(f"node kept in {work}")
