-- sa_jobqueue._sql.transitions.bury(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
UPDATE sa_jobqueue_jobs
SET status=CASE
WHEN sa_jobqueue_jobs.cancel_requested THEN %(param_1)s::VARCHAR
ELSE %(param_2)s::VARCHAR END, finished_at=now(), worker=%(worker)s::VARCHAR, last_error=CAST(%(error)s::VARCHAR AS JSONB), attempt_history=(CASE
WHEN (jsonb_array_length(CASE
WHEN (jsonb_typeof(sa_jobqueue_jobs.attempt_history) = %(jsonb_typeof_1)s::VARCHAR) THEN sa_jobqueue_jobs.attempt_history
ELSE '[]'::jsonb END) >= %(jsonb_array_length_1)s::INTEGER) THEN CASE
WHEN (jsonb_typeof(sa_jobqueue_jobs.attempt_history) = %(jsonb_typeof_1)s::VARCHAR) THEN sa_jobqueue_jobs.attempt_history
ELSE '[]'::jsonb END - %(param_3)s::INTEGER
ELSE CASE
WHEN (jsonb_typeof(sa_jobqueue_jobs.attempt_history) = %(jsonb_typeof_1)s::VARCHAR) THEN sa_jobqueue_jobs.attempt_history
ELSE '[]'::jsonb END END || jsonb_build_array(jsonb_build_object(%(param_4)s::VARCHAR, sa_jobqueue_jobs.attempts, %(param_5)s::VARCHAR, now(), %(param_6)s::VARCHAR, sa_jobqueue_jobs.worker, %(param_7)s::VARCHAR, round(CAST(EXTRACT(epoch
FROM now() - sa_jobqueue_jobs.started_at) AS NUMERIC), %(round_1)s::INTEGER), %(param_8)s::VARCHAR, CASE
WHEN sa_jobqueue_jobs.cancel_requested THEN %(param_9)s::VARCHAR
ELSE %(param_10)s::VARCHAR END, %(param_11)s::VARCHAR, CAST(%(error)s::VARCHAR AS JSONB))))
WHERE sa_jobqueue_jobs.id = %(job_id)s::BIGINT AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.attempts = %(attempt)s::INTEGER
RETURNING sa_jobqueue_jobs.status, CASE
WHEN (sa_jobqueue_jobs.status IN ('succeeded', 'dead', 'cancelled')) THEN sa_jobqueue_settle(ARRAY[sa_jobqueue_jobs.id], ARRAY[sa_jobqueue_jobs.status])
ELSE %(param_12)s::INTEGER END AS settled
;
-- parameters the caller supplies: attempt, error, job_id
-- constants the statement binds:
--   jsonb_array_length_1 = 20
--   jsonb_typeof_1 = 'array'
--   param_1 = 'cancelled'
--   param_10 = 'dead'
--   param_11 = 'error'
--   param_12 = 0
--   param_2 = 'dead'
--   param_3 = 0
--   param_4 = 'attempt'
--   param_5 = 'at'
--   param_6 = 'worker'
--   param_7 = 'duration'
--   param_8 = 'outcome'
--   param_9 = 'cancelled'
--   round_1 = 3
--   status_1 = 'running'
--   worker = None
