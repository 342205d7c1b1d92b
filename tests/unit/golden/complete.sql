-- sa_jobqueue._sql.transitions.complete(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
UPDATE sa_jobqueue_jobs
SET status=%(status)s::VARCHAR, visible_at=statement_timestamp(), finished_at=statement_timestamp(), result=CAST(%(result)s::VARCHAR AS JSONB)
WHERE sa_jobqueue_jobs.cancel_requested IS false AND sa_jobqueue_jobs.id = %(job_id)s::BIGINT AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.attempts = %(attempt)s::INTEGER
RETURNING CASE
WHEN (sa_jobqueue_jobs.result IS NOT NULL) THEN pg_notify(%(param_1)s::VARCHAR, CAST(sa_jobqueue_jobs.id AS TEXT))
ELSE NULL END AS notified, CASE
WHEN (sa_jobqueue_jobs.status IN ('succeeded', 'dead', 'cancelled')) THEN sa_jobqueue_settle(ARRAY[sa_jobqueue_jobs.id], ARRAY[sa_jobqueue_jobs.status])
ELSE %(param_2)s::INTEGER END AS settled
;
-- parameters the caller supplies: attempt, job_id
-- constants the statement binds:
--   param_1 = 'sa_jobqueue_results'
--   param_2 = 0
--   result = None
--   status = 'succeeded'
--   status_1 = 'running'
