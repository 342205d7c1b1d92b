-- sa_jobqueue._sql.claim_many.claim_many(), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
WITH RECURSIVE walk(queue) AS
((SELECT sa_jobqueue_jobs.queue AS queue
FROM sa_jobqueue_jobs
WHERE status IN ('queued', 'running') AND sa_jobqueue_jobs.queue > %(after_queue)s::VARCHAR AND sa_jobqueue_jobs.visible_at <= now()
ORDER BY sa_jobqueue_jobs.queue
LIMIT %(param_16)s::INTEGER) UNION ALL
SELECT (SELECT sa_jobqueue_jobs.queue
FROM sa_jobqueue_jobs
WHERE status IN ('queued', 'running') AND sa_jobqueue_jobs.queue > walk.queue AND sa_jobqueue_jobs.visible_at <= now()
ORDER BY sa_jobqueue_jobs.queue
LIMIT %(param_17)s::INTEGER) AS anon_1
FROM walk
WHERE walk.queue IS NOT NULL),
ready AS MATERIALIZED
(SELECT walk.queue AS queue
FROM walk
WHERE walk.queue IS NOT NULL AND (strpos(walk.queue, ',') = %(strpos_1)s::INTEGER AND strpos(%(near)s::VARCHAR, ',' || walk.queue || ',') > %(strpos_2)s::INTEGER OR walk.queue LIKE any(%(patterns)s::TEXT[]) OR walk.queue IN (SELECT unnest(string_to_array(%(queues)s::VARCHAR, (SELECT ','))) AS unnest_1)) AND (walk.queue NOT IN (SELECT sa_jobqueue_queues.queue
FROM sa_jobqueue_queues
WHERE sa_jobqueue_queues.paused_at IS NOT NULL OR sa_jobqueue_queues.concurrency IS NOT NULL OR sa_jobqueue_queues.rate_limit IS NOT NULL OR sa_jobqueue_queues.key_field IS NOT NULL))
LIMIT %(limit)s::INTEGER),
picked AS MATERIALIZED
(SELECT sa_jobqueue_jobs.id AS id, sa_jobqueue_jobs.priority AS priority, sa_jobqueue_jobs.visible_at AS visible_at
FROM sa_jobqueue_jobs
WHERE sa_jobqueue_jobs.id = any(array((SELECT candidates.id
FROM (SELECT firsts.id AS id, firsts.queue AS queue, firsts.turn AS turn
FROM ready JOIN LATERAL (SELECT sa_jobqueue_jobs.id AS id, sa_jobqueue_jobs.queue AS queue, row_number() OVER (ORDER BY sa_jobqueue_jobs.priority, sa_jobqueue_jobs.visible_at, sa_jobqueue_jobs.id) AS turn
FROM sa_jobqueue_jobs
WHERE status IN ('queued', 'running') AND sa_jobqueue_jobs.queue = ready.queue AND sa_jobqueue_jobs.visible_at <= now()
ORDER BY sa_jobqueue_jobs.priority, sa_jobqueue_jobs.visible_at, sa_jobqueue_jobs.id
LIMIT FLOOR(((%(limit)s::INTEGER + greatest((SELECT count(*) AS count_1
FROM ready), %(greatest_1)s::INTEGER)) - %(param_18)s::INTEGER) / greatest((SELECT count(*) AS count_1
FROM ready), %(greatest_1)s::INTEGER))) AS firsts ON true) AS candidates
ORDER BY candidates.turn, candidates.queue
LIMIT %(limit)s::INTEGER))) AND status IN ('queued', 'running') AND sa_jobqueue_jobs.visible_at <= now() FOR UPDATE SKIP LOCKED)
UPDATE sa_jobqueue_jobs
SET status=CASE
WHEN (sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.cancel_requested) THEN %(param_1)s::VARCHAR
WHEN (sa_jobqueue_jobs.status = %(status_2)s::VARCHAR AND sa_jobqueue_jobs.attempts >= sa_jobqueue_jobs.max_attempts) THEN %(param_2)s::VARCHAR
ELSE %(param_3)s::VARCHAR END, attempts=CASE
WHEN (sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.cancel_requested OR sa_jobqueue_jobs.status = %(status_2)s::VARCHAR AND sa_jobqueue_jobs.attempts >= sa_jobqueue_jobs.max_attempts) THEN sa_jobqueue_jobs.attempts
ELSE sa_jobqueue_jobs.attempts + %(attempts_1)s::INTEGER END, visible_at=(now() + sa_jobqueue_jobs.lease), started_at=CASE
WHEN (sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.cancel_requested OR sa_jobqueue_jobs.status = %(status_2)s::VARCHAR AND sa_jobqueue_jobs.attempts >= sa_jobqueue_jobs.max_attempts) THEN sa_jobqueue_jobs.started_at
ELSE now() END, finished_at=CASE
WHEN (sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.cancel_requested OR sa_jobqueue_jobs.status = %(status_2)s::VARCHAR AND sa_jobqueue_jobs.attempts >= sa_jobqueue_jobs.max_attempts) THEN now() END, worker=%(worker)s::VARCHAR, last_error=CASE
WHEN (sa_jobqueue_jobs.status = %(status_3)s::VARCHAR) THEN jsonb_build_object(%(param_4)s::VARCHAR, %(param_5)s::VARCHAR, %(param_6)s::VARCHAR, %(param_7)s::VARCHAR)
ELSE sa_jobqueue_jobs.last_error END, attempt_history=CASE
WHEN (sa_jobqueue_jobs.status = %(status_4)s::VARCHAR) THEN CASE
WHEN (jsonb_array_length(CASE
WHEN (jsonb_typeof(sa_jobqueue_jobs.attempt_history) = %(jsonb_typeof_1)s::VARCHAR) THEN sa_jobqueue_jobs.attempt_history
ELSE '[]'::jsonb END) >= %(jsonb_array_length_1)s::INTEGER) THEN CASE
WHEN (jsonb_typeof(sa_jobqueue_jobs.attempt_history) = %(jsonb_typeof_1)s::VARCHAR) THEN sa_jobqueue_jobs.attempt_history
ELSE '[]'::jsonb END - %(param_8)s::INTEGER
ELSE CASE
WHEN (jsonb_typeof(sa_jobqueue_jobs.attempt_history) = %(jsonb_typeof_1)s::VARCHAR) THEN sa_jobqueue_jobs.attempt_history
ELSE '[]'::jsonb END END || jsonb_build_array(jsonb_build_object(%(param_9)s::VARCHAR, sa_jobqueue_jobs.attempts, %(param_10)s::VARCHAR, now(), %(param_11)s::VARCHAR, sa_jobqueue_jobs.worker, %(param_12)s::VARCHAR, round(CAST(EXTRACT(epoch
FROM now() - sa_jobqueue_jobs.started_at) AS NUMERIC), %(round_1)s::INTEGER), %(param_13)s::VARCHAR, %(param_14)s::VARCHAR, %(param_15)s::VARCHAR, jsonb_build_object(%(param_4)s::VARCHAR, %(param_5)s::VARCHAR, %(param_6)s::VARCHAR, %(param_7)s::VARCHAR)))
ELSE sa_jobqueue_jobs.attempt_history END, progress=CASE
WHEN (sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.cancel_requested OR sa_jobqueue_jobs.status = %(status_2)s::VARCHAR AND sa_jobqueue_jobs.attempts >= sa_jobqueue_jobs.max_attempts) THEN sa_jobqueue_jobs.progress END, progress_message=CASE
WHEN (sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.cancel_requested OR sa_jobqueue_jobs.status = %(status_2)s::VARCHAR AND sa_jobqueue_jobs.attempts >= sa_jobqueue_jobs.max_attempts) THEN sa_jobqueue_jobs.progress_message END, progress_at=CASE
WHEN (sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.cancel_requested OR sa_jobqueue_jobs.status = %(status_2)s::VARCHAR AND sa_jobqueue_jobs.attempts >= sa_jobqueue_jobs.max_attempts) THEN sa_jobqueue_jobs.progress_at END
FROM picked
WHERE sa_jobqueue_jobs.id = picked.id AND (SELECT set_config('synchronous_commit', 'off', true) AS set_config_1) IS NOT NULL
RETURNING sa_jobqueue_jobs.id, sa_jobqueue_jobs.queue, sa_jobqueue_jobs.task, CAST(sa_jobqueue_jobs.payload AS TEXT) AS payload, sa_jobqueue_jobs.status, sa_jobqueue_jobs.attempts, sa_jobqueue_jobs.max_attempts, sa_jobqueue_jobs.lease, sa_jobqueue_jobs.trace_context, sa_jobqueue_jobs.backoff, sa_jobqueue_jobs.created_at, picked.priority, picked.visible_at, CASE
WHEN (sa_jobqueue_jobs.status IN ('succeeded', 'dead', 'cancelled')) THEN sa_jobqueue_settle(ARRAY[sa_jobqueue_jobs.id], ARRAY[sa_jobqueue_jobs.status])
ELSE %(param_19)s::INTEGER END AS settled, (SELECT count(*) AS count_2
FROM ready) AS ready_queues, (SELECT max(ready.queue) AS max_1
FROM ready) AS last_queue
;
-- parameters the caller supplies: after_queue, limit, near, patterns, queues, worker
-- constants the statement binds:
--   attempts_1 = 1
--   greatest_1 = 1
--   jsonb_array_length_1 = 20
--   jsonb_typeof_1 = 'array'
--   param_1 = 'cancelled'
--   param_10 = 'at'
--   param_11 = 'worker'
--   param_12 = 'duration'
--   param_13 = 'outcome'
--   param_14 = 'lease_expired'
--   param_15 = 'error'
--   param_16 = 1
--   param_17 = 1
--   param_18 = 1
--   param_19 = 0
--   param_2 = 'dead'
--   param_3 = 'running'
--   param_4 = 'type'
--   param_5 = 'LeaseExpired'
--   param_6 = 'message'
--   param_7 = 'lease expired (worker lost)'
--   param_8 = 0
--   param_9 = 'attempt'
--   round_1 = 3
--   status_1 = 'running'
--   status_2 = 'running'
--   status_3 = 'running'
--   status_4 = 'running'
--   strpos_1 = 0
--   strpos_2 = 0
