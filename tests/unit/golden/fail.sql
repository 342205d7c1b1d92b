-- sa_jobqueue._sql.transitions.fail(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
UPDATE sa_jobqueue_jobs
SET status=CASE
WHEN sa_jobqueue_jobs.cancel_requested THEN %(param_1)s::VARCHAR
WHEN (sa_jobqueue_jobs.attempts >= sa_jobqueue_jobs.max_attempts OR sa_jobqueue_jobs.cancel_requested) THEN %(param_2)s::VARCHAR
ELSE %(param_3)s::VARCHAR END, visible_at=(now() + make_interval(%(make_interval_1)s::INTEGER, %(make_interval_2)s::INTEGER, %(make_interval_3)s::INTEGER, %(make_interval_4)s::INTEGER, %(make_interval_5)s::INTEGER, %(make_interval_6)s::INTEGER, %(delay)s)), finished_at=CASE
WHEN (sa_jobqueue_jobs.attempts >= sa_jobqueue_jobs.max_attempts OR sa_jobqueue_jobs.cancel_requested) THEN now() END, worker=%(worker)s::VARCHAR, last_error=CAST(%(error)s::VARCHAR AS JSONB), attempt_history=(CASE
WHEN (jsonb_array_length(CASE
WHEN (jsonb_typeof(sa_jobqueue_jobs.attempt_history) = %(jsonb_typeof_1)s::VARCHAR) THEN sa_jobqueue_jobs.attempt_history
ELSE '[]'::jsonb END) >= %(jsonb_array_length_1)s::INTEGER) THEN CASE
WHEN (jsonb_typeof(sa_jobqueue_jobs.attempt_history) = %(jsonb_typeof_1)s::VARCHAR) THEN sa_jobqueue_jobs.attempt_history
ELSE '[]'::jsonb END - %(param_4)s::INTEGER
ELSE CASE
WHEN (jsonb_typeof(sa_jobqueue_jobs.attempt_history) = %(jsonb_typeof_1)s::VARCHAR) THEN sa_jobqueue_jobs.attempt_history
ELSE '[]'::jsonb END END || jsonb_build_array(jsonb_build_object(%(param_5)s::VARCHAR, sa_jobqueue_jobs.attempts, %(param_6)s::VARCHAR, now(), %(param_7)s::VARCHAR, sa_jobqueue_jobs.worker, %(param_8)s::VARCHAR, round(CAST(EXTRACT(epoch
FROM now() - sa_jobqueue_jobs.started_at) AS NUMERIC), %(round_1)s::INTEGER), %(param_9)s::VARCHAR, CASE
WHEN sa_jobqueue_jobs.cancel_requested THEN %(param_10)s::VARCHAR
WHEN (sa_jobqueue_jobs.attempts >= sa_jobqueue_jobs.max_attempts OR sa_jobqueue_jobs.cancel_requested) THEN %(param_11)s::VARCHAR
ELSE %(param_12)s::VARCHAR END, %(param_13)s::VARCHAR, CAST(%(error)s::VARCHAR AS JSONB))))
WHERE sa_jobqueue_jobs.id = %(job_id)s::BIGINT AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.attempts = %(attempt)s::INTEGER
RETURNING sa_jobqueue_jobs.status, sa_jobqueue_jobs.visible_at, CASE
WHEN (sa_jobqueue_jobs.status IN ('succeeded', 'dead', 'cancelled')) THEN sa_jobqueue_settle(ARRAY[sa_jobqueue_jobs.id], ARRAY[sa_jobqueue_jobs.status])
ELSE %(param_14)s::INTEGER END AS settled
;
-- parameters the caller supplies: attempt, delay, error, job_id
-- constants the statement binds:
--   jsonb_array_length_1 = 20
--   jsonb_typeof_1 = 'array'
--   make_interval_1 = 0
--   make_interval_2 = 0
--   make_interval_3 = 0
--   make_interval_4 = 0
--   make_interval_5 = 0
--   make_interval_6 = 0
--   param_1 = 'cancelled'
--   param_10 = 'cancelled'
--   param_11 = 'dead'
--   param_12 = 'retried'
--   param_13 = 'error'
--   param_14 = 0
--   param_2 = 'dead'
--   param_3 = 'queued'
--   param_4 = 0
--   param_5 = 'attempt'
--   param_6 = 'at'
--   param_7 = 'worker'
--   param_8 = 'duration'
--   param_9 = 'outcome'
--   round_1 = 3
--   status_1 = 'running'
--   worker = None
