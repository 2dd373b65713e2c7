"""A loopback TCP fault proxy in its own process, for PostgreSQL and Redis (``python -m ...sim._netproxy``).

Usage::

    python -m mayfly_contract.sim._netproxy --target HOST:PORT --control PATH \
        [--listen 127.0.0.1:0] [--seed S]

It listens on ``--listen`` (port 0: a free one), prints ``listening PORT`` on
stdout once ready, and relays every connection to ``--target``. The test
process steers it through the Unix socket ``--control``, one command line in,
one answer line out (:class:`NetProxy` is the client):

* ``delay MS [JITTER_MS]``: hold every later chunk, both ways, ``MS`` plus a
  seeded uniform ``0..JITTER_MS`` milliseconds (order is kept);
* ``drop``: a blackhole: stop forwarding both ways, keep every socket open
  (what is sent waits, as in a partition; ``heal`` delivers it);
* ``cut``: reset every open connection now;
* ``cut-mid-commit [HEX]``: forward the client's next chunk (the next one
  holding the bytes ``HEX``, if given) to the server, then reset that
  connection as soon as the server answers, throwing the answer away: the
  server did the write, the client never hears of it (an ambiguous commit);
* ``refuse``: reset new connections as soon as they are accepted;
* ``heal``: no delay, no drop, no refusal, no armed cut;
* ``stats``: ``stats key=value ...`` (connections, open, up, down, cuts,
  ambiguous, refused);
* ``quit``: close everything and exit.

An unknown command answers ``error ...`` and changes nothing. The proxy's
only randomness is the delay jitter, drawn from ``--seed``: the caller seeds
which faults happen and when. One thread, one ``selectors`` loop.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import random
import selectors
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, final
from urllib.parse import urlsplit

_CHUNK: Final = 1 << 16
_MAIN: Final = "import sys; from mayfly_contract.sim._netproxy import main; sys.exit(main())"
_UNIX_PATH_MAX: Final = 100
_UNANSWERED_S: Final = 5.0  # a doomed connection whose server stays silent this long is cut anyway


@dataclass(eq=False)
class _Side:
    """One socket of a relayed connection and the chunks waiting to be written to it."""

    sock: socket.socket
    is_server: bool  # this socket is the server connection
    outgoing: collections.deque[tuple[float, bytes]] = field(default_factory=collections.deque)
    peer: _Side | None = None
    pair: _Pair | None = None


@dataclass(eq=False)
class _Pair:
    """A client connection and its server connection."""

    client: _Side
    server: _Side
    doomed_at: float | None = None  # the client's write went through; cut at the server's answer
    closed: bool = False


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), not an orderly FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _Proxy:
    """The proxy's state: the listener, the control socket, the relayed pairs and the active faults."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int], control: str, seed: int) -> None:
        self.target = target
        self.random = random.Random(seed)
        self.selector = selectors.DefaultSelector()
        self.listener = socket.create_server(listen, backlog=128)
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, "listener")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(control)
        self.control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.control.bind(control)
        self.control.listen(8)
        self.control.setblocking(False)
        self.selector.register(self.control, selectors.EVENT_READ, "control")
        self.controllers: dict[socket.socket, bytes] = {}
        self.pairs: list[_Pair] = []
        self.delay = 0.0
        self.jitter = 0.0
        self.dropped = False
        self.refusing = False
        self.armed: bytes | None = None  # the marker of an armed cut-mid-commit (b"": any chunk)
        self.counts = collections.Counter[str]()
        self.running = True

    @property
    def port(self) -> int:
        port: int = self.listener.getsockname()[1]
        return port

    # -- connections ---------------------------------------------------------------------------------

    def accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        self.counts["connections"] += 1
        if self.refusing:
            self.counts["refused"] += 1
            _reset(client)
            return
        try:
            server = socket.create_connection(self.target, timeout=5)
        except OSError:
            self.counts["upstream_down"] += 1
            _reset(client)
            return
        for sock in (client, server):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pair = _Pair(_Side(client, is_server=False), _Side(server, is_server=True))
        pair.client.peer, pair.server.peer = pair.server, pair.client
        pair.client.pair = pair.server.pair = pair
        self.pairs.append(pair)
        for side in (pair.client, pair.server):
            self.selector.register(side.sock, selectors.EVENT_READ, side)

    def close(self, pair: _Pair) -> None:
        if pair.closed:
            return
        pair.closed = True
        for side in (pair.client, pair.server):
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(side.sock)
            side.outgoing.clear()
            _reset(side.sock)
        self.pairs.remove(pair)

    def read(self, side: _Side) -> None:
        pair, peer = side.pair, side.peer
        assert pair is not None and peer is not None
        try:
            data = side.sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.close(pair)
            return
        if side.is_server and pair.doomed_at is not None:
            # The server answered the doomed write: it has done it; the client never hears of it.
            self.counts["ambiguous"] += 1
            self.close(pair)
            return
        self.counts["down" if side.is_server else "up"] += len(data)
        if side.is_server or self.armed is None or (self.armed and self.armed not in data):
            self.queue(peer, data)
            return
        # An armed cut-mid-commit: this client chunk reaches the server, its answer never comes back.
        self.armed = None
        pair.doomed_at = time.monotonic()
        self.queue(peer, data, immediate=True)

    def queue(self, side: _Side, data: bytes, *, immediate: bool = False) -> None:
        due = time.monotonic()
        if not immediate and (self.delay or self.jitter):
            due += self.delay + self.random.uniform(0.0, self.jitter)
        if side.outgoing:
            due = max(due, side.outgoing[-1][0])
        side.outgoing.append((due, data))
        self.flush(side)

    def flush(self, side: _Side) -> None:
        pair = side.pair
        assert pair is not None
        if pair.closed or self.dropped:
            return
        now = time.monotonic()
        while side.outgoing and side.outgoing[0][0] <= now:
            due, data = side.outgoing[0]
            try:
                sent = side.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.close(pair)
                return
            if sent < len(data):
                side.outgoing[0] = (due, data[sent:])
                break
            side.outgoing.popleft()

    def interest(self, side: _Side) -> None:
        """Watch a socket for what it can do now: nothing while dropped; writes while a due chunk waits."""
        pair = side.pair
        assert pair is not None
        if pair.closed:
            return
        mask = 0
        if not self.dropped:
            mask = selectors.EVENT_READ
            if side.outgoing and side.outgoing[0][0] <= time.monotonic():
                mask |= selectors.EVENT_WRITE
        key = self.selector.get_map().get(side.sock)
        if key is None and mask:
            self.selector.register(side.sock, mask, side)
        elif key is not None and not mask:
            self.selector.unregister(side.sock)
        elif key is not None and key.events != mask:
            self.selector.modify(side.sock, mask, side)

    # -- control ----------------------------------------------------------------------------------

    def command(self, line: str) -> str:
        words = line.split()
        verb, arguments = (words[0], words[1:]) if words else ("", [])
        try:
            if verb == "delay" and 1 <= len(arguments) <= 2:
                delay, jitter = int(arguments[0]), int(arguments[1]) if len(arguments) == 2 else 0
                if delay < 0 or jitter < 0:
                    return "error delay and jitter must be >= 0 ms"
                self.delay, self.jitter = delay / 1000, jitter / 1000
            elif verb == "drop" and not arguments:
                self.dropped = True
            elif verb == "cut" and not arguments:
                for pair in list(self.pairs):
                    self.counts["cuts"] += 1
                    self.close(pair)
            elif verb == "cut-mid-commit" and len(arguments) <= 1:
                self.armed = bytes.fromhex(arguments[0]) if arguments else b""
            elif verb == "refuse" and not arguments:
                self.refusing = True
            elif verb == "heal" and not arguments:
                self.delay = self.jitter = 0.0
                self.dropped = self.refusing = False
                self.armed = None
            elif verb == "stats" and not arguments:
                self.counts["open"] = len(self.pairs)
                keys = ("connections", "open", "up", "down", "cuts", "ambiguous", "refused", "upstream_down")
                return "stats " + " ".join(f"{key}={self.counts[key]}" for key in keys)
            elif verb == "quit" and not arguments:
                self.running = False
            else:
                return f"error unknown command {line!r}; see python -m mayfly_contract.sim._netproxy --help"
        except ValueError as error:
            return f"error {line!r}: {error}"
        return "ok"

    def serve_controller(self, controller: socket.socket) -> None:
        try:
            data = controller.recv(_CHUNK)
        except OSError:
            data = b""
        if not data:
            self.selector.unregister(controller)
            del self.controllers[controller]
            controller.close()
            return
        buffered = self.controllers[controller] + data
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            answer = self.command(line.decode(errors="replace").strip())
            controller.setblocking(True)
            with contextlib.suppress(OSError):
                controller.sendall(answer.encode() + b"\n")
            controller.setblocking(False)
        self.controllers[controller] = buffered

    # -- loop ----------------------------------------------------------------------------------------

    def timeout(self) -> float | None:
        """Seconds until the next delayed chunk falls due or a doomed connection's wait runs out."""
        now = time.monotonic()
        moments: list[float] = []
        for pair in self.pairs:
            if pair.doomed_at is not None:
                moments.append(pair.doomed_at + _UNANSWERED_S)
            if not self.dropped:
                moments.extend(side.outgoing[0][0] for side in (pair.client, pair.server) if side.outgoing)
        return max(0.0, min(moments) - now) if moments else None

    def run(self) -> None:
        sys.stdout.write(f"listening {self.port}\n")
        sys.stdout.flush()
        while self.running:
            for key, events in self.selector.select(self.timeout()):
                if key.data == "listener":
                    self.accept()
                elif key.data == "control":
                    controller, _ = self.control.accept()
                    controller.setblocking(False)
                    self.controllers[controller] = b""
                    self.selector.register(controller, selectors.EVENT_READ, "controller")
                elif key.data == "controller":
                    assert isinstance(key.fileobj, socket.socket)
                    self.serve_controller(key.fileobj)
                else:
                    side: _Side = key.data
                    if events & selectors.EVENT_READ:
                        self.read(side)
                    if events & selectors.EVENT_WRITE:
                        self.flush(side)
            now = time.monotonic()
            for pair in list(self.pairs):
                if pair.doomed_at is not None and now - pair.doomed_at > _UNANSWERED_S:
                    self.counts["cuts"] += 1
                    self.close(pair)
                    continue
                for side in (pair.client, pair.server):
                    self.flush(side)
                    self.interest(side)
        for pair in list(self.pairs):
            self.close(pair)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    """Run the proxy until ``quit`` or a signal."""
    parser = argparse.ArgumentParser(
        prog="python -m mayfly_contract.sim._netproxy", description=__doc__.split("\n\n", 1)[0]
    )
    parser.add_argument("--target", type=_address, required=True, help="HOST:PORT of the real server")
    parser.add_argument("--control", required=True, help="path of the Unix control socket to create")
    parser.add_argument("--listen", type=_address, default=("127.0.0.1", 0), help="default 127.0.0.1:0")
    parser.add_argument("--seed", type=int, default=0, help="seed of the delay jitter")
    arguments = parser.parse_args(argv)
    proxy = _Proxy(arguments.listen, arguments.target, arguments.control, arguments.seed)
    try:
        proxy.run()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(arguments.control)
    return 0


