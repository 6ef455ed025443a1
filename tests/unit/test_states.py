"""The state machine table (jobstore.core.states): pure, no database.

The expected table is written out here independently of `TRANSITIONS`, so a change to the
table shows up as a failing test rather than a silently changed behaviour.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from jobstore.core.states import (
    FINAL,
    HANDED_OUT,
    HOOK_REPORTS,
    TRANSITIONS,
    Decision,
    Event,
    Status,
    decide,
    is_final,
)

S, E = Status, Event
HANDED = (S.FETCHED, S.ACCEPTED, S.RUNNING)
REQUEUE, EXIT_POLICY = "requeue", "exit-policy"

# event -> {from status: to status, or REQUEUE / EXIT_POLICY}
EXPECTED: dict[Event, dict[Status, Status | str]] = {
    E.SUBMIT: {},
    E.FETCH: {S.IDLE: S.FETCHED},
    E.ACCEPT: {S.FETCHED: S.ACCEPTED},
    E.REJECT: {S.FETCHED: S.IDLE, S.ACCEPTED: S.IDLE},
    E.CLAIM_EVICTED: {S.FETCHED: S.IDLE, S.ACCEPTED: S.IDLE},
    E.PREPARE: {S.FETCHED: S.ACCEPTED, S.ACCEPTED: S.ACCEPTED},
    E.UPDATE: {S.FETCHED: S.ACCEPTED, S.ACCEPTED: S.ACCEPTED, S.RUNNING: S.RUNNING},
    E.START: {S.FETCHED: S.RUNNING, S.ACCEPTED: S.RUNNING, S.RUNNING: S.RUNNING},
    E.EXIT: dict.fromkeys(HANDED, EXIT_POLICY),
    E.EVICT: dict.fromkeys(HANDED, REQUEUE),
    E.HOOK_HOLD: dict.fromkeys(HANDED, S.HELD),
    E.HOOK_REMOVE: dict.fromkeys(HANDED, S.REMOVED),
    E.LEASE_EXPIRED: dict.fromkeys(HANDED, REQUEUE),
    E.HOLD: dict.fromkeys((S.IDLE, *HANDED), S.HELD),
    E.RELEASE: {S.HELD: S.IDLE},
    E.REMOVE: dict.fromkeys((S.WAITING, S.IDLE, S.HELD, *HANDED), S.REMOVED),
    E.NODE_READY: {S.WAITING: S.IDLE},
    E.NODE_FUTILE: {S.WAITING: S.REMOVED},
    E.POST_SCRIPT: {},
    E.VACATE: {},  # requests, recorded: the eviction that follows is the transition
    E.VACATE_FAST: {},
}
ENDS_ATTEMPT = {S.WAITING, S.IDLE, S.HELD, S.COMPLETED, S.REMOVED, S.FAILED}

ALLOWED = [(e, s) for e, row in EXPECTED.items() for s in row]
REFUSED = [(e, s) for e, s in itertools.product(Event, Status) if s not in EXPECTED[e]]


def _id(pair: tuple[Event, Status]) -> str:
    return f"{pair[0].value}-{pair[1].value}"


def test_expected_table_covers_every_event():
    assert set(EXPECTED) == set(Event)
    assert len(ALLOWED) + len(REFUSED) == len(Event) * len(Status)


def test_table_matches_transitions_constant():
    # The module's table says the same as ours (no extra or missing cells).
    assert {e: dict(row) for e, row in TRANSITIONS.items() if row} == {
        e: row for e, row in EXPECTED.items() if row
    }


@pytest.mark.parametrize("pair", ALLOWED, ids=_id)
def test_allowed_transition(pair):
    event, status = pair
    target = EXPECTED[event][status]
    d = decide(event, status, attempts=0, max_attempts=5)
    assert isinstance(d, Decision)
    if target == REQUEUE:
        assert d.to_status == S.IDLE
        assert d.counts_attempt
        assert d.reason and "attempt 1 of 5" in d.reason
    elif target == EXIT_POLICY:
        # default policy: the exit succeeded
        assert d.to_status == S.COMPLETED
        assert not d.counts_attempt
    else:
        assert d.to_status == target
        assert not d.counts_attempt
        assert d.reason is None
    assert d.ends_attempt == (d.to_status in ENDS_ATTEMPT)


@pytest.mark.parametrize("pair", REFUSED, ids=_id)
def test_refused_transition(pair):
    event, status = pair
    d = decide(event, status, attempts=0, max_attempts=5)
    assert d.to_status is None
    assert not d.counts_attempt
    assert not d.ends_attempt
    assert d.reason == f"{event} ignored in state {status}"


@pytest.mark.parametrize("status", sorted(FINAL))
@pytest.mark.parametrize("event", list(Event))
def test_final_states_are_final(event, status):
    assert decide(event, status, attempts=0, max_attempts=5).to_status is None


@pytest.mark.parametrize("event", [E.EVICT, E.LEASE_EXPIRED])
@pytest.mark.parametrize("status", HANDED)
@pytest.mark.parametrize(
    ("attempts", "max_attempts", "expected"),
    [
        (0, 3, S.IDLE),
        (1, 3, S.IDLE),
        (2, 3, S.FAILED),  # this attempt is the last one
        (0, 1, S.FAILED),
        (7, 3, S.FAILED),  # already beyond the limit (limit lowered): still fails
    ],
)
def test_requeue_or_failed_at_attempt_limit(event, status, attempts, max_attempts, expected):
    d = decide(event, status, attempts=attempts, max_attempts=max_attempts)
    assert d.to_status == expected
    assert d.counts_attempt
    assert d.ends_attempt
    assert d.reason.startswith(str(event))
    if expected == S.FAILED:
        assert f"all {max_attempts} attempts used" in d.reason
    else:
        assert f"attempt {attempts + 1} of {max_attempts} used" in d.reason


@pytest.mark.parametrize("status", HANDED)
@pytest.mark.parametrize(
    ("succeeded", "retry", "attempts", "max_attempts", "expected", "counts"),
    [
        (True, False, 0, 3, S.COMPLETED, False),  # succeeded
        (True, True, 0, 3, S.COMPLETED, False),  # success wins over a retry wish
        (False, False, 0, 3, S.COMPLETED, False),  # failed, but no retry policy
        (False, True, 0, 3, S.IDLE, True),  # retry wanted, attempts left
        (False, True, 1, 3, S.IDLE, True),
        (False, True, 2, 3, S.FAILED, True),  # retry wanted, attempts exhausted
        (False, True, 0, 1, S.FAILED, True),
    ],
)
def test_exit_policy(status, succeeded, retry, attempts, max_attempts, expected, counts):
    d = decide(
        E.EXIT,
        status,
        attempts=attempts,
        max_attempts=max_attempts,
        exit_succeeded=succeeded,
        retry_wanted=retry,
    )
    assert d.to_status == expected
    assert d.counts_attempt == counts
    assert d.ends_attempt
    if counts:
        assert "exit code asks for a retry" in d.reason
    else:
        assert d.reason is None


def test_reject_and_claim_evicted_never_count_an_attempt():
    for event, status in itertools.product((E.REJECT, E.CLAIM_EVICTED), (S.FETCHED, S.ACCEPTED)):
        d = decide(event, status, attempts=4, max_attempts=5)
        assert d.to_status == S.IDLE
        assert not d.counts_attempt
        assert d.ends_attempt


def test_groups_and_is_final():
    assert frozenset(HANDED) == HANDED_OUT
    assert {S.COMPLETED, S.REMOVED, S.FAILED} == FINAL
    assert all(is_final(s) for s in FINAL)
    assert not any(is_final(s) for s in set(Status) - FINAL)
    assert is_final("completed") and not is_final("idle")
    with pytest.raises(ValueError):
        is_final("nonsense")
    # hook reports are exactly the events a starter or startd hook sends
    assert {
        E.ACCEPT, E.REJECT, E.CLAIM_EVICTED, E.PREPARE, E.UPDATE, E.START,
        E.EXIT, E.EVICT, E.HOOK_HOLD, E.HOOK_REMOVE,
    } == HOOK_REPORTS


# ---- docs/states.md ---------------------------------------------------------------------------

STATES_DOC = Path(__file__).resolve().parents[2] / "docs" / "states.md"
OUTCOMES: dict[Status | str, tuple[Status, ...]] = {
    REQUEUE: (S.IDLE, S.FAILED), EXIT_POLICY: (S.COMPLETED, S.IDLE, S.FAILED)}


def state_diagram() -> str:
    """The mermaid state diagram of TRANSITIONS: an edge per (from, to), its events."""
    edges: dict[tuple[str, str], set[str]] = {
        ("[*]", S.IDLE.value): {E.SUBMIT.value}, ("[*]", S.WAITING.value): {E.SUBMIT.value}}
    for event, row in TRANSITIONS.items():
        for status, target in row.items():
            for outcome in OUTCOMES.get(target, (target,)):
                edges.setdefault((status.value, str(outcome)), set()).add(event.value)
    lines = ["stateDiagram-v2"]
    order = ["[*]", *(s.value for s in Status)]
    for (source, dest), events in sorted(
            edges.items(), key=lambda e: (order.index(e[0][0]), order.index(e[0][1]))):
        lines.append(f"    {source} --> {dest}: {', '.join(sorted(events))}")
    lines += [f"    {s.value} --> [*]" for s in Status if s in FINAL]
    return "\n".join(lines) + "\n"


def test_the_documented_state_diagram_is_the_table():
    (block,) = re.findall(r"```mermaid\n(.*?)```", STATES_DOC.read_text(), re.S)
    assert block == state_diagram(), f"docs/states.md's diagram should read:\n{state_diagram()}"


def test_the_documented_table_names_each_event_and_where_it_applies():
    rows = {}
    for line in STATES_DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[0] and cells[0].split()[0] not in ("event", "---"):
            for name in re.findall(r"\b([a-z_]+)\b", cells[0].split(" (")[0]):
                rows[name] = cells[1]
    assert set(rows) == {e.value for e in Event}
    for event, row in TRANSITIONS.items():
        named = rows[event.value].replace("handed out", ", ".join(s.value for s in HANDED))
        assert {s.strip() for s in named.split(",")} == {s.value for s in row}, event
