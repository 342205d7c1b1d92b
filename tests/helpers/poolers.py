"""Real network components between the tests' processes and PostgreSQL.

:class:`PgBouncer` runs the Debian ``pgbouncer`` binary with its stock settings (only the pool
mode, the address and trust authentication are ours) in a temporary directory, on a free port
of 127.0.0.1. :class:`SilentProxy` is a TCP proxy that can turn every connection open at that
moment silent: it keeps them open, takes what either side sends, and forwards nothing, as a
middlebox or pooler that lost its upstream may; connections made afterwards work normally. It
can also cut chosen new connections right after their handshake, at their first query, as a
pooler or server restarting under a client that just connected does.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import select
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy.engine import URL

from tests.helpers.waiting import wait_for

PGBOUNCER = shutil.which("pgbouncer") or next(
    (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(p)), None
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _host(server: URL) -> str:
    """The test server's host, or the directory of its Unix socket (the embedded server's)."""
    return server.host or str(server.query.get("host", "")) or "/tmp"


def _upstream(server: URL) -> str:
    """pgbouncer's connection string for the test server (TCP, or its Unix socket)."""
    return f"host={_host(server)} port={server.port or 5432}"


def _run_as(server: URL) -> str | None:
    """Whom pgbouncer runs as: it refuses to run as root, so then as the server's own user.

    That user can reach the server's Unix socket (the embedded server's lives in its data
    directory, open to its owner alone), and is given pgbouncer's directory.
    """
    if os.geteuid() != 0:
        return None
    host = _host(server)
    if host.startswith("/"):
        owner = pwd.getpwuid(os.stat(host).st_uid).pw_name
        if owner != "root":
            return owner
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name).pw_name
    raise RuntimeError("no user to run pgbouncer as")


