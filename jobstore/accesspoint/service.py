"""The access point's service loop: its duties (outputs home, event logs, DAG node scripts)
each take a pass whenever the store announces a change, and at least every WAKE (POLL on
SQLite) seconds."""

from __future__ import annotations

import logging
import os
import pwd
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from jobstore.db.channels import CHANNEL
from jobstore.db.store import JobStore
from jobstore.errors import DatabaseError
from jobstore.formats import userlog, views
from jobstore.node import config
from jobstore.node.accounts import owner_refusal

LOG = logging.getLogger("jobstore.schedd")


class _Shown(logging.Filter):
    """What the service logs, with what is not printable as `?`: owners choose node names,
    commands and paths, and the log is read on root's terminal."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        shown = views.shown(text)
        if shown != text:
            record.msg, record.args = shown, None
        return True


LOG.addFilter(_Shown())
AWAY = 5.0  # seconds before the store is tried again when it cannot be reached
POLL = 0.5  # seconds between looks where the store cannot announce its changes (SQLite)
WAKE = 30.0  # seconds between looks where it can (a lost notification costs no more)
GAP = 0.1  # the least time between two looks (notifications anyone may send wake it)
STOP_CHECK = 0.5  # seconds between looks at whether to stop
OWNER_BUDGET = 5.0  # seconds of a pass one owner's failed logs may take (she may lock them)
MAX_SAID = 10_000  # troubles remembered as said (a DAG, an owner, a log), the latest


class Duty(Protocol):
    """One thing the service does: a pass over what is due now (a duty whose `busy` is true
    waits for what the store does not announce, and is looked at every POLL seconds)."""

    def pass_once(self) -> int: ...


def serving_account() -> str | None:
    """The account whose jobs alone this process serves: its own; None as root (every
    owner's, each as herself)."""
    return None if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name


def refusal(owner: str, mine: str | None, settings: config.Settings) -> str | None:
    """Why a service that serves `mine` (None: root's) writes nothing as `owner`; None if
    it may."""
    if mine is not None:
        return None if owner == mine else f"not {mine}'s job"
    try:
        pwd.getpwnam(owner)
    except KeyError:
        return f"account {owner} is not on this access point"
    return owner_refusal(owner, settings)


class SaidOnce:
    """Warnings said once each, by what they are about (a DAG of many nodes, an owner, a
    log): of the last MAX_SAID, so that a new one is always said."""

    def __init__(self) -> None:
        self._said: set[object] = set()

    def warn(self, about: object, message: str) -> None:
        if about in self._said:
            return
        if len(self._said) >= MAX_SAID:
            self._said.clear()
        self._said.add(about)
        LOG.warning("%s", message)


class LogWriter:
    """Appends to the logs of one pass, keeping the seconds each owner's failed appends took:
    past OWNER_BUDGET, the rest of hers are left out of the pass (she may keep them locked)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def over(self, owner: str) -> str | None:
        """Why the rest of `owner`'s logs are left out of this pass (None: they are not)."""
        if self.spent.get(owner, 0.0) > OWNER_BUDGET:
            return f"{owner}'s logs that failed took more than {OWNER_BUDGET:g} s of a pass"
        return None

    def append(self, path: str, text: str, owner: str) -> bool:
        """userlog.append as `owner`; its time charged to her when it fails."""
        start = time.monotonic()
        if userlog.append(path, text, owner=owner):
            return True
        self.spent[owner] = self.spent.get(owner, 0.0) + time.monotonic() - start
        return False


def serve(store: JobStore, settings: config.Settings, duties: Sequence[Duty],
          stop: Callable[[], bool]) -> None:
    """Run the `duties` until `stop()`: at once when the store announces a change
    (PostgreSQL), else every POLL seconds; every WAKE seconds in any case. A store that
    cannot be reached is tried again every AWAY seconds."""
    while not stop():
        try:
            _serve(store, settings, duties, stop)
        except DatabaseError as exc:
            LOG.warning("the job store cannot be reached: %s", exc)
        except Exception as exc:  # noqa: BLE001 - nothing stored stops the service
            LOG.error("a pass failed: %s: %s", type(exc).__name__, " ".join(str(exc).split()))
        else:
            return
        deadline = time.monotonic() + AWAY
        while not stop() and time.monotonic() < deadline:
            time.sleep(STOP_CHECK)


def _serve(store: JobStore, settings: config.Settings, duties: Sequence[Duty],
           stop: Callable[[], bool]) -> None:
    listener = None
    if store.db.can_listen:
        listener = store.db.listener(CHANNEL, settings.connect_timeout)
        listener.open()
    try:
        due = last = 0.0
        while not stop():
            if time.monotonic() >= due:
                for duty in duties:
                    duty.pass_once()
                last = time.monotonic()
                waiting = listener is not None and not any(
                    getattr(duty, "busy", False) for duty in duties)  # nothing announces it
                due = last + (WAKE if waiting else POLL)
            wait = max(0.0, min(STOP_CHECK, due - time.monotonic()))
            if listener is not None:
                if listener.wait(wait):
                    due = min(due, last + GAP)
            else:
                time.sleep(wait)
    finally:
        if listener is not None:
            listener.close()


__all__ = ["Duty", "LogWriter", "refusal", "serve", "serving_account"]
