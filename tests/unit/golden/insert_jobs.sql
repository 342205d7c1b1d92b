-- sa_jobqueue._sql.enqueue.insert_jobs('now', wake=True), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
INSERT INTO sa_jobqueue_jobs (queue, task, payload, priority, max_attempts, lease, visible_at)
SELECT %(b_queue)s::VARCHAR AS anon_2, %(b_task)s::VARCHAR AS anon_3, CAST(p.payload AS JSONB) AS payload, %(b_priority)s::INTEGER AS anon_4, %(b_max_attempts)s::INTEGER AS anon_5, make_interval(%(make_interval_2)s::INTEGER, %(make_interval_3)s::INTEGER, %(make_interval_4)s::INTEGER, %(make_interval_5)s::INTEGER, %(make_interval_6)s::INTEGER, %(make_interval_7)s::INTEGER, %(b_lease)s) AS make_interval_1, now() AS now_1
FROM unnest(%(payloads)s::TEXT[]) AS p(payload)
RETURNING sa_jobqueue_jobs.id, (SELECT pg_notify(%(pg_notify_2)s::VARCHAR, %(b_queue)s::VARCHAR) AS pg_notify_1) AS anon_1
;
-- parameters the caller supplies: b_lease, b_max_attempts, b_priority, b_queue, b_task, payloads
-- constants the statement binds:
--   make_interval_2 = 0
--   make_interval_3 = 0
--   make_interval_4 = 0
--   make_interval_5 = 0
--   make_interval_6 = 0
--   make_interval_7 = 0
--   pg_notify_2 = 'sa_jobqueue'
