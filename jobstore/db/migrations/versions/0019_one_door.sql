-- Migration 0019 (PostgreSQL): one door into the queue. Every write a submitter makes goes
-- through the SECURITY DEFINER functions below, which take the owner from the session and
-- check every value they store; submitters hold no INSERT, UPDATE or DELETE on any table. The
-- DAGs are carried forward by the database itself (jobstore_dag_*), whoever ends a node's job.
-- @schema@ is the quoted schema of the tables. Every function's search_path puts pg_catalog
-- first, and no role but the owner may create objects in the schema, so that nothing a
-- submitter makes can stand in for what a function names.

-- ---- who the session is -----------------------------------------------------------------

CREATE OR REPLACE FUNCTION jobstore_trusted() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
    SELECT pg_has_role(session_user, c.relowner, 'MEMBER')
    FROM pg_class c WHERE c.oid = '@schema@.jobs'::regclass
$$;

CREATE OR REPLACE FUNCTION jobstore_account() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
    SELECT coalesce((SELECT q.account FROM queue_roles q WHERE q.role = session_user),
                    session_user::text)
$$;

CREATE OR REPLACE FUNCTION jobstore_super_user() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
    SELECT jobstore_trusted() OR EXISTS (
        SELECT 1 FROM queue_roles q JOIN pg_roles r ON r.rolname = q.role
        WHERE q.super_user AND pg_has_role(session_user, r.oid, 'MEMBER'))
$$;

