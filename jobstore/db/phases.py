"""Conditions on a job's status in the form the partial indexes of jobs can serve: the indexes
name the phase (`jobs.phase`, jobstore.core.states.PHASES), so a condition on statuses says
which phases they lie in, and the statuses too where they are not whole phases."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import ColumnElement, and_, false, literal_column, true

from jobstore.core.states import PHASES, Status
from jobstore.db.schema import jobs


def status_in(statuses: Iterable[str]) -> ColumnElement[bool]:
    """`jobs.status IN statuses`, with the phase condition of the partial indexes."""
    wanted = {Status(s) for s in statuses}
    if not wanted:
        return false()
    phases = sorted({PHASES[s] for s in wanted})
    in_phases = (jobs.c.phase == _const(phases[0]) if len(phases) == 1
                 else jobs.c.phase.in_([_const(p) for p in phases]))
    if {s for s, p in PHASES.items() if p in phases} == wanted:
        return in_phases
    return and_(in_phases, jobs.c.status.in_(sorted(wanted)))


def status_not_in(statuses: Iterable[str]) -> ColumnElement[bool]:
    """`jobs.status NOT IN statuses`, with the phase condition of the partial indexes (a phase
    left out whole is `phase <> ...`, as ix_jobs_unfinished's predicate says)."""
    unwanted = {Status(s) for s in statuses}
    gone = sorted({p for p in PHASES.values()
                   if all(s in unwanted for s, q in PHASES.items() if q == p)})
    terms: list[ColumnElement[bool]] = [jobs.c.phase != _const(p) for p in gone]
    partial = sorted(s for s in unwanted if PHASES[s] not in gone)
    if partial:
        terms.append(jobs.c.status.not_in(partial))
    return and_(*terms) if terms else true()


def _const(phase: str) -> ColumnElement[str]:
    # a literal, as in the indexes' predicates: the planner proves a partial index usable from
    # constants, never from a bound parameter of a generic plan
    return literal_column(f"'{phase}'")
