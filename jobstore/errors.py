"""Errors shared by the layers, in a module that imports nothing heavy."""


class DatabaseError(RuntimeError):
    """The database cannot be used; the message is safe to show (no password)."""


class UnknownJob(LookupError):
    """No job with that id."""
