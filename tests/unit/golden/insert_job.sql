-- sa_jobqueue._sql.enqueue.insert_job('now', True), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
INSERT INTO sa_jobqueue_jobs (queue, task, payload, priority, max_attempts, lease, visible_at) VALUES (%(queue)s::VARCHAR, %(task)s::VARCHAR, CAST(%(payload)s::VARCHAR AS JSONB), %(priority)s::SMALLINT, %(max_attempts)s::INTEGER, make_interval(%(make_interval_1)s::INTEGER, %(make_interval_2)s::INTEGER, %(make_interval_3)s::INTEGER, %(make_interval_4)s::INTEGER, %(make_interval_5)s::INTEGER, %(make_interval_6)s::INTEGER, %(lease)s), now())
RETURNING sa_jobqueue_jobs.id, pg_notify(%(pg_notify_2)s::VARCHAR, sa_jobqueue_jobs.queue) AS pg_notify_1
;
-- parameters the caller supplies: lease, max_attempts, payload, priority, queue, task
-- constants the statement binds:
--   make_interval_1 = 0
--   make_interval_2 = 0
--   make_interval_3 = 0
--   make_interval_4 = 0
--   make_interval_5 = 0
--   make_interval_6 = 0
--   pg_notify_2 = 'sa_jobqueue'
