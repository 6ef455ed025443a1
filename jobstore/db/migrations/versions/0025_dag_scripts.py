"""The scripts of DAG nodes (SCRIPT PRE, SCRIPT POST, PRE_SKIP), run on the access point by
its `jobstore schedd`: each node keeps its scripts, its directory, the lease on the script
that runs (`script_token`) and the exits the next script is told of. The engine's functions
learn two more node statuses, `pre` and `post` (a script is due or runs): 0019's functions
(and 0024's `jobstore_dag_nodes`) with the lines of CHANGES changed, and two new ones
(0025_dag_scripts.sql) that the agents' roles call.

Revision ID: 0025
Revises: 0024
"""

import functools
import importlib.util
from pathlib import Path

import sqlalchemy as sa
from alembic import op

from jobstore.db.migrations.shared import AGENT_ROLES

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

HERE = Path(__file__).parent
NEW_FUNCTIONS = (
    "jobstore_dag_script_start(bigint, text, text, text, double precision)",
    "jobstore_dag_script_done(bigint, text, text, text, integer, double precision)",
)
COLUMNS = (("pre_script", sa.Text), ("post_script", sa.Text), ("pre_skip", sa.Integer),
           ("directory", sa.Text), ("pre_code", sa.Integer), ("job_code", sa.Integer),
           ("script_token", lambda: sa.String(64)),
           ("script_started_at", lambda: sa.Float(precision=53)))
UNFINISHED = "('waiting', 'ready', 'queued')"
LIVE_NODES = "('waiting', 'ready', 'pre', 'queued', 'post')"
# 0019's text (0024's for jobstore_dag_nodes) -> this migration's, by function
CHANGES = {
    "jobstore_dag_nodes(": [
        ("        LATERAL json_to_record(e.v) AS n(name text, procs integer,\n"
         "            done boolean, priority integer, category text, abort_exit integer,\n"
         "            abort_return integer, final boolean)",
         "        LATERAL json_to_record(e.v) AS n(name text, procs integer,\n"
         "            done boolean, priority integer, category text, abort_exit integer,\n"
         "            abort_return integer, final boolean, pre_script text, post_script text,\n"
         "            pre_skip integer, directory text)"),
        ("    IF v_bad IS NOT NULL THEN\n        PERFORM jobstore_bad(format('DAG %s: %s',",
         "    IF v_bad IS NULL THEN\n"
         "        SELECT format('node %s: a SCRIPT is a command and its DIR an absolute path, '\n"
         "                      'each one line of at most 4096 characters', n.name) INTO v_bad\n"
         "        FROM json_to_recordset(p_nodes) AS n(name text, pre_script text,\n"
         "                                             post_script text, directory text)\n"
         "        WHERE length(n.pre_script) > 4096 OR length(n.post_script) > 4096\n"
         "           OR length(n.directory) > 4096 OR n.pre_script ~ '[\\n\\r]'\n"
         "           OR n.post_script ~ '[\\n\\r]' OR n.directory ~ '[\\n\\r]'\n"
         "           OR btrim(n.pre_script) = '' OR btrim(n.post_script) = ''\n"
         "           OR ((n.pre_script IS NOT NULL OR n.post_script IS NOT NULL)\n"
         "               AND coalesce(n.directory, '') !~ '^/')\n"
         "        LIMIT 1;\n"
         "    END IF;\n"
         "    IF v_bad IS NOT NULL THEN\n        PERFORM jobstore_bad(format('DAG %s: %s',"),
        ("            category, abort_exit, abort_return, final, updated_at)\n",
         "            category, abort_exit, abort_return, final, updated_at, pre_script,\n"
         "            post_script, pre_skip, directory)\n"),
        ("            coalesce(s.final, false), v_now\n",
         "            coalesce(s.final, false), v_now, s.pre_script, s.post_script, s.pre_skip,\n"
         "            s.directory\n"),
    ],
    "jobstore_dag_parents_done(": [
        ("WHERE m.status = 'ready' AND m.cluster_id IS NULL AND NOT m.final), '{}')",
         "WHERE m.status = 'ready' AND m.cluster_id IS NULL AND NOT m.final\n"
         "                         AND m.pre_script IS NULL AND m.post_script IS NULL), '{}')"),
        ("RETURNING n.name, n.status, n.cluster_id, n.final)",
         "RETURNING n.name, n.status, n.cluster_id, n.final, n.pre_script, n.post_script)"),
        ("RETURNING n.status, n.cluster_id IS NULL AND NOT n.final\n",
         "RETURNING n.status, n.cluster_id IS NULL AND NOT n.final AND n.pre_script IS NULL\n"
         "                          AND n.post_script IS NULL\n"),
    ],
    "jobstore_dag_make_futile(": [
        ("status IN ('waiting', 'ready')\n", "status IN ('waiting', 'ready', 'pre')\n"),
    ],
    "jobstore_dag_abort(": [
        ("    UPDATE dags SET dag_status = p_dag_status, exit_code = p_code WHERE id = p_dag;\n",
         "    UPDATE dags SET dag_status = p_dag_status, exit_code = p_code WHERE id = p_dag;\n"
         "    -- a stopped DAG runs no POST script but its FINAL node's\n"
         "    UPDATE dag_nodes SET status = 'failed', updated_at = p_now,\n"
         "        exit_code = CASE WHEN job_code <> 0 THEN job_code ELSE 1 END\n"
         "    WHERE dag_id = p_dag AND status = 'post' AND NOT final;\n"),
        ("n.status IN ('waiting', 'ready') AND NOT n.final), p_now",
         "n.status IN ('waiting', 'ready', 'pre') AND NOT n.final), p_now"),
    ],
    "jobstore_dag_release_ready(": [
        ("    v_noop text[] := '{}';\n",
         "    v_noop text[] := '{}';\n    v_pre text[] := '{}';\n    v_post text[] := '{}';\n"),
        ("             ORDER BY priority DESC, name LOOP\n",
         "             ORDER BY priority DESC, name LOOP\n"
         "        IF n.pre_script IS NOT NULL AND n.pre_code IS NULL THEN\n"
         "            v_pre := v_pre || n.name::text;  -- throttled on the access point\n"
         "            CONTINUE;\n"
         "        END IF;\n"
         "        IF n.cluster_id IS NULL AND n.post_script IS NOT NULL THEN\n"
         "            v_post := v_post || n.name::text;\n"
         "            CONTINUE;\n"
         "        END IF;\n"),
        ("    IF cardinality(v_noop) > 0 THEN\n",
         "    IF cardinality(v_pre) + cardinality(v_post) > 0 THEN\n"
         "        UPDATE dag_nodes SET status = 'pre', updated_at = p_now\n"
         "        WHERE dag_id = p_dag AND name = ANY(v_pre);\n"
         "        UPDATE dag_nodes SET status = 'post', job_code = 0, updated_at = p_now\n"
         "        WHERE dag_id = p_dag AND name = ANY(v_post);\n"
         "        PERFORM pg_notify('jobstore_events', 'page');\n"
         "    END IF;\n"
         "    IF cardinality(v_noop) > 0 THEN\n"),
    ],
    "jobstore_dag_advance(": [(f"status IN {UNFINISHED}", f"status IN {LIVE_NODES}")] * 3,
    "jobstore_dag_jobs_ended(": [
        ("        CONTINUE WHEN v IS NULL;\n",
         "        CONTINUE WHEN v IS NULL;\n"
         "        UPDATE dag_nodes x SET status = 'post', job_code = v, updated_at = p_now\n"
         "        WHERE x.dag_id = n.dag_id AND x.name = n.name AND x.post_script IS NOT NULL;\n"
         "        CONTINUE WHEN FOUND;  -- its POST script decides it\n"),
    ],
}


