-- sa_jobqueue._sql.unique_holders.update_held('debounce', 'after', many=True), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
WITH held AS MATERIALIZED
(SELECT sa_jobqueue_jobs.id AS id, p.new_payload AS new_payload
FROM sa_jobqueue_jobs JOIN unnest(%(payloads)s::TEXT[], %(unique_keys)s::TEXT[]) AS p(new_payload, held_key) ON sa_jobqueue_jobs.unique_key = p.held_key
WHERE sa_jobqueue_jobs.task = %(b_task)s::VARCHAR AND unique_key IS NOT NULL AND status IN ('waiting', 'queued', 'running') AND sa_jobqueue_jobs.status = %(status_1)s::VARCHAR
ORDER BY sa_jobqueue_jobs.id FOR UPDATE OF sa_jobqueue_jobs)
UPDATE sa_jobqueue_jobs
SET payload=CAST(held.new_payload AS JSONB), priority=%(b_priority)s::INTEGER, visible_at=greatest(sa_jobqueue_jobs.visible_at, now() + make_interval(%(make_interval_1)s::INTEGER, %(make_interval_2)s::INTEGER, %(make_interval_3)s::INTEGER, %(make_interval_4)s::INTEGER, %(make_interval_5)s::INTEGER, %(make_interval_6)s::INTEGER, %(delay)s))
FROM held
WHERE sa_jobqueue_jobs.id = held.id AND sa_jobqueue_jobs.status = %(status_2)s::VARCHAR
RETURNING sa_jobqueue_jobs.id, sa_jobqueue_jobs.unique_key, CASE
WHEN (sa_jobqueue_jobs.visible_at <= now()) THEN sa_jobqueue_jobs.queue END AS anon_1, CASE
WHEN (sa_jobqueue_jobs.visible_at <= now()) THEN pg_notify(%(pg_notify_1)s::VARCHAR, sa_jobqueue_jobs.queue) END AS anon_2
;
-- parameters the caller supplies: b_priority, b_task, delay, payloads, unique_keys
-- constants the statement binds:
--   make_interval_1 = 0
--   make_interval_2 = 0
--   make_interval_3 = 0
--   make_interval_4 = 0
--   make_interval_5 = 0
--   make_interval_6 = 0
--   pg_notify_1 = 'sa_jobqueue'
--   status_1 = 'queued'
--   status_2 = 'queued'
