"""Which queues a lane serves: names, and patterns such as ``tenant-*`` or ``*`` (every queue)."""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable
from typing import Any, Final

from .._validation import check_queue_pattern
from ..errors import InvalidNameError, WorkerConfigError

#: What a pattern may use besides a queue name's characters: ``*`` (any run of characters,
#: none included) and ``?`` (one character). Queue names cannot contain either, so a served
#: entry with one is a pattern and nothing else.
WILDCARDS: Final = "*?"

#: How many listed names a many-queue claim is sent as its ``:near`` per slot it fills: the
#: names just past where its walk starts, which tell whether the lane serves the queues the
#: walk reaches without the whole list being read (see ``claim_many``). A drain reaches one
#: listed name per slot, or more when other workers serving the same names took some of
#: them first (their queues are then not due, and the walk passes them): eight per slot
#: leave room for that.
NEAR_PER_SLOT: Final = 8
#: The fewest and the most names sent as ``:near``. The most bounds what a walked queue the
#: lane does not serve costs on top of the whole list's lookup: a search of ``:near``, at
#: most 1,024 names (about 13 kB for names like ``tenant-00042``, a few microseconds).
NEAR_LEAST: Final = 64
NEAR_MOST: Final = 1024

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
        #: Whether the lane claims with the many-queue claim (a pattern, or two names or
        #: more) rather than with one claim for its one queue.
        self.many = bool(self.patterns) or len(self.names) > 1
        # The names in order, as one text with a comma before and after each, and where in
        # it each name's leading comma is (the last entry: the closing comma): a claim's
        # ``:near`` is a slice of it, cut without joining anything again.
        self._sorted = sorted(self.names)
        self._joined = "," + ",".join(self._sorted) + ","
        self._starts = [0]
        for name in self._sorted:
            self._starts.append(self._starts[-1] + len(name) + 1)
        self._fixed = {
            "queues": ",".join(self._sorted),
            "patterns": [like_pattern(p) for p in self.patterns],
        }

    def __contains__(self, queue: object) -> bool:
        return isinstance(queue, str) and (
            queue in self.names or self._regex.fullmatch(queue) is not None
        )

    def params(self, after_queue: str = "", limit: int = 1) -> dict[str, Any]:
        """The many-queue claim's ``:queues`` (the names, comma-separated), ``:patterns``, and
        ``:near`` for a claim of ``limit`` slots whose walk starts past ``after_queue``: the
        next ``NEAR_PER_SLOT`` names per slot (between ``NEAR_LEAST`` and ``NEAR_MOST``) in
        Python's order of strings, which is the database's for queue names only under a
        bytewise collation (``C``, ``C.UTF-8``). Under another, the claim still serves exactly
        the listed queues; it reads its whole list more often."""
        count = min(max(NEAR_PER_SLOT * limit, NEAR_LEAST), NEAR_MOST)
        first = bisect_right(self._sorted, after_queue)
        last = min(first + count, len(self._sorted))
        near = self._joined[self._starts[first] : self._starts[last] + 1]
        return {**self._fixed, "near": near}

    def describe(self, most: int = 5) -> str:
        """The entries for a log line: all of them when few, else a count and the first few."""
        if len(self.entries) <= most:
            return ", ".join(self.entries)
        shown = ", ".join(self.entries[:most])
        return f"{len(self.entries)} queues ({shown}, ...)"
