"""condor_transfer_data for fetched jobs: a finished job's outputs, which its
JOB_EXIT sent back into the store, written where condor_submit's commands say they go on the
submit side (transfer_output_remaps, output and error, else the job's Iwd)."""

from __future__ import annotations

import functools
import os
import pwd
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from classad2 import ExprTree

from jobstore.api.ownerwrite import Wanted, write_as
from jobstore.api.query import Shown, iter_query
from jobstore.core.accounts import ordinary_uid
from jobstore.core.jobs import Job
from jobstore.db.sandbox import OUT
from jobstore.db.store import JobStore
from jobstore.errors import DatabaseError, InvalidInput
from jobstore.formats.classads import Expr
from jobstore.formats.jobads import stored_attrs
from jobstore.submit.transfer import output_destination, parse_remaps


@dataclass(frozen=True)
class Retrieved:
    """The outputs of one job written on the submit side: (output, where it went)."""

    job: Job
    written: tuple[tuple[str, str], ...]


def retrieve(store: JobStore, shown: Shown, ids: Sequence[str] = (),
             constraint: str | None = None) -> list[Retrieved]:
    """Write the outputs of the jobs named (finished or not; those that sent none are left
    out) to their submit-side paths, each by a rename of a whole file, never half of one; as
    root, with the rights of each job's owner."""
    out = []
    for job in iter_query(store, shown, ids, constraint, include_final=True):
        written = write_outputs(store, job)
        if written:
            out.append(Retrieved(job, written))
    return out


def write_outputs(store: JobStore, job: Job) -> tuple[tuple[str, str], ...]:
    """Write the outputs `job` sent (none: nothing) to their submit-side paths, as its owner
    when this process is root: (output, where it went) of each. Nothing of the job's ad is
    evaluated (its remaps and its lists are string literals or refused), and root writes for
    no account but a SQLite store's own owner (who may write any of its rows)."""
    files = store.files.job_files_of(job, OUT)  # the newest attempt's
    if not files:
        return ()
    name = f"job {job.cluster_id}.{job.proc_id}"
    if os.geteuid() == 0:
        _check_owner_as_root(store, name, job.owner)
    ad = stored_attrs(job.ad, strict=False)
    iwd = _literal(name, ad, "Iwd") or "/"
    if not os.path.isabs(iwd):
        raise InvalidInput(f"{name}: its Iwd {iwd!r} is not an absolute path")
    remaps = parse_remaps(_literal(name, ad, "TransferOutputRemaps"))
    listed = tuple(n.strip() for n in _literal(name, ad, "TransferOutput").split(",")
                   if n.strip())
    out, err = _literal(name, ad, "Out"), _literal(name, ad, "Err")
    wanted = []
    for f in files:
        dest = output_destination(f.name, iwd, remaps, _path(out), _path(err), listed)
        wanted.append((f.name, Wanted(dest, f.mode, f.size, functools.partial(
            store.files.file_content, f.owner, f.sha256))))
    budget = BUDGET + sum(w.size for _, w in wanted) / BUDGET_RATE + PER_FILE * len(wanted)
    write_as(job.owner, [w for _, w in wanted], budget)
    return tuple((name, w.dest) for name, w in wanted)


# How long root's writer may take for one job's outputs: BUDGET seconds, one more per
# BUDGET_RATE bytes and PER_FILE per file (a directory of hers that stalls holds nobody else's).
BUDGET, BUDGET_RATE, PER_FILE = 60.0, float(1 << 20), 0.01


def _check_owner_as_root(store: JobStore, name: str, owner: str) -> None:
    """Root writes for an ordinary account only, and only from a store whose rows it may take
    at their word (PostgreSQL's, or a SQLite file of root's alone)."""
    try:
        uid = pwd.getpwnam(owner).pw_uid
    except KeyError:
        raise InvalidInput(f"account {owner} is not on this machine") from None
    if not ordinary_uid(uid):
        raise InvalidInput(f"{name} is {owner}'s: root writes no outputs of a system account")
    try:
        mine = store.db.backend.local_owner()
    except DatabaseError as exc:  # the file, not the database: this job's failure
        raise InvalidInput(str(exc)) from None
    if mine is not None:
        raise InvalidInput(f"the job store is {mine}'s SQLite file, whose rows she may write: "
                           f"root writes none of its outputs (run it as {mine})")


# A ClassAd string literal: its value is read without evaluating anything of a job's.
LITERAL = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)


def _literal(job: str, ad: Mapping[str, object], name: str) -> str:
    """The string value of attribute `name` ("" when unset); InvalidInput when it is an
    expression (condor_submit writes these as literals)."""
    value = ad.get(name)
    if not isinstance(value, Expr):  # a plain value (an Expr is a str too)
        return value if isinstance(value, str) else ""
    text = str(value).strip()
    if not LITERAL.fullmatch(text):
        raise InvalidInput(f"{job}: its {name} is not a string literal")
    result = ExprTree(text).eval()
    return result if isinstance(result, str) else ""


def _path(value: str) -> str | None:
    return value if value and value != "/dev/null" else None
