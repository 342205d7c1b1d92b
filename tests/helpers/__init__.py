"""What the tests share besides fixtures (those live in the conftest.py files), by concern.

- :mod:`tests.helpers.databases`: creating and dropping the tests' databases;
- :mod:`tests.helpers.jobs`: reading job rows, enqueueing through a session of its own, and
  running a worker in burst mode in this process;
- :mod:`tests.helpers.job_states`: writing job rows straight into the table in any state;
- :mod:`tests.helpers.notify`: the statements an engine sends, and the notifications it commits;
- :mod:`tests.helpers.periodic`: making a periodic schedule's latest tick due again;
- :mod:`tests.helpers.processes`: the ``sa-jobqueue`` command as a subprocess, and workers;
- :mod:`tests.helpers.poolers`: pgbouncer and a proxy that can go silent;
- :mod:`tests.helpers.replication`: a primary and its streaming replica, for failovers;
- :mod:`tests.helpers.waiting`: polling for a condition, and a worker in a thread.

A package rather than one module: together they are several hundred lines, and each concern
is imported by different tiers (the unit tier imports none that needs a database).
"""
