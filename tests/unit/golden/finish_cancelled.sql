-- sa_jobqueue._sql.transitions.finish_cancelled(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
UPDATE sa_jobqueue_jobs
SET status=%(status)s::VARCHAR, finished_at=now(), worker=%(worker)s::VARCHAR, attempt_history=(CASE
WHEN (jsonb_array_length(CASE
WHEN (jsonb_typeof(sa_jobqueue_jobs.attempt_history) = %(jsonb_typeof_1)s::VARCHAR) THEN sa_jobqueue_jobs.attempt_history
ELSE '[]'::jsonb END) >= %(jsonb_array_length_1)s::INTEGER) THEN CASE
WHEN (jsonb_typeof(sa_jobqueue_jobs.attempt_history) = %(jsonb_typeof_1)s::VARCHAR) THEN sa_jobqueue_jobs.attempt_history
ELSE '[]'::jsonb END - %(param_1)s::INTEGER
ELSE CASE
WHEN (jsonb_typeof(sa_jobqueue_jobs.attempt_history) = %(jsonb_typeof_1)s::VARCHAR) THEN sa_jobqueue_jobs.attempt_history
ELSE '[]'::jsonb END END || jsonb_build_array(jsonb_build_object(%(param_2)s::VARCHAR, sa_jobqueue_jobs.attempts, %(param_3)s::VARCHAR, now(), %(param_4)s::VARCHAR, sa_jobqueue_jobs.worker, %(param_5)s::VARCHAR, round(CAST(EXTRACT(epoch
FROM now() - sa_jobqueue_jobs.started_at) AS NUMERIC), %(round_1)s::INTEGER), %(param_6)s::VARCHAR, %(param_7)s::VARCHAR, %(param_8)s::VARCHAR, NULL)))
WHERE sa_jobqueue_jobs.cancel_requested IS true AND sa_jobqueue_jobs.id = %(job_id)s::BIGINT AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.attempts = %(attempt)s::INTEGER
RETURNING CASE
WHEN (sa_jobqueue_jobs.status IN ('succeeded', 'dead', 'cancelled')) THEN sa_jobqueue_settle(ARRAY[sa_jobqueue_jobs.id], ARRAY[sa_jobqueue_jobs.status])
ELSE %(param_9)s::INTEGER END AS settled
;
-- parameters the caller supplies: attempt, job_id
-- constants the statement binds:
--   jsonb_array_length_1 = 20
--   jsonb_typeof_1 = 'array'
--   param_1 = 0
--   param_2 = 'attempt'
--   param_3 = 'at'
--   param_4 = 'worker'
--   param_5 = 'duration'
--   param_6 = 'outcome'
--   param_7 = 'cancelled'
--   param_8 = 'error'
--   param_9 = 0
--   round_1 = 3
--   status = 'cancelled'
--   status_1 = 'running'
--   worker = None
