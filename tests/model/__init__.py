"""The model checker: a seeded, fault-injecting exploration of the whole queue.

One seed gives one schedule of operations (enqueues with options, through a Session or an
Engine, typed payloads that do not fit, jobs of a batch task and of a hard-limited task,
cancels, requeues, bulk actions, pauses, caps) against workers that name their queues by
name or by pattern (one of them, in some seeds, a supervisor of two processes), and
faults (killed, stopped and restarted workers, terminated backends, silent or refusing
networks, a pooler restart), as plain data (:mod:`.schedule`). The runner
(:mod:`.runner`) plays it against real ``sa-jobqueue worker`` subprocesses on a database of
the seed's own, records what every call returned (:mod:`.model`), samples the jobs table while
it runs, waits for quiescence, and checks the invariants (:mod:`.invariants`). A violation
prints the seed, the invariant, its evidence and the schedule; ``python -m tests.model
--replay SEED`` plays the same schedule again. See docs/explanation/model-checker.md.
"""
