-- The hand-written statements of the PostgreSQL backend, by name (jobstore.db.backends.statements);
-- everything else it runs is built with SQLAlchemy Core from jobstore.db.schema, and the
-- database's own functions (the door, the DAG engine, the checks) are in the migrations' .sql
-- files. Each statement: `-- name: NAME`, a one-line `-- purpose`, then the SQL. Bind parameters
-- are psycopg's `%(name)s`: the statements run straight on psycopg
-- (jobstore.db.backends.postgresql.driver), or without parameters through SQLAlchemy.
-- The literal statuses, phases and events are jobstore.core.states' values (a test checks).

-- name: idle_autoclusters
-- The queue's autoclusters with idle jobs that fit the slot's resources, each with its first
-- job in claim order (the head a slot judges): a skip scan of ix_jobs_claim that finds the next
-- autocluster and its head in one index probe, whatever the number of idle jobs (PostgreSQL).
WITH RECURSIVE idle(ac, priority, id) AS (
    (SELECT autocluster_id, priority, id FROM jobs WHERE phase = 'idle' AND queue = %(queue)s
     ORDER BY autocluster_id, priority DESC, id LIMIT 1)
    UNION ALL
    SELECT n.autocluster_id, n.priority, n.id FROM idle CROSS JOIN LATERAL (
        SELECT autocluster_id, priority, id FROM jobs
        WHERE phase = 'idle' AND queue = %(queue)s AND autocluster_id > idle.ac
        ORDER BY autocluster_id, priority DESC, id LIMIT 1
    ) AS n
)
SELECT a.id, a.submitter, a.concurrency_limits, idle.id AS head_id,
    idle.priority AS head_priority
FROM idle JOIN autoclusters AS a ON a.id = idle.ac
WHERE a.request_cpus <= %(cpus)s AND a.request_memory <= %(memory)s
    AND a.request_disk <= %(disk)s;

-- name: lock_limits
-- Serialise the claims of jobs that use these concurrency limits (PostgreSQL; a SQLite write
-- transaction is serialised already), in name order so that two claims never deadlock.
SELECT name FROM concurrency_limits WHERE name = ANY(%(names)s) ORDER BY name FOR UPDATE;

-- name: claim_in_autoclusters
-- The claim on PostgreSQL in one round trip: lock the first idle job (claim order) of the first
-- of the given autoclusters that has one unlocked, hand it out, append its `fetch` event and
-- notify followers; returns the row as it was before (or nothing). The state machine's idle ->
-- fetched (jobstore.db.transitions.Transitions.fetch_transition) fills in {assignments}, the
-- SET list (`column = %(column)s` per column it sets but the status), and the statuses and
-- event as literals ({from_status}, {to_status}, {event}); the row decides claims and slot_weight.
WITH cand AS (
    SELECT j.* FROM unnest(%(autoclusters)s::bigint[]) AS a(id)
    CROSS JOIN LATERAL (
        SELECT * FROM jobs
        WHERE phase = 'idle' AND queue = %(queue)s AND autocluster_id = a.id
        ORDER BY priority DESC, id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ) AS j
    LIMIT 1
), upd AS (
    UPDATE jobs SET status = {to_status}, {assignments}, claims = jobs.claims + 1,
        slot_weight = CASE WHEN %(partitionable)s THEN cand.request_cpus ELSE %(weight)s END
    FROM cand WHERE jobs.id = cand.id AND jobs.status = {from_status}
    RETURNING jobs.id, jobs.claims, jobs.slot_weight
), ev AS (
    INSERT INTO job_events (job_id, time, event, from_status, to_status, attempt, slot, host)
    SELECT id, %(now)s, {event}, {from_status}, {to_status}, claims, %(slot)s, %(host)s
    FROM upd
)
SELECT cand.*, upd.slot_weight AS claimed_weight, pg_notify(%(channel)s, cand.id::text) AS notified
FROM cand CROSS JOIN upd;

-- name: begin_transaction
-- Open a transaction and bound each of its statements by a timeout ('0' for none), in one simple
-- query that the transaction's first statement may follow (jobstore.db.driver.begin):
-- set_config(..., true) is SET LOCAL, which PgBouncer in transaction mode allows, a startup
-- option it does not.
BEGIN; SELECT set_config('statement_timeout', %(milliseconds)s, true);

