"""Which queues a lane serves: names, and patterns such as ``tenant-*`` or ``*`` (every queue)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

from .._validation import check_queue_pattern
from ..errors import InvalidNameError, WorkerConfigError

#: What a pattern may use besides a queue name's characters: ``*`` (any run of characters,
#: none included) and ``?`` (one character). Queue names cannot contain either, so a served
#: entry with one is a pattern and nothing else.
WILDCARDS: Final = "*?"

#: The characters SQL LIKE gives a meaning to, escaped with a backslash (LIKE's default
#: escape) when a pattern is sent: ``_`` is a queue name's character and must match itself.
_LIKE_SPECIAL: Final = re.compile(r"([\\%_])")


def is_pattern(entry: str) -> bool:
    """Whether a served entry is a pattern (it has a ``*`` or a ``?``)."""
    return any(c in entry for c in WILDCARDS)


def check_served(entry: object) -> str:
    """A queue name, or a pattern of names; raises WorkerConfigError for anything else."""
    try:
        return check_queue_pattern(entry)
    except InvalidNameError as exc:
        raise WorkerConfigError(str(exc)) from None


def like_pattern(pattern: str) -> str:
    """``pattern`` as SQL LIKE reads it: ``*`` as ``%``, ``?`` as ``_``, the rest literal."""
    escaped = _LIKE_SPECIAL.sub(r"\\\1", pattern)
    return escaped.replace("*", "%").replace("?", "_")


class Served:
    """The queues of a lane: a set of names and a few patterns; ``in`` tells whether a queue
    is one of them.

    What it does not do: list the queues a pattern matches (they are found in the database, by
    the claim), or tell a queue's limits.
    """

    def __init__(self, entries: Iterable[str]) -> None:
        self.entries = [check_served(entry) for entry in entries]
        self.names = frozenset(e for e in self.entries if not is_pattern(e))
        self.patterns = [e for e in dict.fromkeys(self.entries) if is_pattern(e)]
        self._regex = re.compile(
            "|".join(
                ".*".join(".".join(map(re.escape, part.split("?"))) for part in p.split("*"))
                for p in self.patterns
            )
            or r"(?!)"
        )
        self._params: dict[str, Any] | None = None

    @property
    def many(self) -> bool:
        """Whether the lane claims with the many-queue claim (a pattern, or two names or
        more) rather than with one claim for its one queue."""
        return bool(self.patterns) or len(self.names) > 1

    def __contains__(self, queue: object) -> bool:
        return isinstance(queue, str) and (
            queue in self.names or self._regex.fullmatch(queue) is not None
        )

    def params(self) -> dict[str, Any]:
        """The many-queue claim's ``:queues`` (the names, comma-separated) and ``:patterns``,
        made once."""
        if self._params is None:
            self._params = {
                "queues": ",".join(sorted(self.names)),
                "patterns": [like_pattern(p) for p in self.patterns],
            }
        return self._params

    def describe(self, most: int = 5) -> str:
        """The entries for a log line: all of them when few, else a count and the first few."""
        if len(self.entries) <= most:
            return ", ".join(self.entries)
        shown = ", ".join(self.entries[:most])
        return f"{len(self.entries)} queues ({shown}, ...)"
