"""A loopback TCP proxy (its own process, one selector loop) that cuts one connection on a marker.

Usage: python dropproxy.py UPSTREAM_HOST UPSTREAM_PORT MARKER MODE

Prints ``port N`` once listening. Relays every connection to the upstream
server. The first time client-to-server bytes contain MARKER, it cuts that
connection, once, then prints ``dropped``:

- ``before``: the chunk holding MARKER is never forwarded (nothing reaches the server);
- ``after``: the chunk is forwarded, the server's reply is awaited and thrown
  away, then both sockets close: the server finished the statement (and its
  commit) but the client never hears of it.
"""

from __future__ import annotations

import selectors
import socket
import sys


def main() -> None:
    """Run the proxy until killed."""
    host, port, marker, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), sys.argv[4]
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    peers: dict[socket.socket, tuple[socket.socket, bool]] = {}  # socket -> (its peer, is client side)
    armed = True
    sys.stdout.write(f"port {listener.getsockname()[1]}\n")
    sys.stdout.flush()

    def close(sock: socket.socket) -> None:
        for side in (sock, peers.get(sock, (None, False))[0]):
            if side is not None and side in peers:
                selector.unregister(side)
                del peers[side]
                side.close()

    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                client, _ = listener.accept()
                upstream = socket.create_connection((host, port))
                for sock in (client, upstream):
                    sock.setblocking(True)
                    selector.register(sock, selectors.EVENT_READ, None)
                peers[client] = (upstream, True)
                peers[upstream] = (client, False)
                continue
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if sock not in peers:
                continue
            peer, from_client = peers[sock]
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                close(sock)
                continue
            if armed and from_client and marker in data:
                armed = False
                if mode == "after":
                    peer.sendall(data)
                    peer.settimeout(30)
                    peer.recv(65536)  # the server has executed (and committed) the statement
                close(sock)
                sys.stdout.write("dropped\n")
                sys.stdout.flush()
                continue
            peer.sendall(data)


if __name__ == "__main__":
    main()
