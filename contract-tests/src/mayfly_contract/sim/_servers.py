"""Private, restartable servers for tests and the simulator: a PostgreSQL cluster and a durable Redis.

:class:`PrivateCluster` is a throwaway PostgreSQL cluster (initdb into a
temporary directory, ``pg_ctl`` to start and stop it; as root it runs as the
``postgres`` user, because initdb refuses root). :class:`PrivateRedis` is the Redis
backend's own private ``redis-server`` (``mayfly_redis.testing.RedisServer``:
``appendonly yes``, ``appendfsync always``) behind the same small interface.
Both listen on loopback (a cluster on a free port of the caller's range
when one is given), and both restart on the same data: ``restart()`` kills the server
(an immediate shutdown for PostgreSQL: no checkpoint, crash recovery on
start; SIGKILL for Redis: the AOF is replayed) and starts it again.

This module imports no client driver (PostgreSQL readiness is ``pg_ctl -w``;
mayfly-redis is imported when a Redis server is made), so it loads where
neither psycopg nor redis-py is installed.
"""

from __future__ import annotations

import importlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final, Protocol, final


def binaries() -> tuple[str, str] | None:
    """Paths of initdb and pg_ctl, or None when PostgreSQL server binaries are not installed."""
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl:
        return initdb, pg_ctl
    for directory in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (directory / "initdb").exists() and (directory / "pg_ctl").exists():
            return str(directory / "initdb"), str(directory / "pg_ctl")
    return None


def free_port(ports: Iterable[int] | None = None) -> int:
    """A loopback port nothing listens on: the first free one of ``ports``, or any when ``ports`` is None."""
    for port in [0] if ports is None else ports:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            found: int = probe.getsockname()[1]
            return found
    raise RuntimeError(f"no free loopback port in {ports!r}; stop what holds them or pass another range")


@final
class PrivateCluster:
    """A throwaway PostgreSQL cluster on a free loopback port; restartable, crashable."""

    def __init__(self, *settings: str, ports: Iterable[int] | None = None) -> None:
        found = binaries()
        if found is None:
            raise RuntimeError("initdb/pg_ctl not found; install the PostgreSQL server binaries")
        self._initdb, self._pg_ctl = found
        self.root = Path(tempfile.mkdtemp(prefix="mayfly-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port(ports)
        self._settings = settings
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as_user = ["runuser", "-u", "postgres", "--"]
        self._run(
            self._initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"
        )
        self.start()

    @property
    def url(self) -> str:
        """The URL of the cluster's ``postgres`` database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *command: str) -> None:
        subprocess.run([*self._as_user, *command], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = " ".join(
            [f"-p {self.port}", "-c listen_addresses=127.0.0.1", f"-c unix_socket_directories={self.root}"]
            + [f"-c {setting}" for setting in self._settings]
        )
        self._run(
            self._pg_ctl, "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start"
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; ``immediate`` is a crash (no checkpoint, recovery on start)."""
        self._run(self._pg_ctl, "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def crash_restart(self) -> None:
        """Crash the server (immediate shutdown) and start it again."""
        self.stop("immediate")
        self.start()

    restart = crash_restart

    def destroy(self) -> None:
        """Stop the server if running and delete its files."""
        pid_file = self.data / "postmaster.pid"
        if pid_file.exists():
            try:
                self.stop("immediate")
            except subprocess.CalledProcessError:
                pid = int(pid_file.read_text().splitlines()[0])
                os.kill(pid, signal.SIGKILL)
                time.sleep(0.5)
        shutil.rmtree(self.root, ignore_errors=True)


class RestartableServer(Protocol):
    """A private server the simulator may crash and restart on the same data."""

    @property
    def url(self) -> str:
        """The server's base URL (no Mayfly options)."""
        ...

    def restart(self) -> None:
        """Crash the server and start it again on the same data."""
        ...

    def destroy(self) -> None:
        """Stop the server and delete its files."""
        ...


@final
class PrivateRedis:
    """``mayfly_redis.testing.RedisServer`` (AOF, fsync always) seen as a :class:`RestartableServer`.

    Imported when first made, so this module loads where mayfly-redis is not installed.
    """

    def __init__(self) -> None:
        testing = importlib.import_module("mayfly_redis.testing")
        self.server: Any = testing.RedisServer(appendfsync="always")

    @property
    def url(self) -> str:
        """The server's URL (database 0)."""
        url: str = self.server.url
        return url

    def restart(self) -> None:
        """SIGKILL the server (what it fsynced to the AOF is all that survives) and start it again."""
        self.server.kill()
        self.server.start()

    def destroy(self) -> None:
        """Kill the server and delete its files."""
        self.server.stop()


PG_PORTS: Final = range(55450, 55460)
"""The loopback ports :func:`private_server` gives PostgreSQL clusters."""


def private_server(backend: str) -> RestartableServer:
    """A fresh private server for ``backend`` (``postgres`` or ``redis``)."""
    if backend == "postgres":
        return PrivateCluster(ports=PG_PORTS)
    if backend == "redis":
        return PrivateRedis()
    raise ValueError(f"no private server for backend {backend!r}; expected postgres or redis")
