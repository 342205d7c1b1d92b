-- sa_jobqueue._sql.transitions.complete(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
UPDATE sa_jobqueue_jobs
SET status=%(status)s::VARCHAR, visible_at=statement_timestamp(), finished_at=statement_timestamp()
WHERE sa_jobqueue_jobs.cancel_requested IS false AND sa_jobqueue_jobs.id = %(job_id)s::BIGINT AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.attempts = %(attempt)s::INTEGER
;
-- parameters the caller supplies: attempt, job_id
-- constants the statement binds:
--   status = 'succeeded'
--   status_1 = 'running'