@final
class NetProxy:
    """The fault proxy in a subprocess in front of ``target`` (``HOST:PORT``), and its controls.

    ``url(server_url)`` rewrites a server URL to go through the proxy. Every
    control call waits for the proxy's answer, so a fault is in force when the
    call returns.
    """

    def __init__(self, target: str, *, seed: int = 0, workdir: str | Path | None = None) -> None:
        self.target = target
        self._dir = Path(tempfile.mkdtemp(prefix="mfproxy-", dir=workdir))
        if len(str(self._dir / "control")) > _UNIX_PATH_MAX:
            self._dir.rmdir()  # a Unix socket's path is short (108 bytes): fall back to /tmp
            self._dir = Path(tempfile.mkdtemp(prefix="mfproxy-", dir="/tmp"))
        self.control_path = str(self._dir / "control")
        # Not ``-m``: the simulator package imports this module, and running it as __main__ too would warn.
        command = [sys.executable, "-c", _MAIN]
        self.process = subprocess.Popen(
            [*command, "--target", target, "--control", self.control_path, "--seed", str(seed)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().split()
        if line[:1] != ["listening"]:
            self.process.kill()
            raise RuntimeError(f"the fault proxy did not start (exit {self.process.wait()})")
        self.port = int(line[1])
        self._control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._control.connect(self.control_path)
        self._answers = self._control.makefile("r")

    def url(self, server_url: str) -> str:
        """``server_url`` with its host and port replaced by the proxy's."""
        parts = urlsplit(server_url)
        credentials = parts.netloc.rpartition("@")[0]
        netloc = (credentials + "@" if credentials else "") + f"127.0.0.1:{self.port}"
        return parts._replace(netloc=netloc).geturl()

    def send(self, line: str) -> str:
        """Send one command; its answer (raises on ``error``)."""
        self._control.sendall(line.encode() + b"\n")
        answer = self._answers.readline().strip()
        if not answer or answer.startswith("error"):
            raise RuntimeError(f"fault proxy: {line!r} -> {answer or 'no answer (proxy gone)'}")
        return answer

    def delay(self, ms: int, jitter_ms: int = 0) -> None:
        self.send(f"delay {ms} {jitter_ms}")

    def drop(self) -> None:
        self.send("drop")

    def cut(self) -> None:
        self.send("cut")

    def cut_mid_commit(self, marker: bytes = b"") -> None:
        self.send(f"cut-mid-commit {marker.hex()}" if marker else "cut-mid-commit")

    def refuse(self) -> None:
        self.send("refuse")

    def heal(self) -> None:
        self.send("heal")

    def stats(self) -> dict[str, int]:
        words = self.send("stats").split()[1:]
        return {key: int(value) for key, value in (word.split("=", 1) for word in words)}

    def wait_ambiguous(self, count: int, timeout: float) -> bool:
        """Whether ``count`` ambiguous cuts happened within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.stats()["ambiguous"] < count:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self) -> None:
        """Stop the proxy process and remove its control socket."""
        with contextlib.suppress(OSError, RuntimeError):
            self.send("quit")
        self._answers.close()
        self._control.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        with contextlib.suppress(OSError):
            os.unlink(self.control_path)
        with contextlib.suppress(OSError):
            self._dir.rmdir()

    def __enter__(self) -> NetProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(main())
