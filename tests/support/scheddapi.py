"""The `schedd` fixture: jobstore.Schedd, the htcondor2-style Python API, on a migrated test
database, as an ordinary owner, in the test's tmp_path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import jobstore
from jobstore.db.engine import upgrade
from jobstore.testing.support import ordinary_owner


@pytest.fixture
def schedd(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    upgrade(db_url)
    monkeypatch.chdir(tmp_path)
    with jobstore.Schedd(url=db_url, owner=ordinary_owner()) as s:
        yield s
