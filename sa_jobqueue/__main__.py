"""``python -m sa_jobqueue``: the same as the ``sa-jobqueue`` command."""

import sys

from .cli import main

sys.exit(main())
