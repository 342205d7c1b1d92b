-- sa_jobqueue._sql.leases.still_held(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
SELECT sa_jobqueue_jobs.id
FROM sa_jobqueue_jobs, unnest(%(job_ids)s::BIGINT[], %(attempt_list)s::INTEGER[]) AS held(id, attempt)
WHERE sa_jobqueue_jobs.id = ANY (%(job_ids)s::BIGINT[]) AND sa_jobqueue_jobs.id = held.id AND sa_jobqueue_jobs.attempts = held.attempt AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR
;
-- parameters the caller supplies: attempt_list, job_ids
-- constants the statement binds:
--   status_1 = 'running'
