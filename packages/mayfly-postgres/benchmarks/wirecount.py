"""A loopback TCP proxy (its own process, one selector loop) that counts PostgreSQL protocol traffic.

Usage: python wirecount.py UPSTREAM_HOST UPSTREAM_PORT

Prints ``port N`` once listening, then relays every connection to the
upstream server unchanged while parsing both directions of the frontend/backend
protocol (version 3; connect with ``sslmode=disable gssencmode=disable`` so
the stream stays readable). Each line ``snap`` on its standard input makes it
print one JSON object with the counts since the previous ``snap``, then
reset them:

- ``round_trips``: turns of a connection, each time the client sends after
  the server answered it (the client waited for the server in between);
- ``statements``: ``Execute`` messages plus simple ``Query`` messages, and
  ``by_sql``: the same counted by the statement's text (a prepared statement
  is named by the text of its ``Parse``);
- ``syncs``, ``flushes``: ``Sync`` and ``Flush`` messages;
- ``transactions``: ``ReadyForQuery`` messages reporting idle (each ends a
  transaction, implicit or explicit), and ``writing_transactions``: those that
  ran a statement whose text writes (``INSERT``, ``UPDATE``, ``DELETE``,
  ``pg_notify``, the claim function): the commits the server makes durable;
- ``connections``: startup messages (connections opened);
- ``notifications``: ``NotificationResponse`` messages delivered.

These counts do not depend on the machine's load, except where the client
itself decides by timing (how many appends one group commit carries).
"""

from __future__ import annotations

import json
import re
import selectors
import socket
import struct
import sys
from collections import Counter
from typing import Any

_WRITES = re.compile(r"\b(insert|update|delete|pg_notify|mayfly_claim)\b", re.IGNORECASE)
_SSL_REQUEST, _GSS_REQUEST, _CANCEL = 80877103, 80877104, 80877102


class Counts:
    """What the proxy counted since the last snapshot."""

    def __init__(self) -> None:
        self.round_trips = 0
        self.statements = 0
        self.syncs = 0
        self.flushes = 0
        self.transactions = 0
        self.writing_transactions = 0
        self.connections = 0
        self.notifications = 0
        self.by_sql: Counter[str] = Counter()

    def snapshot(self) -> dict[str, Any]:
        shown = {k: v for k, v in vars(self).items() if k != "by_sql"}
        shown["by_sql"] = dict(self.by_sql.most_common())
        return shown


class Connection:
    """One relayed connection: both byte streams and the protocol state parsed from them."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts
        self.client = b""
        self.server = b""
        self.typed_client = False
        self.server_bytes_expected = 0  # one-byte answers to SSL/GSS requests
        self.server_spoke = True  # the client's first send counts as a turn once ready
        self.ready = False
        self.prepared: dict[bytes, str] = {}
        self.portals: dict[bytes, str] = {}
        self.writes = False

    def from_client(self, data: bytes) -> None:
        if self.ready and self.server_spoke:
            self.counts.round_trips += 1
        self.server_spoke = False
        self.client += data
        while True:
            if not self.typed_client:
                if len(self.client) < 8:
                    return
                (length, code) = struct.unpack("!ii", self.client[:8])
                if len(self.client) < length:
                    return
                self.client = self.client[length:]
                if code in (_SSL_REQUEST, _GSS_REQUEST):
                    self.server_bytes_expected += 1
                elif code != _CANCEL:
                    self.typed_client = True
                    self.counts.connections += 1
                continue
            if len(self.client) < 5:
                return
            kind = self.client[:1]
            (length,) = struct.unpack("!i", self.client[1:5])
            if len(self.client) < 1 + length:
                return
            body, self.client = self.client[5 : 1 + length], self.client[1 + length :]
            self._client_message(kind, body)

    def _client_message(self, kind: bytes, body: bytes) -> None:
        counts = self.counts
        if kind == b"P":
            name, rest = body.split(b"\0", 1)
            query = rest.split(b"\0", 1)[0].decode("utf-8", "replace")
            self.prepared[name] = query
        elif kind == b"B":
            portal, statement, _ = body.split(b"\0", 2)
            self.portals[portal] = self.prepared.get(statement, "?")
        elif kind == b"E":
            portal = body.split(b"\0", 1)[0]
            self._statement(self.portals.get(portal, "?"))
        elif kind == b"Q":
            self._statement(body.split(b"\0", 1)[0].decode("utf-8", "replace"))
        elif kind == b"S":
            counts.syncs += 1
        elif kind == b"H":
            counts.flushes += 1

    def _statement(self, query: str) -> None:
        self.counts.statements += 1
        self.counts.by_sql[" ".join(query.split())] += 1
        if _WRITES.search(query):
            self.writes = True

    def from_server(self, data: bytes) -> None:
        self.server_spoke = True
        self.server += data
        while True:
            if self.server_bytes_expected:
                if not self.server:
                    return
                self.server = self.server[1:]
                self.server_bytes_expected -= 1
                continue
            if len(self.server) < 5:
                return
            kind = self.server[:1]
            (length,) = struct.unpack("!i", self.server[1:5])
            if len(self.server) < 1 + length:
                return
            body, self.server = self.server[5 : 1 + length], self.server[1 + length :]
            if kind == b"Z":
                self.ready = True
                if body[:1] == b"I":
                    self.counts.transactions += 1
                    if self.writes:
                        self.counts.writing_transactions += 1
                    self.writes = False
            elif kind == b"A":
                self.counts.notifications += 1


def main() -> None:
    """Relay and count until standard input closes."""
    host, port = sys.argv[1], int(sys.argv[2])
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "listen")
    selector.register(sys.stdin, selectors.EVENT_READ, "control")
    peers: dict[socket.socket, tuple[socket.socket, bool, Connection]] = {}
    counts = Counts()
    sys.stdout.write(f"port {listener.getsockname()[1]}\n")
    sys.stdout.flush()

    def close(sock: socket.socket) -> None:
        for side in (sock, peers.get(sock, (None, False, None))[0]):
            if side is not None and side in peers:
                selector.unregister(side)
                del peers[side]
                side.close()

    while True:
        for key, _ in selector.select():
            if key.data == "listen":
                client, _ = listener.accept()
                upstream = socket.create_connection((host, port))
                state = Connection(counts)
                for sock in (client, upstream):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    selector.register(sock, selectors.EVENT_READ, "relay")
                peers[client] = (upstream, True, state)
                peers[upstream] = (client, False, state)
                continue
            if key.data == "control":
                line = sys.stdin.readline()
                if not line:
                    return
                sys.stdout.write(json.dumps(counts.snapshot()) + "\n")
                sys.stdout.flush()
                fresh = Counts()
                counts.__dict__.update(fresh.__dict__)
                continue
            relayed = key.fileobj
            assert isinstance(relayed, socket.socket)
            if relayed not in peers:
                continue
            peer, from_client, state = peers[relayed]
            try:
                data = relayed.recv(262144)
            except OSError:
                data = b""
            if not data:
                close(relayed)
                continue
            if from_client:
                state.from_client(data)
            else:
                state.from_server(data)
            peer.sendall(data)


if __name__ == "__main__":
    main()
