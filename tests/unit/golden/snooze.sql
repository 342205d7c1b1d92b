-- sa_jobqueue._sql.transitions.snooze(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
UPDATE sa_jobqueue_jobs
SET status=CASE
WHEN sa_jobqueue_jobs.cancel_requested THEN %(param_1)s::VARCHAR
ELSE %(param_2)s::VARCHAR END, max_attempts=greatest(sa_jobqueue_jobs.max_attempts, sa_jobqueue_jobs.attempts + %(attempts_1)s::INTEGER), visible_at=(now() + make_interval(%(make_interval_1)s::INTEGER, %(make_interval_2)s::INTEGER, %(make_interval_3)s::INTEGER, %(make_interval_4)s::INTEGER, %(make_interval_5)s::INTEGER, %(make_interval_6)s::INTEGER, %(delay)s)), finished_at=CASE
WHEN sa_jobqueue_jobs.cancel_requested THEN now() END, worker=%(worker)s::VARCHAR, attempt_history=(CASE
WHEN (jsonb_array_length(coalesce(sa_jobqueue_jobs.attempt_history, '[]'::jsonb)) >= %(jsonb_array_length_1)s::INTEGER) THEN coalesce(sa_jobqueue_jobs.attempt_history, '[]'::jsonb) - %(coalesce_1)s::INTEGER
ELSE coalesce(sa_jobqueue_jobs.attempt_history, '[]'::jsonb) END || jsonb_build_array(jsonb_build_object(%(param_3)s::VARCHAR, sa_jobqueue_jobs.attempts, %(param_4)s::VARCHAR, now(), %(param_5)s::VARCHAR, sa_jobqueue_jobs.worker, %(param_6)s::VARCHAR, round(CAST(EXTRACT(epoch
FROM now() - sa_jobqueue_jobs.started_at) AS NUMERIC), %(round_1)s::INTEGER), %(param_7)s::VARCHAR, CASE
WHEN sa_jobqueue_jobs.cancel_requested THEN %(param_8)s::VARCHAR
ELSE %(param_9)s::VARCHAR END, %(param_10)s::VARCHAR, NULL)))
WHERE sa_jobqueue_jobs.id = %(job_id)s::BIGINT AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.attempts = %(attempt)s::INTEGER
RETURNING sa_jobqueue_jobs.status, sa_jobqueue_jobs.visible_at, CASE
WHEN (sa_jobqueue_jobs.status IN ('succeeded', 'dead', 'cancelled')) THEN sa_jobqueue_settle(ARRAY[sa_jobqueue_jobs.id], ARRAY[sa_jobqueue_jobs.status])
ELSE %(param_11)s::INTEGER END AS settled
;
-- parameters the caller supplies: attempt, delay, job_id
-- constants the statement binds:
--   attempts_1 = 1
--   coalesce_1 = 0
--   jsonb_array_length_1 = 20
--   make_interval_1 = 0
--   make_interval_2 = 0
--   make_interval_3 = 0
--   make_interval_4 = 0
--   make_interval_5 = 0
--   make_interval_6 = 0
--   param_1 = 'cancelled'
--   param_10 = 'error'
--   param_11 = 0
--   param_2 = 'queued'
--   param_3 = 'attempt'
--   param_4 = 'at'
--   param_5 = 'worker'
--   param_6 = 'duration'
--   param_7 = 'outcome'
--   param_8 = 'cancelled'
--   param_9 = 'snoozed'
--   round_1 = 3
--   status_1 = 'running'
--   worker = None
