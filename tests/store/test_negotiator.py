"""The negotiator's guarantees in the claim: matching that never starves (autoclusters), fair
share between submitters, concurrency limits; the policy as unit tests, the store on SQLite and
PostgreSQL."""

from __future__ import annotations

import math
from typing import Any

import pytest
from backends import BOTH_BACKENDS
from bulk import clone
from classad2 import ClassAd

from jobstore.core import fairshare, limits
from jobstore.core.autoclusters import signature
from jobstore.core.claims import Offer, Verdict, VerdictCache
from jobstore.core.fairshare import Usage
from jobstore.core.states import Event
from jobstore.db.store import JobStore
from jobstore.formats.jobads import job_classad
from jobstore.formats.matching import matches, slot_shape
from jobstore.testing.factories import (
    a_job,
    claim,
    claim_request,
    claimed,
    report,
    submit,
    take_every,
)

BIG = Offer(cpus=64, memory=1 << 20, disk=1 << 40)
DAY = 86400.0

# ---- policy: pure functions ---------------------------------------------------------------


def test_priority_decays_by_half_each_halflife() -> None:
    assert fairshare.decayed(10.0, 0.0, DAY, DAY) == pytest.approx(5.0)
    assert fairshare.decayed(10.0, 0.0, 2 * DAY, DAY) == pytest.approx(2.5)
    assert fairshare.decayed(1.0, 0.0, 30 * DAY, DAY) == fairshare.MIN_PRIORITY  # the floor
    # holding 8 slots, the real priority moves half way to 8 in one half-life, then on
    assert fairshare.decayed(0.5, 8.0, DAY, DAY) == pytest.approx(4.25)
    assert fairshare.decayed(0.5, 8.0, 20 * DAY, DAY) == pytest.approx(8.0, rel=1e-5)
    assert fairshare.decayed(3.0, 8.0, 0.0, DAY) == 3.0


def test_effective_priority_is_real_priority_times_factor() -> None:
    u = Usage("a", factor=2.0, priority=4.0, usage=0.0, updated_at=100.0, in_use=3.0)
    assert fairshare.real_priority(u) == 4.0  # the accountant's, until its next update
    assert fairshare.effective_priority(u) == 8.0
    fresh = Usage("b", factor=3.0, priority=0.0, usage=0.0, updated_at=0.0, in_use=0.0)
    assert fairshare.effective_priority(fresh) == 1.5  # the floor 0.5, times the factor


def test_accountant_accumulates_weighted_usage() -> None:
    u = Usage("a", 1.0, 0.5, usage=10.0, updated_at=0.0, in_use=4.0)
    new = fairshare.accrued(u, 3600.0, DAY)
    assert new.usage == pytest.approx(10.0 + 4 * 3600)
    assert new.updated_at == 3600.0 and new.last_usage == 3600.0
    assert new.priority == pytest.approx(fairshare.decayed(0.5, 4.0, 3600.0, DAY))
    idle = fairshare.accrued(Usage("b", 1.0, 2.0, 5.0, 0.0, 0.0, last_usage=7.0), 60.0, DAY)
    assert idle.usage == 5.0 and idle.last_usage == 7.0


def _shares(factors: dict[str, float], slots: int, priority: float = 0.5) -> dict[str, int]:
    """Hand out `slots` one at a time in fair order; how many each submitter got."""
    held = dict.fromkeys(factors, 0.0)
    for _ in range(slots):
        usages = [Usage(n, f, priority, 0.0, 0.0, held[n]) for n, f in factors.items()]
        held[fairshare.fair_order(usages)[0]] += 1
    return {n: int(v) for n, v in held.items()}


def test_fair_order_gives_equal_submitters_equal_slots() -> None:
    for slots in range(1, 40):
        got = _shares({"a": 1.0, "b": 1.0}, slots)
        assert abs(got["a"] - got["b"]) <= 1, (slots, got)


