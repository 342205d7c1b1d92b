-- sa_jobqueue._sql.unique_holders.update_held('replace', 'now'), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
UPDATE sa_jobqueue_jobs
SET payload=CAST(%(b_payload)s::VARCHAR AS JSONB), priority=%(b_priority)s::INTEGER, visible_at=now()
WHERE sa_jobqueue_jobs.unique_key = %(b_unique_key)s::VARCHAR AND sa_jobqueue_jobs.task = %(b_task)s::VARCHAR AND unique_key IS NOT NULL AND status IN ('waiting', 'queued', 'running') AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR
RETURNING sa_jobqueue_jobs.id, sa_jobqueue_jobs.unique_key, CASE
WHEN (sa_jobqueue_jobs.visible_at <= now()) THEN sa_jobqueue_jobs.queue END AS anon_1, CASE
WHEN (sa_jobqueue_jobs.visible_at <= now()) THEN pg_notify(%(pg_notify_1)s::VARCHAR, sa_jobqueue_jobs.queue) END AS anon_2
;
-- parameters the caller supplies: b_payload, b_priority, b_task, b_unique_key
-- constants the statement binds:
--   pg_notify_1 = 'sa_jobqueue'
--   status_1 = 'queued'
