-- sa_jobqueue._sql.leases.extend_leases(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
WITH renewable AS MATERIALIZED
(SELECT sa_jobqueue_jobs.id AS id, CAST(%(progress)s::JSONB AS JSONB) -> CAST(sa_jobqueue_jobs.id AS TEXT) AS report
FROM sa_jobqueue_jobs
WHERE sa_jobqueue_jobs.id = ANY (%(job_ids)s::BIGINT[]) AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.attempts = CAST((SELECT jsonb_object(CAST(%(job_ids)s::BIGINT[] AS TEXT[]), CAST(%(attempt_list)s::INTEGER[] AS TEXT[])) AS jsonb_object_1) ->> CAST(sa_jobqueue_jobs.id AS TEXT) AS INTEGER) AND sa_jobqueue_jobs.visible_at > now() FOR UPDATE OF sa_jobqueue_jobs SKIP LOCKED)
UPDATE sa_jobqueue_jobs
SET visible_at=(now() + sa_jobqueue_jobs.lease), progress=CASE
WHEN (renewable.report IS NOT NULL) THEN CAST(renewable.report ->> %(report_1)s::VARCHAR AS DOUBLE PRECISION)
ELSE sa_jobqueue_jobs.progress END, progress_message=CASE
WHEN (renewable.report IS NOT NULL) THEN renewable.report ->> %(report_2)s::VARCHAR
ELSE sa_jobqueue_jobs.progress_message END, progress_at=CASE
WHEN (renewable.report IS NOT NULL) THEN now()
ELSE sa_jobqueue_jobs.progress_at END
FROM renewable
WHERE sa_jobqueue_jobs.id = renewable.id
RETURNING sa_jobqueue_jobs.id, sa_jobqueue_jobs.cancel_requested
;
-- parameters the caller supplies: attempt_list, job_ids, progress
-- constants the statement binds:
--   report_1 = 'fraction'
--   report_2 = 'message'
--   status_1 = 'running'
