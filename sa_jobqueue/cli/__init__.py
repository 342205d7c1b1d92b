"""The ``sa-jobqueue`` command: run a worker, install the schema, and operate the queue.

    sa-jobqueue worker myapp.jobs:queue [--concurrency N] [--queues a,b | a=8,b=1]
                                        [--database-url URL]
    sa-jobqueue migrate [--database-url URL]
    sa-jobqueue stats [--json] [--watch SECONDS] [--window DURATION]
    sa-jobqueue jobs list|show|retry|cancel|purge [filters]
    sa-jobqueue queues list [--json] | pause NAME | resume NAME
    sa-jobqueue queues limit NAME [--concurrency N | --no-concurrency]
                                  [--rate N/PERIOD | --no-rate]
                                  [--per-key N | --no-per-key] [--key-rate N/PERIOD |
                                  --no-key-rate] [--key FIELD]
    sa-jobqueue queues limit NAME --clear
    sa-jobqueue check [--max-wait DURATION ...] [--json]
    sa-jobqueue verify [--jobs N] [--workers W] [--json] [--keep]
    sa-jobqueue web [--host 127.0.0.1] [--port 8080] [--allow-actions] [--app module:queue]
    sa-jobqueue --version

``--log-level`` and ``--log-format`` go before the subcommand or after it.

Errors a user can fix (wrong URL, unreachable server, missing schema, an app that does not
import) print one line on stderr and exit non-zero; they never dump a traceback, unless asked
for with ``--log-level DEBUG``. ``check`` exits 0 when all is well, 1 on a warning and 2 on a
critical finding (or when it cannot reach the database). Output cut short by its reader
(``| head``) ends the command quietly with status 141, as SIGPIPE ends other tools.

:func:`main` is the entry point (``sa-jobqueue`` and ``python -m sa_jobqueue``). The modules
of this package are internal, not a stable API:

* ``_arguments``: the top-level grammar (the global options, ``--database-url``, every
  command assembled, the options that do not go together); ``_values`` reads the options'
  values;
* a module per command, each with its options (``add_parser``), what it does and how its
  output reads: ``_worker`` (``worker``: logging observers, tracing, the metrics endpoint,
  signals), with ``_app`` loading the user's ``module:attribute`` and ``_supervised`` for
  ``worker --processes N`` (the supervisor, and how each child builds its worker);
  ``_migrate`` (``migrate``); ``_stats``; ``_jobs`` (``jobs list|show``, and the ``jobs``
  grammar) with ``_job_changes`` (``jobs retry|cancel|run-now|purge``); ``_workflows``;
  ``_queues``; ``_check``; ``_verify`` (``verify``'s options and exit status: the run is
  :mod:`sa_jobqueue.verify`); ``_web`` (``web`` and its server: the ``web`` extra, imported
  when it runs);
* ``_operator``: what the operators' commands share (their engine, one line per database
  error); ``_output``: text tables and JSON; ``_logs``: the logging setup; ``_exit``: the exit
  statuses.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from typing import Final

from sqlalchemy.exc import SQLAlchemyError

from .._error_text import one_line
from ..errors import JobQueueError
from . import _check, _jobs, _queues, _stats, _workflows
from ._app import load_app
from ._arguments import parse_args
from ._exit import EXIT_BROKEN_PIPE, EXIT_ERROR, EXIT_USAGE
from ._logs import configure_logging
from ._migrate import migrate
from ._operator import Command, operate
from ._supervised import supervise, supervised
from ._verify import run as run_verify
from ._web import run_web
from ._worker import run_worker

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_ERROR", "EXIT_USAGE", "load_app", "main"]

#: The operators' commands that run on an engine of their own once the schema is checked
#: (:func:`._operator.operate`); ``check`` opens its own, to report what it finds as a probe.
OPERATOR_COMMANDS: Final[dict[str, Command]] = {
    "stats": _stats.run,
    "jobs": _jobs.run,
    "workflows": _workflows.run,
    "queues": _queues.run,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``sa-jobqueue`` command with ``argv`` (default: the process's); its exit status."""
    try:
        try:
            return _main(argv)
        finally:
            # Flushed here: a reader that went away is seen now, in the handler below, rather
            # than as an "Exception ignored" message when the interpreter exits.
            sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped reading (`| head`): nothing went wrong. What is still buffered
        # goes to /dev/null, so that the interpreter's own flush at exit stays quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


def _main(argv: Sequence[str] | None) -> int:
    args = parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    if not args.database_url:
        print("sa-jobqueue: no database: pass --database-url or set DATABASE_URL", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "verify":
            return run_verify(args)  # exit 0 / 1 (lost or doubled) / 2 (could not run)
        if args.command == "migrate":
            return migrate(args)
        if args.command == "check":
            return _check.run(args)  # exit 0 / 1 (warning) / 2 (critical or unreachable)
        if args.command in OPERATOR_COMMANDS:
            return operate(args, OPERATOR_COMMANDS[args.command])
        if args.command == "web":
            return run_web(args)
        return supervise(args) if supervised(args) else run_worker(args)
    except JobQueueError as exc:
        if args.log_level == "DEBUG":
            traceback.print_exception(exc, file=sys.stderr)  # its cause's too, chained
        print(f"sa-jobqueue: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except SQLAlchemyError as exc:
        # A database error none of ours explains (a connection lost at a bad moment): one
        # line, not a traceback; --log-level DEBUG shows the whole of it.
        if args.log_level == "DEBUG":
            traceback.print_exception(exc, file=sys.stderr)
        print(f"sa-jobqueue: database error: {one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
