-- Migration 0022 (PostgreSQL): the door's new cluster takes the access point its outputs go
-- home to. Run as the tables' owner; @schema@ is the store's schema, quoted.

-- A new cluster of `owner` (NULL: the session's account) in `queue`, whose outputs go home to
-- the access point `home` (NULL: spooled); with `key`, the cluster a submit of hers with that
-- key made before, if any (created false).
CREATE FUNCTION jobstore_new_cluster(p_owner text, p_queue text, p_submit_file text,
    p_num_procs integer, p_key text, p_now double precision, p_home text DEFAULT NULL)
RETURNS TABLE (cluster_id bigint, created boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_owner text := coalesce(p_owner, jobstore_account());
    v_now double precision := jobstore_clock(p_now);
    v_id bigint;
BEGIN
    PERFORM jobstore_check_submitter(v_owner);
    -- root is refused here but to the store's owner, whose job of root's is held at the
    -- fetch (a job that got there anyway), as every other node-side refusal
    IF v_owner !~ '^[A-Za-z_][A-Za-z0-9_.-]{0,31}$'
       OR (v_owner = 'root' AND NOT jobstore_trusted()) THEN
        PERFORM jobstore_bad(format('%L is not an account jobs may run as', v_owner));
    END IF;
    IF p_queue IS NULL OR p_queue !~ '^[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,63}$' THEN
        PERFORM jobstore_bad(format('%L is not a queue name', p_queue));
    END IF;
    IF length(p_submit_file) > 4096 OR p_submit_file ~ '[\n\r]' THEN
        PERFORM jobstore_bad('the submit file is not a path');
    END IF;
    IF p_num_procs IS NULL OR p_num_procs < 0 THEN
        PERFORM jobstore_bad('a cluster has 0 procs or more');
    END IF;
    IF p_key IS NOT NULL AND (length(p_key) > 255 OR p_key ~ '[\n\r]') THEN
        PERFORM jobstore_bad('an idempotency key is one line of at most 255 characters');
    END IF;
    IF p_home IS NOT NULL AND p_home !~ '^[A-Za-z0-9][A-Za-z0-9_.@-]{0,254}$' THEN
        PERFORM jobstore_bad(format('%L is not the name of an access point',
                                    left(translate(p_home, E'\n\r', '  '), 300)));
    END IF;
    INSERT INTO clusters (owner, queue, submit_file, num_procs, submitted_at, idempotency_key,
        home)
    VALUES (v_owner, p_queue, p_submit_file, p_num_procs, v_now, p_key, p_home)
    ON CONFLICT (owner, idempotency_key) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NOT NULL THEN
        RETURN QUERY SELECT v_id, true;
        RETURN;
    END IF;
    RETURN QUERY SELECT c.id, false FROM clusters c
        WHERE c.owner = v_owner AND c.idempotency_key = p_key;
END $$;
