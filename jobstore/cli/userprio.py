"""`jobstore userprio`, as condor_userprio: the fair-share table, factors and usage resets."""

from __future__ import annotations

import json
import time

import click

from jobstore.cli.context import Context, fail, guard, pass_ctx
from jobstore.db.store import JobStore
from jobstore.errors import Refused
from jobstore.formats import views


@click.command()
@click.option("-setfactor", "--setfactor", "setfactor", nargs=2, metavar="SUBMITTER FACTOR",
              help="Set a submitter's priority factor (at least 1; effective priority = real "
              "priority x factor, so a larger factor means a smaller share).")
@click.option("-resetusage", "--resetusage", "resetusage", metavar="SUBMITTER",
              help="Reset a submitter's accumulated usage and real priority.")
@click.option("-resetall", "--resetall", "resetall", is_flag=True,
              help="Reset the accumulated usage and real priority of every submitter.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (HTCondor's attribute names).")
@pass_ctx
@guard
def userprio(
    ctx: Context, setfactor: tuple[str, str] | None, resetusage: str | None, resetall: bool,
    as_json: bool,
) -> None:
    """Show fair share between submitters, as condor_userprio: effective priority (smaller is
    better: a larger share of the slots), real priority (decayed use, PRIORITY_HALFLIFE),
    factor, weighted slots in use, accumulated usage, usage start and last usage. Priorities and
    usage are the accountant's last update (`jobstore reap`, or fetches now and then)."""
    store = ctx.store
    try:
        _userprio(store, setfactor, resetusage, resetall, as_json)
    except Refused:
        option = "-setfactor" if setfactor else "-resetusage" if resetusage else "-resetall"
        fail(f"userprio {option} needs the job store's admin role (the owner's, or one that "
             f"`jobstore grant-user --admin` named); {store.db.identity().account} has neither")


def _userprio(store: JobStore, setfactor: tuple[str, str] | None, resetusage: str | None,
              resetall: bool, as_json: bool) -> None:
    if setfactor:
        name, text = setfactor
        try:
            factor = float(text)
            if not store.admin_settings.set_factor(name, factor):
                fail(f"no submitter {name!r}; it appears with its first job")
        except ValueError:
            fail(f"bad priority factor {text!r}: a number of at least 1")
        click.echo(f"The priority factor of {name} was set to {factor:g}")
        return
    if resetusage or resetall:
        done = store.admin_settings.reset_usage(None if resetall else resetusage)
        if resetusage and not done:
            fail(f"no submitter {resetusage!r}")
        click.echo(f"The accumulated usage of {done} submitter(s) was reset")
        return
    now = time.time()
    table = store.negotiator.usage_table()
    if as_json:
        click.echo(json.dumps(views.userprio_json(table, now), indent=1))
        return
    if table:
        last = max(u.updated_at for u, _ in table)
        click.echo(f"Last Priority Update: {time.strftime('%m/%d %H:%M', time.localtime(last))}")
    click.echo(views.format_table(*views.userprio_rows(table, now)))
    click.echo(f"\nNumber of submitters: {len(table)}")
