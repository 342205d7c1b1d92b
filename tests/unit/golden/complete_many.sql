-- sa_jobqueue._sql.transitions.complete_many(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
WITH ended AS
(UPDATE sa_jobqueue_jobs
SET status=%(param_1)s::VARCHAR, visible_at=statement_timestamp(), finished_at=statement_timestamp(), result=(CAST(%(results)s::VARCHAR AS JSONB) -> CAST(sa_jobqueue_jobs.id AS TEXT))
WHERE sa_jobqueue_jobs.id = ANY (%(job_ids)s::BIGINT[]) AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.attempts = CAST((SELECT jsonb_object(CAST(%(job_ids)s::BIGINT[] AS TEXT[]), CAST(%(attempt_list)s::INTEGER[] AS TEXT[])) AS jsonb_object_1) ->> CAST(sa_jobqueue_jobs.id AS TEXT) AS INTEGER) AND sa_jobqueue_jobs.cancel_requested IS false
RETURNING sa_jobqueue_jobs.id, sa_jobqueue_jobs.status, CASE
WHEN (sa_jobqueue_jobs.result IS NOT NULL) THEN pg_notify(%(param_2)s::VARCHAR, CAST(sa_jobqueue_jobs.id AS TEXT))
ELSE NULL END AS notified)
SELECT ended.id, ended.status, ended.notified, (SELECT CASE
WHEN (EXISTS (SELECT *
FROM ended
WHERE ended.status IN ('succeeded', 'dead', 'cancelled'))) THEN sa_jobqueue_settle(array((SELECT ended.id
FROM ended)), array((SELECT ended.status
FROM ended)))
ELSE %(param_3)s::INTEGER END AS anon_1) AS settled
FROM ended
;
-- parameters the caller supplies: attempt_list, job_ids
-- constants the statement binds:
--   param_1 = 'succeeded'
--   param_2 = 'sa_jobqueue_results'
--   param_3 = 0
--   results = '{}'
--   status_1 = 'running'
