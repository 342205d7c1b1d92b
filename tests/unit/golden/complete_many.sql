-- sa_jobqueue._sql.transitions.complete_many(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
UPDATE sa_jobqueue_jobs
SET status=%(status)s::VARCHAR, visible_at=statement_timestamp(), finished_at=statement_timestamp(), result=(CAST(%(results)s::VARCHAR AS JSONB) -> CAST(sa_jobqueue_jobs.id AS TEXT))
WHERE sa_jobqueue_jobs.id = ANY (%(job_ids)s::BIGINT[]) AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.attempts = CAST((SELECT jsonb_object(CAST(%(job_ids)s::BIGINT[] AS TEXT[]), CAST(%(attempt_list)s::INTEGER[] AS TEXT[])) AS jsonb_object_1) ->> CAST(sa_jobqueue_jobs.id AS TEXT) AS INTEGER) AND sa_jobqueue_jobs.cancel_requested IS false
RETURNING sa_jobqueue_jobs.id, CASE
WHEN (sa_jobqueue_jobs.result IS NOT NULL) THEN pg_notify(%(param_1)s::VARCHAR, CAST(sa_jobqueue_jobs.id AS TEXT))
ELSE NULL END AS notified
;
-- parameters the caller supplies: attempt_list, job_ids
-- constants the statement binds:
--   param_1 = 'sa_jobqueue_results'
--   results = '{}'
--   status = 'succeeded'
--   status_1 = 'running'