class PgBouncer:
    """One pgbouncer process in front of the test server, in ``pool_mode``."""

    def __init__(
        self, server: URL, pool_mode: str, pool_size: int = 20, port: int | None = None
    ) -> None:
        """``port``: listen there (a restart on the port of a stopped one), else on a free one."""
        assert PGBOUNCER is not None
        self.server = server
        self.port = port or free_port()
        self._user = _run_as(server)
        self.dir = Path(tempfile.mkdtemp(prefix="sajq-pgbouncer-"))
        user = server.username or "postgres"
        (self.dir / "users.txt").write_text(f'"{user}" "{server.password or ""}"\n')
        (self.dir / "pgbouncer.ini").write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = {_upstream(server)}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {self.dir / 'users.txt'}",
                    f"pool_mode = {pool_mode}",
                    f"default_pool_size = {pool_size}",
                    "max_client_conn = 500",
                    f"logfile = {self.dir / 'pgbouncer.log'}",
                    "",
                ]
            )
        )
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            for path in [self.dir, *self.dir.iterdir()]:
                os.chown(path, entry.pw_uid, entry.pw_gid)
        command = [PGBOUNCER, str(self.dir / "pgbouncer.ini")]
        if self._user is not None:
            command[1:1] = ["-u", self._user]
        self.proc = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        wait_for(self._accepts, timeout=10)

    def _accepts(self) -> bool:
        assert self.proc.poll() is None, f"pgbouncer exited:\n{self.log()}"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 1):
            return True
        return False

    def url(self, database: URL) -> URL:
        """``database``'s URL, through this pgbouncer."""
        return database.set(host="127.0.0.1", port=self.port, query={})

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class SilentProxy:
    """A TCP proxy to the test server whose open connections can all be made to go silent,
    and which can refuse new connections for a while."""

    def __init__(self, server: URL) -> None:
        host, port = _host(server), server.port or 5432
        # The embedded server listens on a Unix socket only.
        self._unix = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else None
        self._tcp = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._refusing = False
        self._silent_new = 0  # how many of the next connections are silent from the start
        self._silent_ready = 0  # how many go silent once the server says it is ready
        self._cut_skip = 0  # how many new connections pass before the cut ones
        self._cut_ready = 0  # how many are cut at their first query after the handshake
        self._cut_answered = 0  # ...or at their first query after this many answered ones
        self._closed = threading.Event()
        #: Set once a silenced connection swallows what its client sent: a statement now
        #: waits for an answer that will never come.
        self.swallowed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, database: URL) -> URL:
        return database.set(host="127.0.0.1", port=self.port, query={})

    def silence(self) -> int:
        """Make every connection open now forward nothing from here on; how many there were."""
        with self._lock:
            live = [pair for pair in self._pairs if not pair.closed.is_set()]
            for pair in live:
                pair.silent = True
            return len(live)

    def silence_next(self, count: int) -> None:
        """The next ``count`` connections are accepted and forward nothing from the start
        (their clients wait for the server's first answer for ever)."""
        with self._lock:
            self._silent_new = count

    def silence_next_once_ready(self, count: int) -> None:
        """The next ``count`` connections go silent once the server has said it is ready for
        queries (its first ReadyForQuery): the handshake completes, the first query hangs."""
        with self._lock:
            self._silent_ready = count

    def cut_next_once_ready(self, count: int, skip: int = 0, answered: int = 0) -> None:
        """Of the connections accepted from now on, ``skip`` pass untouched, then the next
        ``count`` are closed (both ends) when their client sends its first query after the
        handshake (or, with ``answered``, the first after the server answered that many): the
        client saw the server ready, and its query meets a closed connection ("server closed
        the connection unexpectedly")."""
        with self._lock:
            self._cut_skip, self._cut_ready, self._cut_answered = skip, count, answered

    def refuse(self, on: bool) -> None:
        """While on, every new connection is closed as soon as it is accepted."""
        self._refusing = on

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._refusing:
                with contextlib.suppress(OSError):
                    client.close()
                continue
            try:
                if self._unix is not None:
                    server = socket.socket(socket.AF_UNIX)
                    server.connect(self._unix)
                else:
                    server = socket.create_connection(self._tcp, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, server, self.swallowed)
            with self._lock:
                self._pairs = [p for p in self._pairs if not p.closed.is_set()]
                self._pairs.append(pair)
                if self._silent_new > 0:
                    self._silent_new -= 1
                    pair.silent = True
                elif self._silent_ready > 0:
                    self._silent_ready -= 1
                    pair.silent_once_ready = True
                elif self._cut_skip > 0:
                    self._cut_skip -= 1
                elif self._cut_ready > 0:
                    self._cut_ready -= 1
                    pair.cut_after = self._cut_answered
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=pair.pump, args=(src, dst), daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for pair in self._pairs:
                pair.close()


#: The server's ReadyForQuery message (its type byte and length): the handshake is over.
_READY = b"Z\x00\x00\x00\x05"


class _Pair:
    def __init__(
        self, client: socket.socket, server: socket.socket, swallowed: threading.Event
    ) -> None:
        self.client, self.server = client, server
        self.silent = False
        self.silent_once_ready = False
        #: Cut at the client's first query once the server said it is ready this many times
        #: more than once (its handshake's ReadyForQuery, then one per answered query).
        self.cut_after: int | None = None
        self._readies = 0  # the server's ReadyForQuery messages forwarded so far
        self._swallowed = swallowed
        self.closed = threading.Event()

    def pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self.closed.is_set():
                ready, _, _ = select.select([src], [], [], 0.2)
                if not ready:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                if (
                    self.cut_after is not None
                    and src is self.client
                    and self._readies > self.cut_after
                ):
                    break  # the query to cut: nothing forwarded, both ends closed
                if not self.silent:
                    if src is self.server and _READY in data:
                        # Before it is sent: the client's next query may come at once.
                        self._readies += data.count(_READY)
                        self.silent = self.silent_once_ready
                    dst.sendall(data)
                elif src is self.client:  # a silent connection swallows what it is sent
                    self._swallowed.set()
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


@contextlib.contextmanager
def pgbouncer(server: URL, pool_mode: str, pool_size: int = 20) -> Iterator[PgBouncer]:
    bouncer = PgBouncer(server, pool_mode, pool_size)
    try:
        yield bouncer
    finally:
        bouncer.stop()
