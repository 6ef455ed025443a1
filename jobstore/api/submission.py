"""Submitting: job specs from a file, checked for owner and wire safety, into the job store."""

from __future__ import annotations

import os
import pwd
import re
from pathlib import Path
from typing import Any

from jobstore.db.store import JobStore, NewJob
from jobstore.formats.classads import AdError, Expr, Value
from jobstore.formats.jobads import RESERVED, render_job, to_json
from jobstore.node import config
from jobstore.node.accounts import owner_refusal
from jobstore.submit.language import JobSpec, SubmitError, load_jobs

__all__ = ["submit_path", "specs_to_new_jobs", "invoking_user", "SubmitError"]


# POSIX portable user names (useradd's default NAME_REGEX, plus upper case): it becomes part of
# User = "owner@uid_domain", which the starter splits at the '@'.
ACCOUNT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


def invoking_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def choose_owner(requested: str | None, settings: config.Settings) -> str:
    """The job owner: the invoking user, or (for root only) an allowed account named by --owner."""
    me = invoking_user()
    owner = requested or me
    if requested and requested != me and os.getuid() != 0:
        raise SubmitError(f"only root may submit jobs for another user ({requested})")
    if owner == "root" and not requested:
        raise SubmitError(
            "jobs may not run as root: submit as a user, or as root with --owner USER"
        )
    if not ACCOUNT_NAME.fullmatch(owner):
        raise SubmitError(f"{owner!r} is not a valid account name")
    refused = owner_refusal(owner, settings)
    if refused:
        raise SubmitError(refused)
    return owner


def _ad(spec: JobSpec) -> dict[str, Any]:
    attrs: dict[str, Value] = {"Cmd": spec.cmd}
    if spec.args:
        attrs["Arguments"] = spec.args
    if spec.env:
        attrs["Environment"] = spec.env
    attrs["Iwd"] = spec.iwd
    for name, value in (("In", spec.input), ("Out", spec.output), ("Err", spec.error)):
        if value:
            attrs[name] = value
    if spec.requirements:
        attrs["Requirements"] = Expr(spec.requirements)
    if spec.user_log:
        attrs["UserLog"] = spec.user_log
    if spec.max_retries is not None:
        attrs["MaxRetries"] = spec.max_retries
        attrs["SuccessExitCode"] = spec.success_exit_code
    for name, text in spec.custom.items():
        if name.lower() in RESERVED or name.lower() in {a.lower() for a in attrs}:
            raise SubmitError(f"+{name}: attribute is set by the job store and cannot be submitted")
        attrs[name] = Expr(text)
    return {name: to_json(value) for name, value in attrs.items()}


def specs_to_new_jobs(specs: list[JobSpec]) -> list[NewJob]:
    return [
        NewJob(
            proc_id=spec.proc_id,
            cmd=spec.cmd,
            ad=_ad(spec),
            request_cpus=spec.request_cpus,
            request_memory=spec.request_memory,
            request_disk=spec.request_disk,
            requirements=spec.requirements,
            priority=spec.priority,
            max_retries=spec.max_retries,
            success_exit_code=spec.success_exit_code,
            retry_until=spec.retry_until,
            user_log=spec.user_log,
        )
        for spec in specs
    ]


def _check_renders(new_jobs: list[NewJob], owner: str, settings: config.Settings) -> None:
    """Render every job's ad as FETCH_WORK would, so a job that cannot be sent is refused now."""
    for nj in new_jobs:
        row = {
            "ad": nj.ad,
            "owner": owner,
            "cluster_id": 1,
            "proc_id": nj.proc_id,
            "id": 1,
            "submitted_at": 0,
            "priority": nj.priority,
            "request_cpus": nj.request_cpus,
            "request_memory": nj.request_memory,
            "request_disk": nj.request_disk,
            "queue": settings.queue,
            "claims": 1,
            "token": "0" * 32,
        }
        try:
            render_job(
                row,
                keyword=settings.keyword,
                uid_domain=settings.uid_domain,
                job_lease_duration=settings.job_lease_duration,
            )
        except AdError as exc:
            raise SubmitError(f"proc {nj.proc_id}: {exc}") from None


def submit_path(
    store: JobStore,
    path: str | Path,
    settings: config.Settings,
    *,
    owner: str | None = None,
    queue: str | None = None,
) -> tuple[int, list[int]]:
    """Read a submit description or ClassAd file and queue its jobs as one cluster."""
    specs = load_jobs(path)
    if not specs:
        raise SubmitError(f"{path}: no jobs to queue")
    who = choose_owner(owner, settings)
    new_jobs = specs_to_new_jobs(specs)
    _check_renders(new_jobs, who, settings)
    return store.submit(
        new_jobs,
        owner=who,
        queue=queue or settings.queue,
        max_attempts=settings.max_attempts,
        submit_file=str(Path(path).absolute()),
    )
