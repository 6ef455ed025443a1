"""Errors shared by the layers, in a module that imports nothing (the hooks' hot path too).

Every error the job store raises on purpose is a JobstoreError, whose message is one line safe
to show a user; the CLI shows that line, and anything else (a bug) with its traceback.
"""


class JobstoreError(Exception):
    """The root of the job store's errors: the message is one line, safe to show."""


class InvalidInput(JobstoreError, ValueError):
    """A value, argument or file the caller gave that cannot be used; the message says why."""


class ConfigError(JobstoreError, ValueError):
    """A setting that cannot be used; the message names the parameter."""


class DatabaseError(JobstoreError, RuntimeError):
    """The database cannot be used; the message is safe to show (no password)."""


class Refused(DatabaseError, PermissionError):
    """The database refused what this session asked: it is not the job's owner, a queue super
    user or an admin (row-level security, privileges). The message says who and what."""


class UnknownJob(JobstoreError, LookupError):
    """No job with that id."""


class UnknownCluster(JobstoreError, LookupError):
    """No cluster (or DAG) with that id."""


class NotOwner(JobstoreError, PermissionError):
    """An account acts on, or reports on, a job it does not own."""

    def __init__(self, job_id: int, who: str, what: str = "report on") -> None:
        super().__init__(f"{who} may not {what} job {job_id} (not its owner)")
        self.job_id = job_id
