-- sa_jobqueue._sql.claim_limits.claim_limited(keyed=False), compiled for PostgreSQL (psycopg)
-- regenerate: SA_JOBQUEUE_UPDATE_GOLDEN=1 pytest tests/unit/test_sql_golden.py
WITH state AS
(SELECT anon_1.is_paused AS is_paused, anon_1.cap AS cap, anon_1.key_cap AS key_cap, anon_1.key_name AS key_name, anon_1.tracked AS tracked, anon_1.rate_left AS rate_left, anon_1.rate_wait AS rate_wait, anon_1.window_start AS window_start, anon_1.window_used AS window_used, anon_1.live_ids AS live_ids
FROM sa_jobqueue_lock_queue(%(from_queue)s::VARCHAR) AS anon_1),
room AS
(SELECT coalesce(CASE
WHEN (state.is_paused OR state.key_name IS NOT NULL) THEN %(param_17)s::INTEGER
ELSE greatest(least(%(limit)s::INTEGER, coalesce(state.cap - cardinality(CAST((SELECT state.live_ids
FROM state) AS BIGINT[])), %(limit)s::INTEGER), coalesce(state.rate_left, %(limit)s::INTEGER)), %(greatest_1)s::INTEGER) END, %(coalesce_1)s::INTEGER) AS room, CASE
WHEN state.is_paused THEN NULL
ELSE state.rate_wait END AS wait, state.is_paused IS NOT NULL AS limited, state.key_name IS NOT NULL AS keyed
FROM (SELECT %(param_18)s::INTEGER AS one) AS one LEFT OUTER JOIN state ON true),
picked AS MATERIALIZED
(SELECT sa_jobqueue_jobs.id AS id, sa_jobqueue_jobs.priority AS priority, sa_jobqueue_jobs.visible_at AS visible_at
FROM sa_jobqueue_jobs
WHERE status IN ('queued', 'running') AND sa_jobqueue_jobs.queue = %(from_queue)s::VARCHAR AND sa_jobqueue_jobs.visible_at <= now()
ORDER BY sa_jobqueue_jobs.priority, sa_jobqueue_jobs.visible_at, sa_jobqueue_jobs.id
LIMIT (SELECT room.room
FROM room) FOR UPDATE SKIP LOCKED),
claimed AS
(UPDATE sa_jobqueue_jobs
SET status=CASE
WHEN (sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.cancel_requested) THEN %(param_2)s::VARCHAR
WHEN (sa_jobqueue_jobs.status = %(status_2)s::VARCHAR AND sa_jobqueue_jobs.attempts >= sa_jobqueue_jobs.max_attempts) THEN %(param_3)s::VARCHAR
ELSE %(param_4)s::VARCHAR END, attempts=CASE
WHEN (sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.cancel_requested OR sa_jobqueue_jobs.status = %(status_2)s::VARCHAR AND sa_jobqueue_jobs.attempts >= sa_jobqueue_jobs.max_attempts) THEN sa_jobqueue_jobs.attempts
ELSE sa_jobqueue_jobs.attempts + %(attempts_1)s::INTEGER END, visible_at=(now() + sa_jobqueue_jobs.lease), started_at=CASE
WHEN (sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.cancel_requested OR sa_jobqueue_jobs.status = %(status_2)s::VARCHAR AND sa_jobqueue_jobs.attempts >= sa_jobqueue_jobs.max_attempts) THEN sa_jobqueue_jobs.started_at
ELSE now() END, finished_at=CASE
WHEN (sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.cancel_requested OR sa_jobqueue_jobs.status = %(status_2)s::VARCHAR AND sa_jobqueue_jobs.attempts >= sa_jobqueue_jobs.max_attempts) THEN now() END, worker=%(worker)s::VARCHAR, last_error=CASE
WHEN (sa_jobqueue_jobs.status = %(status_3)s::VARCHAR) THEN jsonb_build_object(%(param_5)s::VARCHAR, %(param_6)s::VARCHAR, %(param_7)s::VARCHAR, %(param_8)s::VARCHAR)
ELSE sa_jobqueue_jobs.last_error END, attempt_history=CASE
WHEN (sa_jobqueue_jobs.status = %(status_4)s::VARCHAR) THEN CASE
WHEN (jsonb_array_length(CASE
WHEN (jsonb_typeof(sa_jobqueue_jobs.attempt_history) = %(jsonb_typeof_1)s::VARCHAR) THEN sa_jobqueue_jobs.attempt_history
ELSE '[]'::jsonb END) >= %(jsonb_array_length_1)s::INTEGER) THEN CASE
WHEN (jsonb_typeof(sa_jobqueue_jobs.attempt_history) = %(jsonb_typeof_1)s::VARCHAR) THEN sa_jobqueue_jobs.attempt_history
ELSE '[]'::jsonb END - %(param_9)s::INTEGER
ELSE CASE
WHEN (jsonb_typeof(sa_jobqueue_jobs.attempt_history) = %(jsonb_typeof_1)s::VARCHAR) THEN sa_jobqueue_jobs.attempt_history
ELSE '[]'::jsonb END END || jsonb_build_array(jsonb_build_object(%(param_10)s::VARCHAR, sa_jobqueue_jobs.attempts, %(param_11)s::VARCHAR, now(), %(param_12)s::VARCHAR, sa_jobqueue_jobs.worker, %(param_13)s::VARCHAR, round(CAST(EXTRACT(epoch
FROM now() - sa_jobqueue_jobs.started_at) AS NUMERIC), %(round_1)s::INTEGER), %(param_14)s::VARCHAR, %(param_15)s::VARCHAR, %(param_16)s::VARCHAR, jsonb_build_object(%(param_5)s::VARCHAR, %(param_6)s::VARCHAR, %(param_7)s::VARCHAR, %(param_8)s::VARCHAR)))
ELSE sa_jobqueue_jobs.attempt_history END, progress=CASE
WHEN (sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.cancel_requested OR sa_jobqueue_jobs.status = %(status_2)s::VARCHAR AND sa_jobqueue_jobs.attempts >= sa_jobqueue_jobs.max_attempts) THEN sa_jobqueue_jobs.progress END, progress_message=CASE
WHEN (sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.cancel_requested OR sa_jobqueue_jobs.status = %(status_2)s::VARCHAR AND sa_jobqueue_jobs.attempts >= sa_jobqueue_jobs.max_attempts) THEN sa_jobqueue_jobs.progress_message END, progress_at=CASE
WHEN (sa_jobqueue_jobs.status = %(status_1)s::VARCHAR AND sa_jobqueue_jobs.cancel_requested OR sa_jobqueue_jobs.status = %(status_2)s::VARCHAR AND sa_jobqueue_jobs.attempts >= sa_jobqueue_jobs.max_attempts) THEN sa_jobqueue_jobs.progress_at END
WHERE sa_jobqueue_jobs.id = any(array((SELECT picked.id
FROM picked))) AND (SELECT set_config('synchronous_commit', 'off', true) AS set_config_1) IS NOT NULL
RETURNING sa_jobqueue_jobs.id, sa_jobqueue_jobs.queue, sa_jobqueue_jobs.task, CAST(sa_jobqueue_jobs.payload AS TEXT) AS payload, sa_jobqueue_jobs.status, sa_jobqueue_jobs.attempts, sa_jobqueue_jobs.max_attempts, sa_jobqueue_jobs.lease, sa_jobqueue_jobs.trace_context, sa_jobqueue_jobs.backoff, sa_jobqueue_jobs.created_at, sa_jobqueue_jobs.priority, CAST((SELECT jsonb_object_agg(picked.id, picked.visible_at) AS jsonb_object_agg_1
FROM picked) ->> CAST(sa_jobqueue_jobs.id AS TEXT) AS TIMESTAMP WITH TIME ZONE) AS visible_at, CASE
WHEN (sa_jobqueue_jobs.status IN ('succeeded', 'dead', 'cancelled')) THEN sa_jobqueue_settle(ARRAY[sa_jobqueue_jobs.id], ARRAY[sa_jobqueue_jobs.status])
ELSE %(param_19)s::INTEGER END AS settled),
noted AS
(UPDATE sa_jobqueue_queues
SET rate_window=(SELECT state.window_start
FROM state), rate_count=(SELECT CASE
WHEN (state.rate_left IS NULL) THEN %(param_1)s::INTEGER
ELSE state.window_used + (SELECT count(*) AS count_1
FROM (SELECT claimed.id AS id
FROM claimed
WHERE claimed.status = %(status_5)s::VARCHAR) AS anon_3) END AS anon_2
FROM state), holders=(SELECT CASE
WHEN state.tracked THEN array_cat(CAST((SELECT state.live_ids
FROM state) AS BIGINT[]), array((SELECT claimed.id
FROM claimed
WHERE claimed.status = %(status_5)s::VARCHAR)))
ELSE NULL END AS anon_4
FROM state), recount_until=(SELECT CASE
WHEN state.tracked THEN coalesce(sa_jobqueue_queues.recount_until, now() + %(now_1)s)
ELSE NULL END AS anon_5
FROM state)
WHERE sa_jobqueue_queues.queue = %(from_queue)s::VARCHAR)
SELECT room.room, room.wait, room.limited, room.keyed, NULL AS key_wait, NULL AS completed, NULL AS settled_batch, claimed.id, claimed.queue, claimed.task, claimed.payload, claimed.status, claimed.attempts, claimed.max_attempts, claimed.lease, claimed.trace_context, claimed.backoff, claimed.created_at, claimed.priority, claimed.visible_at, claimed.settled
FROM room LEFT OUTER JOIN claimed ON true
;
-- parameters the caller supplies: from_queue, limit, worker
-- constants the statement binds:
--   attempts_1 = 1
--   coalesce_1 = 0
--   greatest_1 = 0
--   jsonb_array_length_1 = 20
--   jsonb_typeof_1 = 'array'
--   now_1 = datetime.timedelta(seconds=2)
--   param_1 = 0
--   param_10 = 'attempt'
--   param_11 = 'at'
--   param_12 = 'worker'
--   param_13 = 'duration'
--   param_14 = 'outcome'
--   param_15 = 'lease_expired'
--   param_16 = 'error'
--   param_17 = 0
--   param_18 = 1
--   param_19 = 0
--   param_2 = 'cancelled'
--   param_3 = 'dead'
--   param_4 = 'running'
--   param_5 = 'type'
--   param_6 = 'LeaseExpired'
--   param_7 = 'message'
--   param_8 = 'lease expired (worker lost)'
--   param_9 = 0
--   round_1 = 3
--   status_1 = 'running'
--   status_2 = 'running'
--   status_3 = 'running'
--   status_4 = 'running'
--   status_5 = 'running'
