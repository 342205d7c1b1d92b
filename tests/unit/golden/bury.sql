-- sa_jobqueue._sql.transitions.bury(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
UPDATE sa_jobqueue_jobs
SET status=CASE
WHEN sa_jobqueue_jobs.cancel_requested THEN %(param_1)s::VARCHAR
ELSE %(param_2)s::VARCHAR END, finished_at=now(), worker=%(worker)s::VARCHAR, last_error=CAST(%(error)s::VARCHAR AS JSONB), attempt_history=(CASE
WHEN (jsonb_array_length(coalesce(sa_jobqueue_jobs.attempt_history, '[]'::jsonb)) >= %(jsonb_array_length_1)s::INTEGER) THEN coalesce(sa_jobqueue_jobs.attempt_history, '[]'::jsonb) - %(coalesce_1)s::INTEGER
ELSE coalesce(sa_jobqueue_jobs.attempt_history, '[]'::jsonb) END || jsonb_build_array(jsonb_build_object(%(param_3)s::VARCHAR, sa_jobqueue_jobs.attempts, %(param_4)s::VARCHAR, now(), %(param_5)s::VARCHAR, sa_jobqueue_jobs.worker, %(param_6)s::VARCHAR, round(CAST(EXTRACT(epoch
FROM now() - sa_jobqueue_jobs.started_at) AS NUMERIC), %(round_1)s::INTEGER), %(param_7)s::VARCHAR, CASE
WHEN sa_jobqueue_jobs.cancel_requested THEN %(param_8)s::VARCHAR
ELSE %(param_9)s::VARCHAR END, %(param_10)s::VARCHAR, CAST(%(error)s::VARCHAR AS JSONB))))
WHERE sa_jobqueue_jobs.id = %(job_id)s::BIGINT AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.attempts = %(attempt)s::INTEGER
RETURNING sa_jobqueue_jobs.status, CASE
WHEN (sa_jobqueue_jobs.status IN ('succeeded', 'dead', 'cancelled')) THEN sa_jobqueue_settle(ARRAY[sa_jobqueue_jobs.id], ARRAY[sa_jobqueue_jobs.status])
ELSE %(param_11)s::INTEGER END AS settled
;
-- parameters the caller supplies: attempt, error, job_id
-- constants the statement binds:
--   coalesce_1 = 0
--   jsonb_array_length_1 = 20
--   param_1 = 'cancelled'
--   param_10 = 'error'
--   param_11 = 0
--   param_2 = 'dead'
--   param_3 = 'attempt'
--   param_4 = 'at'
--   param_5 = 'worker'
--   param_6 = 'duration'
--   param_7 = 'outcome'
--   param_8 = 'cancelled'
--   param_9 = 'dead'
--   round_1 = 3
--   status_1 = 'running'
--   worker = None
