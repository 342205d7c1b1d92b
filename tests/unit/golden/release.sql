-- sa_jobqueue._sql.transitions.release(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
UPDATE sa_jobqueue_jobs
SET status=CASE
WHEN sa_jobqueue_jobs.cancel_requested THEN %(param_1)s::VARCHAR
ELSE %(param_2)s::VARCHAR END, attempts=(sa_jobqueue_jobs.attempts - %(attempts_1)s::INTEGER), visible_at=now(), started_at=%(started_at)s::TIMESTAMP WITH TIME ZONE, finished_at=CASE
WHEN sa_jobqueue_jobs.cancel_requested THEN now() END, worker=%(worker)s::VARCHAR
FROM unnest(%(job_ids)s::BIGINT[], %(attempt_list)s::INTEGER[]) AS held(id, attempt)
WHERE sa_jobqueue_jobs.id = ANY (%(job_ids)s::BIGINT[]) AND sa_jobqueue_jobs.id = held.id AND sa_jobqueue_jobs.attempts = held.attempt AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR
RETURNING sa_jobqueue_jobs.id
;
-- parameters the caller supplies: attempt_list, job_ids
-- constants the statement binds:
--   attempts_1 = 1
--   param_1 = 'cancelled'
--   param_2 = 'queued'
--   started_at = None
--   status_1 = 'running'
--   worker = None
