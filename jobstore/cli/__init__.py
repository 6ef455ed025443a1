"""The `jobstore` command: a thin layer over the package."""

from jobstore.cli.commands import main

__all__ = ["main"]
