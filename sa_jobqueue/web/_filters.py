"""The jobs list's filters, read from a query string or a form and checked before any SQL.

Bad input raises :class:`~sa_jobqueue.errors.InvalidJobError` with what is wrong; the pages show
its message. Queue and task names are checked against the table's own limits (their lengths),
not the stricter charset ``enqueue`` asks for: a row written some other way can still be
found. Either way they reach the database as bound parameters only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Final, Literal

from .._durations import read_duration
from ..errors import InvalidJobError
from ..models import DEAD, FINISHED_STATUSES, QUEUED, RUNNING
from ..ops.filters import MAX_JOB_ID, check_name_filter, check_statuses, check_tag_filter
from ..ops.health import span

#: Jobs on one page of the list, unless the query asks for another number.
PAGE: Final = 50
#: The most jobs one page of the list shows.
MAX_LIMIT: Final = 500

Order = Literal["newest", "oldest"]


@dataclass(frozen=True)
class JobFilter:
    """What the jobs list shows: the filters, the order, and where the page starts."""

    queue: str | None = None
    task: str | None = None
    statuses: tuple[str, ...] = ()
    #: Only jobs created longer ago than this (by the database's clock).
    older_than: timedelta | None = None
    order: Order = "newest"
    #: The page starts past this id (the next page), in the list's order ...
    after: int | None = None
    #: ... or ends just before it (the previous page).
    before: int | None = None
    limit: int = PAGE
    #: Only jobs whose payload contains this JSON (``payload @> ...``), as canonical text.
    payload: str | None = None
    #: Only jobs carrying every one of these tags (``tags @> ...``).
    tags: tuple[str, ...] = ()
    #: The filter as the user typed the age, to show it back in the form.
    age_text: str = field(default="", compare=False)

    @property
    def newest_first(self) -> bool:
        return self.order == "newest"

    @property
    def within(self) -> Literal["live", "dead"] | None:
        """The partial index holding every status asked for, if one does."""
        if self.payload is not None or self.tags:
            # No index holds payloads or tags: such a search always reads a window of ids.
            return None
        wanted = set(self.statuses)
        if wanted and wanted <= {QUEUED, RUNNING}:
            return "live"
        if wanted == {DEAD}:
            return "dead"
        return None

    def query(self, **changes: object) -> dict[str, str | list[str]]:
        """This filter as query parameters (for links), with ``changes`` applied.

        The page position (``after``, ``before``) is dropped unless given in ``changes``: a
        link that changes the filter starts from the first page.
        """
        values: dict[str, object] = {
            "queue": self.queue,
            "task": self.task,
            "status": list(self.statuses),
            "older_than": self.age_text or None,
            "payload": self.payload,
            "tag": list(self.tags),
            "order": None if self.order == "newest" else self.order,
            "limit": None if self.limit == PAGE else self.limit,
        }
        values.update(changes)
        query: dict[str, str | list[str]] = {}
        for key, value in values.items():
            if value is None or value == [] or value == "":
                continue
            query[key] = [str(v) for v in value] if isinstance(value, list) else str(value)
        return query

    def describe(self) -> str:
        """The filter in words, for headings and messages: ``dead jobs in queue emails``."""
        words = "/".join(self.statuses) + " jobs" if self.statuses else "jobs"
        if self.queue is not None:
            words += f" in queue {self.queue}"
        if self.task is not None:
            words += f" of task {self.task}"
        if self.older_than is not None:
            words += f" created over {span(self.older_than)} ago"
        if self.tags:
            words += f" tagged {' and '.join(self.tags)}"
        if self.payload is not None:
            words += f" with payload containing {self.payload}"
        return words


def read_filter(
    params: Mapping[str, str], statuses: Iterable[str], tags: Iterable[str] = ()
) -> JobFilter:
    """A :class:`JobFilter` from request parameters; InvalidJobError saying what is wrong.

    ``params`` holds the single-valued parameters, ``statuses`` every ``status`` given,
    ``tags`` every ``tag`` given (see :func:`tag_filter`). Empty values count as not given
    (a form's blank fields).
    """
    wanted = [s for s in statuses if s]
    age_text = params.get("older_than", "").strip()
    order = params.get("order", "") or "newest"
    if order not in ("newest", "oldest"):
        raise InvalidJobError(f"order must be 'newest' or 'oldest', not {order!r}")
    after, before = _id(params, "after"), _id(params, "before")
    if after is not None and before is not None:
        raise InvalidJobError("give after or before, not both")
    limit_text = params.get("limit", "")
    limit = _whole(limit_text, "limit") if limit_text else PAGE
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidJobError(f"limit must be from 1 to {MAX_LIMIT}, not {limit}")
    return JobFilter(
        queue=queue_name(params.get("queue", "")),
        task=task_name(params.get("task", "")),
        statuses=tuple(dict.fromkeys(check_statuses(wanted))) if wanted else (),
        older_than=age(age_text) if age_text else None,
        order="oldest" if order == "oldest" else "newest",
        after=after,
        before=before,
        limit=limit,
        payload=payload_filter(params.get("payload", "")),
        tags=tag_filter(tags),
        age_text=age_text,
    )


def tag_filter(texts: Iterable[str]) -> tuple[str, ...]:
    """The tags of the ``tag`` parameters: each may be given apart (``tag=a&tag=b``) or
    several in one, separated by commas or spaces (the form's one field), since a tag holds
    neither. Checked by :func:`~sa_jobqueue.ops.filters.check_tag_filter`, as the CLI's
    ``--tag`` and ``list_jobs`` are; () when none is given."""
    wanted = [tag for text in texts for tag in text.replace(",", " ").split()]
    return tuple(check_tag_filter(wanted)) if wanted else ()


#: The longest payload search, in characters: a search names a few fields, not a document.
MAX_PAYLOAD_SEARCH: Final = 2_000


def payload_filter(text: str) -> str | None:
    """A payload search: a JSON object or array (``{"customer": 42}``), as canonical text; None
    for "". InvalidJobError for anything else: the text reaches the database as a bound
    parameter only, and never as a path or an expression."""
    text = text.strip()
    if not text:
        return None
    if len(text) > MAX_PAYLOAD_SEARCH:
        raise InvalidJobError(f"a payload search is at most {MAX_PAYLOAD_SEARCH:,} characters")
    try:
        value = json.loads(text)
    except ValueError:
        raise InvalidJobError(
            f'a payload search is JSON, such as {{"customer": 42}}, not {text[:40]!r}'
        ) from None
    if not isinstance(value, dict | list):
        raise InvalidJobError(
            'a payload search is a JSON object or array, such as {"customer": 42}: the jobs'
            " whose payload contains it are listed"
        )
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def queue_name(text: str) -> str | None:
    """A queue name of 1 to 64 characters (the column's limit), or None for "".

    Other characters than ``enqueue`` allows are accepted, since rows may have been written
    some other way; the name only ever travels as a bound parameter.
    """
    return check_name_filter(text, "queue") if text else None


def task_name(text: str) -> str | None:
    """A task name of 1 to 200 characters (the column's limit), or None for ""."""
    return check_name_filter(text, "task") if text else None


def age(text: str) -> timedelta:
    """``30s``, ``5m``, ``2h``, ``7d`` or a number of seconds; InvalidJobError otherwise."""
    try:
        return read_duration(text)
    except ValueError as exc:
        raise InvalidJobError(str(exc)) from None


def finished_statuses(statuses: Iterable[str]) -> list[str]:
    """Statuses a purge may delete: one or more of succeeded, dead and cancelled."""
    wanted = check_statuses([s for s in statuses if s] or ["(none)"])
    live = [s for s in wanted if s not in FINISHED_STATUSES]
    if live:
        raise InvalidJobError(
            f"only finished jobs ({', '.join(FINISHED_STATUSES)}) can be purged,"
            f" not {' or '.join(live)} ones"
        )
    return wanted


def _id(params: Mapping[str, str], name: str) -> int | None:
    text = params.get(name, "")
    if not text:
        return None
    number = _whole(text, name)
    if not 0 <= number <= MAX_JOB_ID:
        raise InvalidJobError(f"{name} must be a job id, not {text!r}")
    return number


def _whole(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidJobError(f"{name} must be a whole number, not {text[:40]!r}") from None
