"""The command's exit statuses, shared by every subcommand."""

from __future__ import annotations

from typing import Final

#: Something the user can fix went wrong (one line on stderr says what).
EXIT_ERROR: Final = 1
#: The command line asks for something that cannot be done (argparse exits 2 for the same).
EXIT_USAGE: Final = 2
#: The reader of our output went away (``sa-jobqueue jobs list --json | head``): 128 + SIGPIPE
#: (13), the status a shell shows for ``cat`` or ``grep`` ended that way.
EXIT_BROKEN_PIPE: Final = 141
#: ``check``'s exit status by its worst finding (the convention of Nagios-style probes). An
#: unreachable database counts as critical; usage errors exit 2 too (argparse's status).
CHECK_EXIT: Final = {"ok": 0, "warning": 1, "critical": 2}
