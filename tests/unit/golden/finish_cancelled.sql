-- sa_jobqueue._sql.transitions.finish_cancelled(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
UPDATE sa_jobqueue_jobs
SET status=%(status)s::VARCHAR, finished_at=now(), worker=%(worker)s::VARCHAR
WHERE sa_jobqueue_jobs.cancel_requested IS true AND sa_jobqueue_jobs.id = %(job_id)s::BIGINT AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.attempts = %(attempt)s::INTEGER
;
-- parameters the caller supplies: attempt, job_id
-- constants the statement binds:
--   status = 'cancelled'
--   status_1 = 'running'
--   worker = None
