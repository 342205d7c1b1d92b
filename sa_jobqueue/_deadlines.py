"""Client-side deadlines for the worker's own statements.

A server-side ``statement_timeout`` only helps while the server hears us. A middlebox or pooler
that keeps a TCP session open, answers its keepalives and forwards nothing leaves a statement
waiting for an answer that never comes: the server never saw it, so no timeout of the server's
fires, and the kernel sees a healthy connection. Only the client can notice.

:class:`Deadlines` keeps one watchdog thread. A statement is *armed* with the socket it waits
on and a deadline; if it is still armed when the deadline passes, the watchdog shuts the socket
down (``shutdown(2)``, both ways). The thread blocked in the driver then wakes at once with a
"connection lost" error, SQLAlchemy discards that connection instead of pooling it, and the
caller goes on over a fresh one.

A stopping worker hurries its own statements: a :class:`StopClock` handed to
:func:`guard_statements` caps every deadline at the moment its worker must be gone, and cuts a
statement already waiting when the stop came after ``STOP_HURRY`` more seconds (a live server
answers a claim or a renewal in milliseconds; only a silent connection is cut by it).

What this does not do: it never touches a statement of a handler's own (how long those may run
is the application's business), and it cannot tell whether the server ran a statement whose
answer was lost; every statement it guards is one that is safe to retry or to leave to the
lease (claims, fenced transitions, lease renewal).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import ExceptionContext

log = logging.getLogger("sa_jobqueue.worker")

#: How long the worker waits for any one of its own statements before it gives the connection
#: up (seconds). Above the server-side ``statement_timeout`` the worker's connections carry
#: (see :data:`sa_jobqueue.database.CONTROL_SETTINGS`), so a slow but live server answers with
#: its own error first; below a third of the default 30 s lease, so a lease renewal stuck on a
#: silent connection is retried on a fresh one before the lease runs out.
STATEMENT_DEADLINE = 15.0
#: How long a pooled connection's check at checkout may take (seconds): an empty query, which
#: a live server answers in milliseconds even when busy. A connection that does not answer by
#: then is replaced, so a pool of silent connections costs a handler seconds, not minutes.
PING_DEADLINE = 5.0
#: How long a statement already waiting when its worker is told to stop may go on waiting
#: (seconds): the stop is not held up by a silent connection's full deadline.
STOP_HURRY = 3.0
#: How often the watchdog looks again while a stopping worker's statements are armed (seconds).
_LOOK_AGAIN = 0.25
#: Execution option that overrides the deadline for one connection's statements (seconds).
DEADLINE_OPTION = "sa_jobqueue_deadline"
#: Execution option: the StopClock that hurries the statements of an engine (see
#: guard_statements), for those it sends to the driver itself (``HeldConnection.rows``).
CLOCK_OPTION = "sa_jobqueue_stop_clock"

_INFO_KEY = "sa_jobqueue_deadline_token"
#: Connection info key: the deadline and clock for the COMMIT or ROLLBACK about to be sent
#: (see guard_statements), set by the engine's event and taken by the dialect's method.
_ENDING_KEY = "sa_jobqueue_deadline_ending"


class StopClock:
    """When a stopping worker must be gone: nothing until :meth:`stop`, then a fixed moment.

    Set from a signal handler, so it takes no lock: :meth:`stop` only assigns floats, which
    the watchdog and the worker's threads read (see :class:`Deadlines`).
    """

    def __init__(self) -> None:
        self.stopped_at: float | None = None  # time.monotonic() of the stop
        self.until = float("inf")  # time.monotonic() by which the worker must be gone

    def stop(self, seconds: float) -> None:
        """The stop is now; the worker must be gone ``seconds`` from now (once only)."""
        if self.stopped_at is None:
            now = time.monotonic()
            self.until = now + seconds
            self.stopped_at = now

    def left(self) -> float:
        """Seconds until the worker must be gone (0 once past; inf before the stop)."""
        return max(0.0, self.until - time.monotonic())

    def cap(self, deadline: float, armed_at: float) -> float:
        """The deadline of a statement armed at ``armed_at``, given the stop (if any)."""
        stopped_at = self.stopped_at
        if stopped_at is not None and armed_at <= stopped_at:
            deadline = min(deadline, stopped_at + STOP_HURRY)
        return min(deadline, self.until)


class Deadlines:
    """One watchdog thread that cuts the connections of statements past their deadline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # token -> (deadline, socket fd, seconds it was given, its worker's clock, armed at)
        self._armed: dict[int, tuple[float, int, float, StopClock | None, float]] = {}
        self._cut: set[int] = set()
        self._tokens = itertools.count()
        self._changed = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._silent = False  # an outage was reported and nothing has come back since
        self._wake_at = float("inf")  # when the watchdog looks next

    def arm(self, fd: int, seconds: float, clock: StopClock | None = None) -> int:
        """Watch the socket ``fd`` for ``seconds`` (less once ``clock`` says its worker is
        stopping); returns the token to :meth:`disarm` with."""
        now = time.monotonic()
        deadline = now + seconds if clock is None else clock.cap(now + seconds, now)
        with self._lock:
            token = next(self._tokens)
            self._armed[token] = (deadline, fd, seconds, clock, now)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="sa_jobqueue-deadlines", daemon=True
                )
                self._thread.start()
            elif deadline < self._wake_at:
                self._changed.notify()  # earlier than the watchdog planned to look again
        return token

    def disarm(self, token: int) -> bool:
        """Stop watching; True if the watchdog cut the connection meanwhile."""
        with self._lock:
            self._armed.pop(token, None)
            if token in self._cut:
                self._cut.discard(token)
                return True
        if self._silent:
            self._silent = False
            log.info("the database answers again")
        return False

    def cut(self, token: int) -> bool:
        """Cut the armed connection of ``token`` now; False if it is no longer armed.

        Under the lock, as the watchdog cuts: the connection cannot have been disarmed and
        closed meanwhile, so the descriptor cannot belong to another connection yet.
        """
        with self._lock:
            armed = self._armed.pop(token, None)
            if armed is None:
                return False
            self._cut.add(token)
            _shut(armed[1])
            return True

    @contextlib.contextmanager
    def guard(
        self,
        connection: Any,
        seconds: float = STATEMENT_DEADLINE,
        clock: StopClock | None = None,
    ) -> Iterator[None]:
        """Arm for the ``with`` block the socket of ``connection``, a psycopg connection
        (nothing if it has none any more); ``clock`` hurries it once its worker stops."""
        fd = socket_of(connection)
        if fd is None:
            yield
            return
        token = self.arm(fd, seconds, clock)
        try:
            yield
        finally:
            self.disarm(token)

    def _watch(self) -> None:
        with self._lock:
            while True:
                now = time.monotonic()
                self._wake_at = float("inf")
                for token, (deadline, fd, seconds, clock, armed_at) in list(self._armed.items()):
                    if clock is not None:
                        deadline = clock.cap(deadline, armed_at)
                        if clock.stopped_at is None:
                            # A stop comes without notice (the clock takes no lock): look
                            # again soon while a statement it would hurry waits.
                            self._wake_at = min(self._wake_at, now + _LOOK_AGAIN)
                    if deadline > now:
                        self._wake_at = min(self._wake_at, deadline)
                        continue
                    del self._armed[token]
                    self._cut.add(token)
                    # Under the lock: the statement's thread cannot disarm and close the
                    # socket meanwhile, so the descriptor cannot have been reused.
                    _shut(fd)
                    if not self._silent:
                        self._silent = True
                        log.warning(
                            "the database did not answer within %g s; dropped that"
                            " connection, going on over fresh ones",
                            round(min(seconds, now - armed_at), 1),
                        )
                wait = self._wake_at - now
                self._changed.wait(None if wait == float("inf") else max(wait, 0.01))


