"""Submitting: job specs from a file, checked for owner and wire safety, into the job store."""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Callable
from pathlib import Path

from jobstore.core.jobs import Job
from jobstore.db.backends import Identity
from jobstore.db.store import JobStore
from jobstore.errors import AdError
from jobstore.formats.jobads import render_job
from jobstore.node import config
from jobstore.node.accounts import owner_refusal
from jobstore.submit import SubmitError, load_jobs

__all__ = ["submit_path", "invoking_user", "choose_owner", "render_check", "SubmitError"]


# POSIX portable user names (useradd's default NAME_REGEX, plus upper case): it becomes part of
# User = "owner@uid_domain", which the starter splits at the '@'.
ACCOUNT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


def invoking_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def choose_owner(requested: str | None, settings: config.Settings, identity: Identity) -> str:
    """The job owner. A submitter's own database role (PostgreSQL) submits as the account the
    database says it is; `requested` is passed on for the database to refuse unless the session
    is a queue super user allowed to impersonate it. A trusted session (the store's owner role,
    or a SQLite store: one user's) submits as the invoking user, or (root only) as `requested`.
    Never root, a system account or an account the keyword does not allow."""
    me = invoking_user() if identity.trusted else identity.account
    owner = requested or me
    if identity.trusted and owner == "root" and not requested:
        raise SubmitError(
            "jobs may not run as root: submit as a user, or as root with --owner USER"
        )
    # what is wrong with the name itself first: a line break in it never reaches a message
    if not ACCOUNT_NAME.fullmatch(owner):
        raise SubmitError(f"{owner!r} is not a valid account name")
    refused = owner_refusal(owner, settings)
    if refused:
        raise SubmitError(refused)
    if identity.trusted and owner != me and os.getuid() != 0:
        raise SubmitError(f"only root may submit jobs for another user ({owner})")
    return owner


def render_check(settings: config.Settings) -> Callable[[Job], None]:
    """What the store calls on every job it queues (Submissions.submit's `check`): render its ad
    as FETCH_WORK would, so that a job that cannot be sent is refused now (SubmitError: the
    whole submit rolls back)."""

    def check(job: Job) -> None:
        try:
            render_job(
                job.but(claims=1, token="0" * 32),
                keyword=settings.keyword,
                uid_domain=settings.uid_domain,
                job_lease_duration=settings.job_lease_duration,
            )
        except AdError as exc:
            raise SubmitError(f"proc {job.proc_id}: {exc}") from None

    return check


def submit_path(
    store: JobStore,
    path: str | Path,
    settings: config.Settings,
    *,
    owner: str | None = None,
    queue: str | None = None,
    spool: bool = False,
) -> tuple[int, list[int]]:
    """Read a submit description or ClassAd file and queue its jobs as one cluster; their
    outputs go home to this access point (`jobstore schedd` writes them into each job's Iwd),
    or, `spool`ed, wait in the store for transfer-data."""
    specs = load_jobs(path)
    if not specs:
        raise SubmitError(f"{path}: no jobs to queue")
    who = choose_owner(owner, settings, store.db.identity())
    return store.submissions.submit(
        specs,
        owner=who,
        queue=queue or settings.queue,
        max_attempts=settings.max_attempts,
        submit_file=str(Path(path).absolute()),
        check=render_check(settings),
        home=None if spool else settings.access_point(),
    )