def test_fair_order_follows_the_factors() -> None:
    assert _shares({"a": 1.0, "b": 2.0}, 30) == {"a": 20, "b": 10}
    got = _shares({"a": 1.0, "b": 2.0, "c": 4.0, "d": 4.0}, 32)
    assert got == {"a": 16, "b": 8, "c": 4, "d": 4}


def test_fair_order_prefers_the_lower_real_priority() -> None:
    usages = [Usage("heavy", 1.0, 30.0, 0.0, 0.0, 0.0), Usage("new", 1.0, 0.5, 0.0, 0.0, 0.0)]
    assert fairshare.fair_order(usages) == ["new", "heavy"]


def test_submitter_names() -> None:
    assert fairshare.submitter_name("alice", None, None) == "alice"
    assert fairshare.submitter_name("alice", "physics", None) == "physics.alice"
    assert fairshare.submitter_name("alice", "physics", "bob") == "physics.bob"
    with pytest.raises(ValueError, match="accounting_group"):
        fairshare.submitter_name("alice", 'bad"group', None)


def test_concurrency_limits_parse_and_render() -> None:
    assert limits.parse("XSW, fileserver:3 ,db:0.5") == {"xsw": 1.0, "fileserver": 3.0, "db": 0.5}
    assert limits.parse("") == {} and limits.parse(None) == {}
    assert limits.render(limits.parse("b:2, A")) == "a,b:2"
    assert limits.render({}) is None
    for bad in ("x:0", "x:-1", "x:abc", "bad name", "x.", 'a"b'):
        with pytest.raises(ValueError):
            limits.parse(bad)


def test_concurrency_limit_maximum_from_configuration() -> None:
    config = {"XSW_LIMIT": "4", "CONCURRENCY_LIMIT_DEFAULT": "2",
              "CONCURRENCY_LIMIT_DEFAULT_SMALL": "3"}
    assert limits.maximum("xsw", config.get) == 4
    assert limits.maximum("undefined", config.get) == 2
    assert limits.maximum("small.license", config.get) == 3
    assert limits.maximum("other.license", config.get) == 2
    assert limits.maximum("xsw", lambda _name: None) == math.inf
    with pytest.raises(ValueError, match="XSW_LIMIT"):
        limits.maximum("xsw", {"XSW_LIMIT": "many"}.get)


def test_limit_over() -> None:
    def cap(name: str) -> float:
        return {"a": 3.0, "b": 1.0}.get(name, math.inf)

    assert limits.over({"a": 1}, {"a": 2}, cap) is None
    assert limits.over({"a": 1}, {"a": 3}, cap) == "a"
    assert limits.over({"a": 2}, {"a": 2}, cap) == "a"
    assert limits.over({"a": 1, "b": 1}, {"b": 1}, cap) == "b"
    assert limits.over({"c": 100}, {}, cap) is None


def test_autocluster_signature_ignores_per_job_attributes() -> None:
    base = a_job(ad={"Cmd": "/bin/a", "Arguments": "1", "Out": "o.1", "Color": "blue"})
    same = base.but(id=2, proc_id=5, priority=9, ad={**base.ad, "Arguments": "2", "Out": "o.2"})
    assert signature(same) == signature(base)
    for different in (
        base.but(request_memory=4096),
        base.but(requirements="TARGET.HasGPU"),
        base.but(owner="bob"),
        base.but(submitter="physics.alice"),
        base.but(concurrency_limits="xsw"),
        base.but(queue="other"),
        base.but(ad={**base.ad, "Color": "red"}),
    ):
        assert signature(different) != signature(base)


def test_verdict_cache_expires_and_never_keeps_holds() -> None:
    cache = VerdictCache(ttl=10.0, size=2)
    cache.put("s", 1, Verdict(take=True), now=0.0)
    assert cache.get("s", 1, now=5.0) == Verdict(take=True)
    assert cache.get("s", 1, now=11.0) is None
    assert cache.get(None, 1, now=0.0) is None
    cache.put("s", 2, Verdict(hold_reason="root"), now=0.0)
    assert cache.get("s", 2, now=0.0) is None
    for ac in (3, 4, 5):
        cache.put("s", ac, Verdict(), now=0.0)
    assert len(cache) == 2 and cache.get("s", 3, now=0.0) is None


