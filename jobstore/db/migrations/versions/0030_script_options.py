"""SCRIPT DEFER, SCRIPT DEBUG and SCRIPT HOLD of a DAG's nodes: `dag_nodes.script_options`
(JSON, by kind: {"pre": {"defer": [status, seconds], "debug": [file, "STDOUT" | "STDERR" |
"ALL"]}, "hold": {"command": ..., "debug": ...}, ...}) and `hold_script`, given by the DAG's
owner through the door (`jobstore_dag_script_options`, which checks every value);
`dag_nodes.script_after`, before which a deferred script is not due again, which the access
point's service sets through `jobstore_dag_script_defer` (the agents' roles') when a script
exits with its DEFER status; and a HOLD script's own lease (`hold_token`, `hold_started_at`,
`holds_seen`: the holds of the node's jobs it was started for), taken and given back through
`jobstore_dag_hold_start` and `jobstore_dag_hold_done` (the agents' roles').

Revision ID: 0030
Revises: 0029
"""

import sqlalchemy as sa
from alembic import op

from jobstore.db.migrations.shared import AGENT_ROLES, USER_ROLES, grant, run_sql

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

OPTIONS = "jobstore_dag_script_options(bigint, json)"
DEFER = "jobstore_dag_script_defer(bigint, text, text, text, double precision)"
PROBLEM = "jobstore_script_option_problem(text, json, text)"
HOLD_START = "jobstore_dag_hold_start(bigint, text, text, double precision)"
HOLD_DONE = "jobstore_dag_hold_done(bigint, text, text)"
FREE = "jobstore_dag_nodes_free(bigint[], text[], boolean)"
SQL = r"""
-- Why `p_value` is not the options of a node's `p_kind` script `p_script` (NULL: it is).
CREATE FUNCTION jobstore_script_option_problem(p_kind text, p_value json, p_script text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_defer json;
    v_debug json;
BEGIN
    IF p_kind NOT IN ('pre', 'post', 'hold') THEN
        RETURN format('%L is not PRE, POST or HOLD', p_kind);
    END IF;
    IF json_typeof(p_value) IS DISTINCT FROM 'object' THEN
        RETURN 'its options are not an object';
    END IF;
    IF p_kind = 'hold' THEN
        IF EXISTS (SELECT 1 FROM json_object_keys(p_value) AS k(key)
                   WHERE k.key NOT IN ('command', 'debug')) THEN
            RETURN 'its command line and DEBUG are its only options';
        END IF;
        IF json_typeof(p_value -> 'command') IS DISTINCT FROM 'string'
           OR length(p_value ->> 'command') > 4096 OR btrim(p_value ->> 'command') = ''
           OR (p_value ->> 'command')
              ~ '[[:cntrl:]\u0080-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]' THEN
            RETURN 'its command line is one line of at most 4096 characters';
        END IF;
    ELSIF p_script IS NULL THEN
        RETURN format('the node has no %s script', upper(p_kind));
    ELSIF EXISTS (SELECT 1 FROM json_object_keys(p_value) AS k(key)
                  WHERE k.key NOT IN ('defer', 'debug')) THEN
        RETURN 'DEFER and DEBUG are its only options';
    END IF;
    v_defer := p_value -> 'defer';
    IF v_defer IS NOT NULL AND NOT (
            json_typeof(v_defer) = 'array' AND json_array_length(v_defer) = 2
            AND CASE WHEN (v_defer ->> 0) ~ '^[0-9]{1,3}$' AND (v_defer ->> 1) ~ '^[0-9]{1,7}$'
                          AND json_typeof(v_defer -> 0) = 'number'
                          AND json_typeof(v_defer -> 1) = 'number'
                     THEN (v_defer ->> 0)::integer BETWEEN 1 AND 255
                          AND (v_defer ->> 1)::integer <= 2592000
                     ELSE false END) THEN
        RETURN 'DEFER is an exit status of 1 to 255 and at most 2592000 seconds';
    END IF;
    v_debug := p_value -> 'debug';
    IF v_debug IS NOT NULL AND NOT (
            json_typeof(v_debug) = 'array' AND json_array_length(v_debug) = 2
            AND CASE WHEN json_typeof(v_debug -> 0) = 'string'
                          AND json_typeof(v_debug -> 1) = 'string'
                     THEN length(v_debug ->> 0) BETWEEN 1 AND 4096
                          AND (v_debug ->> 0) !~ '[\x01-\x1f\x7f]'
                          AND (v_debug ->> 1) IN ('STDOUT', 'STDERR', 'ALL')
                     ELSE false END) THEN
        RETURN 'DEBUG is a file''s name and STDOUT, STDERR or ALL';
    END IF;
    RETURN NULL;
END $$;

-- The DEFER and DEBUG options of the scripts of DAG `p_dag`'s nodes, given by its owner:
-- {node: {"pre": {...}, "post": {...}}}, each checked.
CREATE FUNCTION jobstore_dag_script_options(p_dag bigint, p_options json)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    d dags%ROWTYPE;
    n dag_nodes%ROWTYPE;
    v_name text;
    v_value json;
    v_kind text;
    v_options json;
    v_bad text;
BEGIN
    SELECT * INTO d FROM dags WHERE id = p_dag FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JS004', MESSAGE = format('no DAG %s', p_dag);
    END IF;
    PERFORM jobstore_check_submitter(d.owner);
    IF json_typeof(p_options) IS DISTINCT FROM 'object' THEN
        PERFORM jobstore_bad(format('DAG %s: its scripts'' options are an object of nodes',
                                    d.path));
    END IF;
    FOR v_name, v_value IN SELECT o.key, o.value FROM json_each(p_options) AS o(key, value) LOOP
        SELECT * INTO n FROM dag_nodes WHERE dag_id = p_dag AND name = v_name;
        IF NOT FOUND THEN
            PERFORM jobstore_bad(format('DAG %s: no node %s', d.path, v_name));
        END IF;
        IF json_typeof(v_value) IS DISTINCT FROM 'object' THEN
            PERFORM jobstore_bad(format('DAG %s: node %s: its scripts'' options are not an '
                                        'object', d.path, v_name));
        END IF;
        FOR v_kind, v_options IN SELECT k.key, k.value FROM json_each(v_value) AS k(key, value)
        LOOP
            v_bad := jobstore_script_option_problem(v_kind, v_options,
                CASE v_kind WHEN 'pre' THEN n.pre_script WHEN 'post' THEN n.post_script END);
            IF v_bad IS NOT NULL THEN
                PERFORM jobstore_bad(format('DAG %s: node %s: SCRIPT %s: %s', d.path, v_name,
                                            upper(v_kind), v_bad));
            END IF;
        END LOOP;
        IF v_value -> 'hold' IS NOT NULL AND coalesce(n.directory, '') !~ '^/' THEN
            PERFORM jobstore_bad(format('DAG %s: node %s: SCRIPT HOLD: its directory is no '
                                        'absolute path', d.path, v_name));
        END IF;
        UPDATE dag_nodes SET script_options = (v_value::jsonb)::text,
            hold_script = v_value -> 'hold' ->> 'command'
        WHERE dag_id = p_dag AND name = v_name;
    END LOOP;
END $$;

-- Take the lease on node `p_name`'s HOLD script for the run `p_token`, for the holds of its
-- jobs so far: whether the node (its jobs queued, or its POST script due) has holds no HOLD
-- script was started for, and no HOLD script runs.
CREATE FUNCTION jobstore_dag_hold_start(p_dag bigint, p_name text, p_token text,
    p_now double precision)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
BEGIN
    IF p_token IS NULL OR p_token !~ '^[0-9a-f]{32}$' THEN
        PERFORM jobstore_bad('not a script''s run');
    END IF;
    UPDATE dag_nodes n SET hold_token = p_token, hold_started_at = jobstore_clock(p_now),
        holds_seen = h.holds
    FROM (SELECT coalesce(sum(j.num_holds), 0)::bigint AS holds FROM jobs j
          JOIN dag_nodes m ON m.cluster_id = j.cluster_id
          WHERE m.dag_id = p_dag AND m.name = p_name) h
    WHERE n.dag_id = p_dag AND n.name = p_name AND n.hold_script IS NOT NULL
      AND n.hold_token IS NULL AND n.status IN ('queued', 'post')
      AND h.holds > coalesce(n.holds_seen, 0);
    RETURN FOUND;
END $$;

-- Of the nodes (`p_dags`[i], `p_names`[i]), those this transaction now holds (and their
-- DAGs' rows, with `p_dags_too`), skipping those another transaction holds: the service's
-- leases and exits never wait for an owner's open transaction on her own rows.
CREATE FUNCTION jobstore_dag_nodes_free(p_dags bigint[], p_names text[], p_dags_too boolean)
RETURNS TABLE (dag_id bigint, name text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
BEGIN
    IF p_dags_too THEN
        RETURN QUERY SELECT n.dag_id, n.name::text FROM dag_nodes n JOIN dags d ON d.id = n.dag_id
        JOIN unnest(p_dags, p_names) AS k(dag_id, name)
          ON k.dag_id = n.dag_id AND k.name = n.name
        FOR UPDATE OF n, d SKIP LOCKED;
    ELSE
        RETURN QUERY SELECT n.dag_id, n.name::text FROM dag_nodes n
        JOIN unnest(p_dags, p_names) AS k(dag_id, name)
          ON k.dag_id = n.dag_id AND k.name = n.name
        FOR UPDATE OF n SKIP LOCKED;
    END IF;
END $$;

-- The run `p_token` of node `p_name`'s HOLD script ended (its exit changes nothing).
CREATE FUNCTION jobstore_dag_hold_done(p_dag bigint, p_name text, p_token text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
BEGIN
    UPDATE dag_nodes SET hold_token = NULL
    WHERE dag_id = p_dag AND name = p_name AND hold_token = p_token;
    RETURN FOUND;
END $$;

-- The run `p_token` of node `p_name`'s `p_kind` script exited with its DEFER status: the
-- script is due again from `p_until` on (whether the node still waited for that run).
CREATE FUNCTION jobstore_dag_script_defer(p_dag bigint, p_name text, p_kind text,
    p_token text, p_until double precision)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
BEGIN
    UPDATE dag_nodes SET script_token = NULL, script_after = p_until
    WHERE dag_id = p_dag AND name = p_name AND status = p_kind AND script_token = p_token;
    RETURN FOUND;
END $$;
"""


