-- sa_jobqueue._sql.transitions.complete_many(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
UPDATE sa_jobqueue_jobs
SET status=%(status)s::VARCHAR, visible_at=statement_timestamp(), finished_at=statement_timestamp()
FROM unnest(%(job_ids)s::BIGINT[], %(attempt_list)s::INTEGER[]) AS held(id, attempt)
WHERE sa_jobqueue_jobs.id = ANY (%(job_ids)s::BIGINT[]) AND sa_jobqueue_jobs.id = held.id AND sa_jobqueue_jobs.attempts = held.attempt AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.cancel_requested IS false
RETURNING sa_jobqueue_jobs.id
;
-- parameters the caller supplies: attempt_list, job_ids
-- constants the statement binds:
--   status = 'succeeded'
--   status_1 = 'running'
