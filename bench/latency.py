"""Section 3: fetch latency with few and with very many idle jobs."""

from __future__ import annotations

import time

from common import KEYWORD, Env, first, ms, pct, populate, progress, say, table

from jobstore.testing.support import (
    libpq_url,
)


def section_latency(env: Env, big: int, samples: int, ad: str, budget: float) -> dict:
    import psycopg

    from jobstore.core.states import Event
    from jobstore.db.store import JobStore, Offer
    from jobstore.testing.factories import claim_request, report, take_every

    say("")
    say(f"== 3. Fetch latency on PostgreSQL: Negotiator.claim (hook engine: connect + claim),"
        f" claim + reject-to-idle loop, up to {samples} claims")
    store = JobStore.from_url(env.pg_url)
    out: dict[int, tuple[float, float, float]] = {}
    with psycopg.connect(libpq_url(env.pg_url), autocommit=True) as admin:
        for size in (10, big):
            queue = f"lat_{size}"
            t = time.perf_counter()
            populate(admin, queue, size, ad)
            fill = time.perf_counter() - t
            progress(f"latency with {size} idle jobs (populated in {fill:.1f} s)")
            req = claim_request(queue=queue, offer=Offer(cpus=1, memory=1024, disk=1 << 20),
                                slot="slot1@node", keyword=KEYWORD)
            lat: list[float] = []
            stop_at = time.monotonic() + budget / 2
            for i in range(samples + 10):
                if len(lat) >= 50 and time.monotonic() > stop_at:
                    say(f"   ({size:,} idle jobs: {len(lat)} claims, the time budget is spent)")
                    break
                t = time.perf_counter()
                job = store.negotiator.claim(req, take_every)
                dt = time.perf_counter() - t
                if job is None:
                    raise RuntimeError(f"no idle job in {queue}")
                report(store, job, Event.REJECT)
                if i >= 10:  # the first few warm the caches
                    lat.append(dt)
            idle = first(admin.execute(
                "SELECT count(*) FROM jobs WHERE queue = %s AND status = 'idle'", (queue,)
            ))
            if idle != size:
                raise RuntimeError(f"{queue}: {idle} idle jobs after the loop, expected {size}")
            out[size] = (pct(lat, 0.5), pct(lat, 0.99), fill)
    store.db.engine.dispose()
    rows = [[f"{n:,}", ms(p50), ms(p99), f"{fill:.1f}"] for n, (p50, p99, fill) in out.items()]
    say(table(["idle jobs", "p50 ms", "p99 ms", "populate s"], rows))
    r50 = out[big][0] / out[10][0]
    r99 = out[big][1] / out[10][1]
    say(f"   ratio {big:,} vs 10 idle jobs: p50 x{r50:.2f}, p99 x{r99:.2f}"
        " (populated by INSERT ... SELECT generate_series, then ANALYZE)")
    return {"lat": out, "r50": r50, "r99": r99, "big": big}