-- name: job_heads
-- The first jobs of the autoclusters a slot has not judged yet (PostgreSQL).
SELECT * FROM jobs WHERE id = ANY(%(ids)s);

-- name: read_job
-- A job row as it is now and its version, the transaction that wrote it: a report writes it
-- only if it is still that version, instead of locking it (PostgreSQL).
SELECT jobs.*, jobs.xmin::text AS row_version FROM jobs WHERE id = %(job_id)s;

-- name: read_jobs
-- Job rows as they are now and their versions: the reports of one batch write them only if they
-- are still those versions, instead of locking them (PostgreSQL).
SELECT jobs.*, jobs.xmin::text AS row_version FROM jobs WHERE id = ANY(%(job_ids)s);

-- name: lock_job
-- A job row, locked until the transaction ends (PostgreSQL).
SELECT * FROM jobs WHERE id = %(job_id)s FOR UPDATE;

-- name: record_transition
-- A transition in one round trip (PostgreSQL): the job row's UPDATE, made only if the row is
-- still in the status and attempt it was read in (and, with a version, still that version;
-- the status is the event's from_status unless earlier transitions' changes come with it);
-- the event, appended only if it was; the followers' notification. {assignments} is the SET
-- list, `column = %(set_column)s` per column the transition changes (jobstore.db.transitions).
WITH changed AS (
    UPDATE jobs SET {assignments}
    WHERE id = %(job_id)s AND status = %(row_status)s AND claims = %(claims)s
        AND (%(version)s::text IS NULL OR xmin::text = %(version)s::text)
    RETURNING id
), appended AS (
    INSERT INTO job_events (job_id, time, event, from_status, to_status, attempt, slot, host,
        reason, attrs)
    SELECT id, %(time)s::float8, %(event)s::text, %(from_status)s::text, %(to_status)s::text,
        %(attempt)s::integer, %(slot)s::text, %(host)s::text, %(reason)s::text, %(attrs)s::json
    FROM changed
    RETURNING job_id
)
SELECT pg_notify(%(channel)s, %(payload)s) FROM appended;

-- name: update_job_row
-- A job row's change that records no event (a transition's change kept for the end of the
-- transaction, a lease renewed), made only if the row is still in the status and attempt it
-- was read in and, with a version, still that version. {assignments} as in record_transition.
UPDATE jobs SET {assignments}
WHERE id = %(job_id)s AND status = %(row_status)s AND claims = %(claims)s
    AND (%(version)s::text IS NULL OR xmin::text = %(version)s::text);

-- name: record_event
-- An event that changes no job row, and the followers' notification (PostgreSQL).
WITH appended AS (
    INSERT INTO job_events (job_id, time, event, from_status, to_status, attempt, slot, host,
        reason, attrs)
    VALUES (%(job_id)s, %(time)s, %(event)s, %(from_status)s, %(to_status)s, %(attempt)s,
        %(slot)s, %(host)s, %(reason)s, %(attrs)s::json)
    RETURNING job_id
)
SELECT pg_notify(%(channel)s, %(payload)s) FROM appended;

-- name: insert_events
-- The events of a page of a set-based action (rm, hold, release, qedit of many jobs) in one
-- statement, a column an array (PostgreSQL): one execution on the server, not one per event.
INSERT INTO job_events (job_id, time, event, from_status, to_status, attempt, slot, host,
    reason, attrs)
SELECT * FROM unnest(%(job_id)s::bigint[], %(time)s::float8[], %(event)s::text[],
    %(from_status)s::text[], %(to_status)s::text[], %(attempt)s::int[], %(slot)s::text[],
    %(host)s::text[], %(reason)s::text[], %(attrs)s::json[]);

-- name: notify_event
-- Wake the followers of job_events (jobstore watch) when this transaction commits; never sent
-- for one that rolls back.
SELECT pg_notify(%(channel)s, %(payload)s);

-- name: notify_signed
-- Tell the agents when this transaction commits, signed (migration 0019: jobstore_sign).
SELECT pg_notify(%(channel)s, jobstore_sign(%(payload)s));

-- name: notify_key
-- The key the agents check the signed notifications with (jobstore.db.channels).
SELECT key FROM notify_keys WHERE name = 'notify';

-- name: listen_events
-- Follow the job store's notification channel (jobstore.db.channels.CHANNEL) on this connection.
LISTEN jobstore_events;

