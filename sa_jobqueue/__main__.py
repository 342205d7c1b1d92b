"""``python -m sa_jobqueue``: the same as the ``sa-jobqueue`` command."""

import sys

from .cli import main

# Guarded: a child process of the forkserver or spawn start methods (a hard-limited attempt,
# or a handler's own multiprocessing) imports the parent's main module, and must not run
# the command again.
if __name__ == "__main__":
    sys.exit(main())
