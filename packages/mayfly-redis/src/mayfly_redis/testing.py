"""Test tooling: a private ``redis-server`` on a free loopback port, persisting to a temporary directory.

:class:`RedisServer` starts the ``redis-server`` binary found on ``PATH`` (or
``MAYFLY_REDIS_SERVER``) with AOF ``appendfsync always`` by default, waits until
it answers, and can SIGKILL and restart it on the same AOF, which is how the
crash tests prove acknowledged records survive. :class:`RedisClusterNodes`
forms a private Redis Cluster out of such servers. A missing binary raises
``FileNotFoundError``; tests never skip because of it.

:func:`aof_backend` is a contract-suite factory (``mayfly_backend =
"mayfly_redis.testing:aof_backend"``): it starts one private AOF server for the
pytest session and returns its URL; :func:`cluster_backend` does the same with
a three-primary Cluster.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Final, Self, final

import redis

__all__ = [
    "RedisClusterNodes",
    "RedisServer",
    "aof_backend",
    "cluster_backend",
    "legacy_cluster_store",
    "memory_url",
]

_SLOTS: Final = 16384
_BUS_OFFSET: Final = 10000

_START_TIMEOUT_S: Final = 20.0
_DEFAULT_MEMORY_URL: Final = "redis://127.0.0.1:6379/0?durability=memory"


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port(*, cluster: bool = False) -> int:
    """A free loopback port; for a Cluster node, one whose bus port (+10000) is free too."""
    if not cluster:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]
            return port
    # Redis derives the cluster bus port as port + 10000, so the port must be <= 55535.
    # MAYFLY_REDIS_CLUSTER_PORTS=LOW-HIGH keeps the nodes in a range of one's own (shared hosts).
    low, _, high = os.environ.get("MAYFLY_REDIS_CLUSTER_PORTS", "20000-55535").partition("-")
    for _ in range(200):
        candidate = random.randint(int(low), int(high or low))
        if _bindable(candidate) and _bindable(candidate + _BUS_OFFSET):
            return candidate
    raise RuntimeError("no free loopback port pair (port, port + 10000) for a cluster node")


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@final
class RedisServer:
    """A private ``redis-server`` process in a temporary directory; stopped (and removed) on :meth:`stop`.

    ``appendfsync`` is ``"always"`` by default; ``None`` starts a server with
    no persistence at all (``appendonly no``, no RDB), for refusal tests.
    ``tls`` names a directory holding ``ca.crt``, ``server.crt`` and
    ``server.key``: the server then also listens with TLS (see :attr:`tls_url`).
    """

    def __init__(
        self,
        *,
        appendfsync: str | None = "always",
        directory: Path | None = None,
        cluster: bool = False,
        tls: Path | None = None,
    ) -> None:
        binary = os.environ.get("MAYFLY_REDIS_SERVER") or shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server not found on PATH; install it or set MAYFLY_REDIS_SERVER")
        self._binary = binary
        self._owned = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix="mayfly-redis-")) if directory is None else directory
        self.appendfsync = appendfsync
        self.cluster = cluster
        self.tls = tls
        self.port = _free_port(cluster=cluster)
        self.tls_port = _free_port() if tls is not None else None
        self._process: subprocess.Popen[bytes] | None = None
        try:
            self.start()
        except BaseException:
            self.stop()  # a server that never answered leaves no process or directory behind
            raise

    @property
    def url(self) -> str:
        """The journal URL of this server (``durability=aof`` unless the server has no AOF)."""
        base = f"redis://127.0.0.1:{self.port}/0"
        return base if self.appendfsync == "always" else f"{base}?durability=memory"

    @property
    def tls_url(self) -> str:
        """The ``rediss://`` URL of the TLS port, trusting the CA the server was started with."""
        assert self.tls is not None, "server was started without tls"
        options = f"ca_certs={self.tls / 'ca.crt'}"
        if self.appendfsync != "always":
            options += "&durability=memory"
        return f"rediss://127.0.0.1:{self.tls_port}/0?{options}"

    @property
    def pid(self) -> int:
        """The server's process id."""
        assert self._process is not None, "server is not running"
        return self._process.pid

    def _arguments(self) -> list[str]:
        persistence = (
            ["--appendonly", "no"]
            if self.appendfsync is None
            else ["--appendonly", "yes", "--appendfsync", self.appendfsync]
        )
        return [
            self._binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            str(self.directory / "redis.log"),
            *persistence,
            *(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"] if self.cluster else []),
            *self._tls_arguments(),
        ]

    def _tls_arguments(self) -> list[str]:
        if self.tls is None:
            return []
        return [
            "--tls-port",
            str(self.tls_port),
            "--tls-cert-file",
            str(self.tls / "server.crt"),
            "--tls-key-file",
            str(self.tls / "server.key"),
            "--tls-ca-cert-file",
            str(self.tls / "ca.crt"),
            "--tls-auth-clients",
            "no",
        ]

    def start(self) -> None:
        """Start the server (again, on the same directory and port) and wait until it answers PING."""
        if self._process is not None and self._process.poll() is None:
            return
        self._process = subprocess.Popen(
            self._arguments(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not _ping(self.port):
            if self._process.poll() is not None:
                error = self._process.stderr.read().decode() if self._process.stderr else ""
                log = self.directory / "redis.log"
                tail = log.read_text(errors="replace").splitlines()[-3:] if log.exists() else []
                raise RuntimeError(
                    f"redis-server exited with {self._process.returncode}: "
                    + " | ".join([error.strip(), *tail]).strip(" |")
                )
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server on port {self.port} did not answer within 20 s")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the server (no shutdown, no final fsync) and reap it."""
        if self._process is None:
            return
        if self._process.poll() is None:
            os.kill(self._process.pid, signal.SIGKILL)
        self._process.wait(timeout=30)
        if self._process.stderr is not None:
            self._process.stderr.close()
        self._process = None

    def stop(self) -> None:
        """Kill the server and remove its directory if this object created it."""
        self.kill()
        if self._owned:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        """Return the running server."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the server."""
        self.stop()


@final
class RedisClusterNodes:
    """A private Redis Cluster of ``size`` primaries (no replicas), each a :class:`RedisServer`.

    Slots are split evenly with ``CLUSTER ADDSLOTSRANGE`` and the nodes meet
    each other through ``CLUSTER MEET``; the constructor returns once every
    node reports ``cluster_state:ok``.
    """

    def __init__(self, size: int = 3, *, appendfsync: str | None = "always") -> None:
        self.nodes: list[RedisServer] = []
        try:
            for _ in range(size):
                self.nodes.append(RedisServer(appendfsync=appendfsync, cluster=True))
            self._form()
        except BaseException:
            self.stop()
            raise

    def _form(self) -> None:
        clients = [redis.Redis(host="127.0.0.1", port=node.port, protocol=2) for node in self.nodes]
        try:
            share = _SLOTS // len(clients)
            for index, client in enumerate(clients):
                last = _SLOTS - 1 if index == len(clients) - 1 else (index + 1) * share - 1
                client.cluster("ADDSLOTSRANGE", index * share, last)
            for node in self.nodes[1:]:
                clients[0].cluster("MEET", "127.0.0.1", node.port)
            deadline = time.monotonic() + _START_TIMEOUT_S
            while not all(client.cluster("info")["cluster_state"] == "ok" for client in clients):
                if time.monotonic() > deadline:
                    raise RuntimeError("private Redis Cluster did not reach cluster_state:ok within 20 s")
                time.sleep(0.05)
        finally:
            for client in clients:
                client.close()

    @property
    def url(self) -> str:
        """The journal URL of the cluster (its first node; the client discovers the others)."""
        return self.nodes[0].url

    def stop(self) -> None:
        """Stop every node and remove their directories."""
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> Self:
        """Return the running cluster."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the cluster."""
        self.stop()


def legacy_cluster_store(cluster: RedisClusterNodes, prefix: str) -> None:
    """Make ``prefix`` on ``cluster`` look like a store written before sharding (``P:runs``, no marker).

    The listing holds one run id that has no records, as an interrupted first
    append of that layout leaves it (listings skip it).
    """
    client = redis.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port, protocol=2)
    try:
        client.delete(f"{prefix}:layout")
        client.zadd(f"{prefix}:runs", {"00000000-0000-7000-8000-000000000000": 0})
    finally:
        client.close()


_session_server: RedisServer | None = None
_session_cluster: RedisClusterNodes | None = None


def aof_backend() -> str:
    """Contract-suite factory: start (once per process) a private AOF ``always`` server, return its URL."""
    global _session_server  # noqa: PLW0603  # one private server per test process
    if _session_server is None:
        _session_server = RedisServer()
        atexit.register(_session_server.stop)
    return _session_server.url


def cluster_backend() -> str:
    """Contract-suite factory: start (once per process) a private 3-primary AOF Cluster, return its URL."""
    global _session_cluster  # noqa: PLW0603  # one private cluster per test process
    if _session_cluster is None:
        _session_cluster = RedisClusterNodes()
        atexit.register(_session_cluster.stop)
    return _session_cluster.url


def memory_url() -> str:
    """The ``durability=memory`` URL of a non-persistent Redis: ``MAYFLY_REDIS_MEMORY_URL`` or CI's 6379."""
    return os.environ.get("MAYFLY_REDIS_MEMORY_URL") or _DEFAULT_MEMORY_URL