def test_slot_shape_ignores_volatile_attributes() -> None:
    a = ClassAd({"Name": "slot1@n", "Cpus": 4, "LoadAvg": 0.1, "MyCurrentTime": 1})
    b = ClassAd({"Name": "slot1@n", "Cpus": 4, "LoadAvg": 2.5, "MyCurrentTime": 9})
    c = ClassAd({"Name": "slot1@n", "Cpus": 2, "LoadAvg": 0.1, "MyCurrentTime": 1})
    assert slot_shape(a) == slot_shape(b) != slot_shape(c)
    assert slot_shape(a, "KW1") != slot_shape(a, "KW2")


# ---- the store ----------------------------------------------------------------------------


REQ = claim_request(offer=BIG, slot="slot1@node")
SLOT = ClassAd({"Name": "slot1@node", "Cpus": 1, "Memory": 1024, "Disk": 10**6,
                "OpSys": "LINUX", "Arch": "X86_64", "Start": True})


def real_judge(job: Any) -> Verdict:
    """The matchmaking a FETCH_WORK does: the job's Requirements against a GPU-less slot."""
    ad = job_classad(job, keyword="JOBSTORE", uid_domain="localdomain", job_lease_duration=2400)
    return Verdict(take=matches(ad, SLOT))


def test_a_matching_job_behind_20000_that_cannot_match_is_found(store):
    """The admin's mixed queue: 20,000 high-priority GPU jobs no slot here can run, then one
    that fits. It is found at once, with two verdicts, and again after the first is taken."""
    (gpu,) = submit(store, requirements="TARGET.HasGPU =?= true", priority=10)
    clone(store, gpu, 19_999)
    fits = submit(store, 2)
    judged: list[int] = []

    def judge(job: Any) -> Verdict:
        judged.append(job.id)
        return real_judge(job)

    assert claimed(store, REQ, shape="cpu-only", judge=judge).id == fits[0]
    assert len(judged) == 2
    assert claimed(store, REQ, shape="cpu-only", judge=judge).id == fits[1]
    assert len(judged) == 2  # remembered
    assert claim(store, REQ, shape="cpu-only", judge=judge) is None
    assert store.reads.stats()  # the GPU jobs are all still idle
    assert sum(1 for j in store.reads.list_jobs(statuses=["idle"])) == 20_000


def test_claim_order_within_a_submitter_is_priority_then_age(store):
    low = submit(store, 2, requirements="TARGET.Cpus >= 1")
    high = submit(store, 2, priority=5)
    mid = submit(store, 1, priority=1, requirements="TARGET.Memory > 0")
    got = [claimed(store, REQ, shape="s").id for _ in range(5)]
    assert got == [*high, *mid, *low]


def test_two_owners_share_the_slots_from_the_first_fetch(store):
    """Alice queued 1,000 jobs first; Bob gets every other slot from his first fetch on."""
    (a,) = submit(store, owner="alice")
    clone(store, a, 999)
    submit(store, 1000, owner="bob")
    held = {"alice": 0, "bob": 0}
    for n in range(40):
        job = claimed(store, REQ, slot=f"slot{n}@node", shape="s")
        held[job.owner] += 1
        assert abs(held["alice"] - held["bob"]) <= 1, (n, held)
    # a finished job frees its share: the next slot goes to whoever holds fewer
    assert held == {"alice": 20, "bob": 20}


