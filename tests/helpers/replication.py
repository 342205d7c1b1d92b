"""A PostgreSQL primary and its streaming replica, started for one test, for failovers.

:class:`ReplicatedPair` runs Debian's PostgreSQL binaries (``initdb``, ``pg_ctl``,
``pg_basebackup -R``) in a temporary directory, as a production user would set up a primary
and a hot standby: the primary on one free port of 127.0.0.1, the replica made from its base
backup and streaming from it on another, asynchronously or (``synchronous=True``) as the
primary's synchronous standby with ``synchronous_commit=on``. :meth:`ReplicatedPair.url` is the
multi-host URL an application would use (``?host=P1&host=P2&target_session_attrs=read-write``),
which reaches whichever of the two is the primary. :meth:`ReplicatedPair.fail_over` stops the
primary hard (``pg_ctl stop -m immediate``: no shutdown checkpoint, WAL not yet sent is lost to
the replica) and promotes the replica (``pg_ctl promote``).

PostgreSQL refuses to run as root: as root, every command runs as the ``postgres`` OS user
(``runuser``), who owns the directory. ``fsync`` is off (the test stops the server, it never
crashes the machine), so a commit costs no disk flush; nothing else departs from the defaults
but what replication needs.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL

from tests.helpers.poolers import SilentProxy, free_port
from tests.helpers.waiting import wait_for

#: Where Debian's postgresql-15 package puts the server's programs.
PG_BIN = Path("/usr/lib/postgresql/15/bin")
NEEDED = ("initdb", "pg_ctl", "pg_basebackup", "postgres")
#: Why a failover test cannot run here, or None when it can.
MISSING: str | None = (
    None
    if all((PG_BIN / name).exists() for name in NEEDED)
    else f"PostgreSQL 15's binaries are not in {PG_BIN} (Debian package postgresql-15)"
)
#: The replica's name, as the primary's ``synchronous_standby_names`` knows it.
REPLICA_NAME = "replica"


def _os_user() -> str | None:
    """Whom the servers run as: ``postgres`` when we are root (initdb refuses root), else us."""
    if os.geteuid() != 0:
        return None
    return pwd.getpwnam("postgres").pw_name


class Cluster:
    """One PostgreSQL data directory and its server, on 127.0.0.1 at ``port``."""

    def __init__(self, data: Path, port: int, user: str | None) -> None:
        self.data, self.port, self._user = data, port, user

    def run(self, *command: str, timeout: float = 60) -> str:
        """Run one of the server's programs as the servers' OS user; its output."""
        argv = [str(PG_BIN / command[0]), *command[1:]]
        if self._user is not None:
            argv = ["runuser", "-u", self._user, "--", *argv]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done.stdout

    def configure(self, **settings: str) -> None:
        """Append ``settings`` to postgresql.conf (the last line of a setting wins)."""
        with (self.data / "postgresql.conf").open("a") as conf:
            for name, value in settings.items():
                conf.write(f"{name} = '{value}'\n")

    def start(self) -> None:
        log = self.data.parent / f"{self.data.name}.log"
        self.run("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(log))

    def stop_immediately(self) -> None:
        """``pg_ctl stop -m immediate``: every backend is ended at once, as in a crash."""
        self.run("pg_ctl", "stop", "-m", "immediate", "-D", str(self.data))

    def promote(self) -> None:
        """``pg_ctl promote -w``: returns once the replica accepts writes."""
        self.run("pg_ctl", "promote", "-w", "-t", "60", "-D", str(self.data))

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def log(self) -> str:
        path = self.data.parent / f"{self.data.name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


class ReplicatedPair:
    """A primary and its streaming replica in a temporary directory; :meth:`close` removes both."""

    def __init__(self, *, synchronous: bool) -> None:
        self.synchronous = synchronous
        self._user = _os_user()
        self.dir = Path(tempfile.mkdtemp(prefix="sajq-failover-"))
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self.primary = Cluster(self.dir / "primary", free_port(), self._user)
        self.replica = Cluster(self.dir / "replica", free_port(), self._user)
        self.link: SilentProxy | None = None
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        primary, replica = self.primary, self.replica
        # Trust authentication, for local and TCP connections and replication alike.
        primary.run("initdb", "-D", str(primary.data), "-U", "postgres", "--auth=trust", "-N")
        primary.configure(
            listen_addresses="127.0.0.1",
            port=str(primary.port),
            unix_socket_directories=str(self.dir),
            fsync="off",
            wal_level="replica",
            max_wal_senders="5",
            hot_standby="on",
            # As many connections as two workers of a few threads, the test and a margin.
            max_connections="100",
        )
        if self.synchronous:
            # A commit returns once the standby has flushed its WAL: no acknowledged commit is
            # lost when the standby is promoted.
            primary.configure(synchronous_standby_names=REPLICA_NAME, synchronous_commit="on")
        primary.start()
        # The replica streams through a proxy of ours, which :meth:`lag` can make swallow it.
        self.link = SilentProxy(self.direct_url(primary))
        # -R writes standby.signal and primary_conninfo (with this connection string, so the
        # replica names itself REPLICA_NAME to the primary, through the proxy); -X stream takes
        # the WAL along.
        replica.run(
            "pg_basebackup",
            "-D",
            str(replica.data),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "-d",
            f"host=127.0.0.1 port={self.link.port} user=postgres application_name={REPLICA_NAME}",
        )
        # The replica's configuration is a copy of the primary's: once promoted it would wait
        # for a synchronous standby of its own, which it does not have, at every commit.
        replica.configure(port=str(replica.port), synchronous_standby_names="")
        replica.start()
        wait_for(self._streaming, timeout=30, context=replica.log)

    def _streaming(self) -> bool:
        """The primary sees the replica streaming (and, when synchronous, as synchronous)."""
        engine = sa.create_engine(self.direct_url(self.primary), poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as conn:
                state = conn.execute(
                    sa.text(
                        "SELECT sync_state FROM pg_stat_replication"
                        " WHERE application_name = :name AND state = 'streaming'"
                    ),
                    {"name": REPLICA_NAME},
                ).scalar()
        finally:
            engine.dispose()
        return state == ("sync" if self.synchronous else "async")

    def url(self, database: str = "postgres") -> URL:
        """The multi-host URL an application uses: the first host that accepts writes."""
        return URL.create(
            "postgresql+psycopg",
            username="postgres",
            database=database,
            query={
                "host": [f"127.0.0.1:{self.primary.port}", f"127.0.0.1:{self.replica.port}"],
                "target_session_attrs": "read-write",
            },
        )

    def direct_url(self, cluster: Cluster, database: str = "postgres") -> URL:
        """A URL of one of the two servers, whatever its role."""
        return URL.create(
            "postgresql+psycopg",
            username="postgres",
            host="127.0.0.1",
            port=cluster.port,
            database=database,
        )

    def lag(self) -> None:
        """From now on the replica receives nothing: what the primary commits is not sent.

        Its replication connection stays open and the primary's sender goes on writing to it
        (an asynchronous replica lagging behind, as on a slow or congested link). With a
        synchronous replica every commit would wait for good.
        """
        assert not self.synchronous, "a synchronous primary would wait for the replica for good"
        assert self.link is not None
        self.link.silence()

    def fail_over(self) -> None:
        """Stop the primary hard, then promote the replica."""
        self.primary.stop_immediately()
        self.replica.promote()

    def logs(self) -> str:
        return f"--- primary:\n{self.primary.log()}\n--- replica:\n{self.replica.log()}"

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
        for cluster in (self.primary, self.replica):
            if cluster.running():
                with contextlib.suppress(Exception):
                    cluster.stop_immediately()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def replicated_pair(*, synchronous: bool) -> Iterator[ReplicatedPair]:
    pair = ReplicatedPair(synchronous=synchronous)
    try:
        yield pair
    finally:
        pair.close()
