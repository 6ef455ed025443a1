"""Errors shared by the layers, in a module that imports nothing heavy."""


class DatabaseError(RuntimeError):
    """The database cannot be used; the message is safe to show (no password)."""


class UnknownJob(LookupError):
    """No job with that id."""


class NotOwner(PermissionError):
    """A report about a job from an account that does not own it."""

    def __init__(self, job_id: int, who: str) -> None:
        super().__init__(f"{who} may not report on job {job_id} (not its owner)")
        self.job_id = job_id
