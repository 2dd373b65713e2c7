"""Test tooling: a private ``redis-server`` on a free loopback port, persisting to a temporary directory.

:class:`RedisServer` starts the ``redis-server`` binary found on ``PATH`` (or
``MAYFLY_REDIS_SERVER``) with AOF ``appendfsync always`` by default, waits until
it answers, and can SIGKILL and restart it on the same AOF, which is how the
crash tests prove acknowledged records survive. A missing binary raises
``FileNotFoundError``; tests never skip because of it.

:func:`aof_backend` is a contract-suite factory (``mayfly_backend =
"mayfly_redis.testing:aof_backend"``): it starts one private AOF server for the
pytest session and returns its URL.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Final, Self, final

__all__ = ["RedisServer", "aof_backend"]

_START_TIMEOUT_S: Final = 20.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


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
    """

    def __init__(self, *, appendfsync: str | None = "always", directory: Path | None = None) -> None:
        binary = os.environ.get("MAYFLY_REDIS_SERVER") or shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server not found on PATH; install it or set MAYFLY_REDIS_SERVER")
        self._binary = binary
        self._owned = directory is None
        self.directory = Path(tempfile.mkdtemp(prefix="mayfly-redis-")) if directory is None else directory
        self.appendfsync = appendfsync
        self.port = _free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        """The journal URL of this server (``durability=aof`` unless the server has no AOF)."""
        base = f"redis://127.0.0.1:{self.port}/0"
        return base if self.appendfsync == "always" else f"{base}?durability=memory"

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
                raise RuntimeError(f"redis-server exited with {self._process.returncode}: {error.strip()}")
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


_session_server: RedisServer | None = None


def aof_backend() -> str:
    """Contract-suite factory: start (once per process) a private AOF ``always`` server, return its URL."""
    global _session_server  # noqa: PLW0603  # one private server per test process
    if _session_server is None:
        _session_server = RedisServer()
        atexit.register(_session_server.stop)
    return _session_server.url