def _shut(fd: int) -> None:
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by the peer
    finally:
        sock.close()


#: The watchdog every worker in this process shares.
DEADLINES = Deadlines()


def socket_of(dbapi_connection: Any) -> int | None:
    """The socket a psycopg connection talks over, or None if it has none (closed)."""
    try:
        return int(dbapi_connection.fileno())
    except Exception:
        return None


def guard_statements(
    engine: Engine, seconds: float | None = None, clock: StopClock | None = None
) -> None:
    """Give every statement run through ``engine`` a client-side deadline (``seconds``,
    :data:`STATEMENT_DEADLINE` unless given).

    ``engine`` may be an option engine (``engine.execution_options(...)``): the deadline then
    holds for its connections only, not for the engine it was made from. A connection's own
    ``execution_options(sa_jobqueue_deadline=...)`` overrides ``seconds``. With ``clock``, a
    stopping worker's statements are hurried (see :class:`StopClock`).
    """
    limit = STATEMENT_DEADLINE if seconds is None else seconds
    engine.update_execution_options(**{DEADLINE_OPTION: limit, CLOCK_OPTION: clock})

    @event.listens_for(engine, "before_cursor_execute")
    def arm(conn: Any, cursor: Any, *_: Any) -> None:
        fd = socket_of(cursor.connection)
        if fd is not None:
            limit = conn.get_execution_options()[DEADLINE_OPTION]
            conn.info[_INFO_KEY] = DEADLINES.arm(fd, limit, clock)

    @event.listens_for(engine, "after_cursor_execute")
    def disarm(conn: Any, *_: Any) -> None:
        token = conn.info.pop(_INFO_KEY, None)
        if token is not None:
            DEADLINES.disarm(token)

    @event.listens_for(engine, "handle_error")
    def discard(context: ExceptionContext) -> None:
        info = failed_connection_info(context)
        token = None if info is None else info.pop(_INFO_KEY, None)
        if token is not None and DEADLINES.disarm(token):
            context.is_disconnect = True  # never back into the pool

    # A transaction's COMMIT and ROLLBACK go to the driver without a cursor, so no statement
    # event sees them, and on a silent connection they too would wait for ever: the engine's
    # events (which fire just before, for this engine's connections only) leave the
    # deadline for the dialect's method to arm around the call.
    @event.listens_for(engine, "commit")
    @event.listens_for(engine, "rollback")
    def ending(conn: Any) -> None:
        if conn.invalidated or conn.closed:
            return  # nothing goes to the driver (and its info would raise)
        conn.info[_ENDING_KEY] = (conn.get_execution_options()[DEADLINE_OPTION], clock)

    _guard_endings(engine.dialect)


