"""htcondor-jobstore: fetch-work hooks that pull HTCondor jobs from a job database.

The public face for Python callers, loaded on first use so that the hooks, which import
`jobstore.agent.client`, never pay for the database layers:

    import jobstore
    schedd = jobstore.Schedd()   # as htcondor2.Schedd(): submit, query, act, edit, history
"""

__version__ = "0.1.0"

# name -> the module that defines it
_PUBLIC = {
    "Schedd": "jobstore.api.schedd",
    "SubmitResult": "jobstore.api.schedd",
    "Submit": "jobstore.api.dags",
    "JobAction": "jobstore.api.schedd",
    "JobStore": "jobstore.db.store",
    "Outcome": "jobstore.db.store",
    "Job": "jobstore.core.jobs",
    "JobEvent": "jobstore.core.jobs",
    "JobSpec": "jobstore.core.jobs",
    "JobFinished": "jobstore.api.watch",
    "subscribe": "jobstore.api.watch",
    "watch": "jobstore.api.watch",
    "submit_path": "jobstore.api.submission",
    "SubmitError": "jobstore.submit",
    "load_jobs": "jobstore.submit",
    "JobstoreError": "jobstore.errors",
    "InvalidInput": "jobstore.errors",
    "DatabaseError": "jobstore.errors",
    "UnknownJob": "jobstore.errors",
}
__all__ = sorted(_PUBLIC)


# No imports up here: the hooks import this package first, and `typing` alone would cost them
# more than the rest of their start (tests/unit/test_layers.py). Type checkers see the names below.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from jobstore.api.dags import Submit  # noqa: F401
    from jobstore.api.schedd import JobAction, Schedd, SubmitResult  # noqa: F401
    from jobstore.api.submission import submit_path  # noqa: F401
    from jobstore.api.watch import JobFinished, subscribe, watch  # noqa: F401
    from jobstore.core.jobs import Job, JobEvent, JobSpec  # noqa: F401
    from jobstore.db.store import JobStore, Outcome  # noqa: F401
    from jobstore.errors import DatabaseError, InvalidInput, JobstoreError, UnknownJob  # noqa: F401
    from jobstore.submit import SubmitError, load_jobs  # noqa: F401


def __getattr__(name: str) -> object:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'jobstore' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
