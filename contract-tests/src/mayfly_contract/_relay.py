"""A loopback TCP relay that delays every reply, run as its own process: ``python -m mayfly_contract._relay``.

The hub-blocking clause (``journal.hub.never-blocks``) puts it between a
network backend and its server. It runs in a separate process on purpose: a
backend that blocks its thread while it waits for a reply cannot also block
the relay that is holding that reply back, so a blocking backend makes the
clause fail on time instead of hanging it.

Protocol, one line each way on stdin/stdout:

* ``relay HOST PORT`` -> ``port N``: listen on ``127.0.0.1:N`` and forward each
  connection to ``HOST:PORT`` (the same upstream always gets the same port);
* ``delay MS`` -> ``ok``: hold every later server-to-client chunk back ``MS``
  milliseconds (client-to-server bytes always pass at once);
* ``stats`` -> ``bytes N``: server-to-client bytes delivered so far;
* end of input: close everything and exit.

One thread and one ``selectors`` loop; no event loop.
"""

from __future__ import annotations

import collections
import contextlib
import os
import selectors
import socket
import sys
import time
from dataclasses import dataclass, field

_CHUNK = 1 << 16


@dataclass
class _Side:
    """One socket of a relayed connection and the bytes waiting to be written to it."""

    sock: socket.socket
    outgoing: collections.deque[tuple[float, bytes]] = field(default_factory=collections.deque)
    peer: _Side | None = None
    delayed: bool = False  # writes to this side are replies (held back by the delay)


class Relay:
    """The relay's state: listeners by upstream, relayed connections, the delay and counters."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.listeners: dict[tuple[str, int], socket.socket] = {}
        self.delay = 0.0
        self.delivered = 0
        self.commands = b""
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "control")

    def listen(self, host: str, port: int) -> int:
        """The local port relaying to ``host:port``, opened on first use."""
        key = (host, port)
        listener = self.listeners.get(key)
        if listener is None:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", 0))
            listener.listen(64)
            listener.setblocking(False)
            self.listeners[key] = listener
            self.selector.register(listener, selectors.EVENT_READ, ("listener", key))
        port_number: int = listener.getsockname()[1]
        return port_number

    def accept(self, listener: socket.socket, upstream: tuple[str, int]) -> None:
        """Pair a new client with a fresh connection to its upstream."""
        client, _ = listener.accept()
        try:
            server = socket.create_connection(upstream, timeout=10)
        except OSError:
            client.close()
            return
        for sock in (client, server):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client_side, server_side = _Side(client, delayed=True), _Side(server)
        client_side.peer, server_side.peer = server_side, client_side
        for side in (client_side, server_side):
            self.selector.register(side.sock, selectors.EVENT_READ, side)

    def control(self) -> bool:
        """Handle the parent's commands; False once its input ended."""
        data = os.read(sys.stdin.fileno(), _CHUNK)
        if not data:
            return False
        self.commands += data
        while b"\n" in self.commands:
            line, self.commands = self.commands.split(b"\n", 1)
            words = line.decode().split()
            if words[:1] == ["relay"]:
                answer = f"port {self.listen(words[1], int(words[2]))}"
            elif words[:1] == ["delay"]:
                self.delay = int(words[1]) / 1000
                answer = "ok"
            elif words[:1] == ["stats"]:
                answer = f"bytes {self.delivered}"
            else:
                answer = f"error unknown command {line!r}"
            sys.stdout.write(answer + "\n")
            sys.stdout.flush()
        return True

    def read(self, side: _Side) -> None:
        """Move what arrived on ``side`` to its peer's outgoing queue, due now or after the delay."""
        peer = side.peer
        assert peer is not None
        try:
            data = side.sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.drop(side)
            return
        due = time.monotonic() + (self.delay if peer.delayed else 0.0)
        peer.outgoing.append((due, data))
        self.flush(peer)

    def flush(self, side: _Side) -> None:
        """Write every chunk that is due to ``side``; watch for writability if the socket is full."""
        if side.sock.fileno() < 0:
            return
        now = time.monotonic()
        while side.outgoing and side.outgoing[0][0] <= now:
            due, data = side.outgoing[0]
            try:
                sent = side.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.drop(side)
                return
            if side.delayed:
                self.delivered += sent
            if sent < len(data):
                side.outgoing[0] = (due, data[sent:])
                self.selector.modify(side.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, side)
                return
            side.outgoing.popleft()
        self.selector.modify(side.sock, selectors.EVENT_READ, side)

    def drop(self, side: _Side) -> None:
        """Close a connection pair (either end closing ends both)."""
        for end in (side, side.peer):
            if end is None or end.sock.fileno() < 0:
                continue
            end.outgoing.clear()
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(end.sock)
            end.sock.close()

    def pending(self) -> list[_Side]:
        """The sides with bytes queued."""
        return [
            key.data
            for key in self.selector.get_map().values()
            if isinstance(key.data, _Side) and key.data.outgoing
        ]

    def run(self) -> None:
        """Serve until the parent's input ends."""
        while True:
            waiting = self.pending()
            timeout = None
            if waiting:
                timeout = max(0.0, min(side.outgoing[0][0] for side in waiting) - time.monotonic())
            for key, events in self.selector.select(timeout):
                if key.data == "control":
                    if not self.control():
                        return
                elif isinstance(key.data, tuple):
                    self.accept(key.fileobj, key.data[1])  # type: ignore[arg-type]  # a listener socket
                else:
                    side: _Side = key.data
                    if events & selectors.EVENT_READ:
                        self.read(side)
                    if events & selectors.EVENT_WRITE:
                        self.flush(side)
            for side in self.pending():
                self.flush(side)


def main() -> None:
    """Run the relay on this process's stdin and stdout."""
    Relay().run()


if __name__ == "__main__":
    main()
