"""The access point's service in-process: the order in which it takes the jobs due."""

from __future__ import annotations

from jobstore.accesspoint.outputs import _by_turns
from jobstore.testing.factories import a_job


def test_one_owners_many_jobs_keep_nobody_waiting_behind_all_of_them() -> None:
    due = [a_job(id=i, owner=o) for i, o in enumerate("aaaabca")]
    assert [(j.owner, j.id) for j in _by_turns(due)] == [
        ("a", 0), ("b", 4), ("c", 5), ("a", 1), ("a", 2), ("a", 3), ("a", 6)]
