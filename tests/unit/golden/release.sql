-- sa_jobqueue._sql.transitions.release(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
UPDATE sa_jobqueue_jobs
SET status=CASE
WHEN sa_jobqueue_jobs.cancel_requested THEN %(param_1)s::VARCHAR
ELSE %(param_2)s::VARCHAR END, attempts=(sa_jobqueue_jobs.attempts - %(attempts_1)s::INTEGER), visible_at=coalesce(CAST(CAST(%(due_list)s::VARCHAR AS JSONB) ->> CAST(sa_jobqueue_jobs.id AS TEXT) AS TIMESTAMP WITH TIME ZONE), now()), started_at=%(started_at)s::TIMESTAMP WITH TIME ZONE, finished_at=CASE
WHEN sa_jobqueue_jobs.cancel_requested THEN now() END, worker=%(worker)s::VARCHAR
WHERE sa_jobqueue_jobs.id = ANY (%(job_ids)s::BIGINT[]) AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.attempts = CAST((SELECT jsonb_object(CAST(%(job_ids)s::BIGINT[] AS TEXT[]), CAST(%(attempt_list)s::INTEGER[] AS TEXT[])) AS jsonb_object_1) ->> CAST(sa_jobqueue_jobs.id AS TEXT) AS INTEGER)
RETURNING sa_jobqueue_jobs.id, CASE
WHEN (sa_jobqueue_jobs.status IN ('succeeded', 'dead', 'cancelled')) THEN sa_jobqueue_settle(ARRAY[sa_jobqueue_jobs.id], ARRAY[sa_jobqueue_jobs.status])
ELSE %(param_3)s::INTEGER END AS settled
;
-- parameters the caller supplies: attempt_list, job_ids
-- constants the statement binds:
--   attempts_1 = 1
--   due_list = '{}'
--   param_1 = 'cancelled'
--   param_2 = 'queued'
--   param_3 = 0
--   started_at = None
--   status_1 = 'running'
--   worker = None
