"""Which accounts a job may run as: never root or a system account, only what the keyword's
configuration allows."""

from __future__ import annotations

import pwd

from jobstore.core.accounts import MIN_USER_UID, NOBODY_UID
from jobstore.node import config


def owner_refusal(owner: str, settings: config.Settings) -> str | None:
    """Why `owner` may not run jobs through this keyword, or None. Never root, a system
    account or a service account (JOBSTORE_AGENT_STARTD_USERS, else condor: it would talk to
    the agent as the startd). Asked at submit and at every fetch."""
    if owner == "root":
        return "jobs may not run as root"
    if owner in settings.service_accounts:
        return (f"account {owner} is a service account (JOBSTORE_AGENT_STARTD_USERS): jobs may"
                " not run as it")
    try:
        uid = pwd.getpwnam(owner).pw_uid
    except KeyError:
        uid = None
    if uid is not None and (uid < MIN_USER_UID or uid >= NOBODY_UID):
        return f"account {owner} is a system account (uid {uid})"
    if not settings.owner_allowed(owner):
        return f"owner {owner} is not in {settings.keyword}_JOBSTORE_ALLOWED_OWNERS"
    return None


def account_exists(owner: str) -> bool:
    try:
        pwd.getpwnam(owner)
    except KeyError:
        return False
    return True
