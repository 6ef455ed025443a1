-- The hand-written statements of the job store, by name; everything else is built with
-- SQLAlchemy Core from jobstore.db.schema. Each statement: `-- name: NAME`, a one-line
-- `-- purpose`, then the SQL. Bind parameters are `:name` (run with SQLAlchemy's text()),
-- except `claim_first`, which runs as driver SQL (psycopg's `%(name)s`) on the claim's hot path.
-- The literal statuses and events are jobstore.core.states' values (tests/test_sql.py checks).

-- name: claim_first
-- The claim's fast path on PostgreSQL in one round trip: lock the best idle candidate of the
-- queue that fits the slot (the partial index ix_jobs_claim gives the order), hand it out,
-- append its `fetch` event and notify followers; returns the row as it was before (or nothing).
WITH cand AS (
    SELECT * FROM jobs
    WHERE status = 'idle' AND queue = %(queue)s AND request_cpus <= %(cpus)s
      AND request_memory <= %(memory)s AND request_disk <= %(disk)s
    ORDER BY priority DESC, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE jobs SET status = 'fetched', token = %(token)s, claims = jobs.claims + 1,
        lease_expires_at = %(lease_expires_at)s, slot = %(slot)s, host = %(host)s,
        keyword = %(keyword)s, fetched_at = %(fetched_at)s, job_pid = %(job_pid)s,
        reason = %(reason)s, updated_at = %(now)s
    FROM cand WHERE jobs.id = cand.id AND jobs.status = 'idle'
    RETURNING jobs.id, jobs.claims
), ev AS (
    INSERT INTO job_events (job_id, time, event, from_status, to_status, attempt, slot, host)
    SELECT id, %(now)s, 'fetch', 'idle', 'fetched', claims, %(slot)s, %(host)s
    FROM upd
)
SELECT cand.*, pg_notify(%(channel)s, cand.id::text) AS notified FROM cand CROSS JOIN upd;

-- name: set_statement_timeout
-- Bound every statement of this transaction (set_config(..., true) is SET LOCAL: PgBouncer in
-- transaction mode allows it, a startup option it does not).
SELECT set_config('statement_timeout', :milliseconds, true);

-- name: notify_event
-- Wake the followers of job_events (jobstore watch) when this transaction commits; never sent
-- for one that rolls back.
SELECT pg_notify(:channel, :payload);

-- name: listen_events
-- Follow the job store's notification channel (jobstore.db.notify.CHANNEL) on this connection.
LISTEN jobstore_events;

-- name: snapshot_bounds
-- xmin and xmax of a snapshot taken now: a follower of job_events knows when every transaction
-- that could still add a lower event id has ended.
SELECT pg_snapshot_xmin(s)::text, pg_snapshot_xmax(s)::text FROM pg_current_snapshot() AS s;

-- name: xact_horizon
-- A transaction id assigned now: every transaction that had an id before has a smaller one.
SELECT pg_current_xact_id()::text;

-- name: grant_targets
-- The sequence behind job_events.id and the schema of the tables (jobstore grant).
SELECT pg_get_serial_sequence('job_events', 'id') AS sequence, current_schema() AS schema;

-- The grants of `jobstore grant ROLE`, run in this order; `{role}`, `{schema}`, `{sequence}` and
-- `{columns}` are identifiers the caller quotes (no bind parameters in DDL).

-- name: grant_revoke
-- Start the role from nothing on the job store's tables.
REVOKE ALL ON clusters, jobs, job_events FROM {role};

-- name: grant_schema
-- Let the role see the schema the tables live in.
GRANT USAGE ON SCHEMA {schema} TO {role};

-- name: grant_read
-- Read the queue, the clusters and the events (user logs, watch).
GRANT SELECT ON clusters, jobs, job_events TO {role};

-- name: grant_update
-- Change only the columns a claim, a transition or a report changes (also FOR UPDATE locks).
GRANT UPDATE ({columns}) ON jobs TO {role};

-- name: grant_events
-- Append the transition and report events.
GRANT INSERT ON job_events TO {role};

-- name: grant_sequence
-- Take the ids of new events.
GRANT USAGE ON SEQUENCE {sequence} TO {role};
