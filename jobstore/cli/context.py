"""What every `jobstore` command shares: the settings and store it works on, one-line errors."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from jobstore.api.query import Shown
from jobstore.db.store import JobStore
from jobstore.errors import JobstoreError, UnknownJob
from jobstore.node import config

ADMIN_STATEMENT_TIMEOUT_MS = 300_000


class Context:
    def __init__(self, db: str | None, keyword: str | None) -> None:
        self.db = db
        self.keyword = keyword
        self._settings: config.Settings | None = None
        self._store: JobStore | None = None

    @property
    def settings(self) -> config.Settings:
        if self._settings is None:
            self._settings = config.load_settings(self.keyword, self.db)
        return self._settings

    @property
    def database_url(self) -> str:
        """The URL with its password; ConfigError when the password file cannot be read."""
        if self.settings.credentials_error:
            raise config.ConfigError(self.settings.credentials_error)
        return self.settings.database_url

    @property
    def store(self) -> JobStore:
        if self._store is None:
            # Admin queries scan whole queues (q -autocluster over 1M jobs takes seconds); the
            # hooks' tight statement timeout protects slots, not an admin's terminal.
            self._store = JobStore.from_url(
                self.database_url, statement_timeout_ms=ADMIN_STATEMENT_TIMEOUT_MS
            )
        return self._store

    @property
    def shown(self) -> Shown:
        return Shown(self.settings.keyword, self.settings.uid_domain)


pass_ctx = click.make_pass_decorator(Context)


def fail(message: str) -> None:
    click.echo(f"jobstore: {message}", err=True)
    sys.exit(1)


def guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the job store's errors (JobstoreError) into one line on stderr and exit status 1;
    anything else is a bug, shown with its traceback."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UnknownJob as exc:
            fail(f"no such job: {exc.args[0]}")
        except JobstoreError as exc:
            fail(str(exc))

    return wrapper


class _UsageLine(click.ClickException):
    """A usage error shown as one line (click's own form takes four), exit status 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"jobstore: {self.message}", err=True)


def _usage_line(exc: click.UsageError) -> _UsageLine:
    sub = exc.ctx is not None and exc.ctx.parent is not None
    where = f"{exc.ctx.info_name}: " if sub and exc.ctx is not None else ""
    return _UsageLine(f"{where}{exc.format_message()} (see --help)")


class Group(click.Group):
    """The `jobstore` group: usage errors of the group and its commands in one line."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, _af_flags(args))

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:
            raise _usage_line(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise _usage_line(exc) from None


def _af_flags(args: list[str]) -> list[str]:
    """condor_q's `-af:jh` (and `-autoformat:jh`) as `-af --af-options jh`."""
    out: list[str] = []
    for arg in args:
        head, colon, flags = arg.partition(":")
        if colon and head in ("-af", "-autoformat", "--autoformat"):
            out += ["-af", "--af-options", flags]
        else:
            out.append(arg)
    return out
