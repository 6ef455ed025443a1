"""Errors of `jobstore.Schedd` as htcondor2 raises them: each is still the package's own type
(every JobstoreError: SubmitError, DatabaseError, UnknownJob, NotOwner, InvalidInput, ...; a
ValueError, PermissionError or LookupError) and also an
htcondor2.HTCondorException, so that `except htcondor2.HTCondorException` catches it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import htcondor2

from jobstore.errors import JobstoreError

F = TypeVar("F", bound=Callable[..., Any])
_TRANSLATED = (JobstoreError, ValueError, PermissionError, LookupError)


_MIXED: dict[type[BaseException], type[BaseException]] = {}


def _mixed(cls: type[BaseException]) -> type[BaseException]:
    """`cls` that is also an htcondor2.HTCondorException (one class per error type)."""
    if cls not in _MIXED:
        _MIXED[cls] = type(cls.__name__, (cls, htcondor2.HTCondorException),
                           {"__module__": cls.__module__, "__doc__": cls.__doc__})
    return _MIXED[cls]


def as_htcondor(exc: BaseException) -> BaseException:
    """`exc` as an instance of its type mixed with htcondor2.HTCondorException: the same
    message and attributes."""
    if isinstance(exc, htcondor2.HTCondorException):
        return exc
    cls = _mixed(type(exc))
    new = None
    for base in cls.__mro__:  # the built-in base whose layout the instance has
        if base.__module__ == "builtins" and base is not object:
            try:
                new = base.__new__(cls, *exc.args)  # type: ignore[call-overload]
                break
            except TypeError:
                continue
    if new is None:
        return exc
    new.args = exc.args
    new.__dict__.update(vars(exc))
    return new


def htcondor_errors(fn: F) -> F:
    """Raise what `fn` raises as htcondor2 exceptions (as_htcondor)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except _TRANSLATED as exc:
            raise as_htcondor(exc) from None

    return cast(F, wrapper)