@BOTH_BACKENDS
def test_priority_factors_give_shares_in_their_ratio(store):
    submit(store, 100, owner="alice")
    submit(store, 100, owner="bob")
    assert store.admin_settings.set_factor("bob", 2.0)
    assert not store.admin_settings.set_factor("nobody", 2.0)
    with pytest.raises(ValueError):
        store.admin_settings.set_factor("bob", 0.5)
    owners = [claimed(store, REQ, shape="s").owner for _ in range(30)]
    assert owners.count("alice") == 20 and owners.count("bob") == 10


def test_fair_share_off_is_priority_then_age(store):
    first = submit(store, 5, owner="alice")
    submit(store, 5, owner="bob")
    got = [claimed(store, REQ, shape="s", fair_share=False).id for _ in range(5)]
    assert got == first


def test_accounting_group_is_the_submitter(store):
    submit(store, 4, owner="alice", accounting_group="physics")
    submit(store, 4, owner="bob", accounting_group="physics", accounting_group_user="alice")
    submit(store, 4, owner="carol")
    owners = [claimed(store, REQ, shape="s") for _ in range(4)]
    subs = sorted(j.submitter for j in owners)
    assert subs.count("carol") == 2 and subs.count("physics.alice") == 2
    table = {u.name: u for u, _ in store.negotiator.usage_table()}
    assert set(table) == {"carol", "physics.alice"}
    assert table["physics.alice"].in_use == 2


def test_slot_weight_is_what_a_submitter_holds(store):
    submit(store, 2, owner="alice", request_cpus=3)
    submit(store, 2, owner="bob")
    a = claimed(store, REQ, shape="p", partitionable=True, fair_share=False)
    assert (a.owner, a.slot_weight) == ("alice", 3.0)
    b = claimed(store, REQ, shape="s", weight=4.0, fair_share=False)
    assert b.slot_weight == 4.0
    held = {u.name: u.in_use for u, _ in store.negotiator.usage_table()}
    assert held == {"alice": 7.0, "bob": 0.0}
    # bob holds less: he gets the next slot although alice's jobs are older
    assert claimed(store, REQ, shape="s").owner == "bob"


@BOTH_BACKENDS
def test_accountant_decays_priorities_once_per_interval(store):
    submit(store, 4, owner="alice")
    submit(store, 1, owner="bob")
    t0 = store.negotiator.usage_table()[0][0].updated_at
    for _ in range(4):
        claim(store, REQ, shape="s", fair_share=False)
    # not due
    assert store.negotiator.update_priorities(halflife=DAY, interval=60, now=t0 + 30) == 0
    assert store.negotiator.update_priorities(halflife=DAY, interval=60, now=t0 + DAY) == 2
    assert store.negotiator.update_priorities(halflife=DAY, interval=60, now=t0 + DAY + 1) == 0
    rows = {u.name: (u, first) for u, first in store.negotiator.usage_table()}
    alice, first = rows["alice"]
    assert alice.priority == pytest.approx(0.5 * 0.5 + 4 * 0.5)
    assert alice.usage == pytest.approx(4 * DAY, rel=1e-3)
    assert first == pytest.approx(t0 + DAY) and alice.last_usage == pytest.approx(t0 + DAY)
    assert rows["bob"][0].priority == fairshare.MIN_PRIORITY
    assert store.admin_settings.reset_usage("alice", now=t0 + DAY) == 1
    alice = {u.name: u for u, _ in store.negotiator.usage_table()}["alice"]
    assert (alice.priority, alice.usage) == (fairshare.MIN_PRIORITY, 0.0)


def test_concurrency_limit_caps_jobs_across_slots(store):
    lic = submit(store, 5, concurrency_limits="LIC")
    plain = submit(store, 2)

    def cap(name: str) -> float:
        return {"lic": 3.0}.get(name, math.inf)

    got = [claim(store, REQ, slot=f"s{n}", shape="s", limit=cap) for n in range(6)]
    assert [j.id for j in got if j] == [*lic[:3], *plain]
    assert got[5] is None
    assert store.reads.get_job(lic[0]).concurrency_limits == "lic"
    # a job that leaves frees its units, whatever the way out
    report(store, got[0], Event.EXIT)
    assert claimed(store, REQ, shape="s", limit=cap).id == lic[3]
    store.actions.admin(got[1].id, Event.REMOVE)
    assert claimed(store, REQ, shape="s", limit=cap).id == lic[4]
    # without limits enforced, nothing holds them back
    more = submit(store, 2, concurrency_limits="lic")
    assert claimed(store, REQ, shape="s").id == more[0]


