"""Running the console: a hub whose main task waits for SIGTERM or SIGINT while the server serves."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from types import FrameType

from mayfly.console._http import HttpServer
from mayfly.console._web import Console
from mayfly.substrate import Hub, spawn, wait_readable

__all__ = ["serve"]


def serve(
    console: Console,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    on_ready: Callable[[str], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> None:
    """Serve ``console`` on ``host:port`` until SIGTERM or SIGINT (``port=0``: a free port).

    The server binds before ``on_ready(url)`` is called, so a caller that
    prints the URL prints one that answers. Call it from the main thread (it
    installs the signal handlers) outside any running hub. ``log`` is told
    one line per request (see :class:`~mayfly.console.HttpServer`).
    """
    server = HttpServer(console, host, port, log=log)
    read, write = os.pipe()
    os.set_blocking(write, False)
    os.set_blocking(read, False)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        with contextlib.suppress(OSError):
            os.write(write, bytes([signum]))

    def main() -> None:
        spawn(server.serve, name="console accept")
        if on_ready is not None:
            on_ready(server.url)
        wait_readable(read)  # the main task ends on a signal; the hub then cancels the connections

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        Hub().run(main)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.close()
        os.close(read)
        os.close(write)
