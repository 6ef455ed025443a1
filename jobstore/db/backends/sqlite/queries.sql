-- The hand-written statements of the SQLite backend, by name (jobstore.db.backends.statements);
-- everything else it runs is built with SQLAlchemy Core from jobstore.db.schema. Bind
-- parameters are `:name`. The literal statuses and phases are jobstore.core.states' values.

-- name: idle_autoclusters
-- The queue's autoclusters with idle jobs that fit the slot's resources, each with its first
-- job in claim order (the head a slot judges); SQLite has no LATERAL: three index probes per
-- autocluster.
WITH RECURSIVE idle(id) AS (
    SELECT min(autocluster_id) FROM jobs WHERE phase = 'idle' AND queue = :queue
    UNION ALL
    SELECT (SELECT min(j.autocluster_id) FROM jobs AS j
            WHERE j.phase = 'idle' AND j.queue = :queue AND j.autocluster_id > idle.id)
    FROM idle WHERE idle.id IS NOT NULL
), heads AS (
    SELECT a.id, a.submitter, a.concurrency_limits,
        (SELECT j.id FROM jobs AS j
         WHERE j.phase = 'idle' AND j.queue = :queue AND j.autocluster_id = a.id
         ORDER BY j.priority DESC, j.id LIMIT 1) AS head_id
    FROM idle JOIN autoclusters AS a ON a.id = idle.id
    WHERE a.request_cpus <= :cpus AND a.request_memory <= :memory AND a.request_disk <= :disk
)
SELECT heads.id, heads.submitter, heads.concurrency_limits, heads.head_id,
    h.priority AS head_priority
FROM heads JOIN jobs AS h ON h.id = heads.head_id;
