-- sa_jobqueue._sql.transitions.finish_cancelled(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
UPDATE sa_jobqueue_jobs
SET status=%(status)s::VARCHAR, finished_at=now(), worker=%(worker)s::VARCHAR, attempt_history=(CASE
WHEN (jsonb_array_length(coalesce(sa_jobqueue_jobs.attempt_history, '[]'::jsonb)) >= %(jsonb_array_length_1)s::INTEGER) THEN coalesce(sa_jobqueue_jobs.attempt_history, '[]'::jsonb) - %(coalesce_1)s::INTEGER
ELSE coalesce(sa_jobqueue_jobs.attempt_history, '[]'::jsonb) END || jsonb_build_array(jsonb_build_object(%(param_1)s::VARCHAR, sa_jobqueue_jobs.attempts, %(param_2)s::VARCHAR, now(), %(param_3)s::VARCHAR, sa_jobqueue_jobs.worker, %(param_4)s::VARCHAR, round(CAST(EXTRACT(epoch
FROM now() - sa_jobqueue_jobs.started_at) AS NUMERIC), %(round_1)s::INTEGER), %(param_5)s::VARCHAR, %(param_6)s::VARCHAR, %(param_7)s::VARCHAR, NULL)))
WHERE sa_jobqueue_jobs.cancel_requested IS true AND sa_jobqueue_jobs.id = %(job_id)s::BIGINT AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.attempts = %(attempt)s::INTEGER
RETURNING CASE
WHEN (sa_jobqueue_jobs.status IN ('succeeded', 'dead', 'cancelled')) THEN sa_jobqueue_settle(ARRAY[sa_jobqueue_jobs.id], ARRAY[sa_jobqueue_jobs.status])
ELSE %(param_8)s::INTEGER END AS settled
;
-- parameters the caller supplies: attempt, job_id
-- constants the statement binds:
--   coalesce_1 = 0
--   jsonb_array_length_1 = 20
--   param_1 = 'attempt'
--   param_2 = 'at'
--   param_3 = 'worker'
--   param_4 = 'duration'
--   param_5 = 'outcome'
--   param_6 = 'cancelled'
--   param_7 = 'error'
--   param_8 = 0
--   round_1 = 3
--   status = 'cancelled'
--   status_1 = 'running'
--   worker = None
