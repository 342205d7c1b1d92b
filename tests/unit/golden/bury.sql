-- sa_jobqueue._sql.transitions.bury(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
UPDATE sa_jobqueue_jobs
SET status=CASE
WHEN sa_jobqueue_jobs.cancel_requested THEN %(param_1)s::VARCHAR
ELSE %(param_2)s::VARCHAR END, finished_at=now(), worker=%(worker)s::VARCHAR, last_error=CAST(%(error)s::VARCHAR AS JSONB)
WHERE sa_jobqueue_jobs.id = %(job_id)s::BIGINT AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.attempts = %(attempt)s::INTEGER
RETURNING sa_jobqueue_jobs.status, CASE
WHEN (sa_jobqueue_jobs.status IN ('succeeded', 'dead', 'cancelled')) THEN sa_jobqueue_settle(ARRAY[sa_jobqueue_jobs.id], ARRAY[sa_jobqueue_jobs.status])
ELSE %(param_3)s::INTEGER END AS settled
;
-- parameters the caller supplies: attempt, error, job_id
-- constants the statement binds:
--   param_1 = 'cancelled'
--   param_2 = 'dead'
--   param_3 = 0
--   status_1 = 'running'
--   worker = None
