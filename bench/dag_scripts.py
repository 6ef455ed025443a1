#!/usr/bin/env python3
"""DAG node scripts, as root, on PostgreSQL: a wide DAG (a root, then the rest at once) whose
every node has a POST script, run to its end by one claiming slot in this process while a
real `jobstore schedd` runs the scripts as the DAG's owner, against the same DAG without
scripts (the same service running), in the same run. No-op jobs make each node's own cost
as large a part as it can be: the ratio is the scripts' whole cost. Also the service's CPU
per script (its runners' and scripts' included).

Usage: sudo .venv/bin/python bench/dag_scripts.py [--db-url ADMIN_URL] [--nodes N]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import OWNER, cleanup, cpu_seconds, create_pg, make_env  # noqa: E402
from dag import drain  # noqa: E402
from schedd_scale import DEFAULT_ADMIN_URL  # noqa: E402

from jobstore.api.dags import submit_dag  # noqa: E402
from jobstore.db.store import JobStore  # noqa: E402
from jobstore.node import config  # noqa: E402
from jobstore.testing.support import ensure_account  # noqa: E402

HOME = "bench-ap.example.org"
CLI = [sys.executable, "-m", "jobstore.cli"]
TARGET = 1.5


def _run(store: JobStore, settings: config.Settings, dag: Path, tmp: Path) -> tuple[float, float]:
    """Submit `dag`, run its jobs and wait for its end, with a service of its own: (the
    seconds from the submit to the DAG's end, the service's CPU seconds)."""
    service = subprocess.Popen([*CLI, "--db", settings.database_url, "schedd", "--name", HOME],
                               env={**os.environ, "JOBSTORE_DAG_SCRIPTS": str(tmp / "dagscripts")},
                               stderr=subprocess.DEVNULL)
    time.sleep(2.0)  # started and listening
    cpu0 = cpu_seconds(service.pid)
    try:
        started = time.monotonic()
        dag_id = submit_dag(store, str(dag), settings, owner=OWNER).dag_id
        while True:
            drain(store)
            row = store.dags.dag_of(dag_id)
            if row is not None and row.status in ("completed", "failed", "removed"):
                break
            time.sleep(0.01)
        took = time.monotonic() - started
        assert row.status == "completed", row
        return took, cpu_seconds(service.pid) - cpu0
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db-url", default=DEFAULT_ADMIN_URL)
    ap.add_argument("--nodes", type=int, default=2_000)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the scripts run as the DAG's owner")
    user = ensure_account(OWNER, uid=1001)
    env = make_env(args.db_url)
    try:
        create_pg(env)
        os.environ["JOBSTORE_DATABASE_URL"] = env.pg_url
        os.environ["JOBSTORE_SCHEDD_NAME"] = HOME
        settings = config.load_settings(None)
        store = JobStore.from_url(env.pg_url, statement_timeout_ms=None)
        work = env.tmp / "dag"
        work.mkdir()
        (work / "n.sub").write_text("executable = /bin/true\nqueue\n")
        post = work / "post.sh"
        post.write_text("#!/bin/sh\nexit 0\n")
        post.chmod(0o755)
        for path in (work, work / "n.sub", post):
            os.chown(path, user.pw_uid, user.pw_gid)
        nodes = "JOB root n.sub\n" + "".join(f"JOB W{i} n.sub\n" for i in range(args.nodes - 1))
        edges = "PARENT root CHILD " + " ".join(f"W{i}" for i in range(args.nodes - 1)) + "\n"
        (work / "plain.dag").write_text(nodes + edges)
        (work / "scripts.dag").write_text(nodes + edges + "SCRIPT POST ALL_NODES post.sh $JOB "
                                          "$RETURN\n")
        base, base_cpu = _run(store, settings, work / "plain.dag", env.tmp)
        took, cpu = _run(store, settings, work / "scripts.dag", env.tmp)
        ratio = took / base
        print(f"wide DAG of {args.nodes:,} no-op nodes, one claiming slot, PostgreSQL: "
              f"{took:.1f} s with a POST script per node against {base:.1f} s without "
              f"(ratio {ratio:.2f}, target <= {TARGET}: {'PASS' if ratio <= TARGET else 'MISS'})"
              f"; the service's CPU {cpu:.1f} s against {base_cpu:.1f} s: "
              f"{(cpu - base_cpu) / args.nodes * 1000:.1f} ms per script")
        store.db.engine.dispose()
    finally:
        cleanup(env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
