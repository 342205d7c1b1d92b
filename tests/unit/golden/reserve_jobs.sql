-- sa_jobqueue._sql.copying.reserve_jobs('now', True), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
SELECT (SELECT array_agg(nextval((SELECT pg_get_serial_sequence(%(pg_get_serial_sequence_2)s, %(pg_get_serial_sequence_3)s::VARCHAR) AS pg_get_serial_sequence_1))) AS array_agg_1
FROM generate_series(%(generate_series_1)s::INTEGER, %(n)s::INTEGER)) AS ids, CAST(make_interval(%(make_interval_1)s::INTEGER, %(make_interval_2)s::INTEGER, %(make_interval_3)s::INTEGER, %(make_interval_4)s::INTEGER, %(make_interval_5)s::INTEGER, %(make_interval_6)s::INTEGER, %(lease)s) AS TEXT) AS lease, pg_notify(%(pg_notify_2)s::VARCHAR, %(queue)s::VARCHAR) AS pg_notify_1
;
-- parameters the caller supplies: lease, n, queue
-- constants the statement binds:
--   generate_series_1 = 1
--   make_interval_1 = 0
--   make_interval_2 = 0
--   make_interval_3 = 0
--   make_interval_4 = 0
--   make_interval_5 = 0
--   make_interval_6 = 0
--   pg_get_serial_sequence_2 = 'sa_jobqueue_jobs'
--   pg_get_serial_sequence_3 = 'id'
--   pg_notify_2 = 'sa_jobqueue'
