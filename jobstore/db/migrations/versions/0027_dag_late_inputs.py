"""A DAG node's inputs read when it is submitted: a node with parents (or the FINAL node)
keeps the transfer_input_files its jobs take (`late_inputs`, JSON [[path, name], ...]), which
the access point's `jobstore schedd` reads as the DAG's owner once the node's parents are done
and their outputs home, as DAGMan reads a node's submit description then. Such a node waits in
`pre`, as for a PRE script, and its inputs and the release of its jobs are one transaction
(`jobstore_dag_script_done` with 0; -1001, DAGMan's submit failure, when they could not be
read). 0025's functions with the lines of CHANGES changed.

Revision ID: 0027
Revises: 0026
"""

import functools
import importlib.util
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

HERE = Path(__file__).parent
# 0025's text -> this migration's, by function
CHANGES = {
    "jobstore_dag_nodes(": [
        ("    IF v_bad IS NOT NULL THEN\n        PERFORM jobstore_bad(format('DAG %s: %s',",
         "    IF v_bad IS NULL THEN\n"
         "        SELECT format('node %s: its late inputs are at most 1000 pairs of an absolute '\n"
         "                      'path and a name in the sandbox, in 1 MB', n.name) INTO v_bad\n"
         "        FROM json_to_recordset(p_nodes) AS n(name text, late_inputs json)\n"
         "        WHERE n.late_inputs IS NOT NULL AND json_typeof(n.late_inputs) <> 'null'\n"
         "          AND (json_typeof(n.late_inputs) <> 'array'\n"
         "               OR json_array_length(n.late_inputs) NOT BETWEEN 1 AND 1000\n"
         "               OR octet_length(n.late_inputs::text) > 1048576\n"
         "               OR EXISTS (\n"
         "                   SELECT 1 FROM json_array_elements(n.late_inputs) AS e(v)\n"
         "                   WHERE json_typeof(e.v) <> 'array' OR json_array_length(e.v) <> 2\n"
         "                      OR json_typeof(e.v -> 0) <> 'string'\n"
         "                      OR json_typeof(e.v -> 1) <> 'string'\n"
         "                      OR (e.v ->> 0) !~ '^/' OR length(e.v ->> 0) > 4096\n"
         "                      OR length(e.v ->> 1) > 4096\n"
         "                      OR (e.v ->> 0) || (e.v ->> 1) ~ '[\\x01-\\x1f\\x7f]'\n"
         "                      OR (e.v ->> 1) ~ '^/' OR (e.v ->> 1) ~ '(^|/)\\.\\.(/|$)'))\n"
         "        LIMIT 1;\n"
         "    END IF;\n"
         "    IF v_bad IS NOT NULL THEN\n        PERFORM jobstore_bad(format('DAG %s: %s',"),
        ("            pre_skip integer, directory text)\n",
         "            pre_skip integer, directory text, late_inputs json)\n"),
        ("            post_script, pre_skip, directory)\n",
         "            post_script, pre_skip, directory, late_inputs)\n"),
        ("            coalesce(s.final, false), v_now, s.pre_script, s.post_script, s.pre_skip,\n"
         "            s.directory\n",
         "            coalesce(s.final, false), v_now, s.pre_script, s.post_script, s.pre_skip,\n"
         "            s.directory, CASE WHEN json_typeof(s.late_inputs) = 'array'\n"
         "                              THEN s.late_inputs::text END\n"),
    ],
    "jobstore_dag_release_ready(": [
        ("        IF n.pre_script IS NOT NULL AND n.pre_code IS NULL THEN\n",
         "        IF (n.pre_script IS NOT NULL OR n.late_inputs IS NOT NULL)\n"
         "           AND n.pre_code IS NULL THEN\n"),
    ],
    "jobstore_dag_script_done(": [
        ("                'node_futile', 'removed', v_now, format("
         "'%sits PRE script exited with %s',\n"
         "                CASE WHEN v_skipped THEN 'PRE_SKIP: ' ELSE '' END, p_code));\n",
         "                'node_futile', 'removed', v_now, CASE WHEN p_code = -1001\n"
         "                THEN 'its transfer_input_files could not be read on the access point '\n"
         "                     'when the node was submitted'\n"
         "                ELSE format('%sits PRE script exited with %s',\n"
         "                CASE WHEN v_skipped THEN 'PRE_SKIP: ' ELSE '' END, p_code) END);\n"),
    ],
}


def upgrade() -> None:
    op.add_column("dag_nodes", sa.Column("late_inputs", sa.Text()))
    if op.get_bind().dialect.name != "postgresql":
        return
    for name in CHANGES:
        _scripts()._dag_home()._run_sql(_changed(name))


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for name in CHANGES:
            _scripts()._dag_home()._run_sql(_before(name))
    op.drop_column("dag_nodes", "late_inputs")


def _before(name: str) -> str:
    """`name`'s CREATE OR REPLACE FUNCTION as 0025 left it."""
    scripts = _scripts()
    if name in scripts.CHANGES:
        return scripts._changed(name)
    sql = (HERE / "0025_dag_scripts.sql").read_text(encoding="utf-8")
    start = sql.index(f"CREATE FUNCTION {name}")
    text = sql[start:sql.index("END $$;", start) + len("END $$;")]
    return text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


def _changed(name: str) -> str:
    text = _before(name)
    for old, new in CHANGES[name]:
        assert old in text, (name, old)
        text = text.replace(old, new, 1)
    return text


@functools.cache
def _scripts():  # noqa: ANN202 - the migration module 0025 (its functions' text)
    spec = importlib.util.spec_from_file_location("dag_scripts", HERE / "0025_dag_scripts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