-- name: listen_work
-- Follow the channel of new claimable work (jobstore.db.notify.WORK, sent by the jobs table's
-- triggers of migration 0018; payload the new work's shapes), as the waiting fetches do.
LISTEN jobstore_work;

-- name: listen_stops
-- Follow the channel of stopped attempts (jobstore.db.notify.STOPS: a handed-out job held or
-- removed; payload its id), as the node agents do.
LISTEN jobstore_stops;

-- name: snapshot_bounds
-- xmin and xmax of a snapshot taken now: a follower of job_events knows when every transaction
-- that could still add a lower event id has ended.
SELECT pg_snapshot_xmin(s)::text, pg_snapshot_xmax(s)::text FROM pg_current_snapshot() AS s;

-- name: xact_horizon
-- A transaction id assigned now: every transaction that had an id before has a smaller one.
SELECT pg_current_xact_id()::text;

-- name: autovacuum_setting
-- Whether the server runs autovacuum (the tables' own settings need it: jobstore init warns).
SELECT current_setting('autovacuum') AS autovacuum;

-- name: table_rows_estimate
-- The planner's estimate of the jobs table's rows (no scan; -1 before its first ANALYZE).
SELECT reltuples::bigint FROM pg_class WHERE oid = 'jobs'::regclass;

-- name: next_job_ids
-- Reserve n job ids from the jobs table's sequence, in order (a bulk submit COPYs its rows).
SELECT nextval(pg_get_serial_sequence('jobs', 'id')) AS id FROM generate_series(1, %(n)s)
ORDER BY 1;

-- name: next_cluster_ids
-- Reserve n cluster ids from the clusters table's sequence, in order (a DAG's nodes).
SELECT nextval(pg_get_serial_sequence('clusters', 'id')) AS id FROM generate_series(1, %(n)s)
ORDER BY 1;

-- name: copy_rows
-- Stream rows into a table (a bulk submit); `{table}` and `{columns}` are identifiers the caller
-- quotes.
COPY {table} ({columns}) FROM STDIN;

-- A submitter's own role (row-level security, migration 0012) may not COPY into the job store's
-- tables: her rows are streamed into a temporary table of the same shape, then inserted from it,
-- each checked by the policies.

-- name: copy_staging_table
-- The session's staging table for `{table}`, dropped when the transaction ends.
CREATE TEMPORARY TABLE IF NOT EXISTS {staging}
    (LIKE {table} INCLUDING DEFAULTS INCLUDING GENERATED) ON COMMIT DROP;

-- name: copy_from_staging
-- Insert the staged rows into the table (the policies check each).
INSERT INTO {table} ({columns}) SELECT {columns} FROM {staging};

-- name: copy_staging_clear
-- Empty the staging table for the next batch.
TRUNCATE {staging};

-- name: grant_targets
-- The sequence behind job_events.id and the schema of the tables (jobstore grant).
SELECT pg_get_serial_sequence('job_events', 'id') AS sequence, current_schema() AS schema,
       (SELECT pg_get_serial_sequence(c.oid::regclass::text, 'id') FROM pg_class c
        WHERE c.oid = to_regclass('job_files')) AS files_sequence;

-- The grants of `jobstore grant ROLE`, run in this order; `{role}`, `{schema}`, `{sequence}` and
-- `{columns}` are identifiers the caller quotes (no bind parameters in DDL).

-- name: grant_revoke
-- Start the role from nothing on the job store's tables.
REVOKE ALL ON clusters, jobs, job_events, autoclusters, autocluster_limits, concurrency_limits,
    submitters, passes, slots, sandbox_files, sandbox_chunks, job_files, store_limits, dags,
    dag_nodes, dag_edges, dag_categories, job_attr_rules, accounting_groups, notify_keys,
    deliveries, event_cursors, logged_events, dagman_logs, dag_files, vacate_requests
    FROM {role};

-- name: grant_schema
-- Let the role see the schema the tables live in.
GRANT USAGE ON SCHEMA {schema} TO {role};

-- name: grant_read
-- Read the queue, the clusters and the events (user logs, watch), and the negotiator's tables.
GRANT SELECT ON clusters, jobs, job_events, autoclusters, autocluster_limits, concurrency_limits,
    submitters, passes, slots TO {role};

-- name: grant_update
-- Change only the columns a claim, a transition or a report changes (also FOR UPDATE locks).
GRANT UPDATE ({columns}) ON jobs TO {role};

-- name: grant_limit_locks
-- Lock a concurrency limit's row while a claim counts it (SELECT ... FOR UPDATE needs this).
GRANT UPDATE (name) ON concurrency_limits TO {role};

-- name: grant_accountant
-- Update the submitters' priorities and usage (the accountant); never their factors.
GRANT UPDATE (priority, usage, in_use, updated_at, first_usage, last_usage) ON submitters
    TO {role};

-- name: grant_passes
-- Take the turn of a pool-wide periodic pass (the jobs' policy pass: Maintenance.police_due).
GRANT INSERT, UPDATE ON passes TO {role};

-- name: grant_slots
-- Publish this node's slot ads and expire stale ones (jobstore status).
GRANT INSERT, UPDATE, DELETE ON slots TO {role};

-- name: grant_events
-- Append the transition and report events.
GRANT INSERT ON job_events TO {role};

-- name: grant_sequence
-- Take the ids of new events.
GRANT USAGE ON SEQUENCE {sequence} TO {role};

-- name: grant_deliveries
-- Write a job's outputs home (jobstore schedd) and prune the record with the job.
GRANT SELECT, INSERT, UPDATE, DELETE ON deliveries TO {role};

-- name: grant_vacate_requests
-- See the attempts their owners asked to vacate (condor_vacate_job), and prune the requests
-- with their jobs.
GRANT SELECT, DELETE ON vacate_requests TO {role};

-- name: grant_event_logs
-- Keep where the access point's event logs stand (jobstore schedd), and prune a DAG's record
-- with the DAG.
GRANT SELECT, INSERT, UPDATE, DELETE ON event_cursors, logged_events, dagman_logs, dag_files
    TO {role};

-- name: grant_files
-- Read a job's input files for its sandbox, store its outputs, and prune them with the job.
GRANT SELECT, INSERT, DELETE ON sandbox_files, sandbox_chunks, job_files TO {role};

-- name: grant_store_limits
-- Read the limits on what a submit may store (the database's triggers read them too).
GRANT SELECT ON store_limits TO {role};

-- name: grant_files_sequence
-- Take the ids of new job_files rows.
GRANT USAGE ON SEQUENCE {files_sequence} TO {role};

-- name: grant_agent_drop_files_policy
-- Make the agent's row-level security policy on sandbox_files again.
DROP POLICY IF EXISTS {policy} ON sandbox_files;

-- name: grant_agent_files_policy
-- The agent's role reads and stores every owner's files (migration 0015).
CREATE POLICY {policy} ON sandbox_files TO {role} USING (true) WITH CHECK (true);

-- name: grant_agent_drop_chunks_policy
-- Make the agent's row-level security policy on sandbox_chunks again.
DROP POLICY IF EXISTS {policy} ON sandbox_chunks;

-- name: grant_agent_chunks_policy
-- The agent's role reads and stores every owner's file contents (migration 0015).
CREATE POLICY {policy} ON sandbox_chunks TO {role} USING (true) WITH CHECK (true);

-- name: grant_agent_drop_job_files_policy
-- Make the agent's row-level security policy on job_files again.
DROP POLICY IF EXISTS {policy} ON job_files;

-- name: grant_agent_job_files_policy
-- The agent's role reads every job's file lists and records its outputs (migration 0015).
CREATE POLICY {policy} ON job_files TO {role} USING (true) WITH CHECK (true);

-- name: grant_dags
-- Read the DAGs (the database's engine carries them forward: grant_dag_engine).
GRANT SELECT ON dags, dag_nodes, dag_edges, dag_categories, job_attr_rules,
    accounting_groups TO {role};

-- name: grant_dag_engine
-- Carry the DAGs of the jobs a transition ends forward, in its transaction, and sign the
-- notifications the agents act on (migration 0019).
GRANT EXECUTE ON FUNCTION jobstore_dag_jobs_ended(bigint[], double precision),
    jobstore_dag_node_started(bigint, double precision), jobstore_sign(text),
    jobstore_dag_script_start(bigint, text, text, text, double precision),
    jobstore_dag_script_done(bigint, text, text, text, integer, double precision),
    jobstore_dag_script_defer(bigint, text, text, text, double precision),
    jobstore_dag_hold_start(bigint, text, text, double precision),
    jobstore_dag_hold_done(bigint, text, text),
    jobstore_dag_nodes_free(bigint[], text[], boolean) TO {role};

-- name: grant_notify_key
-- Read the key that signs the notifications the agents act on (jobstore.db.channels).
GRANT SELECT ON notify_keys TO {role};

-- name: grant_agent_drop_dags_policy
-- Make the agent's row-level security policy on dags again.
DROP POLICY IF EXISTS {policy} ON dags;

-- name: grant_agent_dags_policy
-- The agent's role reads every DAG (migration 0017).
CREATE POLICY {policy} ON dags FOR SELECT TO {role} USING (true);

-- name: grant_agent_drop_dag_nodes_policy
-- Make the agent's row-level security policy on dag_nodes again.
DROP POLICY IF EXISTS {policy} ON dag_nodes;

-- name: grant_agent_dag_nodes_policy
-- The agent's role reads every DAG's nodes (migration 0017).
CREATE POLICY {policy} ON dag_nodes FOR SELECT TO {role} USING (true);

-- name: grant_agent_drop_dag_edges_policy
-- Make the agent's row-level security policy on dag_edges again.
DROP POLICY IF EXISTS {policy} ON dag_edges;

-- name: grant_agent_dag_edges_policy
-- The agent's role reads every DAG's dependencies (migration 0017).
CREATE POLICY {policy} ON dag_edges FOR SELECT TO {role} USING (true);

-- name: grant_agent_drop_dag_categories_policy
-- Make the agent's row-level security policy on dag_categories again.
DROP POLICY IF EXISTS {policy} ON dag_categories;

-- name: grant_agent_dag_categories_policy
-- The agent's role reads every DAG's throttles (migration 0017).
CREATE POLICY {policy} ON dag_categories FOR SELECT TO {role} USING (true);

-- name: grant_agent_drop_update_policy
-- Make the agent's row-level security policy on jobs again (`{policy}`: its name).
DROP POLICY IF EXISTS {policy} ON jobs;

-- name: grant_agent_update_policy
-- The agent's role may change every job (migration 0012): its column privileges say which
-- columns.
CREATE POLICY {policy} ON jobs FOR UPDATE TO {role} USING (true) WITH CHECK (true);

-- name: grant_agent_drop_event_policy
-- Make the agent's row-level security policy on job_events again.
DROP POLICY IF EXISTS {policy} ON job_events;

-- name: grant_agent_event_policy
-- The agent's role may record an event of every job (migration 0012).
CREATE POLICY {policy} ON job_events FOR INSERT TO {role} WITH CHECK (true);

-- The grants of `jobstore grant-user ROLE`, in this order (after grant_schema): a submitter
-- reads, and writes only through the door's functions (migration 0019), which check her
-- rights and every value; `{readable}` is every column of jobs but the attempt's token,
-- `{door}` the door's functions.

-- name: user_revoke
-- Start the submitter's role from nothing on the job store's tables and sequences.
REVOKE ALL ON clusters, jobs, job_events, autoclusters, autocluster_limits, concurrency_limits,
    submitters, passes, queue_roles, slots, sandbox_files, sandbox_chunks, job_files,
    store_limits, dags, dag_nodes, dag_edges, dag_categories, job_attr_rules,
    accounting_groups, notify_keys, deliveries, event_cursors, logged_events, dagman_logs,
    dag_files, vacate_requests FROM {role};

-- name: user_revoke_sequences
-- ... and on their sequences (a submitter takes no id herself: the door's functions do).
REVOKE ALL ON ALL SEQUENCES IN SCHEMA {schema} FROM {role};

-- name: user_read
-- Read the queue and the history, as condor_q and condor_history may (the policies of
-- migrations 0015 and 0017 show each owner only her own files and DAGs).
GRANT SELECT ON clusters, job_events, autoclusters, autocluster_limits, concurrency_limits,
    submitters, passes, queue_roles, slots, sandbox_files, sandbox_chunks, job_files,
    store_limits, dags, dag_nodes, dag_edges, dag_categories, job_attr_rules,
    accounting_groups TO {role};

-- name: user_read_jobs
-- Read every column of the jobs but the attempt's token (it names the attempt's sandbox).
GRANT SELECT ({readable}) ON jobs TO {role};

-- name: user_door
-- Submit, hold, release, remove, edit, queue DAGs and (the admin's) condor_userprio through
-- the door's functions, which decide what the session may do.
GRANT EXECUTE ON FUNCTION {door} TO {role};

-- name: user_check_pattern
-- Whether a --may-impersonate pattern is one regular expression alone and anchored as
-- jobstore_may_submit_as anchors it (a whole-name match; migration 0019).
SELECT jobstore_valid_pattern(%(pattern)s::text) AS valid;

-- name: user_register
-- Record the role's rights (read by the database's functions: jobstore_account, ...).
INSERT INTO queue_roles (role, account, super_user, may_impersonate, admin)
VALUES (%(role)s, %(account)s, %(super_user)s, %(may_impersonate)s, %(admin)s)
ON CONFLICT (role) DO UPDATE SET account = excluded.account, super_user = excluded.super_user,
    may_impersonate = excluded.may_impersonate, admin = excluded.admin;

-- name: user_forget
-- Forget a role's rights (jobstore revoke-user).
DELETE FROM queue_roles WHERE role = %(role)s;

-- name: user_accounting_group
-- Let an account's jobs be charged to an accounting group (the admin's map, migration 0019).
INSERT INTO accounting_groups (account, name) VALUES (%(account)s, %(name)s)
ON CONFLICT DO NOTHING;

-- name: session_identity
-- Who this session is, as the database decides (migration 0012): its OS account, whether it
-- owns the store and whether it is a queue super user.
SELECT jobstore_account() AS account, jobstore_trusted() AS trusted,
       jobstore_super_user() AS super_user;

-- name: reads_tokens
-- Whether this session may read an attempt's token (a submitter's role may not: migration 0019).
SELECT has_column_privilege('jobs', 'token', 'SELECT');

-- name: file_chunks
-- A range of one owner's sandbox file, its chunks in order (PostgreSQL, read in binary).
SELECT data FROM sandbox_chunks
WHERE owner = %(owner)s AND sha256 = %(sha256)s AND seq BETWEEN %(first)s AND %(last)s
ORDER BY seq;

-- The door into the queue (migration 0019): each statement calls one of the database's own
-- functions, which check the session's rights and every value (jobstore.db.backends.postgresql.door).

-- name: door_new_cluster
-- A new cluster, or the one a submit of the owner's with the same idempotency key made.
SELECT cluster_id, created FROM jobstore_new_cluster(%(owner)s::text, %(queue)s::text,
    %(submit_file)s::text, %(num_procs)s::integer, %(key)s::text, %(now)s::float8,
    %(home)s::text);

-- name: door_queue_jobs
-- Queue jobs (a JSON array) with their submit events: their ids in order.
SELECT id FROM jobstore_queue_jobs(%(cluster)s::bigint, %(jobs)s::json, %(now)s::float8) AS id;

-- name: door_queue_procs
-- Queue procs first to last of a templated cluster: their ids in proc order.
SELECT id FROM jobstore_queue_procs(%(cluster)s::bigint, %(clusters)s::bigint[], %(job)s::json,
    %(per_item)s::integer, %(counters)s::json, %(items)s::json, %(first)s::integer,
    %(last)s::integer, %(now)s::float8) AS id;

-- name: door_store_file
-- Register an input file of the owner's: whether it is new.
SELECT jobstore_store_file(%(owner)s::text, %(sha256)s::text, %(size)s::bigint);

-- name: door_store_chunk
-- One chunk of a new input file.
SELECT jobstore_store_chunk(%(owner)s::text, %(sha256)s::text, %(seq)s::integer,
    %(data)s::bytea);

-- name: door_add_inputs
-- A cluster's or one proc's input files (a JSON array of name, sha256, mode).
SELECT jobstore_add_inputs(%(cluster)s::bigint, %(proc)s::integer, %(files)s::json);

-- name: door_act
-- Hold, release or remove jobs: what it did to each (jobstore_change rows).
SELECT * FROM jobstore_act(%(ids)s::bigint[], %(event)s::text, %(reason)s::text,
    %(code)s::integer, %(subcode)s::integer, %(skip_locked)s::boolean, %(now)s::float8);

-- name: door_vacate
-- condor_vacate_job [-fast] of jobs: what it did to each (jobstore_change rows).
SELECT * FROM jobstore_vacate(%(ids)s::bigint[], %(fast)s::boolean, %(reason)s::text,
    %(skip_locked)s::boolean, %(now)s::float8);

-- name: door_edit
-- condor_qedit of jobs: what it did to each (jobstore_change rows).
SELECT * FROM jobstore_edit(%(ids)s::bigint[], %(name)s::text, %(text)s::text,
    %(signatures)s::text[], %(skip_locked)s::boolean, %(now)s::float8);

-- name: door_set_factor
-- condor_userprio -setfactor.
SELECT jobstore_set_factor(%(name)s::text, %(factor)s::float8);

-- name: door_reset_usage
-- condor_userprio -resetusage, -resetall (name NULL).
SELECT jobstore_reset_usage(%(name)s::text, %(now)s::float8);

-- name: door_new_dag
-- A DAG's own cluster and row.
SELECT jobstore_new_dag(%(owner)s::text, %(queue)s::text, %(path)s::text,
    %(batch_name)s::text, %(max_jobs)s::integer, %(max_idle)s::integer, %(attrs)s::json,
    %(now)s::float8, %(home)s::text);

-- name: door_dag_nodes
-- A new DAG's nodes, dependencies and throttles: each node's cluster.
SELECT name, cluster_id FROM jobstore_dag_nodes(%(dag)s::bigint, %(nodes)s::json,
    %(edges)s::json, %(categories)s::json, %(now)s::float8);

-- name: door_dag_settings
-- A new DAG's NODE_STATUS_FILE and its scripts' throttles.
SELECT jobstore_dag_settings(%(dag)s::bigint, %(status_file)s::text, %(every)s::integer,
    %(max_pre)s::integer, %(max_post)s::integer);

-- name: door_dag_script_options
-- A new DAG's scripts' DEFER and DEBUG options, by node.
SELECT jobstore_dag_script_options(%(dag)s::bigint, %(options)s::json);

-- name: door_start_dag
-- Release the nodes of a queued DAG that wait for no parent.
SELECT * FROM jobstore_start_dag(%(dag)s::bigint, %(now)s::float8);

-- name: door_pause_dag
-- Hold or release a DAG.
SELECT * FROM jobstore_pause_dag(%(dag)s::bigint, %(held)s::boolean, %(now)s::float8);

-- name: door_remove_dag
-- Remove a DAG.
SELECT * FROM jobstore_remove_dag(%(dag)s::bigint, %(why)s::text, %(now)s::float8);

-- name: dag_jobs_ended
-- Carry the DAGs of jobs that ended in this transaction forward (the database's engine).
SELECT * FROM jobstore_dag_jobs_ended(%(ids)s::bigint[], %(now)s::float8);

-- name: dag_script_start
-- Take the lease on a DAG node's due script for one run of it (the access point's service).
SELECT jobstore_dag_script_start(%(dag)s::bigint, %(name)s, %(kind)s, %(token)s,
    %(now)s::float8);

-- name: dag_script_done
-- A DAG node's script ended: carry its DAG forward.
SELECT * FROM jobstore_dag_script_done(%(dag)s::bigint, %(name)s, %(kind)s, %(token)s,
    %(code)s::integer, %(now)s::float8);

-- name: dag_script_defer
-- A DAG node's script exited with its DEFER status: due again from `until` on.
SELECT jobstore_dag_script_defer(%(dag)s::bigint, %(name)s, %(kind)s, %(token)s,
    %(until)s::float8);

-- name: dag_nodes_free
-- Of these DAG nodes, those this transaction now holds (skipping another's).
SELECT * FROM jobstore_dag_nodes_free(%(dags)s::bigint[], %(names)s::text[],
    %(dags_too)s::boolean);

-- name: dag_hold_start
-- Take the lease on a DAG node's HOLD script for the holds of its jobs so far.
SELECT jobstore_dag_hold_start(%(dag)s::bigint, %(name)s, %(token)s, %(now)s::float8);

-- name: dag_hold_done
-- A DAG node's HOLD script ended.
SELECT jobstore_dag_hold_done(%(dag)s::bigint, %(name)s, %(token)s);

-- name: dag_node_started
-- A DAG node's job started: a DAG with -maxidle may release more nodes.
SELECT * FROM jobstore_dag_node_started(%(dag)s::bigint, %(now)s::float8);

-- name: noted_jobs
-- The jobs whose events a commit listener wants (with a user log, or every one), without the
-- attempt's token; {columns}: every other column of jobs.
SELECT {columns}, NULL::text AS token FROM jobs
WHERE id = ANY(%(ids)s::bigint[]) AND (%(every)s::boolean OR user_log IS NOT NULL);
