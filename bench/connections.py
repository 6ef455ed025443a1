"""Section 4: database connections opened per job life by the hook path."""

from __future__ import annotations

import os
import time
from typing import Any

from common import IDENTITY, KEYWORD, LIFE, Env, first, say, submit_one, table
from hookcost import LifeError, run_empty_fetch, run_life

from jobstore.testing.support import (
    insert_identity,
    libpq_url,
)


def section_connections(env: Env, backends: list[tuple[str, str]], calls, jobs: int) -> dict:
    import psycopg
    from sqlalchemy import event

    from jobstore.db.store import JobStore
    from jobstore.node import config, handlers, hookcall
    from jobstore.node.services import direct

    say("")
    say(f"== 4. Database connections opened by the hook path (mean over {jobs} jobs)")
    res: dict[str, Any] = {}
    rows = []
    # (a) the real hook processes, PostgreSQL: pg_stat_database.sessions of the bench database
    if env.pg_url:
        store = JobStore.from_url(env.pg_url)
        with psycopg.connect(libpq_url(env.pg_url), autocommit=True) as mon:

            def sessions() -> int:
                # a backend reports its session at exit, shortly after the client hangs up
                last, stable = -1, 0
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    mon.execute("SELECT pg_stat_clear_snapshot()")
                    n = first(mon.execute(
                        "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
                    ))
                    stable = stable + 1 if n == last else 0
                    if stable >= 3:
                        return int(n)
                    last = n
                    time.sleep(0.1)
                return int(last)

            life_total = empty_total = 0
            # run_life's own bookkeeping (submit, final check) uses `store`: count it apart
            own = {"n": 0}

            def listener(*_a: Any) -> None:
                own["n"] += 1

            for _ in range(jobs):
                own["n"] = 0
                event.listen(store.db.engine, "connect", listener)
                s0 = sessions()
                run_life(env, env.pg_url, store, calls, None)
                s1 = sessions()
                run_empty_fetch(env, env.pg_url, calls)
                s2 = sessions()
                event.remove(store.db.engine, "connect", listener)
                life_total += s1 - s0 - own["n"]
                empty_total += s2 - s1
            store.db.engine.dispose()
        res["pg_processes"] = (life_total / jobs, empty_total / jobs)
        rows.append(["postgresql: hook processes (pg_stat_database.sessions)",
                     f"{life_total / jobs:.2f}", f"{empty_total / jobs:.2f}", "-"])
    # (b) the same handlers in this process, connect events on the hook's engine, per hook
    for name, url in backends:
        os.environ["JOBSTORE_DATABASE_URL"] = url
        hstore = direct().store_for(config.load_settings(KEYWORD))
        counter = {"n": 0}

        def on_connect(*_a: Any, _c: dict = counter) -> None:
            _c["n"] += 1

        event.listen(hstore.db.engine, "connect", on_connect)
        per_hook: dict[str, int] = {}
        life = empty = 0
        helper = JobStore.from_url(url)
        for _ in range(jobs):
            job_id = submit_one(helper)
            identity: list[bytes] = []
            for label, exe, stem, argv in LIFE:
                call = calls[stem]
                stdin = call.stdin
                if exe != "fetch_job":
                    stdin = insert_identity(stdin, identity, reply_fetch=exe == "reply_fetch")
                before = counter["n"]
                resp = handlers.handle(hookcall.HookRequest(
                    hook=exe, argv=list(argv), stdin=stdin, env={**os.environ, **call.env},
                    node=direct()))
                if resp.error:
                    raise LifeError(f"in-process {label}: {resp.error}")
                if exe == "fetch_job":
                    identity = [ln for ln in resp.stdout.split(b"\n")
                                if ln.split(b" = ")[0] in IDENTITY]
                per_hook[label] = per_hook.get(label, 0) + counter["n"] - before
                life += counter["n"] - before
            if helper.reads.get_job(job_id).status != "completed":
                raise LifeError(f"in-process life of job {job_id} did not complete it")
            before = counter["n"]
            slot_ad = calls["01-FETCH_WORK"].stdin
            resp = handlers.handle(hookcall.HookRequest(
                hook="fetch_job", argv=[], stdin=slot_ad, env=dict(os.environ), node=direct()))
            if resp.stdout or resp.error:
                raise LifeError(f"in-process empty fetch: {resp.stdout[:100]!r} {resp.error}")
            empty += counter["n"] - before
        event.remove(hstore.db.engine, "connect", on_connect)
        helper.db.engine.dispose()
        breakdown = " ".join(f"{round(per_hook[label] / jobs, 2):g}" for label, *_ in LIFE)
        res[f"{name}_inproc"] = (life / jobs, empty / jobs, breakdown)
        rows.append([f"{name}: handlers in-process (engine connect events)",
                     f"{life / jobs:.2f}", f"{empty / jobs:.2f}", breakdown])
    os.environ.pop("JOBSTORE_DATABASE_URL", None)
    say(table(["path", "per job life", "per empty fetch", "fetch/reply/upd/prep/upd/exit"], rows))
    say("   (fetch_job also reaps expired leases in 5% of calls: one more connection then;"
        " each idle slot runs an empty fetch every FetchWorkDelay)")
    return res
