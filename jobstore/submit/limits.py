"""The submit readers' limits."""

from __future__ import annotations

MAX_PROCS = 100_000
"""Largest number of procs one submit file may produce."""
