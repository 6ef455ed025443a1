"""htcondor-jobstore: fetch-work hooks that pull HTCondor jobs from a job database."""

__version__ = "0.1.0"