def upgrade() -> None:
    for name, kind in COLUMNS:
        op.add_column("dag_nodes", sa.Column(name, kind()))
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    for name in CHANGES:
        _dag_home()._run_sql(_changed(name))
    _dag_home()._run_sql((HERE / "0025_dag_scripts.sql").read_text(encoding="utf-8"))
    quote = bind.dialect.identifier_preparer.quote
    for function in NEW_FUNCTIONS:
        op.execute(f"REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC")
        for role in bind.execute(sa.text(AGENT_ROLES)).scalars():
            op.execute(f"GRANT EXECUTE ON FUNCTION {function} TO {quote(role)}")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        for function in NEW_FUNCTIONS:
            op.execute(f"DROP FUNCTION {function}")
        for name in CHANGES:
            _dag_home()._run_sql(_before(name))
    for name, _kind in reversed(COLUMNS):
        op.drop_column("dag_nodes", name)


def _before(name: str) -> str:
    """`name`'s CREATE OR REPLACE FUNCTION as it was before this migration."""
    home = _dag_home()
    text = home._function(name)
    for old, new in home.CHANGES.get(name, []):
        text = text.replace(old, new, 1)
    return text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def _changed(name: str) -> str:
    text = _before(name)
    for old, new in CHANGES[name]:
        assert old in text, (name, old)
        text = text.replace(old, new, 1)
    return text


@functools.cache
def _dag_home():  # noqa: ANN202 - the migration module 0024 (its functions' text, its SQL run)
    spec = importlib.util.spec_from_file_location("dag_home", HERE / "0024_dag_home.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
