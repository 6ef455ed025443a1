"""Test data that lives with the tests: tests/fixtures, with real HTCondor 25 hook transcripts
(see its README)."""

from __future__ import annotations

from pathlib import Path

# Test data that lives with the tests: real HTCondor 25 hook transcripts (see its README).
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TRANSCRIPTS = FIXTURES / "htcondor-transcripts"
