"""Every SQL statement sa_jobqueue runs, built with SQLAlchemy Core in one reviewable place.

One module per concern. The worker's: ``claiming``, ``transitions``, ``leases``,
``retention``, ``history`` (the hourly counts the upkeep folds in) and ``workers`` (its row
in the registry). The application's: ``enqueue`` (with ``unique_holders``, the job holding a
unique key, and ``copying``, many jobs by COPY), ``periodic``, ``admin``, ``listing`` (pages
of jobs) and ``finished`` (requeueing dead jobs, purging old ones). The operator's: ``stats``,
``health`` and ``dashboard`` (the web pages). Around them: ``schema`` (where the database's
schema stands), ``session`` (the session itself: a ping, a local timeout), ``testing``
(``sa_jobqueue.testing``'s drain) and ``verify`` (``sa-jobqueue verify``, with its record
tables). ``fence``, ``clock`` and ``arrays`` (every bound array of job ids or attempts) hold
the pieces they share.

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
