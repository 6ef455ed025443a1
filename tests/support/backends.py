"""Which databases a test runs on in `make test`: conftest's db_url gives SQLite there (and
PostgreSQL in `make test-slow`); a test where both are the point runs on both in every step."""

from __future__ import annotations

import pytest

BOTH_BACKENDS = pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
