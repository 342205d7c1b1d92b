"""``sa-jobqueue verify``: the hammer test, run against your own database.

Run it where your workers run (the same server, the same pooler, the same network)::

    sa-jobqueue verify --jobs 10000 --workers 3

It creates a schema of its own, ``sa_jobqueue_verify_<12 hex digits>``, installs the queue's
tables there with the package's own Alembic revisions, starts W real worker processes
(``python -m sa_jobqueue worker sa_jobqueue.verify.tasks:queue``) and enqueues N jobs. Once a
third of them have succeeded it SIGKILLs the worker holding the most claimed jobs and starts
another in its place, as a supervisor would. When every job has finished, or ``--timeout``
has passed, it stops the workers, counts, and drops the schema; also after an error, Ctrl-C or
SIGTERM (``--keep`` keeps it).

Each run of the handler leaves two records:

- a row in ``verify_runs``, written through an autocommit connection of its own before the
  work: every execution, those lost with the killed worker included (at-least-once execution);
- a row in ``verify_results``, written through ``ctx.session``: committed together with the
  job's fenced completion, so exactly one per succeeded job (exactly-once database effects).

The run passes (exit 0) when every job succeeded with exactly one result row. A job that did not
succeed (lost), a second result row for a job (duplicate), a success without its result row or a
result row without its success is a failure (exit 1). Handlers that ran more than once are
reported, not failed: the jobs the killed worker had started run again elsewhere, and that is
the promise (at-least-once execution).

Every connection of the run, the workers' included, gets ``-c search_path=<schema>`` as a
startup option, so the unchanged worker command and the unchanged migrations work inside the
schema; verify checks that the option took effect before it installs anything there. Not
promised: running through a pooler that drops startup options (PgBouncer in transaction mode
without ``search_path`` among its tracked parameters). verify then stops with status 2 and
says so; point it at a session-mode pool or at the server. Nor does it leave the rest of the
database entirely untouched: ``pg_notify`` reaches every listener of the database, so your own
workers see (and ignore) wake-ups for the queue ``sa_jobqueue_verify``. A verify process that
is itself SIGKILLed cannot drop its schema (its workers do stop, within a second or two).

The modules of this package are internal: ``hammer`` (the run), ``workers`` (the worker
subprocesses), ``report`` (what the run concludes), ``names`` (what the run and its workers
agree on) and ``tasks`` (the handler, which only the workers import). Their statements and the
run's record tables are in :mod:`sa_jobqueue._sql.verify`; the command line (options, exit
status) is the CLI's, in ``sa_jobqueue.cli._verify``.
"""
