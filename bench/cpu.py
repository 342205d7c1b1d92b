"""CPU time of processes from /proc: worker process trees and PostgreSQL backends.

A process's CPU time is ``utime + stime`` of ``/proc/<pid>/stat`` (all its threads), in clock
ticks. A tree's adds ``cutime + cstime`` of each live member, which hold the CPU of children
it has reaped, so a child that ran and exited inside a window still counts, once. Take a
:func:`snapshot` before and after a window and subtract with :func:`cpu_seconds`. A
single process (a PostgreSQL backend) is read to the nanosecond from ``/proc/<pid>/schedstat``
where the kernel provides it.

PostgreSQL's backends are processes of the server's machine: their CPU is readable here only
when the server runs on this machine (``pg_stat_activity.pid`` is then a local pid whose
command is ``postgres``); :func:`backend_pids` returns None otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

TICK = os.sysconf("SC_CLK_TCK")  # clock ticks per second (usually 100: 10 ms resolution)
PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command (field 2) is in parentheses and may hold spaces: split after its ')'.
    return text[text.rindex(")") + 2 :].split()


def process_ticks(pid: int, *, reaped_children: bool = False) -> int | None:
    """utime + stime of one process (+ cutime + cstime), or None if it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    # After the command: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    ticks = int(fields[11]) + int(fields[12])
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks


def children(pid: int) -> list[int]:
    """The live children of ``pid`` (from each of its threads' ``children`` file)."""
    found: list[int] = []
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def tree(roots: Iterable[int]) -> list[int]:
    """``roots`` and all their live descendants."""
    seen: list[int] = []
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.append(pid)
        stack += children(pid)
    return seen


def process_ns(pid: int) -> int | None:
    """CPU time of a single-threaded process in nanoseconds (the scheduler's own count, in
    ``/proc/<pid>/schedstat``), or None if it is gone or the kernel does not say."""
    try:
        return int((PROC / str(pid) / "schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Snapshot:
    """CPU time per process at one moment, in nanoseconds."""

    ns: dict[int, int] = field(default_factory=dict)


def snapshot(pids: Iterable[int], *, reaped_children: bool = False) -> Snapshot:
    """CPU of each process: of a PostgreSQL backend (one thread) to the nanosecond from
    schedstat where the kernel has it, else from its clock ticks (10 ms: a drain of a thousand
    jobs at 20 us each is two ticks); with ``reaped_children`` (trees), from the ticks."""
    taken = Snapshot()
    for pid in pids:
        ns = None if reaped_children else process_ns(pid)
        if ns is None:
            ticks = process_ticks(pid, reaped_children=reaped_children)
            ns = None if ticks is None else ticks * 1_000_000_000 // TICK
        if ns is not None:
            taken.ns[pid] = ns
    return taken


def tree_snapshot(roots: Iterable[int]) -> Snapshot:
    """CPU of the process trees under ``roots``, reaped children included."""
    return snapshot(tree(roots), reaped_children=True)


@dataclass(frozen=True)
class Window:
    """CPU used between two snapshots of the same processes."""

    seconds: float
    #: Processes in the first snapshot that were gone by the second (their CPU in the
    #: window is lost unless a parent in the tree reaped them).
    vanished: int


def cpu_seconds(before: Snapshot, after: Snapshot) -> Window:
    """CPU used from ``before`` to ``after``; a process new in ``after`` counts whole."""
    ns = 0
    for pid, end in after.ns.items():
        ns += end - before.ns.get(pid, 0)
    vanished = sum(1 for pid in before.ns if pid not in after.ns)
    return Window(ns / 1e9, vanished)


def _is_local_postgres(pid: int) -> bool:
    try:
        return (PROC / str(pid) / "comm").read_text().strip() in ("postgres", "postmaster")
    except OSError:
        return False


def backend_pids(conn: psycopg.Connection[Any], exclude: Iterable[int] = ()) -> list[int] | None:
    """Pids of the client backends of ``conn``'s database, less ``exclude``.

    None when the server's processes are not on this machine (CPU not measurable here).
    """
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND backend_type = 'client backend'"
    ).fetchall()
    if not _is_local_postgres(conn.info.backend_pid):
        return None
    skip = set(exclude)
    return [int(row[0]) for row in rows if int(row[0]) not in skip]
