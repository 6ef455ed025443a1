"""Which databases a test runs on in `make test`: conftest's db_url gives SQLite there (and
PostgreSQL in `make test-slow`, marked `matrix`); a test where both are the point runs on both
in `make test`."""

from __future__ import annotations

import pytest

BOTH_BACKENDS = pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
