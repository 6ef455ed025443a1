"""How many examples a Hypothesis test tries: few in `make test` (a developer's quick run), the
number the test asks for in `make test-slow` (JOBSTORE_TEST_EXAMPLES=large), which CI runs too."""

from __future__ import annotations

import os

LARGE = os.environ.get("JOBSTORE_TEST_EXAMPLES") == "large"
SMALL = 25  # a test's examples in `make test`, at most
UNSPECIFIED_LARGE = 200  # a test that names no number, in `make test-slow`


def examples(wanted: int) -> int:
    """`wanted` examples in the large run, at most SMALL in the quick one."""
    return wanted if LARGE else min(wanted, SMALL)
