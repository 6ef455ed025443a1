"""condor_vacate_job: `vacate_requests` holds the attempt of a job its owner (or a queue super
user) asked to vacate, written only through the door function `jobstore_vacate`, which checks
who asks and records the request as the job's event (`vacate` or `vacate_fast`, no
transition). The node's agent reads it and vacates the slot; the job goes back to idle as its
JOB_EXIT evict reports. The agents' roles read it and prune it with its job.

Revision ID: 0029
Revises: 0028
"""

import sqlalchemy as sa
from alembic import op

from jobstore.db.migrations.shared import AGENT_ROLES, USER_ROLES, grant, run_sql

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

FUNCTION = "jobstore_vacate(bigint[], boolean, text, boolean, double precision)"
SQL = r"""
-- condor_vacate_job [-fast] of the jobs `p_ids` by their owner or a queue super user: each
-- accepted or running job the session may act on (and whose attempt was not stopped) gets a
-- request for its current attempt, and, when that is new (not asked already, or fast now), an
-- event and its node's agent told; the others are reported as denied, skipped (another
-- transaction holds them) or left as they were. The reason is one line of printable text.
CREATE FUNCTION jobstore_vacate(p_ids bigint[], p_fast boolean, p_reason text,
    p_skip_locked boolean, p_now double precision)
RETURNS SETOF jobstore_change
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, @schema@, pg_temp
SET jit = off AS $$
#variable_conflict use_column
DECLARE
    v_account text := jobstore_account();
    v_super boolean := jobstore_super_user();
    v_now double precision := jobstore_clock(p_now);
    v_event text := CASE WHEN p_fast THEN 'vacate_fast' ELSE 'vacate' END;
    v_locked bigint[];
    v_ids bigint[];
    v_new bigint[];
BEGIN
    IF NOT jobstore_submitter() THEN
        PERFORM jobstore_refused(v_account || ' may not vacate jobs of this job store'
                                 || ' (ask its admin for `jobstore grant-user`)');
    END IF;
    IF p_fast IS NULL THEN
        PERFORM jobstore_bad('a vacate is graceful or fast');
    END IF;
    IF length(p_reason) > 1024
       OR p_reason ~ '[[:cntrl:]\u0085\u2028\u2029\u202a-\u202e\u2066-\u2069]' THEN
        PERFORM jobstore_bad('a reason is one line of at most 1024 printable characters');
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
    SELECT j.id, v_event, j.status::text, NULL::text, j.claims, NULL::text, NULL::json, false,
           CASE WHEN NOT (j.owner = v_account OR v_super) THEN 'denied' ELSE 'skipped' END
    FROM jobs j WHERE j.id = ANY(p_ids) AND NOT j.id = ANY(v_locked);
    SELECT coalesce(array_agg(j.id ORDER BY j.id), '{}') INTO v_ids FROM jobs j
    WHERE j.id = ANY(v_locked) AND j.status IN ('accepted', 'running')
      AND j.winding_down_until IS NULL;
    WITH asked AS (
        INSERT INTO vacate_requests AS v (job_id, attempt, fast, requested_at)
        SELECT j.id, j.claims, p_fast, v_now FROM jobs j WHERE j.id = ANY(v_ids)
        ON CONFLICT (job_id) DO UPDATE SET fast = EXCLUDED.fast, attempt = EXCLUDED.attempt,
            requested_at = EXCLUDED.requested_at
        WHERE v.attempt <> EXCLUDED.attempt OR (EXCLUDED.fast AND NOT v.fast)
        RETURNING v.job_id)
    SELECT coalesce(array_agg(job_id), '{}') INTO v_new FROM asked;
    INSERT INTO job_events (job_id, time, event, from_status, to_status, attempt, slot, host,
        reason)
    SELECT j.id, v_now, v_event, j.status::text, NULL, j.claims, j.slot, j.host, p_reason
    FROM jobs j WHERE j.id = ANY(v_new) ORDER BY j.id;
    IF cardinality(v_new) > 0 THEN
        PERFORM pg_notify('jobstore_events', 'page');
        PERFORM pg_notify('jobstore_stops', jobstore_sign(x.id::text)) FROM unnest(v_new) x(id);
    END IF;
    RETURN QUERY
    SELECT j.id, v_event, j.status::text, NULL::text, j.claims,
           CASE WHEN j.id = ANY(v_new) THEN p_reason END, NULL::json, j.id = ANY(v_ids), 'acted'
    FROM jobs j WHERE j.id = ANY(v_locked) ORDER BY j.id;
END $$;
"""


def upgrade() -> None:
    op.create_table(
        "vacate_requests",
        sa.Column("job_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  autoincrement=False, nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("fast", sa.Boolean(), nullable=False),
        sa.Column("requested_at", sa.Float(precision=53), nullable=False),
        sa.PrimaryKeyConstraint("job_id", name="pk_vacate_requests"),
    )
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    run_sql(bind, SQL)
    op.execute(f"REVOKE EXECUTE ON FUNCTION {FUNCTION} FROM PUBLIC")
    grant(bind, USER_ROLES, f"GRANT EXECUTE ON FUNCTION {FUNCTION} TO {{role}}")
    grant(bind, AGENT_ROLES, "GRANT SELECT, DELETE ON vacate_requests TO {role}")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION {FUNCTION}")
    op.drop_table("vacate_requests")
