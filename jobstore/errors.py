"""Every error class of the job store, in a module that imports nothing (the hooks' hot path
imports it too).

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


# ---- What a caller gave: ClassAds, submit files, DAGs, constraints, inputs ------------------
class AdError(JobstoreError, ValueError):
    """Input that is not the ClassAd text HTCondor would send."""


class RemapError(JobstoreError, ValueError):
    """A pair that is not NAME = TARGET."""


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


class DagError(SubmitError):
    """A DAG file that cannot be run: names the file and the line."""


class ConstraintError(JobstoreError, ValueError):
    """A constraint that is not a ClassAd expression."""


class InputTooLarge(JobstoreError, ValueError):
    """A submit's input over the store's limits (store_limits); the message says the way."""


class FileChanged(JobstoreError, ValueError):
    """A file changed while it was being stored (its bytes no longer have the hash read)."""


# ---- The database ---------------------------------------------------------------------------
class RowChanged(DatabaseError):
    """The job row changed between its read and the write that depended on it."""


# ---- The execute node: hooks, reports, the spool, sandboxes, expressions --------------------
class HookError(JobstoreError):
    """A one-line, user-facing reason why a hook did nothing."""


class BadReport(JobstoreError, ValueError):
    """A report that no genuine hook could have written; never applied."""


class ForeignReport(JobstoreError):
    """A report about a job of another job store (it names another database): never applied
    here; the replay of its own keyword sends it."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"the report about job {job_id} belongs to another job store")
        self.job_id = job_id


class SpoolError(JobstoreError, OSError):
    """The spool directory cannot be used safely."""


class NotWritten(JobstoreError, OSError):
    """Files that could not be written as their owner where they go (why, in one line)."""


class NotRead(JobstoreError, OSError):
    """Files that could not be read as their owner (why, in one line)."""


class SandboxError(JobstoreError):
    """Why a sandbox cannot be made, filled or sent back; errno when the system said one."""

    def __init__(self, message: str, err: int = 0) -> None:
        super().__init__(message)
        self.errno = err


class HandOff(JobstoreError):
    """JOB_EXIT's time for sending the outputs is up: the agent sends the rest (agent mode)."""

    def __init__(self) -> None:
        super().__init__("outputs not all sent in JOB_EXIT's time: handed to the agent")


class WorkerUnavailable(JobstoreError, RuntimeError):
    """No worker process could be started: nothing is judged (and nobody held) meanwhile."""


class TooCostly(JobstoreError):
    """A job's expression took longer than the bound (`seconds`) to evaluate."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        super().__init__(self.reason("an expression"))

    def reason(self, what: str) -> str:
        """The hold reason of a job whose `what` took too long to evaluate."""
        return (f"{what} took more than {self.seconds:g} s to evaluate (the job store's bound "
                "on a job's expressions): the job is held so that it costs the node nothing "
                "more")


class Died(TooCostly):
    """A worker died evaluating an expression, the second time it was asked (a fresh worker
    the second time): whatever in it kills libclassad, the job is held."""

    def reason(self, what: str) -> str:
        return (f"{what} made the job store's expression worker die twice: the job is held so "
                "that it costs the node nothing more")


# ---- The agent and the emulated startd ------------------------------------------------------
class ProtocolError(JobstoreError, ValueError):
    """A malformed or oversized message."""


class AgentError(JobstoreError, RuntimeError):
    """The agent cannot start; the message is one line for the user."""


class StarterFailed(JobstoreError):
    """Initialisation failure: the real starter does DC_Exit(1) and runs no hook."""
