-- Migration 0025 (PostgreSQL): the scripts of DAG nodes, run by the access point's service.
-- It takes a due script's lease (jobstore_dag_script_start) before it starts it, and gives
-- its exit (jobstore_dag_script_done), which carries the DAG forward in that transaction.
-- Only the agents' roles (as which a `jobstore schedd` connects) may call them.

-- Take the lease on node `p_name`'s due `p_kind` script ('pre' or 'post') for the run
-- `p_token`: whether it was free (a PRE script starts only in a running DAG).
CREATE FUNCTION jobstore_dag_script_start(p_dag bigint, p_name text, p_kind text,
    p_token text, p_now double precision)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
BEGIN
    IF p_token IS NULL OR p_token !~ '^[0-9a-f]{32}$' OR p_kind NOT IN ('pre', 'post') THEN
        PERFORM jobstore_bad('not a script''s run');
    END IF;
    IF p_kind = 'pre' AND NOT EXISTS (SELECT 1 FROM dags WHERE id = p_dag
                                      AND status = 'running') THEN
        RETURN false;
    END IF;
    UPDATE dag_nodes SET script_token = p_token, script_started_at = jobstore_clock(p_now)
    WHERE dag_id = p_dag AND name = p_name AND status = p_kind AND script_token IS NULL;
    RETURN FOUND;
END $$;

-- Node `p_name`'s `p_kind` script of the run `p_token` exited with `p_code`: a PRE script's 0
-- releases the node's jobs, its PRE_SKIP exit makes the node done without them, another exit
-- fails it; a POST script's exit is the node's. Nothing when it is not the run the node
-- waited for.
CREATE FUNCTION jobstore_dag_script_done(p_dag bigint, p_name text, p_kind text,
    p_token text, p_code integer, p_now double precision)
RETURNS SETOF jobstore_change
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp
SET jit = off AS $$
#variable_conflict use_column
DECLARE
    n dag_nodes%ROWTYPE;
    v_now double precision := jobstore_clock(p_now);
    v_skipped boolean;
BEGIN
    PERFORM 1 FROM dags WHERE id = p_dag FOR UPDATE;
    SELECT * INTO n FROM dag_nodes WHERE dag_id = p_dag AND name = p_name FOR UPDATE;
    IF NOT FOUND OR n.status <> p_kind OR n.script_token IS DISTINCT FROM p_token THEN
        RETURN;
    END IF;
    UPDATE dag_nodes SET script_token = NULL, updated_at = v_now,
        pre_code = CASE WHEN p_kind = 'pre' THEN p_code ELSE pre_code END
    WHERE dag_id = p_dag AND name = p_name;
    IF p_kind = 'post' THEN
        -- its end recorded on the node's proc 0 (DAGMan's 016 in its log)
        INSERT INTO job_events (job_id, time, event, from_status, to_status, attrs)
        SELECT j.id, v_now, 'post_script', j.status, j.status,
               json_build_object('ReturnValue', p_code, 'DAGNodeName', p_name)
        FROM jobs j WHERE j.cluster_id = n.cluster_id AND j.proc_id = 0;
        IF FOUND THEN
            PERFORM pg_notify('jobstore_events', 'page');
        END IF;
        RETURN QUERY SELECT * FROM jobstore_dag_node_ended(p_dag, p_name, p_code, v_now);
    ELSIF p_code = 0 THEN
        UPDATE dag_nodes SET status = 'ready' WHERE dag_id = p_dag AND name = p_name;
    ELSE
        v_skipped := p_code = n.pre_skip;
        IF n.cluster_id IS NOT NULL THEN
            RETURN QUERY SELECT * FROM jobstore_dag_move_jobs(ARRAY[n.cluster_id],
                'node_futile', 'removed', v_now, format('%sits PRE script exited with %s',
                CASE WHEN v_skipped THEN 'PRE_SKIP: ' ELSE '' END, p_code));
        END IF;
        RETURN QUERY SELECT * FROM jobstore_dag_node_ended(p_dag, p_name,
            CASE WHEN v_skipped THEN 0 ELSE p_code END, v_now);
    END IF;
    RETURN QUERY SELECT * FROM jobstore_dag_advance(p_dag, v_now);
END $$;