def upgrade() -> None:
    op.add_column("dag_nodes", sa.Column("script_options", sa.Text()))
    op.add_column("dag_nodes", sa.Column("script_after", sa.Float(precision=53)))
    op.add_column("dag_nodes", sa.Column("hold_script", sa.Text()))
    op.add_column("dag_nodes", sa.Column("hold_token", sa.String(64)))
    op.add_column("dag_nodes", sa.Column("hold_started_at", sa.Float(precision=53)))
    op.add_column("dag_nodes", sa.Column("holds_seen", sa.BigInteger()))
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    run_sql(bind, SQL)
    for function in (OPTIONS, DEFER, PROBLEM, HOLD_START, HOLD_DONE, FREE):
        op.execute(f"REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC")
    grant(bind, USER_ROLES, f"GRANT EXECUTE ON FUNCTION {OPTIONS} TO {{role}}")
    for function in (DEFER, HOLD_START, HOLD_DONE, FREE):
        grant(bind, AGENT_ROLES, f"GRANT EXECUTE ON FUNCTION {function} TO {{role}}")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for function in (OPTIONS, DEFER, PROBLEM, HOLD_START, HOLD_DONE, FREE):
            op.execute(f"DROP FUNCTION {function}")
    for column in ("holds_seen", "hold_started_at", "hold_token", "hold_script"):
        op.drop_column("dag_nodes", column)
    op.drop_column("dag_nodes", "script_after")
    op.drop_column("dag_nodes", "script_options")
