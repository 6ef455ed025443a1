"""`jobstore status`, as condor_status: the pool's slots as their nodes' agents published them."""

from __future__ import annotations

import click
from classad2 import ClassAd

from jobstore.api.pool import slot_ads
from jobstore.cli.context import Context, guard, pass_ctx
from jobstore.errors import InvalidInput
from jobstore.formats import views
from jobstore.formats.classads import get_float, get_int, get_str, sprint_ad

_STATES = ("Owner", "Claimed", "Unclaimed", "Matched", "Preempting", "Drained", "Backfill")


@click.command()
@click.argument("attrs", nargs=-1, metavar="[ATTR]...")
@click.option("-constraint", "--constraint", "constraint", metavar="EXPR",
              help="Only slots for which the ClassAd expression EXPR is true.")
@click.option("-af", "-autoformat", "--autoformat", "autoformat", is_flag=True,
              help="Print the attributes (or expressions) given as arguments, a line a slot.")
@click.option("-compact", "--compact", "compact", is_flag=True,
              help="One line per machine: its slots, CPUs, memory and states.")
@click.option("-total", "-totals", "--total", "total", is_flag=True,
              help="Only the totals: slots by Arch/OpSys and State.")
@click.option("-l", "-long", "--long", "long", is_flag=True, help="Full slot ads.")
@pass_ctx
@guard
def status(ctx: Context, attrs: tuple[str, ...], constraint: str | None, autoformat: bool,
           compact: bool, total: bool, long: bool) -> None:
    """List the pool's slots, like condor_status: those the nodes' agents published (each
    agent every UPDATE_INTERVAL, from the slot ads its startd gives FETCH_WORK); a slot not
    heard of for CLASSAD_LIFETIME is left out."""
    try:
        slots = list(slot_ads(ctx.store, constraint))
    except Exception as exc:  # classad2's parse errors
        raise InvalidInput(f"-constraint: not a ClassAd expression: {constraint}") from exc
    if autoformat or attrs:
        exprs = views.af_exprs(attrs)
        for ad in slots:
            click.echo(views.autoformat(ad, exprs))
    elif long:
        for ad in slots:
            click.echo(sprint_ad(ad))
    elif compact:
        click.echo(views.format_table(*_compact(slots)))
    else:
        if not total:
            click.echo(views.format_table(*_rows(slots)) + "\n")
        click.echo(views.format_table(*_totals(slots)))


def _rows(slots: list[ClassAd]) -> tuple[list[str], list[list[str]]]:
    header = ["Name", "OpSys", "Arch", "State", "Activity", "LoadAv", "Mem", "Cpus", "GPUs"]
    rows = [[get_str(ad, "Name") or "", get_str(ad, "OpSys") or "", get_str(ad, "Arch") or "",
             get_str(ad, "State") or "", get_str(ad, "Activity") or "",
             f"{get_float(ad, 'LoadAvg') or 0.0:.3f}", str(get_int(ad, "Memory") or 0),
             str(get_int(ad, "Cpus") or 0), str(get_int(ad, "GPUs") or 0)] for ad in slots]
    return header, rows


def _compact(slots: list[ClassAd]) -> tuple[list[str], list[list[str]]]:
    machines: dict[str, list[ClassAd]] = {}
    for ad in slots:
        machines.setdefault(get_str(ad, "Machine") or "", []).append(ad)
    header = ["Machine", "Platform", "Slots", "Cpus", "Gpus", "TotalGb", "FreCpu", "St"]
    rows = []
    for machine, ads in sorted(machines.items()):
        first = ads[0]
        free = sum(get_int(a, "Cpus") or 0 for a in ads if get_str(a, "State") == "Unclaimed")
        states = "".join(sorted({(get_str(a, "State") or "?")[0] for a in ads}))
        rows.append([machine, f"{get_str(first, 'Arch') or ''}/{get_str(first, 'OpSys') or ''}",
                     str(len(ads)), str(sum(get_int(a, "Cpus") or 0 for a in ads)),
                     str(sum(get_int(a, "GPUs") or 0 for a in ads)),
                     f"{sum(get_int(a, 'Memory') or 0 for a in ads) / 1024:.2f}", str(free),
                     states])
    return header, rows


def _totals(slots: list[ClassAd]) -> tuple[list[str], list[list[str]]]:
    groups: dict[str, dict[str, int]] = {}
    for ad in slots:
        key = f"{get_str(ad, 'Arch') or '?'}/{get_str(ad, 'OpSys') or '?'}"
        counts = groups.setdefault(key, {})
        state = get_str(ad, "State") or "Owner"
        counts[state] = counts.get(state, 0) + 1
    header = ["", "Total", *_STATES]
    rows = [[key, str(sum(c.values())), *(str(c.get(s, 0)) for s in _STATES)]
            for key, c in sorted(groups.items())]
    every = {s: sum(c.get(s, 0) for c in groups.values()) for s in _STATES}
    rows.append(["Total", str(len(slots)), *(str(every[s]) for s in _STATES)])
    return header, rows
