"""The command line's top-level grammar: the global options, and every command assembled.

Each command's module declares its own options, defaults and help texts with its
``add_parser(commands, database_option)`` (``_worker``, ``_migrate``, ``_stats``, ``_jobs``,
``_workflows``, ``_queues``, ``_check``, ``_verify``, ``_web``); :func:`build_parser` puts
them together in the order ``--help`` lists them, with ``--database-url``
(:func:`_database_option`) and the :data:`GLOBAL_OPTIONS`. :func:`parse_args` refuses options
that do not go together; the options' values are read by :mod:`._values`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any, Final

from .. import __version__
from ..database import POOLER_ENV, POOLERS
from . import _check, _jobs, _migrate, _queues, _stats, _verify, _web, _worker, _workflows

LOG_FORMATS: Final = ("text", "json")
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
#: The level when --log-level is not given. Alembic's own records are shown only when a level
#: is given (see configure_logging).
DEFAULT_LOG_LEVEL: Final = "INFO"

#: Options every command takes, before its name or after it (after it, it wins): one entry
#: each, the flag and its add_argument settings; _add_global_options puts them everywhere.
GLOBAL_OPTIONS: Final[tuple[tuple[str, dict[str, Any]], ...]] = (
    (
        "--log-level",
        {
            "choices": LOG_LEVELS,
            "default": None,
            "help": f"least severe records logged (default {DEFAULT_LOG_LEVEL}; Alembic's"
            " own only when given as INFO or DEBUG; DEBUG also shows an error's traceback)",
        },
    ),
    (
        "--pooler",
        {
            "choices": POOLERS,
            "default": os.environ.get(POOLER_ENV, "session"),
            "help": "what stands between us and PostgreSQL: 'session' (a direct connection, or"
            " PgBouncer in session mode) or 'transaction' (PgBouncer in transaction mode:"
            " no LISTEN, no prepared statements, settings per transaction); default"
            " $SA_JOBQUEUE_POOLER or session",
        },
    ),
    (
        "--log-format",
        {
            "choices": LOG_FORMATS,
            "default": "text",
            "help": "text lines, or one JSON object per line (default text; json adds a record"
            " per job transition to a worker's log)",
        },
    ),
)

#: Each command's declaration, ``add_parser(commands, database_option)`` in its module, in the
#: order ``--help`` lists them.
COMMANDS: Final = (
    _worker.add_parser,
    _migrate.add_parser,
    _stats.add_parser,
    _jobs.add_parser,
    _workflows.add_parser,
    _queues.add_parser,
    _check.add_parser,
    _verify.add_parser,
    _web.add_parser,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``sa-jobqueue`` parser with every subcommand and the global options on each."""
    parser = argparse.ArgumentParser(
        prog="sa-jobqueue", description="A job queue in your PostgreSQL database."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for add_parser in COMMANDS:
        add_parser(commands, _database_option)
    _add_global_options(parser)  # last: every subcommand exists by now
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line read by :func:`build_parser`, and options that do not go together
    refused as argparse refuses a bad value: the command's usage and exit status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "queues" and args.action == "limit":
        _queues.refuse_conflicts(args, _subparser(parser, "queues", "limit").error)
    return args


def _subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    """The parser of the subcommand at ``path`` (``"queues", "limit"``)."""
    for name in path:
        (choices,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = choices.choices[name]
    return parser


def _database_option(sub: argparse.ArgumentParser) -> None:
    """Give ``sub`` ``--database-url``: each command's ``add_parser`` is handed this."""
    sub.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL"),
        help="PostgreSQL URL (default: $DATABASE_URL)",
    )


def _add_global_options(parser: argparse.ArgumentParser, *, top: bool = True) -> None:
    """Give ``parser`` and each of its subcommands, at every depth, the GLOBAL_OPTIONS.

    Only the top level has the defaults. On a subcommand an option left out sets nothing
    (``SUPPRESS``), so it does not undo the same option given before the subcommand's name.
    """
    for flag, settings in GLOBAL_OPTIONS:
        default = settings["default"] if top else argparse.SUPPRESS
        parser.add_argument(flag, **{**settings, "default": default})
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # an alias is the same parser
                _add_global_options(sub, top=False)
