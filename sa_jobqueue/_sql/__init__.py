"""Every SQL statement sa_jobqueue runs, built with SQLAlchemy Core in one reviewable place.

One module per concern: ``claiming``, ``transitions``, ``leases``, ``enqueue``, ``periodic``,
``admin`` and ``retention``; ``fence`` and ``clock`` hold the pieces they share.

Each function returns a statement with named bind parameters; callers execute it with values.
Nothing here does I/O. Rules that hold for all of them:

* Time comes from the database (``now()``); Python passes durations only. Workers' clocks
  may be wrong, and two workers' clocks always disagree a little.
* Every transition of a running job is fenced: ``WHERE id = :job_id AND status = 'running' AND
  attempts = :attempt``. ``attempts`` is counted at claim time, so it names one attempt; a
  worker whose lease expired (and whose job was reclaimed, making ``attempts`` larger) matches
  zero rows and must roll back instead of overwriting the newer attempt's outcome.
* Queue and task names are always bound parameters, never spliced into SQL text.
"""
