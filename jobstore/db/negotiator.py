"""The negotiator inside the claim: autoclusters, fair share between submitters, concurrency
limits, and the accountant that keeps condor_userprio's table.

A claim lists the queue's idle autoclusters that fit the slot (one index probe each), judges each
autocluster once per slot shape (the verdict is remembered), orders the submitters that have a
matching one by fair share, and hands out the first idle job, in claim order, of the best
submitter's matching autoclusters whose concurrency limits have room: one transaction that writes
the row and its `fetch` event.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import starmap
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    and_,
    bindparam,
    func,
    literal_column,
    select,
    update,
)

from jobstore.core import fairshare, limits
from jobstore.core.autoclusters import signature
from jobstore.core.claims import ClaimRequest, Verdict, VerdictCache
from jobstore.core.fairshare import Usage
from jobstore.core.jobs import Job
from jobstore.core.states import HANDED_OUT, Event, Status
from jobstore.db.backends import MENU, Params
from jobstore.db.phases import status_in
from jobstore.db.schema import (
    autocluster_limits,
    autoclusters,
    concurrency_limits,
    jobs,
    submitters,
)
from jobstore.db.transactions import Transactions
from jobstore.db.transitions import Transitions
from jobstore.errors import InvalidInput

# a literal, not a parameter: the partial index ix_jobs_active is on it
OUT: ColumnElement[str] = literal_column("'out'")

# Fair share's view of some submitters: the accountant's row and the weighted slots their
# handed-out jobs hold now (ix_jobs_active)
SUBMITTER_USAGE = select(
    submitters.c.name, submitters.c.factor, submitters.c.priority, submitters.c.usage,
    submitters.c.updated_at, submitters.c.last_usage,
    select(func.coalesce(func.sum(jobs.c.slot_weight), 0))
    .where(jobs.c.submitter == submitters.c.name, jobs.c.phase == OUT)
    .scalar_subquery().label("in_use"),
).where(submitters.c.name.in_(bindparam("names", expanding=True)))

# The units of each named concurrency limit that handed-out jobs hold, across all nodes: the jobs
# of each autocluster that uses it, found under the autocluster's submitter in ix_jobs_active
LIMITS_IN_USE = (
    select(autocluster_limits.c.name, func.sum(autocluster_limits.c.amount).label("in_use"))
    .select_from(autocluster_limits
                 .join(autoclusters, autoclusters.c.id == autocluster_limits.c.autocluster_id)
                 .join(jobs, and_(jobs.c.submitter == autoclusters.c.submitter,
                                  jobs.c.autocluster_id == autocluster_limits.c.autocluster_id)))
    .where(autocluster_limits.c.name.in_(bindparam("names", expanding=True)),
           jobs.c.phase == OUT)
    .group_by(autocluster_limits.c.name)
)

# Jobs of an autocluster a refused owner's claim puts on hold at once (the rest next time).
HOLD_BATCH = 100


@dataclass(frozen=True, slots=True)
class IdleCluster:
    """An autocluster with idle jobs that fit the slot, and its first job in claim order."""

    id: int
    submitter: str
    concurrency_limits: str | None
    head_id: int
    head_priority: int

    @property
    def order(self) -> tuple[int, int]:
        return (-self.head_priority, self.head_id)


def _claim_changes(req: ClaimRequest, now: float) -> dict[str, Any]:
    """The columns a claim sets on the job it hands out (besides status, claims, weight)."""
    return {
        "token": secrets.token_hex(16),
        "lease_expires_at": now + req.claim_lease,
        "lease_renewed_until": None,
        "slot": req.slot,
        "host": req.host,
        "keyword": req.keyword,
        "fetched_at": now,
        "job_pid": None,
        "reason": None,
    }


class Negotiator:
    """Matching, fair share and limits in the claim; the accountant; userprio's table."""

    def __init__(self, db: Transactions, transitions: Transitions) -> None:
        self.db = db
        self.transitions = transitions
        self.verdicts = VerdictCache()

    # ---- submit: the autocluster and submitter of new jobs --------------------------------

    def register(self, conn: Connection, queued: Sequence[Job], now: float) -> list[int]:
        """The autocluster id of each job (created when new), with its limits and submitter
        rows."""
        ids: dict[str, int] = {}
        out = []
        for job in queued:
            sig = signature(job)
            if sig not in ids:
                ids[sig] = self._autocluster(conn, sig, job, now)
            out.append(ids[sig])
        for name in {job.submitter for job in queued}:
            self.db.backend.insert_missing(conn, submitters, {"name": name, "updated_at": now})
        return out

    def _autocluster(self, conn: Connection, sig: str, job: Job, now: float) -> int:
        # the owner is part of the key: another submitter's row can never stand for this one
        mine = (autoclusters.c.owner == job.owner, autoclusters.c.signature == sig)
        found = conn.execute(select(autoclusters.c.id).where(*mine)).scalar()
        if found is not None:
            return int(found)
        values: Params = {
            "signature": sig,
            "queue": job.queue,
            "owner": job.owner,
            "submitter": job.submitter,
            "request_cpus": job.request_cpus,
            "request_memory": job.request_memory,
            "request_disk": job.request_disk,
            "requirements": job.requirements,
            "concurrency_limits": job.concurrency_limits,
            "created_at": now,
        }
        self.db.backend.insert_missing(conn, autoclusters, values, ["owner", "signature"])
        ac = int(conn.execute(select(autoclusters.c.id).where(*mine)).scalar_one())
        for name, amount in limits.parse(job.concurrency_limits).items():
            self.db.backend.insert_missing(conn, concurrency_limits, {"name": name})
            self.db.backend.insert_missing(
                conn, autocluster_limits, {"autocluster_id": ac, "name": name, "amount": amount}
            )
        return ac

    # ---- the claim ------------------------------------------------------------------------

    def claim(self, req: ClaimRequest, judge: Callable[[Job], Verdict]) -> Job | None:
        """Hand the best matching idle job of `req.queue` to a slot, atomically.

        `judge` sees one job of each autocluster not yet judged for this slot shape and decides
        for the whole autocluster (Requirements both ways, owner rules); a `hold_reason` puts the
        autocluster's idle jobs on hold. Among the submitters with a matching autocluster the
        fair-share order decides (with `req.fair_share`), then the job's priority and age; a job
        whose concurrency limits have no room is passed over (with `req.limit`).
        """
        now = time.time()
        params: Params = {
            "queue": req.queue,
            "cpus": req.offer.cpus,
            "memory": req.offer.memory,
            "disk": req.offer.disk,
        }
        # A job's user wrote what `judge` evaluates: where verdicts are remembered (a slot
        # shape), autoclusters not judged yet are judged outside the transaction, which then
        # starts again, so that no lock or connection waits for an expression (node.bounded)
        judged_outside = req.shape is None
        while True:
            # the menu is read in the round trip that opens the transaction where it can be
            with self.db.opened(MENU, params) as (conn, opened):
                menu = list(starmap(IdleCluster, self.db.backend.menu(conn, opened, params)))
                heads = self._unjudged(conn, req, menu)
                if not heads or judged_outside:
                    matching = self._matching(conn, req, judge, menu, heads, now) if menu else []
                    for group in self._submitter_order(conn, req, matching, now):
                        job = self._take_within_limits(conn, req, group, now)
                        if job is not None:
                            return job
                    return None
            self._judge_outside(req, judge, menu, heads, now)  # then the claim starts again
            judged_outside = True

    def _unjudged(self, conn: Connection, req: ClaimRequest, menu: list[IdleCluster]
                  ) -> dict[int, Job]:
        """The first jobs of the autoclusters of `menu` without a remembered verdict (one
        query), by id."""
        unknown = [m.head_id for m in menu if self.verdicts.get(req.shape, m.id) is None]
        return {job.id: job for job in self.db.backend.jobs_of(conn, unknown)} if unknown else {}

    def _judge_outside(self, req: ClaimRequest, judge: Callable[[Job], Verdict],
                       menu: list[IdleCluster], heads: dict[int, Job], now: float) -> None:
        """Judge the unjudged autoclusters of `menu` in no transaction: remember each verdict,
        and hold the idle jobs of those the verdict holds (a transaction of their own)."""
        for m in menu:
            head = heads.get(m.head_id)
            if head is None:
                continue
            verdict = judge(head)
            if verdict.hold_reason:
                with self.db.transaction() as conn:
                    self.hold_idle(conn, m.id, verdict.hold_reason, verdict.hold_code, now,
                                    slot=req.slot, host=req.host)
            else:
                self.verdicts.put(req.shape, m.id, verdict)

    def _matching(
        self,
        conn: Connection,
        req: ClaimRequest,
        judge: Callable[[Job], Verdict],
        menu: list[IdleCluster],
        heads: dict[int, Job],
        now: float,
    ) -> list[IdleCluster]:
        """The autoclusters of `menu` that match the slot: remembered verdicts, else `judge` on
        each one's first job (`heads`: `_unjudged`)."""
        known = {m.id: self.verdicts.get(req.shape, m.id) for m in menu}
        out = []
        for m in menu:
            verdict = known[m.id]
            if verdict is None:
                head = heads.get(m.head_id)
                if head is None:  # claimed since the menu was read
                    continue
                verdict = judge(head)
                if verdict.hold_reason:
                    self.hold_idle(conn, m.id, verdict.hold_reason, verdict.hold_code, now,
                                    slot=req.slot, host=req.host)
                    continue
                self.verdicts.put(req.shape, m.id, verdict)
            if verdict.take:
                out.append(m)
        return out

    def hold_idle(
        self, conn: Connection, autocluster: int, reason: str, code: int, now: float, *,
        slot: str | None = None, host: str | None = None,
    ) -> None:
        """Put the idle jobs of `autocluster` on hold (HOLD_BATCH at most; a locked one is
        passed over)."""
        q = (
            select(jobs)
            .where(status_in([Status.IDLE]), jobs.c.autocluster_id == autocluster)
            .order_by(jobs.c.id)
            .limit(HOLD_BATCH)
            .with_for_update(skip_locked=True)
        )
        for row in conn.execute(q).all():
            self.transitions.apply(
                conn, Job.from_row(row._mapping), Event.HOLD, decide_args={}, now=now,
                reason=reason, slot=slot, host=host,
                hold=(code, 0),
            )

    def _submitter_order(
        self, conn: Connection, req: ClaimRequest, matching: list[IdleCluster], now: float
    ) -> list[list[IdleCluster]]:
        """The matching autoclusters in groups to try in turn, each in claim order: one group per
        submitter in fair-share order, or (fair share off, or one submitter) a single group."""
        if not matching:
            return []
        by_submitter: dict[str, list[IdleCluster]] = {}
        for m in matching:
            by_submitter.setdefault(m.submitter, []).append(m)
        if not req.fair_share or len(by_submitter) == 1:
            return [sorted(matching, key=lambda m: m.order)]
        usages = {u.name: u for u in self._usages(conn, list(by_submitter))}
        for name in by_submitter:
            usages.setdefault(name, Usage(name, fairshare.DEFAULT_FACTOR,
                                          fairshare.MIN_PRIORITY, 0.0, now, 0.0))
        order = fairshare.fair_order(usages.values())
        return [sorted(by_submitter[name], key=lambda m: m.order) for name in order]

    def _usages(self, conn: Connection, names: list[str]) -> list[Usage]:
        rows = conn.execute(SUBMITTER_USAGE, {"names": names})
        return [
            Usage(r.name, r.factor, r.priority, r.usage, r.updated_at, float(r.in_use or 0),
                  r.last_usage)
            for r in rows
        ]

    def _take_within_limits(
        self, conn: Connection, req: ClaimRequest, group: list[IdleCluster], now: float
    ) -> Job | None:
        """The first idle job of `group` whose limits have room; the autoclusters before the
        first one with limits are tried without taking any limit's lock."""
        if req.limit is None:
            return self._take(conn, req, group, now)
        free = 0
        while free < len(group) and not group[free].concurrency_limits:
            free += 1
        if free:
            job = self._take(conn, req, group[:free], now)
            if job is not None or free == len(group):
                return job
        rest = group[free:]
        needed = {m.id: limits.parse(m.concurrency_limits) for m in rest}
        names = sorted({name for need in needed.values() for name in need})
        self.db.backend.lock_limits(conn, names)  # claims of jobs using one limit: one at a time
        in_use = {r.name: float(r.in_use) for r in conn.execute(LIMITS_IN_USE, {"names": names})}
        allowed = [m for m in rest if limits.over(needed[m.id], in_use, req.limit) is None]
        return self._take(conn, req, allowed, now) if allowed else None

    def _take(
        self, conn: Connection, req: ClaimRequest, group: Sequence[IdleCluster], now: float
    ) -> Job | None:
        """Hand out the first idle, unlocked job of the first autocluster of `group` that has
        one: the backend's take, with the state machine's idle -> fetched (`claim`)."""
        if not group:
            return None
        changes = _claim_changes(req, now)

        def hand_out(conn: Connection, job: Job, extra: Mapping[str, Any]) -> None:
            self.transitions.apply(conn, job, Event.FETCH, decide_args={}, now=now,
                        changes={**changes, **extra}, slot=req.slot, host=req.host,
                        attempt=job.claims + 1)

        return self.db.backend.take(conn, req, [m.id for m in group],
                                 self.transitions.fetch_transition(changes, now), now, hand_out)

    # ---- the accountant and condor_userprio ------------------------------------------------

    def update_priorities(
        self, *, halflife: float = fairshare.DEFAULT_HALFLIFE, interval: float = 60.0,
        now: float | None = None,
    ) -> int:
        """Decay every submitter's real priority towards what it holds now and accumulate its
        usage, for the rows not updated in the last `interval` seconds (the negotiator's
        accountant); concurrent callers never update a row twice. Returns the rows updated."""
        now = time.time() if now is None else now
        with self.db.transaction() as conn:
            due = conn.execute(
                select(submitters)
                .where(submitters.c.updated_at <= now - interval)
                .with_for_update(skip_locked=True)
            ).all()
            if not due:
                return 0
            held = self._held(conn, [r.name for r in due])
            for r in due:
                u = Usage(r.name, r.factor, r.priority, r.usage, r.updated_at,
                          held.get(r.name, 0.0), r.last_usage)
                new = fairshare.accrued(u, now, halflife)
                conn.execute(
                    update(submitters)
                    .where(submitters.c.name == r.name)
                    .values(
                        priority=new.priority, usage=new.usage, in_use=new.in_use,
                        updated_at=now, last_usage=new.last_usage,
                        first_usage=r.first_usage or (now if new.in_use > 0 else None),
                    )
                )
            return len(due)

    def _held(self, conn: Connection, names: Iterable[str] | None = None) -> dict[str, float]:
        """Weighted slots held now, by submitter."""
        q = (
            select(jobs.c.submitter, func.coalesce(func.sum(jobs.c.slot_weight), 0.0))
            .where(status_in(HANDED_OUT))
            .group_by(jobs.c.submitter)
        )
        if names is not None:
            q = q.where(jobs.c.submitter.in_(list(names)))
        return {name: float(amount) for name, amount in conn.execute(q)}

    def usage_table(self) -> list[tuple[Usage, float | None]]:
        """Every submitter's accounting row with what it holds now, and its first usage
        (condor_userprio's table; `jobstore.core.fairshare` computes the priorities)."""
        with self.db.transaction() as conn:
            rows = conn.execute(select(submitters).order_by(submitters.c.name)).all()
            held = self._held(conn)
        return [
            (
                Usage(r.name, r.factor, r.priority, r.usage, r.updated_at,
                      held.get(r.name, 0.0), r.last_usage),
                r.first_usage,
            )
            for r in rows
        ]

    def set_factor(self, name: str, factor: float) -> bool:
        """condor_userprio -setfactor; False when the submitter is unknown."""
        if not factor >= 1.0:
            raise InvalidInput("a priority factor must be at least 1")
        with self.db.transaction() as conn:
            done = conn.execute(
                update(submitters).where(submitters.c.name == name).values(factor=factor)
            )
            return bool(done.rowcount)

    def reset_usage(self, name: str | None = None, *, now: float | None = None) -> int:
        """condor_userprio -resetusage (one submitter) or -resetall: accumulated usage to 0 and
        real priority to its lowest value. Returns the rows reset."""
        now = time.time() if now is None else now
        q = update(submitters).values(
            usage=0.0, priority=fairshare.MIN_PRIORITY, first_usage=None, updated_at=now
        )
        if name is not None:
            q = q.where(submitters.c.name == name)
        with self.db.transaction() as conn:
            return int(conn.execute(q).rowcount)