def test_limit_amounts_and_several_limits(store):
    big = submit(store, 2, concurrency_limits="db:2, lic")
    small = submit(store, 2, concurrency_limits="db")

    def cap(name: str) -> float:
        return {"db": 3.0, "lic": 5.0}.get(name, math.inf)

    first = claimed(store, REQ, shape="s", limit=cap, fair_share=False)
    assert first.id == big[0]
    # db holds 2 of 3: the next big job (2 more) does not fit, a small one (1) does
    assert claimed(store, REQ, shape="s", limit=cap, fair_share=False).id == small[0]
    assert claim(store, REQ, shape="s", limit=cap, fair_share=False) is None


def test_refused_owner_autocluster_is_held(store):
    ids = submit(store, 3, owner="root")
    ok = submit(store, 1)

    def judge(job: Any) -> Verdict:
        return (Verdict(hold_reason="jobs may not run as root") if job.owner == "root"
                else take_every(job))

    assert claimed(store, REQ, shape="s", judge=judge).id == ok[0]
    assert {store.reads.get_job(i).status for i in ids} == {"held"}


# ---- through the FETCH_WORK executable: limits and fair share from the configuration ---------

SLOT_AD = "htcondor-transcripts/01-normal-job/01-FETCH_WORK.stdin"


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_fetch_work_hook_applies_limits_from_the_configuration(
    db_url, hook_dir, condor_config, fixtures_dir
):
    """LIC_LIMIT and CONCURRENCY_LIMIT_DEFAULT_<SET> in the HTCondor configuration cap what the
    real hook hands out; the job ad carries ConcurrencyLimits and AccountingGroup."""
    from hookrun import hook_env, run_hook

    from jobstore.db.engine import upgrade
    from jobstore.formats import classads
    from jobstore.testing.support import ordinary_owner

    owner = ordinary_owner()
    upgrade(db_url)
    store = JobStore.from_url(db_url)
    try:
        lic = submit(store, 2, owner=owner, concurrency_limits="LIC", accounting_group="physics")
        small = submit(store, 3, owner=owner, concurrency_limits="small.db")
    finally:
        store.db.engine.dispose()
    with open(condor_config, "a") as fh:
        fh.write("LIC_LIMIT = 1\nCONCURRENCY_LIMIT_DEFAULT_SMALL = 2\n"
                 "JOBSTORE_FAIR_SHARE = false\n")
    env = hook_env(db_url, condor_config)
    stdin = (fixtures_dir / SLOT_AD).read_bytes()
    got = []
    for _ in range(5):
        res = run_hook(hook_dir, "fetch_job", stdin, env=env, timeout=60)
        assert res.returncode == 0 and not res.stderr, res.stderr
        if not res.stdout:
            got.append(None)
            continue
        ad = classads.parse_ad(classads.decode(res.stdout))
        got.append(classads.get_int(ad, "JobstoreJobId"))
        if got[-1] == lic[0]:
            assert classads.get_str(ad, "ConcurrencyLimits") == "lic"
            assert classads.get_str(ad, "AccountingGroup") == f"physics.{owner}"
    assert got == [lic[0], small[0], small[1], None, None]
    with open(condor_config, "a") as fh:
        fh.write("LIC_LIMIT = many\n")
    res = run_hook(hook_dir, "fetch_job", stdin, env=env, timeout=60)
    assert not res.stdout and res.stderr.count(b"\n") == 1 and b"LIC_LIMIT" in res.stderr