-- Whether a session may use the door at all: the store's owner, or a role `jobstore
-- grant-user` registered (or a member of one).
CREATE FUNCTION jobstore_submitter() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
    SELECT jobstore_trusted() OR EXISTS (
        SELECT 1 FROM queue_roles q JOIN pg_roles r ON r.rolname = q.role
        WHERE pg_has_role(session_user, r.oid, 'MEMBER'))
$$;

CREATE FUNCTION jobstore_admin() RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
    SELECT jobstore_trusted() OR EXISTS (
        SELECT 1 FROM queue_roles q JOIN pg_roles r ON r.rolname = q.role
        WHERE q.admin AND pg_has_role(session_user, r.oid, 'MEMBER'))
$$;

-- A --may-impersonate pattern is one regular expression on its own and as the whole-name
-- match `^(?:PATTERN)$`: only then is the wrapped form the same pattern (`alice)|(x` is not).
CREATE FUNCTION jobstore_valid_pattern(pattern text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
    PERFORM '' ~ pattern;
    PERFORM '' ~ ('^(?:' || pattern || ')$');
    RETURN true;
EXCEPTION WHEN invalid_regular_expression THEN
    RETURN false;
END $$;

CREATE OR REPLACE FUNCTION jobstore_may_submit_as(owner text) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
    SELECT owner = jobstore_account() OR jobstore_trusted() OR EXISTS (
        SELECT 1 FROM queue_roles q JOIN pg_roles r ON r.rolname = q.role
        WHERE q.super_user AND q.may_impersonate IS NOT NULL
          AND jobstore_valid_pattern(q.may_impersonate)
          AND pg_has_role(session_user, r.oid, 'MEMBER')
          AND owner ~ ('^(?:' || q.may_impersonate || ')$'))
$$;

-- ---- notifications the agents can believe --------------------------------------------------
-- Anyone who may connect may NOTIFY any channel. What the agents act on (new work, stopped
-- attempts) is signed with a key only the tables' owner and the agents' roles read:
-- "<ms> <xid> <mac> <payload>", the mac the first 32 hex digits of
-- sha256(key || hex(sha256(key || "<ms> <xid> <payload>"))) (jobstore.db.channels checks it).

INSERT INTO notify_keys (name, key)
VALUES ('notify', replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''));

CREATE FUNCTION jobstore_sign(p_payload text) RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
    SELECT format('%s %s %s %s', m.ms, m.xid, left(encode(sha256(convert_to(k.key || encode(
               sha256(convert_to(k.key || m.ms || ' ' || m.xid || ' ' || p_payload, 'UTF8')),
               'hex'), 'UTF8')), 'hex'), 32), p_payload)
    FROM notify_keys k,
         (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint::text AS ms,
                 pg_current_xact_id()::text AS xid) m
    WHERE k.name = 'notify'
$$;

CREATE OR REPLACE FUNCTION jobstore_work_shapes(shapes text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, @schema@, pg_temp AS $$
BEGIN
    IF shapes IS NOT NULL THEN
        PERFORM pg_notify('jobstore_work', jobstore_sign(CASE WHEN length(shapes) > 7800
                                                               THEN '*' ELSE shapes END));
    END IF;
END $$;

-- ---- refusals: one line each, with a code the client maps (JS001 bad input, JS002 refused,
-- JS004 unknown) ------------------------------------------------------------------------------

CREATE FUNCTION jobstore_bad(message text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
#variable_conflict use_column
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'JS001', MESSAGE = message;
END $$;

CREATE FUNCTION jobstore_refused(message text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
#variable_conflict use_column
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'JS002', MESSAGE = message;
END $$;

-- The session may use the door and submit as `owner` (JS002 otherwise).
CREATE FUNCTION jobstore_check_submitter(owner text) RETURNS void
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
BEGIN
    IF NOT jobstore_submitter() THEN
        PERFORM jobstore_refused(jobstore_account() || ' may not submit jobs to this job store'
            || ' (ask its admin for `jobstore grant-user`)');
    END IF;
    IF NOT jobstore_may_submit_as(owner) THEN
        PERFORM jobstore_refused(jobstore_account() || ' may not submit jobs as ' || owner
            || ': only a queue super user may submit for the accounts its'
            || ' QUEUE_SUPER_USER_MAY_IMPERSONATE rule allows');
    END IF;
END $$;

-- The time a session's write is recorded at: the caller's for the store's owner, the
-- database's own clock for everyone else.
CREATE FUNCTION jobstore_clock(wanted double precision) RETURNS double precision
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
    SELECT CASE WHEN wanted IS NOT NULL AND jobstore_trusted() THEN wanted
                ELSE extract(epoch FROM clock_timestamp())::double precision END
$$;

-- ---- what a stored value may be -----------------------------------------------------------
-- libclassad parses and prints an expression recursively: a chain of about 32,000 binary
-- operators overflows an 8 MB stack (the parser itself refuses some 200 nested parentheses
-- and 400 unary operators). A job's ad never needs more than FETCH_WORK can print (10,240
-- bytes), so an expression or string is at most 10,240 characters with at most 2,048
-- operators outside its string literals, and an ad's JSON at most 32,768 bytes.

CREATE FUNCTION jobstore_operators(value text) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT length(regexp_replace(regexp_replace(value, '"(?:[^"\\]|\\.)*"', '', 'g'),
                                 '[^-+*/%&|^<>=!?:(\[{.,]', '', 'g'))
$$;

-- Why `value` (a string or an expression's text) cannot be stored, else NULL.
CREATE FUNCTION jobstore_value_problem(value text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN value IS NULL THEN NULL
        WHEN length(value) > 10240 THEN 'longer than 10240 characters'
        WHEN value ~ '[\n\r]' THEN 'a line break'
        WHEN length(value) > 2048 AND jobstore_operators(value) > 2048
            THEN 'more than 2048 operators'
    END
$$;

-- Why a JSON number (its text) cannot be a job's value: what a ClassAd integer (64 bits) or
-- real holds, written in at most 32 characters.
CREATE FUNCTION jobstore_number_problem(p_text text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN length(p_text) > 32 THEN 'a number longer than 32 characters'
        WHEN p_text ~ '[.eE]' THEN CASE WHEN abs(p_text::numeric) < 1e300 THEN NULL
                                        ELSE 'a number out of range' END
        WHEN p_text::numeric BETWEEN -9223372036854775808 AND 9223372036854775807 THEN NULL
        ELSE 'an integer out of range'
    END
$$;

-- Why the submitted attribute `name` = `value` (a JSON value of the ad) cannot be stored,
-- else NULL. `when_` is 'submit' or 'edit'; `super` whether the session is a queue super user.
CREATE FUNCTION jobstore_attr_problem(p_name text, p_value json, p_when text, p_super boolean)
RETURNS text LANGUAGE sql STABLE SET search_path = pg_catalog, @schema@, pg_temp AS $$
    SELECT CASE
        WHEN p_name !~ '^[A-Za-z_][A-Za-z0-9_]{0,99}$' THEN 'not an attribute name'
        WHEN (lower(p_name) LIKE 'jobstore%' AND r.rule IS NULL) OR r.rule = 'immutable'
            THEN 'this attribute is set by the job store'
        WHEN r.rule = 'submit' AND p_when NOT IN ('submit', 'dag')
            THEN 'this attribute cannot change'
        WHEN r.rule = 'protected' AND p_when = 'edit' AND NOT p_super
            THEN 'only a queue super user may change this attribute'
        WHEN r.rule = 'dag' AND p_when <> 'dag' THEN 'only a DAG node''s job has it'
        WHEN json_typeof(p_value) = 'object' THEN CASE
            WHEN json_typeof(p_value->'expr') IS DISTINCT FROM 'string'
                 OR (SELECT count(*) FROM json_object_keys(p_value)) <> 1
                THEN 'not a value the job store keeps'
            ELSE jobstore_value_problem(p_value->>'expr') END
        WHEN json_typeof(p_value) = 'string' THEN jobstore_value_problem(p_value #>> '{}')
        WHEN json_typeof(p_value) = 'number' THEN jobstore_number_problem(p_value::text)
        WHEN json_typeof(p_value) = 'boolean' THEN NULL
        ELSE 'not a value the job store keeps'
    END
    FROM (SELECT 1) AS one LEFT JOIN job_attr_rules r ON r.name = lower(p_name)
$$;

-- Why the ads of `jobs` (their cluster, proc and ad) cannot be stored, the first problem,
-- else NULL: each attribute by its rule, the whole ad by its size, no name twice.
CREATE FUNCTION jobstore_ads_problem(p_ads json, p_when text, p_super boolean) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, @schema@, pg_temp AS $$
    WITH a AS (
        SELECT x.cluster_id, x.proc_id, x.ad, json_typeof(x.ad) = 'object' AS object,
               length(x.ad::text) AS size
        FROM json_to_recordset(p_ads) AS x(cluster_id bigint, proc_id integer, ad json)
    ), k AS (
        SELECT a.cluster_id, a.proc_id, e.key
        FROM a CROSS JOIN LATERAL json_object_keys(CASE WHEN a.object THEN a.ad
                                                        ELSE '{}' END) AS e(key)
    ), bad AS (
        SELECT a.cluster_id, a.proc_id, NULL::text AS name, CASE
            WHEN a.ad IS NULL OR NOT a.object THEN 'its ad is not an object'
            WHEN a.size > 32768 THEN 'its ad is larger than 32768 bytes' END AS why
        FROM a
        UNION ALL
        SELECT k.cluster_id, k.proc_id, k.key, CASE
            WHEN k.key !~ '^[A-Za-z_][A-Za-z0-9_]{0,99}$' THEN 'not an attribute name'
            WHEN (lower(k.key) LIKE 'jobstore%' AND r.rule IS NULL) OR r.rule = 'immutable'
                THEN 'this attribute is set by the job store'
            WHEN r.rule = 'submit' AND p_when NOT IN ('submit', 'dag')
                THEN 'this attribute cannot change'
            WHEN r.rule = 'protected' AND p_when = 'edit' AND NOT p_super
                THEN 'only a queue super user may change this attribute'
            WHEN r.rule = 'dag' AND p_when <> 'dag' THEN 'only a DAG node''s job has it' END
        FROM k LEFT JOIN job_attr_rules r ON r.name = lower(k.key)
        UNION ALL
        SELECT k.cluster_id, k.proc_id, min(k.key), 'an attribute named twice'
        FROM k GROUP BY k.cluster_id, k.proc_id, lower(k.key) HAVING count(*) > 1
        UNION ALL
        -- each value a string, a boolean, a number a ClassAd holds or {"expr": string}; one
        -- can be too long or too deep only in an ad longer than 2048 bytes or with an escape
        -- that could be a line break
        SELECT a.cluster_id, a.proc_id, e.key, CASE
            WHEN a.size > 2048 OR a.ad::text ~ '\\[nru]'
                THEN jobstore_attr_problem(e.key, e.value, p_when, p_super)
            ELSE CASE json_typeof(e.value)
                WHEN 'string' THEN NULL
                WHEN 'boolean' THEN NULL
                WHEN 'number' THEN jobstore_number_problem(e.value::text)
                WHEN 'object' THEN CASE
                    WHEN e.value::text ~ '^\{\s*"expr"\s*:\s*"(?:[^"\\]|\\.)*"\s*\}$'
                        THEN NULL
                    ELSE 'not a value the job store keeps' END
                ELSE 'not a value the job store keeps' END END
        FROM a CROSS JOIN LATERAL json_each(CASE WHEN a.object THEN a.ad ELSE '{}' END) AS e
    )
    SELECT format('job %s.%s: %s%s', cluster_id, proc_id,
                  CASE WHEN name IS NULL THEN '' ELSE name || ': ' END, why)
    FROM bad WHERE why IS NOT NULL ORDER BY cluster_id, proc_id LIMIT 1
$$;

-- Why the job columns a submitter chooses cannot be stored (`j`: one job as sent), else NULL.
CREATE FUNCTION jobstore_columns_problem(cmd text, request_cpus bigint, request_memory bigint,
    request_disk bigint, requirements text, max_attempts bigint, success_exit_code bigint,
    retry_until text, max_retries bigint, user_log text, concurrency_limits text,
    priority bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN cmd IS NULL OR cmd = '' THEN 'no executable'
        WHEN length(cmd) > 4096 OR cmd ~ '[\n\r]' THEN 'the executable is not a path'
        WHEN request_cpus IS NULL OR request_cpus NOT BETWEEN 0 AND 2147483647
            THEN 'RequestCpus is not an integer of 0 or more'
        WHEN request_memory IS NULL OR request_memory NOT BETWEEN 0 AND 2147483647
            THEN 'RequestMemory is not an integer of 0 or more'
        WHEN request_disk IS NULL OR request_disk NOT BETWEEN 0 AND 9007199254740991
            THEN 'RequestDisk is not an integer of 0 or more'
        WHEN priority IS NOT NULL AND priority NOT BETWEEN -2147483648 AND 2147483647
            THEN 'JobPrio is not an integer'
        WHEN max_attempts IS NULL OR max_attempts NOT BETWEEN 1 AND 100000
            THEN 'the number of attempts is not between 1 and 100000'
        WHEN success_exit_code IS NOT NULL
             AND success_exit_code NOT BETWEEN -2147483648 AND 2147483647
            THEN 'success_exit_code is not an integer'
        WHEN max_retries IS NOT NULL AND max_retries NOT BETWEEN 0 AND 99999
            THEN 'max_retries is not between 0 and 99999'
        WHEN user_log IS NOT NULL AND (length(user_log) > 4096 OR user_log ~ '[\n\r]')
            THEN 'the user log is not a path'
        WHEN concurrency_limits IS NOT NULL AND concurrency_limits !~
            '^[a-z0-9_][a-z0-9_.]*(:[0-9.e+]+)?(,[a-z0-9_][a-z0-9_.]*(:[0-9.e+]+)?)*$'
            THEN 'concurrency_limits is not a list of limits'
        WHEN length(coalesce(concurrency_limits, '')) > 4096
            THEN 'concurrency_limits is too long'
        ELSE coalesce('Requirements: ' || jobstore_value_problem(requirements),
                      'retry_until: ' || jobstore_value_problem(retry_until))
    END
$$;

-- The fair-share account a job of `owner` may be charged to: the owner, or an accounting
-- group the admin's map grants her (GROUP.owner); the store's owner chooses any.
CREATE FUNCTION jobstore_submitter_problem(owner text, submitter text, trusted boolean)
RETURNS text LANGUAGE sql STABLE SET search_path = pg_catalog, @schema@, pg_temp AS $$
    SELECT CASE
        WHEN submitter IS NULL OR submitter = owner THEN NULL
        WHEN submitter !~ '^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,99}\.[A-Za-z0-9_][A-Za-z0-9_.@-]{0,99}$'
            THEN 'accounting_group is not a valid name'
        WHEN trusted THEN NULL
        WHEN EXISTS (SELECT 1 FROM accounting_groups g
                     WHERE g.account IN (owner, '*') AND submitter = g.name || '.' || owner)
            THEN NULL
        ELSE format('%s may not charge accounting group %s (the admin grants groups:'
                    ' jobstore grant-user %s --accounting-group GROUP)',
                    owner, left(submitter, greatest(0, length(submitter) - length(owner) - 1)),
                    owner)
    END
$$;

-- Each proc's ad is checked by the trigger below unless the door checked it already
-- (jobstore.checked, which only the door and the store's owner may set to any effect: no
-- other role may write these tables).
CREATE FUNCTION jobstore_check_new_jobs() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    why text;
BEGIN
    IF coalesce(current_setting('jobstore.checked', true), '') = 'on' THEN
        RETURN NULL;
    END IF;
    SELECT coalesce(
        jobstore_ads_problem((SELECT json_agg(json_build_object('cluster_id', n.cluster_id,
            'proc_id', n.proc_id, 'ad', n.ad)) FROM new_jobs n), 'submit', true),
        (SELECT format('job %s.%s: %s', n.cluster_id, n.proc_id, p) FROM new_jobs n,
            LATERAL jobstore_columns_problem(n.cmd, n.request_cpus, n.request_memory,
                n.request_disk, n.requirements, n.max_attempts, n.success_exit_code,
                n.retry_until, n.max_retries, n.user_log, n.concurrency_limits, n.priority) p
         WHERE p IS NOT NULL LIMIT 1)) INTO why;
    IF why IS NOT NULL THEN
        PERFORM jobstore_bad(why);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER jobstore_check_new_jobs AFTER INSERT ON jobs
REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION jobstore_check_new_jobs();

CREATE FUNCTION jobstore_check_changed_job() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    why text;
BEGIN
    IF coalesce(current_setting('jobstore.checked', true), '') = 'on' THEN
        RETURN NEW;
    END IF;
    why := coalesce(
        jobstore_ads_problem(json_build_array(json_build_object('cluster_id', NEW.cluster_id,
            'proc_id', NEW.proc_id, 'ad', NEW.ad)), 'edit', true),
        jobstore_columns_problem(NEW.cmd, NEW.request_cpus, NEW.request_memory,
            NEW.request_disk, NEW.requirements, NEW.max_attempts, NEW.success_exit_code,
            NEW.retry_until, NEW.max_retries, NEW.user_log, NEW.concurrency_limits,
            NEW.priority));
    IF why IS NOT NULL THEN
        PERFORM jobstore_bad(why);
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER jobstore_check_changed_job BEFORE UPDATE OF ad, cmd, requirements, retry_until,
    user_log, concurrency_limits ON jobs FOR EACH ROW EXECUTE FUNCTION jobstore_check_changed_job();

-- ---- a job's outputs: bounded whoever stores them -------------------------------------------
-- The outputs (and checkpoint files) one attempt stores are at most the store's
-- max_output_mb (JOBSTORE_MAX_OUTPUT_MB), or where that is 0 the job's RequestDisk (KiB); an
-- attempt's new outputs or checkpoint replace those of the attempts before it.
CREATE FUNCTION jobstore_check_outputs() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    over record;
BEGIN
    DELETE FROM job_files f USING (SELECT DISTINCT cluster_id, proc_id, direction, attempt
                                   FROM added WHERE direction IN ('out', 'ckpt')) a
    WHERE f.cluster_id = a.cluster_id AND f.proc_id = a.proc_id
      AND f.direction = a.direction AND f.attempt < a.attempt;
    SELECT a.cluster_id, a.proc_id, t.total,
           coalesce(nullif(jobstore_store_limit('max_output_mb', 0), 0), j.request_disk * 1024)
           AS most INTO over
    FROM (SELECT DISTINCT cluster_id, proc_id, attempt FROM added
          WHERE direction IN ('out', 'ckpt')) a
    JOIN jobs j ON j.cluster_id = a.cluster_id AND j.proc_id = a.proc_id,
    LATERAL (SELECT sum(f.size) AS total FROM job_files f
             WHERE f.cluster_id = a.cluster_id AND f.proc_id = a.proc_id
               AND f.direction IN ('out', 'ckpt') AND f.attempt = a.attempt) t
    WHERE t.total > coalesce(nullif(jobstore_store_limit('max_output_mb', 0), 0),
                             j.request_disk * 1024)
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = format(
            'the outputs of job %s.%s are %s KiB, more than the %s KiB it may send back (its'
            ' RequestDisk, or JOBSTORE_MAX_OUTPUT_MB)', over.cluster_id, over.proc_id,
            over.total / 1024, over.most / 1024);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER jobstore_outputs_limit AFTER INSERT ON job_files
REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION jobstore_check_outputs();

-- ---- submitting -------------------------------------------------------------------------------

-- A new cluster of `owner` (NULL: the session's account) in `queue`; with `key`, the cluster a
-- submit of hers with that key made before, if any (created false).
CREATE FUNCTION jobstore_new_cluster(p_owner text, p_queue text, p_submit_file text,
    p_num_procs integer, p_key text, p_now double precision)
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
    INSERT INTO clusters (owner, queue, submit_file, num_procs, submitted_at, idempotency_key)
    VALUES (v_owner, p_queue, p_submit_file, p_num_procs, v_now, p_key)
    ON CONFLICT (owner, idempotency_key) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NOT NULL THEN
        RETURN QUERY SELECT v_id, true;
        RETURN;
    END IF;
    RETURN QUERY SELECT c.id, false FROM clusters c
        WHERE c.owner = v_owner AND c.idempotency_key = p_key;
END $$;

-- Whether attribute `p_name` tells one job of an autocluster from another, matching never
-- looking at it (jobstore.core.autoclusters.PER_JOB; tests/system/test_one_door.py compares them).
CREATE FUNCTION jobstore_per_job(p_name text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT lower(p_name) IN ('cmd', 'arguments', 'args', 'environment', 'env', 'iwd', 'in',
        'out', 'err', 'userlog', 'procid', 'clusterid', 'qdate', 'jobprio', 'globaljobid',
        'dagmanjobid', 'dagnodename', 'dagparentnodenames')
$$;

-- What matching sees of a job's ad besides its autocluster's columns, as jobstore.core.
-- autoclusters.significant_attrs takes it (every attribute but PER_JOB's, names in lower case):
-- the md5 of its JSON. The jobs of one autocluster have the same (a slot judges one of them).
CREATE FUNCTION jobstore_significant(p_ad json) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT md5(coalesce(jsonb_object_agg(lower(e.key), e.value::jsonb), '{}'::jsonb)::text)
    FROM json_each(CASE WHEN json_typeof(p_ad) = 'object' THEN p_ad ELSE '{}' END) AS e
    WHERE NOT jobstore_per_job(e.key)
$$;

-- The autocluster of each signature, made where it is new with its limits and submitter rows:
-- the key columns of every job of one signature must be its autocluster's.
CREATE FUNCTION jobstore_autoclusters(p_owner text, p_jobs json, p_now double precision)
RETURNS TABLE (ac_signature text, ac_id bigint)
LANGUAGE plpgsql SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bad text;
BEGIN
    INSERT INTO submitters (name, updated_at)
    SELECT DISTINCT j.submitter, p_now FROM json_to_recordset(p_jobs) AS j(submitter text)
    ORDER BY 1 ON CONFLICT (name) DO NOTHING;
    INSERT INTO autoclusters (signature, queue, owner, submitter, request_cpus, request_memory,
        request_disk, requirements, concurrency_limits, significant, created_at)
    SELECT DISTINCT ON (j.signature) j.signature, j.queue, p_owner, j.submitter,
        j.request_cpus, j.request_memory, j.request_disk, j.requirements, j.concurrency_limits,
        j.significant, p_now
    FROM json_to_recordset(p_jobs) AS j(signature text, queue text, submitter text,
        request_cpus integer, request_memory integer, request_disk bigint, requirements text,
        concurrency_limits text, significant text)
    ORDER BY j.signature
    ON CONFLICT (owner, signature) DO NOTHING;
    -- one made before its jobs' significant attributes were kept, and left without jobs
    UPDATE autoclusters a SET significant = j.significant
    FROM json_to_recordset(p_jobs) AS j(signature text, significant text)
    WHERE a.owner = p_owner AND a.signature = j.signature AND a.significant IS NULL;
    SELECT format('signature %s: the jobs of one autocluster differ in what matching sees',
                  j.signature) INTO v_bad
    FROM json_to_recordset(p_jobs) AS j(signature text, queue text, submitter text,
        request_cpus integer, request_memory integer, request_disk bigint, requirements text,
        concurrency_limits text, significant text)
    JOIN autoclusters a ON a.owner = p_owner AND a.signature = j.signature
    WHERE (a.queue, a.submitter, a.request_cpus, a.request_memory, a.request_disk)
          IS DISTINCT FROM (j.queue, j.submitter, j.request_cpus, j.request_memory,
                            j.request_disk)
       OR a.requirements IS DISTINCT FROM j.requirements
       OR a.concurrency_limits IS DISTINCT FROM j.concurrency_limits
       OR a.significant IS DISTINCT FROM j.significant
    LIMIT 1;
    IF v_bad IS NOT NULL THEN
        PERFORM jobstore_bad(v_bad);
    END IF;
    -- each limit an autocluster uses, and its units per job (a positive number)
    INSERT INTO concurrency_limits (name)
    SELECT DISTINCT split_part(l, ':', 1)
    FROM (SELECT DISTINCT j.concurrency_limits FROM json_to_recordset(p_jobs)
          AS j(concurrency_limits text) WHERE j.concurrency_limits IS NOT NULL) s,
         LATERAL unnest(string_to_array(s.concurrency_limits, ',')) AS l
    ORDER BY 1 ON CONFLICT (name) DO NOTHING;
    INSERT INTO autocluster_limits (autocluster_id, name, amount)
    SELECT a.id, split_part(l, ':', 1),
           sum(CASE WHEN l LIKE '%:%' THEN split_part(l, ':', 2)::double precision ELSE 1 END)
    FROM autoclusters a
    JOIN (SELECT DISTINCT j.signature FROM json_to_recordset(p_jobs) AS j(signature text)) s
        ON s.signature = a.signature,
    LATERAL unnest(string_to_array(a.concurrency_limits, ',')) AS l
    WHERE a.owner = p_owner AND a.concurrency_limits IS NOT NULL
    GROUP BY a.id, split_part(l, ':', 1)
    ON CONFLICT DO NOTHING;
    IF EXISTS (SELECT 1 FROM autocluster_limits l JOIN autoclusters a ON a.id = l.autocluster_id
               WHERE a.owner = p_owner AND NOT (l.amount > 0 AND l.amount < 1e9)) THEN
        PERFORM jobstore_bad('a concurrency limit''s units must be a positive number');
    END IF;
    RETURN QUERY SELECT a.signature::text, a.id FROM autoclusters a
        JOIN (SELECT DISTINCT j.signature FROM json_to_recordset(p_jobs) AS j(signature text)) s
        ON s.signature = a.signature WHERE a.owner = p_owner;
END $$;

-- A cluster's jobs may be queued: the session may submit as its owner; a DAG node's cluster
-- takes its jobs before the node is queued, waiting. The status they are queued in.
CREATE FUNCTION jobstore_cluster_status(p_cluster bigint) RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_owner text;
    v_node text;
BEGIN
    SELECT c.owner INTO v_owner FROM clusters c WHERE c.id = p_cluster;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JS004', MESSAGE = format('no cluster %s', p_cluster);
    END IF;
    PERFORM jobstore_check_submitter(v_owner);
    IF EXISTS (SELECT 1 FROM dags d WHERE d.id = p_cluster) THEN
        PERFORM jobstore_bad(format('cluster %s is a DAG''s own, not a node''s', p_cluster));
    END IF;
    SELECT n.status INTO v_node FROM dag_nodes n WHERE n.cluster_id = p_cluster;
    IF NOT FOUND THEN
        RETURN 'idle';
    END IF;
    IF v_node NOT IN ('waiting', 'ready') THEN
        PERFORM jobstore_bad(format('cluster %s is a DAG node''s that was queued already',
                                    p_cluster));
    END IF;
    RETURN 'waiting';
END $$;

-- Queue jobs (a JSON array of jobs as the submit made them: cluster_id (default p_cluster, all
-- of one owner), proc_id, priority, ad, cmd, request_cpus, request_memory, request_disk,
-- requirements, max_attempts, success_exit_code, retry_until, max_retries, user_log,
-- submitter, concurrency_limits, periodic, signature (the autocluster's), hold), each with its
-- submit event (and its hold, for condor_submit's `hold = true`): idle, or waiting in a DAG
-- node's cluster. Their ids, in the order given.
CREATE FUNCTION jobstore_queue_jobs(p_cluster bigint, p_jobs json, p_now double precision)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp
SET jit = off AS $$
#variable_conflict use_column
DECLARE
    c clusters%ROWTYPE;
    v_now double precision := jobstore_clock(p_now);
    v_trusted boolean := jobstore_trusted();
    v_bad text;
    v_ids bigint[];
    v_status text[];
    v_held bigint[];
    v_dags bigint;
    v_plain bigint;
BEGIN
    SELECT * INTO c FROM clusters WHERE id = p_cluster;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JS004', MESSAGE = format('no cluster %s', p_cluster);
    END IF;
    PERFORM jobstore_check_submitter(c.owner);
    IF json_typeof(p_jobs) IS DISTINCT FROM 'array' THEN
        PERFORM jobstore_bad('the jobs are not a list');
    END IF;
    -- their clusters: the owner's, none a DAG's own, a DAG node's only before it is queued
    SELECT format('cluster %s: %s', cl.id, CASE
        WHEN x.id IS NULL THEN 'no such cluster'
        WHEN x.owner <> c.owner THEN 'another owner''s'
        WHEN EXISTS (SELECT 1 FROM dags d WHERE d.id = cl.id) THEN 'a DAG''s own'
        ELSE 'a DAG node''s that was queued already' END) INTO v_bad
    FROM (SELECT DISTINCT coalesce(j.cluster_id, p_cluster) AS id
          FROM json_to_recordset(p_jobs) AS j(cluster_id bigint)) cl
    LEFT JOIN clusters x ON x.id = cl.id
    LEFT JOIN dag_nodes n ON n.cluster_id = cl.id
    WHERE x.id IS NULL OR x.owner <> c.owner OR EXISTS (SELECT 1 FROM dags d WHERE d.id = cl.id)
       OR n.status NOT IN ('waiting', 'ready')
    LIMIT 1;
    IF v_bad IS NULL THEN
        SELECT format('job %s.%s: %s', coalesce(j.cluster_id, p_cluster), j.proc_id, p)
        INTO v_bad
        FROM json_to_recordset(p_jobs) AS j(cluster_id bigint, proc_id bigint, priority bigint,
            cmd text, request_cpus bigint, request_memory bigint, request_disk bigint,
            requirements text, max_attempts bigint, success_exit_code bigint, retry_until text,
            max_retries bigint, user_log text, submitter text, concurrency_limits text,
            signature text),
        LATERAL (SELECT CASE
            WHEN j.proc_id IS NULL OR j.proc_id NOT BETWEEN 0 AND 2147483647
                THEN 'a proc id is 0 or more'
            WHEN j.signature IS NULL OR j.signature !~ '^[0-9a-f]{64}$'
                THEN 'no autocluster signature'
            ELSE coalesce(jobstore_columns_problem(j.cmd, j.request_cpus, j.request_memory,
                    j.request_disk, j.requirements, j.max_attempts, j.success_exit_code,
                    j.retry_until, j.max_retries, j.user_log, j.concurrency_limits,
                    j.priority),
                 jobstore_submitter_problem(c.owner, j.submitter, v_trusted)) END AS p) AS s
        WHERE p IS NOT NULL LIMIT 1;
    END IF;
    SELECT count(DISTINCT n.dag_id), count(*) FILTER (WHERE n.dag_id IS NULL)
    INTO v_dags, v_plain
    FROM json_to_recordset(p_jobs) AS j(cluster_id bigint)
    LEFT JOIN dag_nodes n ON n.cluster_id = coalesce(j.cluster_id, p_cluster);
    IF v_bad IS NULL AND v_dags > 0 AND (v_plain > 0 OR v_dags > 1) THEN
        v_bad := 'the jobs of one call are one DAG''s nodes'' or none';
    END IF;
    IF v_bad IS NULL AND v_dags > 0 THEN
        SELECT format('job %s.%s: DAGManJobId is not its DAG''s', j.cluster_id, j.proc_id)
        INTO v_bad
        FROM json_to_recordset(p_jobs) AS j(cluster_id bigint, proc_id integer, ad json)
        JOIN dag_nodes n ON n.cluster_id = coalesce(j.cluster_id, p_cluster)
        WHERE (j.ad->'DAGManJobId'->>'expr') IS DISTINCT FROM n.dag_id::text
           OR (j.ad->'DAGNodeName'->>'expr') IS DISTINCT FROM '"' || n.name || '"'
        LIMIT 1;
    END IF;
    IF v_bad IS NULL THEN
        v_bad := jobstore_ads_problem((SELECT json_agg(json_build_object(
            'cluster_id', coalesce(j.cluster_id, p_cluster), 'proc_id', j.proc_id, 'ad', j.ad))
            FROM json_to_recordset(p_jobs) AS j(cluster_id bigint, proc_id integer, ad json)),
            CASE WHEN v_dags > 0 THEN 'dag' ELSE 'submit' END, jobstore_super_user());
    END IF;
    IF v_bad IS NOT NULL THEN
        PERFORM jobstore_bad(v_bad);
    END IF;
    PERFORM set_config('jobstore.checked', 'on', true);
    WITH sent AS (
        SELECT j.*, coalesce(j.cluster_id, p_cluster) AS cluster, e.n, x.queue,
               CASE WHEN nd.cluster_id IS NULL THEN 'idle' ELSE 'waiting' END AS queued_as
        FROM json_array_elements(p_jobs) WITH ORDINALITY AS e(v, n),
        LATERAL json_to_record(e.v) AS j(cluster_id bigint, proc_id integer,
            priority integer, ad json, cmd text, request_cpus integer, request_memory integer,
            request_disk bigint, requirements text, max_attempts integer,
            success_exit_code integer, retry_until text, max_retries integer, user_log text,
            submitter text, concurrency_limits text, periodic boolean, signature text,
            hold boolean)
        JOIN clusters x ON x.id = coalesce(j.cluster_id, p_cluster)
        LEFT JOIN dag_nodes nd ON nd.cluster_id = x.id
    ), ac AS (
        SELECT * FROM jobstore_autoclusters(c.owner, (SELECT json_agg(json_build_object(
            'signature', s.signature, 'queue', s.queue,
            'submitter', coalesce(s.submitter, c.owner), 'request_cpus', s.request_cpus,
            'request_memory', s.request_memory, 'request_disk', s.request_disk,
            'requirements', s.requirements, 'concurrency_limits', s.concurrency_limits,
            'significant', jobstore_significant(s.ad)))
            FROM sent s), v_now)
    ), made AS (
        INSERT INTO jobs (cluster_id, proc_id, queue, priority, owner, ad, cmd, request_cpus,
            request_memory, request_disk, requirements, max_attempts, success_exit_code,
            retry_until, max_retries, user_log, submitted_at, submitter, concurrency_limits,
            autocluster_id, periodic, reason, hold_code, hold_subcode, num_holds, claims,
            attempts, num_starts, updated_at, status)
        SELECT s.cluster, s.proc_id, s.queue, coalesce(s.priority, 0), c.owner, s.ad, s.cmd,
            s.request_cpus, s.request_memory, s.request_disk, s.requirements, s.max_attempts,
            coalesce(s.success_exit_code, 0), s.retry_until, s.max_retries, s.user_log, v_now,
            coalesce(s.submitter, c.owner), s.concurrency_limits, ac.ac_id,
            CASE WHEN s.periodic THEN true END,
            CASE WHEN s.hold THEN 'submitted on hold at user''s request' END,
            CASE WHEN s.hold THEN 15 END, CASE WHEN s.hold THEN 0 END,
            CASE WHEN s.hold THEN 1 ELSE 0 END, 0, 0, 0, v_now,
            CASE WHEN s.hold THEN 'held' ELSE s.queued_as END
        FROM sent s JOIN ac ON ac.ac_signature = s.signature
        ORDER BY s.n
        RETURNING id, cluster_id, proc_id
    )
    SELECT array_agg(m.id ORDER BY s.n), array_agg(s.queued_as ORDER BY s.n),
           array_agg(m.id ORDER BY s.n) FILTER (WHERE s.hold)
    INTO v_ids, v_status, v_held
    FROM made m JOIN sent s ON s.cluster = m.cluster_id AND s.proc_id = m.proc_id;
    PERFORM set_config('jobstore.checked', 'off', true);
    INSERT INTO job_events (job_id, time, event, from_status, to_status, attempt)
    SELECT x.i, v_now, 'submit', NULL, x.st, 0 FROM unnest(v_ids, v_status) AS x(i, st)
    ORDER BY x.i;
    INSERT INTO job_events (job_id, time, event, from_status, to_status, attempt, reason, attrs)
    SELECT i, v_now, 'hold', 'idle', 'held', 0, 'submitted on hold at user''s request',
           '{"HoldReasonCode":15,"HoldReasonSubCode":0}'::json
    FROM unnest(v_held) AS i ORDER BY i;
    RETURN QUERY SELECT unnest(v_ids);
END $$;

-- Whether `p_text` (a template's ad, or one of its values) is longer than `p_limit` in any
-- item row once each placeholder is replaced: a counter's (`p_counters`) by a number (at most
-- 10 digits), an item's by its value in that row (`p_items`: placeholder -> its values, a row
-- each; `p_longest`: placeholder -> the length of its longest value). The rows are read only
-- when the longest values together would pass the limit.
CREATE FUNCTION jobstore_too_wide(p_text text, p_counters text[], p_items json,
    p_longest jsonb, p_limit integer) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    WITH used AS (
        SELECT k, (length(p_text) - length(replace(p_text, k, ''))) / length(k) AS n
        FROM json_object_keys(coalesce(p_items, '{}')) AS k
    ), base AS (
        SELECT length(p_text) + coalesce((SELECT sum(c.n * (10 - length(c.k))) FROM (
            SELECT k, (length(p_text) - length(replace(p_text, k, ''))) / length(k) AS n
            FROM unnest(p_counters) AS k) c), 0) AS size
    )
    SELECT CASE
        WHEN b.size + coalesce((SELECT sum(u.n * ((p_longest ->> u.k)::bigint - length(u.k)))
                                FROM used u WHERE u.n > 0), 0) <= p_limit THEN false
        ELSE b.size + coalesce((SELECT max(g.grow) FROM (
                 SELECT e.r, sum(u.n * (length(e.v) - length(u.k))) AS grow
                 FROM used u CROSS JOIN LATERAL json_array_elements_text(p_items -> u.k)
                     WITH ORDINALITY AS e(v, r)
                 WHERE u.n > 0 GROUP BY e.r) g), 0) > p_limit END
    FROM base b
$$;

-- Queue procs p_first to p_last of a templated cluster (jobstore.core.jobs.ProcTemplate): the
-- database makes each proc's row from `p_job` (one job as jobstore_queue_jobs takes them, its
-- ad holding the placeholders), each placeholder replaced by its counter's number (`p_counters`:
-- placeholder -> proc, step or row) or its item's value in the proc's item row (`p_items`:
-- placeholder -> the values of the item rows from p_first's on). `p_clusters`: each proc a
-- cluster of its own, the clusters of p_first to p_last in order (a DAG's nodes, each its proc
-- 0; p_cluster their first). Their ids in proc order.
CREATE FUNCTION jobstore_queue_procs(p_cluster bigint, p_clusters bigint[], p_job json,
    p_per_item integer, p_counters json, p_items json, p_first integer, p_last integer,
    p_now double precision)
RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp
SET jit = off AS $$
#variable_conflict use_column
DECLARE
    c clusters%ROWTYPE;
    v_status text;
    v_now double precision := jobstore_clock(p_now);
    v_trusted boolean := jobstore_trusted();
    j record;
    v_ad text;
    v_places text[] := '{}';
    v_kinds text[] := '{}';
    v_counters text[] := '{}';
    v_rows integer;
    v_expr text := '$1';
    v_from text;
    v_zip text[] := '{}';
    v_longest bigint;
    v_most jsonb := '{}';
    v_bad text;
    v_ac bigint;
    v_ids bigint[];
    v_value json;
    i integer;
    k text;
    v text;
BEGIN
    IF p_per_item IS NULL OR p_per_item < 1 OR p_first IS NULL OR p_first < 0
       OR p_last IS NULL OR p_last < p_first OR p_last - p_first >= 1000000 THEN
        PERFORM jobstore_bad('not a range of procs');
    END IF;
    IF p_clusters IS NULL THEN
        v_status := jobstore_cluster_status(p_cluster);
        SELECT * INTO c FROM clusters WHERE id = p_cluster;
    ELSE
        -- a DAG's nodes: each cluster a node's of one DAG of one owner, not queued yet
        SELECT * INTO c FROM clusters WHERE id = p_cluster;
        IF NOT FOUND OR cardinality(p_clusters) <> p_last - p_first + 1 OR p_per_item <> 1
           OR p_clusters[1] <> p_cluster THEN
            PERFORM jobstore_bad('a cluster for each proc');
        END IF;
        PERFORM jobstore_check_submitter(c.owner);
        IF EXISTS (SELECT 1 FROM unnest(p_clusters) AS x(id)
                   LEFT JOIN clusters y ON y.id = x.id LEFT JOIN dag_nodes n ON n.cluster_id = x.id
                   WHERE y.owner IS DISTINCT FROM c.owner OR n.status IS NULL
                      OR n.status NOT IN ('waiting', 'ready')
                      OR n.dag_id <> (SELECT m.dag_id FROM dag_nodes m
                                      WHERE m.cluster_id = p_cluster)) THEN
            PERFORM jobstore_bad('the procs'' clusters are not nodes of one DAG waiting for jobs');
        END IF;
        v_status := 'waiting';
    END IF;
    SELECT * INTO j FROM json_to_record(p_job) AS x(priority bigint, ad json, cmd text,
        request_cpus bigint, request_memory bigint, request_disk bigint, requirements text,
        max_attempts bigint, success_exit_code bigint, retry_until text, max_retries bigint,
        user_log text, submitter text, concurrency_limits text, periodic boolean,
        signature text, hold boolean);
    v_bad := coalesce(
        CASE WHEN j.signature IS NULL OR j.signature !~ '^[0-9a-f]{64}$'
             THEN 'no autocluster signature' END,
        jobstore_columns_problem(j.cmd, j.request_cpus, j.request_memory, j.request_disk,
            j.requirements, j.max_attempts, j.success_exit_code, j.retry_until, j.max_retries,
            j.user_log, j.concurrency_limits, j.priority),
        jobstore_submitter_problem(c.owner, j.submitter, v_trusted),
        CASE WHEN p_clusters IS NOT NULL AND (j.ad->'DAGManJobId'->>'expr') IS DISTINCT FROM
                  (SELECT n.dag_id::text FROM dag_nodes n WHERE n.cluster_id = p_cluster)
             THEN 'DAGManJobId is not its DAG''s' END);
    IF v_bad IS NOT NULL THEN
        PERFORM jobstore_bad(format('job %s.%s: %s', p_cluster, p_first, v_bad));
    END IF;
    v_bad := jobstore_ads_problem(json_build_array(json_build_object('cluster_id', p_cluster,
        'proc_id', p_first, 'ad', j.ad)), CASE WHEN p_clusters IS NULL THEN 'submit' ELSE 'dag'
                                              END, jobstore_super_user());
    IF v_bad IS NOT NULL THEN
        PERFORM jobstore_bad(v_bad);
    END IF;
    -- the placeholders: the counters' (proc, step, row), then the items' (a value per item
    -- row: text that is the same in JSON and in a ClassAd string, as
    -- jobstore.submit.description and jobstore.api.dags make them)
    FOR k, v IN SELECT key, value FROM json_each_text(coalesce(p_counters, '{}')) LOOP
        IF v NOT IN ('proc', 'step', 'row') THEN
            PERFORM jobstore_bad('a counter is proc, step or row');
        END IF;
        v_places := v_places || k;
        v_kinds := v_kinds || v;
        v_counters := v_counters || k;
    END LOOP;
    v_rows := p_last / p_per_item - p_first / p_per_item + 1;
    FOR k, v_value IN SELECT key, value FROM json_each(coalesce(p_items, '{}')) LOOP
        v_longest := NULL;
        IF json_typeof(v_value) = 'array' AND json_array_length(v_value) = v_rows THEN
            SELECT CASE WHEN bool_and(json_typeof(e) = 'string'
                                      AND e #>> '{}' !~ '[^ !#-\[\]-~]'
                                      AND strpos(e #>> '{}', 'JOBSTORE') = 0)
                        THEN max(length(e #>> '{}')) END
            INTO v_longest FROM json_array_elements(v_value) e;
        END IF;
        IF v_longest IS NULL OR v_longest > 10240 THEN
            PERFORM jobstore_bad('an item''s values are printable text without quotes,'
                                 ' backslashes or JOBSTORE, at most 10240 characters, one for'
                                 ' each item row');
        END IF;
        v_most := v_most || jsonb_build_object(k, v_longest);
        v_places := v_places || k;
        v_kinds := v_kinds || 'item'::text;
        v_zip := v_zip || format('json_array_elements_text($2 -> %L)', k);
    END LOOP;
    v_ad := j.ad::text;
    FOR i IN 1 .. coalesce(cardinality(v_places), 0) LOOP
        IF v_places[i] !~ '^JOBSTORE(PROC[0-9]{3}|NODE[01])X[0-9a-f]{12}$' THEN
            PERFORM jobstore_bad('not a placeholder of the job store''s');
        END IF;
        IF EXISTS (SELECT 1 FROM json_object_keys(j.ad) AS key
                   WHERE strpos(key, v_places[i]) > 0) THEN
            PERFORM jobstore_bad('a placeholder in an attribute''s name');
        END IF;
        -- only where jobs of one autocluster may differ (what matching never looks at)
        IF EXISTS (SELECT 1 FROM json_each(j.ad) AS e
                   WHERE strpos(e.value::text, v_places[i]) > 0 AND NOT jobstore_per_job(e.key))
        THEN
            PERFORM jobstore_bad('a placeholder in an attribute matching looks at');
        END IF;
    END LOOP;
    -- the widest row's ad, and each of its values, within their bounds
    IF cardinality(v_places) > 0 THEN
        IF jobstore_too_wide(v_ad, v_counters, p_items, v_most, 32768) THEN
            PERFORM jobstore_bad(format('job %s.%s: its ad may be larger than 32768 bytes',
                                        p_cluster, p_first));
        END IF;
        SELECT format('job %s.%s: %s: may be longer than 10240 characters', p_cluster,
                      p_first, e.key) INTO v_bad
        FROM json_each(j.ad) AS e
        WHERE e.value::text LIKE '%JOBSTORE%'
          AND jobstore_too_wide(e.value::text, v_counters, p_items, v_most, 10240)
        LIMIT 1;
        IF v_bad IS NOT NULL THEN
            PERFORM jobstore_bad(v_bad);
        END IF;
    END IF;
    SELECT a.ac_id INTO v_ac FROM jobstore_autoclusters(c.owner, json_build_array(
        json_build_object('signature', j.signature, 'queue', c.queue,
            'submitter', coalesce(j.submitter, c.owner), 'request_cpus', j.request_cpus,
            'request_memory', j.request_memory, 'request_disk', j.request_disk,
            'requirements', j.requirements, 'concurrency_limits', j.concurrency_limits,
            'significant', jobstore_significant(j.ad))),
        v_now) a;
    -- replace(...(replace($1, placeholder, its text)...)) for each placeholder; the item
    -- rows (their values and, a DAG's nodes, their clusters) zipped side by side, each row's
    -- procs made from it
    i := 0;
    FOR k IN 1 .. coalesce(cardinality(v_places), 0) LOOP
        IF v_kinds[k] = 'item' THEN
            i := i + 1;
        END IF;
        v_expr := format('replace(%s, %L, %s)', v_expr, v_places[k], CASE v_kinds[k]
            WHEN 'proc' THEN 'proc::text'
            WHEN 'step' THEN '(proc % $4)::text'
            WHEN 'row' THEN '(proc / $4)::text'
            ELSE format('it.v%s', i) END);
    END LOOP;
    IF p_clusters IS NOT NULL THEN
        v_zip := v_zip || 'unnest($3)'::text;
    END IF;
    IF cardinality(v_zip) = 0 THEN
        v_from := 'generate_series($5, $6) AS proc';
    ELSE
        v_from := format('ROWS FROM (%s) WITH ORDINALITY AS it(%s), LATERAL generate_series('
            'greatest($5, ($5 / $4 + it.n - 1) * $4), least($6, ($5 / $4 + it.n) * $4 - 1))'
            ' AS proc', array_to_string(v_zip, ', '), (SELECT string_agg(
                CASE WHEN x <= i THEN 'v' || x ELSE 'cl' END || ', ', '' ORDER BY x)
                FROM generate_series(1, cardinality(v_zip)) AS x) || 'n');
    END IF;
    PERFORM set_config('jobstore.checked', 'on', true);
    EXECUTE format($q$
        WITH made AS (
            INSERT INTO jobs (cluster_id, proc_id, queue, priority, owner, ad, cmd,
                request_cpus, request_memory, request_disk, requirements, max_attempts,
                success_exit_code, retry_until, max_retries, user_log, submitted_at,
                submitter, concurrency_limits, autocluster_id, periodic, reason, hold_code,
                hold_subcode, num_holds, claims, attempts, num_starts, updated_at, status)
            SELECT %s,
                CASE WHEN $3 IS NULL THEN proc ELSE 0 END, $8, $9, $10, (%s)::json, $11, $12,
                $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27,
                $28, $29, 0, 0, 0, $21, $30
            FROM %s ORDER BY proc
            RETURNING id)
        SELECT array_agg(id ORDER BY id) FROM made$q$,
        CASE WHEN p_clusters IS NULL THEN '$7::bigint' ELSE 'it.cl::bigint' END, v_expr, v_from)
    INTO v_ids
    USING v_ad, p_items, p_clusters, p_per_item, p_first, p_last, p_cluster, c.queue,
        coalesce(j.priority, 0)::integer, c.owner, j.cmd, j.request_cpus::integer,
        j.request_memory::integer, j.request_disk, j.requirements, j.max_attempts::integer,
        coalesce(j.success_exit_code, 0)::integer, j.retry_until, j.max_retries::integer,
        j.user_log, v_now, coalesce(j.submitter, c.owner), j.concurrency_limits, v_ac,
        CASE WHEN j.periodic THEN true END,
        CASE WHEN j.hold THEN 'submitted on hold at user''s request' END,
        CASE WHEN j.hold THEN 15 END, CASE WHEN j.hold THEN 0 END,
        CASE WHEN j.hold THEN 1 ELSE 0 END, CASE WHEN j.hold THEN 'held' ELSE v_status END;
    PERFORM set_config('jobstore.checked', 'off', true);
    INSERT INTO job_events (job_id, time, event, from_status, to_status, attempt)
    SELECT x, v_now, 'submit', NULL, v_status, 0 FROM unnest(v_ids) AS x ORDER BY x;
    IF j.hold THEN
        INSERT INTO job_events (job_id, time, event, from_status, to_status, attempt, reason,
            attrs)
        SELECT x, v_now, 'hold', v_status, 'held', 0, 'submitted on hold at user''s request',
               '{"HoldReasonCode":15,"HoldReasonSubCode":0}'::json
        FROM unnest(v_ids) AS x ORDER BY x;
    END IF;
    RETURN QUERY SELECT unnest(v_ids);
END $$;

-- ---- a submit's input files ---------------------------------------------------------------

-- Register the file `p_sha256` of `p_size` bytes as `p_owner`'s: whether it is new (its
-- chunks are then stored with jobstore_store_chunk, in this transaction).
CREATE FUNCTION jobstore_store_file(p_owner text, p_sha256 text, p_size bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_new boolean;
BEGIN
    PERFORM jobstore_check_submitter(p_owner);
    IF p_sha256 !~ '^[0-9a-f]{64}$' OR p_size IS NULL OR p_size < 0 THEN
        PERFORM jobstore_bad('not a file''s sha256 and size');
    END IF;
    -- an input's limit, whoever calls (0016's trigger spares the roles that store outputs)
    IF p_size > jobstore_store_limit('max_input_file_mb', 1024) THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = format(
            'a file of %s MB is more than the %s MB an input file may be'
            ' (JOBSTORE_MAX_INPUT_FILE_MB)', p_size / 1048576,
            jobstore_store_limit('max_input_file_mb', 1024) / 1048576);
    END IF;
    INSERT INTO sandbox_files (owner, sha256, size, created_at)
    VALUES (p_owner, p_sha256, p_size, extract(epoch FROM clock_timestamp()))
    ON CONFLICT DO NOTHING RETURNING true INTO v_new;
    RETURN coalesce(v_new, false);
END $$;

CREATE FUNCTION jobstore_store_chunk(p_owner text, p_sha256 text, p_seq integer, p_data bytea)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
BEGIN
    PERFORM jobstore_check_submitter(p_owner);
    IF p_seq IS NULL OR p_seq < 0 OR p_data IS NULL THEN
        PERFORM jobstore_bad('not a chunk of a file');
    END IF;
    INSERT INTO sandbox_chunks (owner, sha256, seq, data) VALUES (p_owner, p_sha256, p_seq, p_data);
END $$;

-- The input files of a cluster (`p_proc` NULL: every proc's) or of one proc: a JSON array of
-- {name, sha256, mode}, each a file of the cluster's owner stored before.
CREATE FUNCTION jobstore_add_inputs(p_cluster bigint, p_proc integer, p_files json)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp
SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_owner text;
    v_bad text;
BEGIN
    SELECT owner INTO v_owner FROM clusters WHERE id = p_cluster;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JS004', MESSAGE = format('no cluster %s', p_cluster);
    END IF;
    PERFORM jobstore_check_submitter(v_owner);
    SELECT CASE
        WHEN f.name IS NULL OR f.name = '' OR length(f.name) > 4096 OR f.name LIKE '/%'
             OR f.name ~ '[\x01-\x1f]' OR '..' = ANY(string_to_array(f.name, '/'))
             OR '.' = ANY(string_to_array(f.name, '/')) OR '' = ANY(string_to_array(f.name, '/'))
            THEN format('%L is not a path inside the sandbox', f.name)
        WHEN f.mode IS NULL OR f.mode NOT BETWEEN 0 AND 4095 THEN format('%s: not a mode', f.name)
        WHEN NOT EXISTS (SELECT 1 FROM sandbox_files s WHERE s.owner = v_owner
                         AND s.sha256 = f.sha256) THEN format('%s: not stored', f.name)
    END INTO v_bad
    FROM json_to_recordset(p_files) AS f(name text, sha256 text, mode integer)
    WHERE f.name IS NULL OR f.name = '' OR length(f.name) > 4096 OR f.name LIKE '/%'
       OR f.name ~ '[\x01-\x1f]' OR '..' = ANY(string_to_array(f.name, '/'))
       OR '.' = ANY(string_to_array(f.name, '/')) OR '' = ANY(string_to_array(f.name, '/'))
       OR f.mode IS NULL OR f.mode NOT BETWEEN 0 AND 4095
       OR NOT EXISTS (SELECT 1 FROM sandbox_files s WHERE s.owner = v_owner
                      AND s.sha256 = f.sha256)
    LIMIT 1;
    IF v_bad IS NOT NULL THEN
        PERFORM jobstore_bad('transfer_input_files: ' || v_bad);
    END IF;
    INSERT INTO job_files (cluster_id, proc_id, direction, name, owner, sha256, size, mode,
        created_at)
    SELECT p_cluster, p_proc, 'in', f.name, v_owner, f.sha256, s.size, f.mode,
           extract(epoch FROM clock_timestamp())
    FROM json_array_elements(p_files) WITH ORDINALITY AS e(v, n),
    LATERAL json_to_record(e.v) AS f(name text, sha256 text, mode integer)
    JOIN sandbox_files s ON s.owner = v_owner AND s.sha256 = f.sha256
    ORDER BY e.n;
END $$;

-- ---- holding, releasing, removing -------------------------------------------------------------

-- What an action or the DAGs did to a job: the event written (to_status NULL: recorded or
-- ignored, nothing changed), whether a release waits for the job's attempt to end, and what
-- kind of row it is: 'acted' (a job the caller named), 'denied' (not the session's to act
-- on), 'skipped' (another transaction holds it), 'moved' (the DAGs moved it).
CREATE TYPE jobstore_change AS (job_id bigint, event text, from_status text, to_status text,
    attempt integer, reason text, attrs json, pending boolean, kind text);

-- The transition `p_event` (hold, release, remove) of the jobs `p_ids`, which the caller has
-- locked; the DAGs of those that ended are carried forward.
CREATE FUNCTION jobstore_apply_act(p_ids bigint[], p_event text, p_reason text, p_code integer,
    p_subcode integer, p_now double precision, p_kind text)
RETURNS SETOF jobstore_change
LANGUAGE plpgsql SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_ids bigint[];
    v_before text[];
    v_after text[];
    v_claims integer[];
    v_ended bigint[];
BEGIN
    IF p_event = 'release' THEN
        -- a held job whose stopped attempt may still run: released when it ends
        RETURN QUERY
        WITH w AS (
            SELECT j.id, j.claims, j.slot, j.host, j.release_pending FROM jobs j
            WHERE j.id = ANY(p_ids) AND j.status = 'held' AND j.winding_down_until > p_now
        ), marked AS (
            UPDATE jobs SET release_pending = true, updated_at = p_now FROM w
            WHERE jobs.id = w.id AND w.release_pending IS NOT TRUE RETURNING jobs.id
        ), ev AS (
            INSERT INTO job_events (job_id, time, event, from_status, to_status, attempt, slot,
                host, reason)
            SELECT w.id, p_now, 'release', 'held', NULL, w.claims, w.slot, w.host,
                   format('release pending: attempt %s is still ending on %s', w.claims,
                          coalesce(w.slot, 'None'))
            FROM w JOIN marked m ON m.id = w.id ORDER BY w.id RETURNING job_id
        )
        SELECT w.id, 'release', 'held', NULL::text, w.claims,
               format('release pending: attempt %s is still ending on %s', w.claims,
                      coalesce(w.slot, 'None')), NULL::json, true, p_kind
        FROM w;
    END IF;
    WITH cur AS (
        SELECT j.*, CASE
            WHEN p_event = 'hold' AND j.status IN ('idle', 'fetched', 'accepted', 'running')
                THEN 'held'
            WHEN p_event = 'release' AND j.status = 'held'
                 AND NOT coalesce(j.winding_down_until > p_now, false) THEN 'idle'
            WHEN p_event = 'remove'
                 AND j.status IN ('waiting', 'idle', 'held', 'fetched', 'accepted', 'running')
                THEN 'removed'
            END AS to_status
        FROM jobs j WHERE j.id = ANY(p_ids)
    ), changed AS (
        UPDATE jobs SET
            status = c.to_status, updated_at = p_now,
            token = NULL, lease_expires_at = NULL, lease_renewed_until = NULL,
            finished_at = CASE WHEN c.to_status = 'removed' THEN p_now ELSE c.finished_at END,
            reason = CASE WHEN c.to_status = 'held'
                               OR (p_reason IS NOT NULL AND c.to_status IN ('idle', 'removed'))
                          THEN p_reason ELSE c.reason END,
            wall_clock = CASE WHEN c.status = 'running' AND c.started_at IS NOT NULL
                              THEN coalesce(c.wall_clock, 0) + greatest(0, p_now - c.started_at)
                              ELSE c.wall_clock END,
            hold_code = CASE WHEN c.to_status = 'held' THEN p_code
                             WHEN c.status = 'held' THEN NULL ELSE c.hold_code END,
            hold_subcode = CASE WHEN c.to_status = 'held' THEN p_subcode
                                WHEN c.status = 'held' THEN NULL ELSE c.hold_subcode END,
            num_holds = CASE WHEN c.to_status = 'held' THEN coalesce(c.num_holds, 0) + 1
                             ELSE c.num_holds END,
            winding_down_until = CASE WHEN c.status IN ('fetched', 'accepted', 'running')
                THEN greatest(coalesce(greatest(c.lease_expires_at, c.lease_renewed_until), p_now),
                              p_now)
                ELSE c.winding_down_until END
        FROM cur c WHERE jobs.id = c.id AND c.to_status IS NOT NULL
        RETURNING jobs.id, c.status AS before, c.to_status AS after, c.claims
    )
    SELECT array_agg(id ORDER BY id), array_agg(before ORDER BY id), array_agg(after ORDER BY id),
           array_agg(claims ORDER BY id)
    INTO v_ids, v_before, v_after, v_claims FROM changed;
    INSERT INTO job_events (job_id, time, event, from_status, to_status, attempt, reason, attrs)
    SELECT x.id, p_now, p_event, x.before, x.after, x.claims, p_reason,
           CASE WHEN x.after = 'held' THEN format('{"HoldReasonCode":%s,"HoldReasonSubCode":%s}', p_code,
                                                  p_subcode)::json END
    FROM unnest(v_ids, v_before, v_after, v_claims) AS x(id, before, after, claims) ORDER BY x.id;
    IF cardinality(v_ids) > 0 THEN
        PERFORM pg_notify('jobstore_events', 'page');
        PERFORM pg_notify('jobstore_stops', jobstore_sign(x.id::text))
        FROM unnest(v_ids, v_before) AS x(id, before)
        WHERE x.before IN ('fetched', 'accepted', 'running');
    END IF;
    RETURN QUERY
    SELECT x.id, p_event, x.before, x.after, x.claims, p_reason,
           CASE WHEN x.after = 'held' THEN format('{"HoldReasonCode":%s,"HoldReasonSubCode":%s}', p_code,
                                                  p_subcode)::json END,
           false, p_kind
    FROM unnest(v_ids, v_before, v_after, v_claims) AS x(id, before, after, claims);
    SELECT array_agg(x.id) INTO v_ended FROM unnest(v_ids, v_after) AS x(id, after)
    WHERE x.after = 'removed';
    RETURN QUERY SELECT * FROM jobstore_dag_jobs_ended(v_ended, p_now);
END $$;

-- A hold, release or rm of the jobs `p_ids` by their owner or a queue super user: each job
-- the session may act on is locked (those another transaction holds are skipped with
-- `p_skip_locked`) and changed; the others are reported as denied.
CREATE FUNCTION jobstore_act(p_ids bigint[], p_event text, p_reason text, p_code integer,
    p_subcode integer, p_skip_locked boolean, p_now double precision)
RETURNS SETOF jobstore_change
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp
SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_account text := jobstore_account();
    v_super boolean := jobstore_super_user();
    v_now double precision := jobstore_clock(p_now);
    v_locked bigint[];
    v_done bigint[] := '{}';
    v_code integer := p_code;
    v_subcode integer := p_subcode;
    r jobstore_change;
BEGIN
    IF NOT jobstore_submitter() THEN
        PERFORM jobstore_refused(v_account || ' may not act on jobs of this job store'
                                 || ' (ask its admin for `jobstore grant-user`)');
    END IF;
    IF p_event IS NULL OR p_event NOT IN ('hold', 'release', 'remove') THEN
        PERFORM jobstore_bad(format('%L is not hold, release or remove', p_event));
    END IF;
    IF length(p_reason) > 1024 OR p_reason ~ '[\n\r]' THEN
        PERFORM jobstore_bad('a reason is one line of at most 1024 characters');
    END IF;
    IF NOT jobstore_trusted() OR v_code IS NULL THEN
        v_code := 1;  -- UserRequest: what a submitter's hold is
        v_subcode := 0;
    END IF;
    IF p_skip_locked THEN
        SELECT array_agg(id) INTO v_locked FROM (
            SELECT j.id FROM jobs j WHERE j.id = ANY(p_ids) AND (j.owner = v_account OR v_super)
            ORDER BY j.id FOR UPDATE SKIP LOCKED) s;
    ELSE
        SELECT array_agg(id) INTO v_locked FROM (
            SELECT j.id FROM jobs j WHERE j.id = ANY(p_ids) AND (j.owner = v_account OR v_super)
            ORDER BY j.id FOR UPDATE) s;
    END IF;
    v_locked := coalesce(v_locked, '{}');
    RETURN QUERY
    SELECT j.id, p_event, j.status::text, NULL::text, j.claims, NULL::text, NULL::json, false,
           CASE WHEN NOT (j.owner = v_account OR v_super) THEN 'denied' ELSE 'skipped' END
    FROM jobs j WHERE j.id = ANY(p_ids) AND NOT j.id = ANY(v_locked);
    FOR r IN SELECT * FROM jobstore_apply_act(v_locked, p_event, p_reason, v_code, v_subcode,
                                              v_now, 'acted') LOOP
        IF r.kind = 'acted' THEN
            v_done := v_done || r.job_id;
        END IF;
        RETURN NEXT r;
    END LOOP;
    -- the locked jobs the action left as they were (not in a status it applies to)
    RETURN QUERY
    SELECT j.id, p_event, j.status::text, NULL::text, j.claims, NULL::text, NULL::json, false,
           'acted'
    FROM jobs j WHERE j.id = ANY(v_locked) AND NOT j.id = ANY(v_done);
END $$;

-- ---- condor_qedit -----------------------------------------------------------------------------

-- Set attribute `p_name` to the expression `p_text` on the waiting (idle or held) jobs of
-- `p_ids` the session may act on; `p_signatures`: each job's autocluster signature after the
-- edit, in the order of `p_ids`.
CREATE FUNCTION jobstore_edit(p_ids bigint[], p_name text, p_text text, p_signatures text[],
    p_skip_locked boolean, p_now double precision)
RETURNS SETOF jobstore_change
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp
SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_account text := jobstore_account();
    v_super boolean := jobstore_super_user();
    v_now double precision := jobstore_clock(p_now);
    v_low text := lower(p_name);
    v_column text;
    v_number bigint;
    v_bad text;
    v_locked bigint[];
    v_rows json;
    v_edited bigint[];
    v_owner text;
BEGIN
    IF NOT jobstore_submitter() THEN
        PERFORM jobstore_refused(v_account || ' may not edit jobs of this job store'
                                 || ' (ask its admin for `jobstore grant-user`)');
    END IF;
    v_bad := jobstore_attr_problem(p_name, json_build_object('expr', p_text), 'edit', v_super);
    IF v_bad IS NULL AND v_low IN ('jobstatus', 'jobstorestatus', 'numjobstarts',
            'jobstoreclaims', 'enteredcurrentstatus', 'exitcode', 'exitsignal',
            'exitbysignal', 'remotehost', 'jobpid', 'remoteusercpu', 'remotesyscpu',
            'imagesize', 'memoryusage', 'residentsetsize', 'jobstartdate',
            'jobcurrentstartdate', 'jobcurrentstartexecutingdate', 'shadowbday',
            'completiondate', 'holdreason', 'lastreason', 'holdreasoncode',
            'holdreasonsubcode', 'numholds') THEN
        v_bad := 'this attribute cannot be edited';
    END IF;
    IF v_bad IS NOT NULL THEN
        PERFORM jobstore_bad(p_name || ': ' || v_bad);
    END IF;
    v_column := CASE v_low WHEN 'jobprio' THEN 'priority' WHEN 'requestcpus' THEN 'request_cpus'
        WHEN 'requestmemory' THEN 'request_memory' WHEN 'requestdisk' THEN 'request_disk' END;
    IF v_column IS NOT NULL THEN
        IF p_text !~ '^-?[0-9]{1,18}$' OR (v_low <> 'jobprio' AND p_text LIKE '-%') THEN
            PERFORM jobstore_bad(format('%s: %s is not a non-negative integer', p_name, p_text));
        END IF;
        v_number := p_text::bigint;
        IF v_number NOT BETWEEN -2147483648 AND (CASE WHEN v_low = 'requestdisk'
                THEN 9007199254740991 ELSE 2147483647 END) THEN
            PERFORM jobstore_bad(format('%s: %s is out of range', p_name, p_text));
        END IF;
    END IF;
    IF cardinality(p_signatures) IS DISTINCT FROM cardinality(p_ids)
       OR EXISTS (SELECT 1 FROM unnest(p_signatures) s WHERE s !~ '^[0-9a-f]{64}$') THEN
        PERFORM jobstore_bad('a signature for each job');
    END IF;
    IF p_skip_locked THEN
        SELECT array_agg(id) INTO v_locked FROM (
            SELECT j.id FROM jobs j WHERE j.id = ANY(p_ids) AND (j.owner = v_account OR v_super)
            ORDER BY j.id FOR UPDATE SKIP LOCKED) s;
    ELSE
        SELECT array_agg(id) INTO v_locked FROM (
            SELECT j.id FROM jobs j WHERE j.id = ANY(p_ids) AND (j.owner = v_account OR v_super)
            ORDER BY j.id FOR UPDATE) s;
    END IF;
    v_locked := coalesce(v_locked, '{}');
    RETURN QUERY
    SELECT j.id, 'edit', j.status::text, NULL::text, j.claims, NULL::text, NULL::json, false,
           CASE WHEN NOT (j.owner = v_account OR v_super) THEN 'denied' ELSE 'skipped' END
    FROM jobs j WHERE j.id = ANY(p_ids) AND NOT j.id = ANY(v_locked);
    -- each waiting job as the edit makes it
    SELECT json_agg(json_build_object('id', j.id, 'cluster_id', j.cluster_id,
        'proc_id', j.proc_id, 'owner', j.owner, 'signature', s.sig, 'queue', j.queue,
        'submitter', j.submitter,
        'request_cpus', CASE WHEN v_column = 'request_cpus' THEN v_number ELSE j.request_cpus END,
        'request_memory', CASE WHEN v_column = 'request_memory' THEN v_number
                               ELSE j.request_memory END,
        'request_disk', CASE WHEN v_column = 'request_disk' THEN v_number ELSE j.request_disk END,
        'requirements', CASE WHEN v_low = 'requirements' THEN p_text ELSE j.requirements END,
        'concurrency_limits', j.concurrency_limits, 'ad', n.ad,
        'significant', jobstore_significant(n.ad),
        'priority', CASE WHEN v_column = 'priority' THEN v_number ELSE j.priority END,
        'periodic', CASE WHEN EXISTS (SELECT 1 FROM json_object_keys(n.ad) k WHERE lower(k) IN (
            'periodichold', 'periodicrelease', 'periodicremove', 'allowedexecuteduration',
            'allowedjobduration')) THEN true END))
    INTO v_rows
    FROM jobs j
    JOIN unnest(p_ids, p_signatures) AS s(id, sig) ON s.id = j.id,
    LATERAL (SELECT coalesce(json_object_agg(e.key, e.value), '{}'::json) AS ad FROM (
        SELECT e.key, e.value FROM json_each(j.ad) e WHERE lower(e.key) <> v_low
        UNION ALL
        SELECT p_name, json_build_object('expr', p_text) WHERE v_column IS NULL) e) n
    WHERE j.id = ANY(v_locked) AND j.status IN ('idle', 'held');
    IF v_rows IS NOT NULL THEN
        v_bad := jobstore_ads_problem(v_rows, 'edit', v_super);
        IF v_bad IS NOT NULL THEN
            PERFORM jobstore_bad(v_bad);
        END IF;
        FOR v_owner IN SELECT DISTINCT e.owner FROM json_to_recordset(v_rows) AS e(owner text)
        LOOP
            PERFORM jobstore_autoclusters(v_owner, (SELECT json_agg(e) FROM json_array_elements(
                v_rows) AS e WHERE e->>'owner' = v_owner), v_now);
        END LOOP;
        PERFORM set_config('jobstore.checked', 'on', true);
        WITH changed AS (
            UPDATE jobs SET ad = e.ad, priority = e.priority, request_cpus = e.request_cpus,
                request_memory = e.request_memory, request_disk = e.request_disk,
                requirements = e.requirements, periodic = e.periodic, autocluster_id = a.id,
                updated_at = v_now
            FROM json_to_recordset(v_rows) AS e(id bigint, owner text, signature text,
                ad json, priority integer, request_cpus integer, request_memory integer,
                request_disk bigint, requirements text, periodic boolean)
            JOIN autoclusters a ON a.owner = e.owner AND a.signature = e.signature
            WHERE jobs.id = e.id RETURNING jobs.id
        )
        SELECT array_agg(id ORDER BY id) INTO v_edited FROM changed;
        PERFORM set_config('jobstore.checked', 'off', true);
        INSERT INTO job_events (job_id, time, event, from_status, to_status, attempt, reason,
            attrs)
        SELECT j.id, v_now, 'edit', j.status, NULL, j.claims, p_name || ' = ' || p_text,
               ('{' || to_json(p_name) || ':' || to_json(p_text) || '}')::json
        FROM jobs j WHERE j.id = ANY(v_edited) ORDER BY j.id;
        PERFORM pg_notify('jobstore_events', 'page');
    END IF;
    RETURN QUERY
    SELECT j.id, 'edit', j.status::text, NULL::text, j.claims, p_name || ' = ' || p_text,
           ('{' || to_json(p_name) || ':' || to_json(p_text) || '}')::json, j.id = ANY(coalesce(v_edited, '{}')), 'acted'
    FROM jobs j WHERE j.id = ANY(v_locked);
END $$;

-- ---- condor_userprio --------------------------------------------------------------------------

CREATE FUNCTION jobstore_set_factor(p_name text, p_factor double precision) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_done boolean;
BEGIN
    IF NOT jobstore_admin() THEN
        PERFORM jobstore_refused(jobstore_account() || ' may not change priority factors'
                                 || ' (condor_userprio''s changes are the admin''s)');
    END IF;
    IF NOT (p_factor >= 1 AND p_factor < 1e12) THEN
        PERFORM jobstore_bad('a priority factor must be at least 1');
    END IF;
    UPDATE submitters SET factor = p_factor WHERE name = p_name RETURNING true INTO v_done;
    RETURN coalesce(v_done, false);
END $$;

CREATE FUNCTION jobstore_reset_usage(p_name text, p_now double precision) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_rows integer;
BEGIN
    IF NOT jobstore_admin() THEN
        PERFORM jobstore_refused(jobstore_account() || ' may not reset usage'
                                 || ' (condor_userprio''s changes are the admin''s)');
    END IF;
    UPDATE submitters SET usage = 0, priority = 0.5, first_usage = NULL,
        updated_at = jobstore_clock(p_now)
    WHERE p_name IS NULL OR name = p_name;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows;
END $$;

-- ---- DAGs: queued whole, carried forward by the database ------------------------------------

-- A DAG of `p_owner` (NULL: the session's account): its own cluster (its DAGManJobId) and its
-- `dags` row; its nodes come with jobstore_dag_nodes.
CREATE FUNCTION jobstore_new_dag(p_owner text, p_queue text, p_path text, p_batch_name text,
    p_max_jobs integer, p_max_idle integer, p_attrs json, p_now double precision)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_id bigint;
    v_now double precision := jobstore_clock(p_now);
    v_bad text;
BEGIN
    SELECT cluster_id INTO v_id FROM jobstore_new_cluster(p_owner, p_queue, p_path, 0, NULL,
                                                          p_now);
    IF p_path IS NULL OR length(p_batch_name) > 255 OR p_batch_name ~ '[\n\r]' THEN
        PERFORM jobstore_bad('a DAG has a path and a batch name of one line');
    END IF;
    IF p_max_jobs < 1 OR p_max_idle < 1 THEN
        PERFORM jobstore_bad('-maxjobs and -maxidle are 1 or more');
    END IF;
    IF p_attrs IS NOT NULL AND (json_typeof(p_attrs) <> 'object' OR EXISTS (
            SELECT 1 FROM json_each(p_attrs) AS e WHERE json_typeof(e.value) <> 'string')) THEN
        PERFORM jobstore_bad('SET_JOB_ATTR: each value is the text of an expression');
    END IF;
    IF p_attrs IS NOT NULL THEN
        v_bad := jobstore_ads_problem(json_build_array(json_build_object('cluster_id', v_id,
            'proc_id', 0, 'ad', (SELECT json_object_agg(k, json_build_object('expr', v))
                                 FROM json_each_text(p_attrs) AS e(k, v)))), 'submit', false);
        IF v_bad IS NOT NULL THEN
            PERFORM jobstore_bad('SET_JOB_ATTR: ' || v_bad);
        END IF;
    END IF;
    INSERT INTO dags (id, owner, path, batch_name, status, created_at, attrs, max_jobs, max_idle)
    SELECT v_id, c.owner, p_path, coalesce(p_batch_name, regexp_replace(p_path, '^.*/', '')
           || '+' || v_id), 'running', v_now, p_attrs::text, p_max_jobs, p_max_idle
    FROM clusters c WHERE c.id = v_id;
    RETURN v_id;
END $$;

-- The nodes of a new DAG (a JSON array of {name, procs (its jobs: 0 for a NOOP node), done,
-- priority, category, abort_exit, abort_return, final}), their dependencies ({parent, child})
-- and its categories' throttles ({name, maxjobs}), once; a cluster made for each node with
-- jobs. Each node's cluster, by name.
CREATE FUNCTION jobstore_dag_nodes(p_dag bigint, p_nodes json, p_edges json,
    p_categories json, p_now double precision)
RETURNS TABLE (name text, cluster_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp
SET jit = off
-- a DAG's nodes and edges are sets of any size the planner cannot count: hash, never loop
SET enable_nestloop = off AS $$
#variable_conflict use_column
DECLARE
    d dags%ROWTYPE;
    v_now double precision := jobstore_clock(p_now);
    v_bad text;
BEGIN
    SELECT * INTO d FROM dags WHERE id = p_dag FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JS004', MESSAGE = format('no DAG %s', p_dag);
    END IF;
    PERFORM jobstore_check_submitter(d.owner);
    IF EXISTS (SELECT 1 FROM dag_nodes n WHERE n.dag_id = p_dag) THEN
        PERFORM jobstore_bad(format('DAG %s has its nodes already', p_dag));
    END IF;
    SELECT CASE
        WHEN n.name IS NULL OR length(n.name) NOT BETWEEN 1 AND 255
             OR n.name ~ '[\s{}"\\]' THEN
            format('%L is not a node name', n.name)
        WHEN n.procs IS NULL OR n.procs NOT BETWEEN 0 AND 1000000 THEN
            format('node %s: not a number of jobs', n.name)
        WHEN length(n.category) > 255 OR n.category ~ '[\s"\\]' THEN
            format('node %s: not a category', n.name)
        END INTO v_bad
    FROM json_to_recordset(p_nodes) AS n(name text, procs integer, category text)
    WHERE n.name IS NULL OR length(n.name) NOT BETWEEN 1 AND 255 OR n.name ~ '[\s{}"\\]'
       OR n.procs IS NULL
       OR n.procs NOT BETWEEN 0 AND 1000000 OR length(n.category) > 255
       OR n.category ~ '[\s"\\]'
    LIMIT 1;
    IF v_bad IS NULL THEN
        SELECT format('node %s is named twice', n.name) INTO v_bad
        FROM json_to_recordset(p_nodes) AS n(name text) GROUP BY n.name HAVING count(*) > 1
        LIMIT 1;
    END IF;
    IF v_bad IS NULL THEN
        SELECT format('%s -> %s: not a dependency between two of its nodes', e.parent, e.child)
        INTO v_bad FROM json_to_recordset(p_edges) AS e(parent text, child text)
        WHERE e.parent = e.child OR e.parent IS NULL OR e.child IS NULL
        LIMIT 1;
    END IF;
    IF v_bad IS NULL THEN
        SELECT format('%s: not one of its nodes, named in a dependency', x.name) INTO v_bad
        FROM (SELECT e.parent AS name FROM json_to_recordset(p_edges) AS e(parent text)
              UNION SELECT e.child FROM json_to_recordset(p_edges) AS e(child text)
              EXCEPT SELECT n.name FROM json_to_recordset(p_nodes) AS n(name text)) x
        LIMIT 1;
    END IF;
    IF v_bad IS NULL THEN
        SELECT format('CATEGORY %L: not a name and a MAXJOBS of 0 or more', c.name) INTO v_bad
        FROM json_to_recordset(p_categories) AS c(name text, maxjobs integer)
        WHERE c.name IS NULL OR length(c.name) > 255 OR c.name ~ '[\s"\\]'
           OR c.maxjobs IS NULL OR c.maxjobs < 0
        LIMIT 1;
    END IF;
    IF v_bad IS NOT NULL THEN
        PERFORM jobstore_bad(format('DAG %s: %s', d.path, v_bad));
    END IF;
    INSERT INTO dag_edges (dag_id, parent, child, owner)
    SELECT DISTINCT p_dag, e.parent, e.child, d.owner
    FROM json_to_recordset(p_edges) AS e(parent text, child text);
    INSERT INTO dag_categories (dag_id, name, owner, maxjobs)
    SELECT p_dag, c.name, d.owner, c.maxjobs
    FROM json_to_recordset(p_categories) AS c(name text, maxjobs integer);
    RETURN QUERY
    WITH sent AS (
        SELECT n.*, e.ord FROM json_array_elements(p_nodes) WITH ORDINALITY AS e(v, ord),
        LATERAL json_to_record(e.v) AS n(name text, procs integer,
            done boolean, priority integer, category text, abort_exit integer,
            abort_return integer, final boolean)
    ), made AS (
        INSERT INTO clusters (owner, queue, submit_file, num_procs, submitted_at)
        SELECT d.owner, c.queue, NULL, s.procs, v_now FROM sent s, clusters c
        WHERE c.id = p_dag AND s.procs > 0 AND NOT coalesce(s.done, false) ORDER BY s.ord
        RETURNING id
    ), mapped AS (
        SELECT s.name, m.id FROM (SELECT id, row_number() OVER (ORDER BY id) AS k FROM made) m
        JOIN (SELECT name, row_number() OVER (ORDER BY ord) AS k FROM sent
              WHERE procs > 0 AND NOT coalesce(done, false)) s ON s.k = m.k
    ), pending AS (
        SELECT e.child, count(*) AS n
        FROM (SELECT DISTINCT x.parent, x.child
              FROM json_to_recordset(p_edges) AS x(parent text, child text)) e
        JOIN sent p ON p.name = e.parent
        WHERE NOT coalesce(p.done, false)
        GROUP BY e.child
    ), nodes AS (
        INSERT INTO dag_nodes (dag_id, name, owner, cluster_id, status, pending, priority,
            category, abort_exit, abort_return, final, updated_at)
        SELECT p_dag, s.name, d.owner, m.id,
            CASE WHEN s.done THEN 'done' ELSE 'waiting' END, coalesce(w.n, 0),
            coalesce(s.priority, 0), s.category, s.abort_exit, s.abort_return,
            coalesce(s.final, false), v_now
        FROM sent s LEFT JOIN mapped m ON m.name = s.name LEFT JOIN pending w ON w.child = s.name
        ORDER BY s.ord
        RETURNING dag_nodes.name, dag_nodes.cluster_id
    )
    SELECT n.name::text, n.cluster_id FROM nodes n WHERE n.cluster_id IS NOT NULL;
END $$;

-- Start a DAG whose nodes and jobs are queued: the nodes without parents to wait for are
-- ready, and released as its throttles allow.
CREATE FUNCTION jobstore_start_dag(p_dag bigint, p_now double precision)
RETURNS SETOF jobstore_change
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp
SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_owner text;
BEGIN
    SELECT owner INTO v_owner FROM dags WHERE id = p_dag FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JS004', MESSAGE = format('no DAG %s', p_dag);
    END IF;
    PERFORM jobstore_check_submitter(v_owner);
    UPDATE dag_nodes SET status = 'ready'
    WHERE dag_id = p_dag AND status = 'waiting' AND pending = 0 AND NOT final;
    RETURN QUERY SELECT * FROM jobstore_dag_advance(p_dag, jobstore_clock(p_now));
END $$;

-- The session may act on the DAG `p_dag` (its owner or a queue super user): its row, locked.
CREATE FUNCTION jobstore_dag_acted_on(p_dag bigint, p_what text) RETURNS dags
LANGUAGE plpgsql SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    d dags%ROWTYPE;
BEGIN
    SELECT * INTO d FROM dags WHERE id = p_dag FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'JS004', MESSAGE = format('no DAG %s', p_dag);
    END IF;
    IF NOT jobstore_submitter() OR NOT (d.owner = jobstore_account() OR jobstore_super_user())
    THEN
        PERFORM jobstore_refused(format('%s may not %s DAG %s (not its owner)',
                                        jobstore_account(), p_what, p_dag));
    END IF;
    RETURN d;
END $$;

-- condor_hold (`p_held`) or condor_release of DAGMan's job: no node is released while held.
CREATE FUNCTION jobstore_pause_dag(p_dag bigint, p_held boolean, p_now double precision)
RETURNS SETOF jobstore_change
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp
SET jit = off AS $$
#variable_conflict use_column
DECLARE
    d dags%ROWTYPE := jobstore_dag_acted_on(p_dag, CASE WHEN p_held THEN 'hold'
                                                         ELSE 'release' END);
BEGIN
    UPDATE dags SET status = CASE WHEN p_held THEN 'held' ELSE 'running' END
    WHERE id = p_dag AND status = CASE WHEN p_held THEN 'running' ELSE 'held' END;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT p_dag, 'paused', d.status::text, NULL::text, 0, NULL::text, NULL::json,
                        false, 'dag';
    IF NOT p_held THEN
        RETURN QUERY SELECT * FROM jobstore_dag_advance(p_dag, jobstore_clock(p_now));
    END IF;
END $$;

-- condor_rm of DAGMan's job: what has not run never will, the queued nodes' jobs are removed,
-- the DAG ends removed (its FINAL node still runs).
CREATE FUNCTION jobstore_remove_dag(p_dag bigint, p_why text, p_now double precision)
RETURNS SETOF jobstore_change
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp
SET jit = off AS $$
#variable_conflict use_column
DECLARE
    d dags%ROWTYPE := jobstore_dag_acted_on(p_dag, 'remove');
    v_now double precision := jobstore_clock(p_now);
BEGIN
    IF d.status NOT IN ('running', 'held') THEN
        RETURN;
    END IF;
    IF length(p_why) > 1024 OR p_why ~ '[\n\r]' THEN
        PERFORM jobstore_bad('a reason is one line of at most 1024 characters');
    END IF;
    UPDATE dags SET status = 'removing' WHERE id = p_dag;
    RETURN QUERY SELECT p_dag, 'removed', d.status::text, NULL::text, 0, NULL::text, NULL::json,
                        false, 'dag';
    RETURN QUERY SELECT * FROM jobstore_dag_abort(p_dag, v_now, coalesce(p_why,
                                                  'the DAG was removed'), 4, 1);
    RETURN QUERY SELECT * FROM jobstore_dag_advance(p_dag, v_now);
END $$;

-- The DAGs' engine: what jobstore.db.dags does in Python on SQLite, in the transactions that
-- end their nodes' jobs, whoever ends them (the agent calls jobstore_dag_jobs_ended and
-- jobstore_dag_node_started; the actions above call them too).

-- A node's result from its cluster's jobs: NULL while one is unfinished; 0 when each
-- completed with exit code 0; else the first failing job's code (1 when it has none).
CREATE FUNCTION jobstore_dag_node_verdict(p_cluster bigint) RETURNS integer
LANGUAGE sql STABLE SET search_path = pg_catalog, @schema@, pg_temp AS $$
    SELECT CASE
        WHEN bool_or(j.phase <> 'done') THEN NULL
        ELSE coalesce((array_agg(CASE WHEN j.status = 'completed' AND j.exit_code <> 0
                                           AND NOT coalesce(j.exit_by_signal, false)
                                      THEN j.exit_code ELSE 1 END ORDER BY j.proc_id)
                       FILTER (WHERE j.status <> 'completed' OR coalesce(j.exit_by_signal, false)
                               OR j.exit_code IS DISTINCT FROM 0))[1], 0)
    END
    FROM jobs j WHERE j.cluster_id = p_cluster
$$;

-- Waiting jobs of `p_clusters` to `p_to` (idle: queued; removed: futile), each with its event.
CREATE FUNCTION jobstore_dag_move_jobs(p_clusters bigint[], p_event text, p_to text,
    p_now double precision, p_why text)
RETURNS SETOF jobstore_change
LANGUAGE plpgsql SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_ids bigint[];
    v_claims integer[];
BEGIN
    IF coalesce(cardinality(p_clusters), 0) = 0 THEN
        RETURN;
    END IF;
    WITH moved AS (
        UPDATE jobs SET status = p_to, updated_at = p_now,
            finished_at = CASE WHEN p_to = 'removed' THEN p_now ELSE finished_at END,
            reason = CASE WHEN p_to = 'removed' THEN p_why ELSE reason END
        WHERE cluster_id = ANY(p_clusters) AND status = 'waiting'
        RETURNING id, claims
    )
    SELECT array_agg(id ORDER BY id), array_agg(claims ORDER BY id) INTO v_ids, v_claims
    FROM moved;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    INSERT INTO job_events (job_id, time, event, from_status, to_status, attempt, reason)
    SELECT x.id, p_now, p_event, 'waiting', p_to, x.claims, p_why
    FROM unnest(v_ids, v_claims) AS x(id, claims) ORDER BY x.id;
    PERFORM pg_notify('jobstore_events', 'page');
    RETURN QUERY SELECT x.id, p_event, 'waiting'::text, p_to, x.claims, p_why, NULL::json, false,
                        'moved'
    FROM unnest(v_ids, v_claims) AS x(id, claims);
END $$;

-- Nodes `p_names` of DAG `p_dag` are done: one parent fewer to wait for, for each of their
-- children; those with none left are ready. In a running DAG a NOOP child that is ready is
-- done at once, and so on down a chain of them. Each child is read and written by its whole
-- key (the planner never knows how big a DAG made in this transaction is, and a plan by its id
-- and status reads all its nodes of that status at every step: `(status = ...) IS TRUE` is
-- what no index serves); a step with many children is one statement.
CREATE FUNCTION jobstore_dag_parents_done(p_dag bigint, p_names text[], p_now double precision)
RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_names text[] := p_names;
    v_name text;
    v_kids text[];
    v_noop text[];
    v_running boolean;
    v_status text;
    v_is_noop boolean;
BEGIN
    SELECT status = 'running' INTO v_running FROM dags WHERE id = p_dag;
    LOOP
        v_kids := '{}';
        FOREACH v_name IN ARRAY v_names LOOP
            v_kids := v_kids || ARRAY(SELECT e.child::text FROM dag_edges e
                                      WHERE e.dag_id = p_dag AND e.parent = v_name);
        END LOOP;
        v_noop := '{}';
        IF cardinality(v_kids) > 256 THEN
            WITH kids AS (
                SELECT k.child, count(*) AS k FROM unnest(v_kids) AS k(child) GROUP BY k.child
            ), moved AS (
                UPDATE dag_nodes n SET pending = n.pending - kids.k, updated_at = p_now,
                    status = CASE WHEN n.pending <= kids.k THEN 'ready' ELSE 'waiting' END
                FROM kids WHERE n.dag_id = p_dag AND n.name = kids.child
                  AND n.status = 'waiting'
                RETURNING n.name, n.status, n.cluster_id, n.final)
            SELECT coalesce(array_agg(m.name::text) FILTER (
                       WHERE m.status = 'ready' AND m.cluster_id IS NULL AND NOT m.final), '{}')
            INTO v_noop FROM moved m;
        ELSE
            FOREACH v_name IN ARRAY v_kids LOOP
                UPDATE dag_nodes n SET pending = n.pending - 1, updated_at = p_now,
                    status = CASE WHEN n.pending <= 1 THEN 'ready' ELSE 'waiting' END
                WHERE n.dag_id = p_dag AND n.name = v_name AND (n.status = 'waiting') IS TRUE
                RETURNING n.status, n.cluster_id IS NULL AND NOT n.final
                INTO v_status, v_is_noop;
                IF FOUND AND v_status = 'ready' AND v_is_noop THEN
                    v_noop := v_noop || v_name;
                END IF;
            END LOOP;
        END IF;
        EXIT WHEN NOT coalesce(v_running, false) OR cardinality(v_noop) = 0;
        FOREACH v_name IN ARRAY v_noop LOOP
            UPDATE dag_nodes SET status = 'done', exit_code = 0, updated_at = p_now
            WHERE dag_id = p_dag AND name = v_name AND (status = 'ready') IS TRUE;
        END LOOP;
        v_names := v_noop;
    END LOOP;
END $$;

-- Nodes that will never run (not the FINAL node): their waiting jobs removed.
CREATE FUNCTION jobstore_dag_make_futile(p_dag bigint, p_names text[], p_now double precision,
    p_why text)
RETURNS SETOF jobstore_change
LANGUAGE plpgsql SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_clusters bigint[];
BEGIN
    WITH futile AS (
        UPDATE dag_nodes SET status = 'futile', updated_at = p_now
        WHERE dag_id = p_dag AND name = ANY(p_names) AND status IN ('waiting', 'ready')
          AND NOT final
        RETURNING cluster_id
    )
    SELECT array_agg(cluster_id) FILTER (WHERE cluster_id IS NOT NULL) INTO v_clusters
    FROM futile;
    IF v_clusters IS NOT NULL THEN
        RETURN QUERY SELECT * FROM jobstore_dag_move_jobs(v_clusters, 'node_futile', 'removed',
                                                          p_now, p_why);
    END IF;
END $$;

-- Stop a DAG: what has not run never will (the FINAL node still runs), its queued nodes'
-- unfinished jobs are removed (as jobstore rm removes them).
CREATE FUNCTION jobstore_dag_abort(p_dag bigint, p_now double precision, p_why text,
    p_dag_status integer, p_code integer)
RETURNS SETOF jobstore_change
LANGUAGE plpgsql SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_ids bigint[];
BEGIN
    UPDATE dags SET dag_status = p_dag_status, exit_code = p_code WHERE id = p_dag;
    RETURN QUERY SELECT * FROM jobstore_dag_make_futile(p_dag, ARRAY(
        SELECT n.name FROM dag_nodes n WHERE n.dag_id = p_dag
          AND n.status IN ('waiting', 'ready') AND NOT n.final), p_now, 'never run: ' || p_why);
    SELECT array_agg(id) INTO v_ids FROM (
        SELECT j.id FROM jobs j JOIN dag_nodes n ON n.cluster_id = j.cluster_id
        WHERE n.dag_id = p_dag AND n.status = 'queued' AND NOT n.final AND j.phase <> 'done'
        ORDER BY j.id FOR UPDATE OF j) s;
    IF v_ids IS NOT NULL THEN
        RETURN QUERY SELECT * FROM jobstore_apply_act(v_ids, 'remove', p_why, 1, 0, p_now,
                                                      'moved');
    END IF;
END $$;

-- A node ended with `p_code`: its children are one parent nearer, or its descendants futile
-- and, on its ABORT-DAG-ON exit, the DAG stopped.
CREATE FUNCTION jobstore_dag_node_ended(p_dag bigint, p_name text, p_code integer,
    p_now double precision)
RETURNS SETOF jobstore_change
LANGUAGE plpgsql SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    n record;
BEGIN
    UPDATE dag_nodes SET status = CASE WHEN p_code = 0 THEN 'done' ELSE 'failed' END,
        exit_code = p_code, updated_at = p_now
    WHERE dag_id = p_dag AND name = p_name RETURNING abort_exit, abort_return INTO n;
    IF p_code = 0 THEN
        PERFORM jobstore_dag_parents_done(p_dag, ARRAY[p_name], p_now);
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM jobstore_dag_make_futile(p_dag, ARRAY(
        WITH RECURSIVE below(name) AS (
            SELECT e.child FROM dag_edges e WHERE e.dag_id = p_dag AND e.parent = p_name
            UNION
            SELECT e.child FROM dag_edges e JOIN below b ON e.parent = b.name
            WHERE e.dag_id = p_dag)
        SELECT name FROM below), p_now, format('never run: its ancestor node %s failed', p_name));
    IF n.abort_exit IS NOT NULL AND n.abort_exit = p_code THEN
        RETURN QUERY SELECT * FROM jobstore_dag_abort(p_dag, p_now,
            format('ABORT-DAG-ON: node %s exited with %s', p_name, p_code), 3,
            coalesce(n.abort_return, p_code));
    END IF;
END $$;

-- Release what the throttles allow of the ready nodes, best priority first (the FINAL node
-- with `p_final`); a NOOP node is done at once (a row of kind 'noop' says one was).
CREATE FUNCTION jobstore_dag_release_ready(p_dag bigint, p_now double precision,
    p_final boolean)
RETURNS SETOF jobstore_change
LANGUAGE plpgsql SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    d dags%ROWTYPE;
    n record;
    v_total integer;
    v_idle integer := 0;
    v_released text[] := '{}';
    v_clusters bigint[] := '{}';
    v_noop text[] := '{}';
    v_queued jsonb;
    v_limit integer;
BEGIN
    SELECT * INTO d FROM dags WHERE id = p_dag;
    SELECT coalesce(jsonb_object_agg(coalesce(category, ''), c), '{}'::jsonb), coalesce(sum(c), 0)
    INTO v_queued, v_total
    FROM (SELECT category, count(*) AS c FROM dag_nodes WHERE dag_id = p_dag AND status = 'queued'
          GROUP BY category) s;
    IF d.max_idle IS NOT NULL THEN
        SELECT count(*) INTO v_idle FROM jobs j JOIN dag_nodes x ON x.cluster_id = j.cluster_id
        WHERE x.dag_id = p_dag AND j.status = 'idle';
    END IF;
    FOR n IN SELECT * FROM dag_nodes WHERE dag_id = p_dag AND status = 'ready' AND final = p_final
             ORDER BY priority DESC, name LOOP
        IF n.cluster_id IS NULL THEN
            v_noop := v_noop || n.name::text;
            CONTINUE;
        END IF;
        IF NOT p_final THEN
            EXIT WHEN d.max_jobs IS NOT NULL AND v_total >= d.max_jobs;
            EXIT WHEN d.max_idle IS NOT NULL AND v_idle >= d.max_idle;
            SELECT maxjobs INTO v_limit FROM dag_categories
            WHERE dag_id = p_dag AND dag_categories.name = n.category;
            IF FOUND AND coalesce((v_queued ->> coalesce(n.category, ''))::integer, 0) >= v_limit
            THEN
                CONTINUE;
            END IF;
        END IF;
        v_released := v_released || n.name::text;
        v_clusters := v_clusters || n.cluster_id;
        v_total := v_total + 1;
        v_queued := jsonb_set(v_queued, ARRAY[coalesce(n.category, '')], to_jsonb(
            coalesce((v_queued ->> coalesce(n.category, ''))::integer, 0) + 1));
        IF d.max_idle IS NOT NULL THEN
            v_idle := v_idle + (SELECT count(*) FROM jobs WHERE cluster_id = n.cluster_id);
        END IF;
    END LOOP;
    IF cardinality(v_released) > 0 THEN
        UPDATE dag_nodes SET status = 'queued', updated_at = p_now
        WHERE dag_id = p_dag AND status = 'ready' AND name = ANY(v_released);
        RETURN QUERY SELECT * FROM jobstore_dag_move_jobs(v_clusters, 'node_ready', 'idle', p_now,
                                                          'its parents are done');
    END IF;
    IF cardinality(v_noop) > 0 THEN
        UPDATE dag_nodes SET status = 'done', exit_code = 0, updated_at = p_now
        WHERE dag_id = p_dag AND name = ANY(v_noop);
        PERFORM jobstore_dag_parents_done(p_dag, v_noop, p_now);
        RETURN QUERY SELECT NULL::bigint, 'noop', NULL::text, NULL::text, NULL::integer,
                            NULL::text, NULL::json, false, 'noop';
    END IF;
END $$;

-- DAGMan's result once nothing can run: the FINAL node's when there is one, else failed when
-- any node failed or never ran.
CREATE FUNCTION jobstore_dag_end(p_dag bigint, p_now double precision) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    d dags%ROWTYPE;
    v_final boolean;
    v_ok boolean;
    v_status integer;
BEGIN
    SELECT * INTO d FROM dags WHERE id = p_dag;
    SELECT bool_or(final), CASE WHEN bool_or(final) THEN bool_or(final AND status = 'done')
                                ELSE bool_and(status = 'done') END
    INTO v_final, v_ok FROM dag_nodes WHERE dag_id = p_dag;
    v_ok := coalesce(v_ok, true);
    v_status := CASE WHEN d.dag_status <> 0 THEN d.dag_status WHEN v_ok THEN 0 ELSE 2 END;
    IF coalesce(v_final, false) AND v_ok AND d.status <> 'removing' THEN
        v_status := 0;
    END IF;
    UPDATE dags SET
        status = CASE WHEN d.status = 'removing' THEN 'removed' WHEN v_ok THEN 'completed'
                      ELSE 'failed' END,
        dag_status = v_status,
        exit_code = CASE WHEN v_ok AND d.status <> 'removing' THEN 0
                         ELSE coalesce(d.exit_code, 1) END,
        finished_at = p_now
    WHERE id = p_dag;
END $$;

-- Release the ready nodes the DAG's throttles allow, then its FINAL node or its end when
-- nothing else can run.
CREATE FUNCTION jobstore_dag_advance(p_dag bigint, p_now double precision)
RETURNS SETOF jobstore_change
LANGUAGE plpgsql SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_status text;
    v_noop boolean;
    r jobstore_change;
BEGIN
    SELECT status INTO v_status FROM dags WHERE id = p_dag;
    IF v_status IS NULL OR v_status NOT IN ('running', 'removing') THEN
        RETURN;
    END IF;
    LOOP
        EXIT WHEN v_status <> 'running';
        v_noop := false;
        FOR r IN SELECT * FROM jobstore_dag_release_ready(p_dag, p_now, false) LOOP
            IF r.kind = 'noop' THEN
                v_noop := true;
            ELSE
                RETURN NEXT r;
            END IF;
        END LOOP;
        EXIT WHEN NOT v_noop;
    END LOOP;
    IF EXISTS (SELECT 1 FROM dag_nodes WHERE dag_id = p_dag AND NOT final
               AND status IN ('waiting', 'ready', 'queued')) THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM dag_nodes WHERE dag_id = p_dag AND final
               AND status IN ('waiting', 'ready')) THEN
        UPDATE dag_nodes SET status = 'ready', pending = 0 WHERE dag_id = p_dag AND final;
        RETURN QUERY SELECT * FROM jobstore_dag_release_ready(p_dag, p_now, true) x
                     WHERE x.kind <> 'noop';
        IF EXISTS (SELECT 1 FROM dag_nodes WHERE dag_id = p_dag
                   AND status IN ('waiting', 'ready', 'queued')) THEN
            RETURN;
        END IF;
    ELSIF EXISTS (SELECT 1 FROM dag_nodes WHERE dag_id = p_dag
                  AND status IN ('waiting', 'ready', 'queued')) THEN
        RETURN;  -- the FINAL node runs
    END IF;
    PERFORM jobstore_dag_end(p_dag, p_now);
END $$;

-- Jobs `p_ids` ended in this transaction: decide the nodes they end, carry their DAGs forward.
CREATE FUNCTION jobstore_dag_jobs_ended(p_ids bigint[], p_now double precision)
RETURNS SETOF jobstore_change
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp
SET jit = off AS $$
#variable_conflict use_column
DECLARE
    n record;
    v integer;
BEGIN
    IF p_ids IS NULL OR cardinality(p_ids) = 0
       OR NOT EXISTS (SELECT 1 FROM dags WHERE status IN ('running', 'held', 'removing')) THEN
        RETURN;
    END IF;
    FOR n IN SELECT DISTINCT x.dag_id, x.name, x.cluster_id FROM dag_nodes x
             JOIN jobs j ON j.cluster_id = x.cluster_id
             WHERE j.id = ANY(p_ids) AND x.status = 'queued' ORDER BY x.dag_id, x.name LOOP
        -- a node an earlier one's end decided meanwhile is not decided again
        CONTINUE WHEN NOT EXISTS (SELECT 1 FROM dag_nodes x WHERE x.dag_id = n.dag_id
                                  AND x.name = n.name AND x.status = 'queued');
        v := jobstore_dag_node_verdict(n.cluster_id);
        CONTINUE WHEN v IS NULL;
        RETURN QUERY SELECT * FROM jobstore_dag_node_ended(n.dag_id, n.name, v, p_now);
        RETURN QUERY SELECT * FROM jobstore_dag_advance(n.dag_id, p_now);
    END LOOP;
END $$;

-- A node's job of DAG `p_dag` started: a DAG with -maxidle may release more nodes.
CREATE FUNCTION jobstore_dag_node_started(p_dag bigint, p_now double precision)
RETURNS SETOF jobstore_change
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp AS $$
#variable_conflict use_column
BEGIN
    IF EXISTS (SELECT 1 FROM dags WHERE id = p_dag AND status = 'running'
               AND max_idle IS NOT NULL) THEN
        RETURN QUERY SELECT * FROM jobstore_dag_advance(p_dag, p_now);
    END IF;
END $$;