def _guard_endings(dialect: Any) -> None:
    """Arm a deadline around the dialect's COMMIT and ROLLBACK where an engine's event asked
    for one (see :func:`guard_statements`); once per dialect, which an engine and the option
    engines made from it share."""
    if getattr(dialect, "_sa_jobqueue_endings", False):
        return
    dialect._sa_jobqueue_endings = True
    for name in ("do_commit", "do_rollback"):
        setattr(dialect, name, _armed_ending(getattr(dialect, name)))


def _armed_ending(end: Any) -> Any:
    def armed(proxied: Any) -> None:
        try:
            wanted = proxied.info.pop(_ENDING_KEY, None)
        except NotImplementedError:  # the engine's first connection's setup (no info)
            wanted = None
        raw = None if wanted is None else proxied.dbapi_connection
        # In autocommit (the worker's own engine) psycopg sends nothing: no deadline to arm.
        fd = None if raw is None or raw.autocommit else socket_of(raw)
        if fd is None:
            end(proxied)
            return
        seconds, clock = wanted
        proxied.info[_INFO_KEY] = DEADLINES.arm(fd, seconds, clock)
        end(proxied)  # on an error the engine's handle_error disarms (see discard)
        token = proxied.info.pop(_INFO_KEY, None)
        if token is not None:
            DEADLINES.disarm(token)

    return armed


def failed_connection_info(context: ExceptionContext) -> dict[Any, Any] | None:
    """The ``info`` of the connection whose statement failed; None if it has none.

    For a ``handle_error`` hook. SQLAlchemy sets an engine up (server version, settings) on
    its first connection through a Connection of its own, whose ``info`` raises
    NotImplementedError; an error there (a connection cut during that setup) still reaches
    the engine's hooks, and a hook that raised would replace the error: the caller would see
    NotImplementedError, or the setup would go on over a closed connection ("This
    Connection is closed"), instead of the lost connection it is. No execution event runs on
    that Connection, so it holds nothing of ours to look up.
    """
    conn = context.connection
    if conn is None:
        return None
    try:
        return conn.info
    except NotImplementedError:  # the first connection's setup (see above)
        return None
