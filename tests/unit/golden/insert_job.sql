-- sa_jobqueue._sql.enqueue.insert_job('now', True), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
INSERT INTO sa_jobqueue_jobs (queue, task, payload, priority, max_attempts, lease, visible_at) VALUES (%(queue)s::VARCHAR, %(task)s::VARCHAR, CAST(%(payload)s::VARCHAR AS JSONB), %(priority)s::SMALLINT, %(max_attempts)s::INTEGER, make_interval(0, 0, 0, 0, 0, 0, %(lease)s), now())
RETURNING sa_jobqueue_jobs.id, pg_notify('sa_jobqueue', sa_jobqueue_jobs.queue) AS pg_notify_1
;
-- parameters the caller supplies: lease, max_attempts, payload, priority, queue, task
-- constants: none
