"""What the submit readers raise: one-line errors naming the file and the command."""

from __future__ import annotations

from jobstore.errors import JobstoreError

MAX_PROCS = 100_000
"""Largest number of procs one submit file may produce."""


class FieldError(JobstoreError, ValueError):
    """A bad value, with the command or attribute it belongs to."""

    def __init__(self, what: str, message: str) -> None:
        super().__init__(message)
        self.what = what


class SubmitError(JobstoreError):
    """A submit description or ClassAd file cannot be turned into jobs."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
