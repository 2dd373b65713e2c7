"""Cooperative sockets for redis-py: every wait on the network parks on the greenlet hub.

redis-py's sync client accepts a ``connection_class``. :class:`HubConnection`
hands the client a :class:`HubSocket`: a non-blocking socket whose ``recv``,
``recv_into``, ``sendall`` and ``connect`` retry after parking the current hub
task on :func:`mayfly.substrate.wait_readable` / ``wait_writable``. Outside a hub
(plain scripts, offload threads) the same socket waits with ``poll`` on the
calling thread instead. No monkeypatching, no asyncio.

Three waits redis-py would otherwise make behind our back, and how they are handled:

* DNS: ``getaddrinfo`` blocks. A numeric host is resolved in place
  (``AI_NUMERICHOST`` never touches the network); any other name goes through
  :func:`mayfly.substrate.offload` when a hub is running.
* The hiredis parser polls the raw descriptor itself (``select.poll`` in
  ``_socket_can_read``) and reads into its own buffer, outside the socket we
  hand out. We always install the pure-Python RESP2 parser, whose every read
  goes through :class:`HubSocket`, whether or not hiredis is installed.
* TLS: the handshake runs non-blocking, parking on the hub for each
  ``SSLWantRead``/``SSLWantWrite``, and reads of a TLS socket park the same way.
"""

from __future__ import annotations

import errno
import select
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

from redis._parsers import _RESP2Parser
from redis.connection import Connection, SSLConnection
from redis.exceptions import ConnectionError

from mayfly.errors import HubNotRunning, WaitTimeout
from mayfly.substrate import current_hub, offload, wait_readable, wait_writable

__all__ = [
    "AofPolicy",
    "DurabilityLost",
    "HubConnection",
    "HubSSLConnection",
    "HubSocket",
    "bound_to",
    "resolve",
]

T = TypeVar("T")

_READ: Final = select.POLLIN
_WRITE: Final = select.POLLOUT
_IN_PROGRESS: Final = frozenset({errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EALREADY, errno.EINTR})


def _on_hub() -> bool:
    try:
        current_hub()
    except HubNotRunning:
        return False
    return True


def resolve(host: str, port: int, family: int = 0, timeout: float | None = None) -> list[tuple[Any, ...]]:
    """Return ``getaddrinfo`` results for a TCP ``host:port`` without blocking the hub.

    On the hub a name lookup is offloaded and bounded by ``timeout`` seconds
    (``OffloadTimeout``, a ``TimeoutError``, which redis-py reports as a
    connect timeout). Off the hub the lookup blocks the calling thread, as the
    resolver's own timeouts allow.
    """
    try:
        return socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
    except socket.gaierror:
        pass  # a name, not a numeric address: a real lookup follows
    if _on_hub():
        return offload(socket.getaddrinfo, host, port, family, socket.SOCK_STREAM, timeout=timeout)
    return socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)


class HubSocket:
    """A non-blocking socket whose waits park the hub task (or poll the thread outside a hub).

    It offers the subset of the socket API redis-py's connections and the
    RESP2 parser use. ``settimeout`` sets the bound of each wait; ``0`` means
    "never wait", so a would-block raises ``BlockingIOError`` as on a real
    non-blocking socket (redis-py's ``can_read`` relies on that).
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._timeout: float | None = None

    @property
    def raw(self) -> socket.socket:
        """The underlying socket (non-blocking)."""
        return self._sock

    def fileno(self) -> int:
        """The socket's file descriptor."""
        return self._sock.fileno()

    def settimeout(self, timeout: float | None) -> None:
        """Bound every later wait by ``timeout`` seconds (``None``: unbounded, ``0``: never wait)."""
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        """The current wait bound."""
        return self._timeout

    def setsockopt(self, level: int, option: int, value: int | bytes) -> None:
        """Set a socket option on the underlying socket."""
        self._sock.setsockopt(level, option, value)

    def getpeername(self) -> Any:
        """The remote address."""
        return self._sock.getpeername()

    def shutdown(self, how: int) -> None:
        """Shut the connection down in direction ``how``."""
        self._sock.shutdown(how)

    def close(self) -> None:
        """Close the socket."""
        self._sock.close()

    def _deadline(self) -> float | None:
        return None if self._timeout is None else time.monotonic() + self._timeout

    def _wait(self, events: int, deadline: float | None) -> None:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if remaining == 0.0:
            raise TimeoutError("timed out")
        if _on_hub():
            try:
                if events == _READ:
                    wait_readable(self._sock, remaining)
                else:
                    wait_writable(self._sock, remaining)
            except WaitTimeout:
                raise TimeoutError("timed out") from None
            return
        poller = select.poll()
        poller.register(self._sock, events)
        if not poller.poll(None if remaining is None else max(1, int(remaining * 1000))):
            raise TimeoutError("timed out")

    def _io(self, call: Callable[[], T]) -> T:
        """Run a non-blocking ``call`` until it completes, waiting between attempts."""
        deadline: float | None = None
        started = False
        while True:
            try:
                return call()
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                events = _READ
            except ssl.SSLWantWriteError:
                events = _WRITE
            if self._timeout == 0:
                raise BlockingIOError(errno.EWOULDBLOCK, "operation would block")
            if not started:
                deadline, started = self._deadline(), True
            self._wait(events, deadline)

    def recv(self, size: int, flags: int = 0) -> bytes:
        """Receive up to ``size`` bytes, parking until some arrive."""
        return self._io(lambda: self._sock.recv(size, flags))

    def recv_into(self, buffer: Any, size: int = 0, flags: int = 0) -> int:
        """Receive into ``buffer``, parking until some bytes arrive."""
        return self._io(lambda: self._sock.recv_into(buffer, size, flags))

    def sendall(self, data: bytes | bytearray | memoryview) -> None:
        """Send every byte of ``data``, parking while the send buffer is full."""
        view = memoryview(data).cast("B")
        deadline = self._deadline()
        while view:
            try:
                sent = self._sock.send(view)
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                self._wait(_WRITE, deadline)
                continue
            except ssl.SSLWantReadError:
                self._wait(_READ, deadline)
                continue
            view = view[sent:]

    def connect(self, address: Any) -> None:
        """Connect to ``address``, parking until the TCP handshake completes."""
        code = self._sock.connect_ex(address)
        if code in _IN_PROGRESS:
            self._wait(_WRITE, self._deadline())
            code = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            raise OSError(code, f"connect to {address!r} failed: {errno.errorcode.get(code, code)}")

    def handshake(self) -> None:
        """Complete the TLS handshake of a wrapped socket, parking between steps."""
        assert isinstance(self._sock, ssl.SSLSocket)
        tls = self._sock
        self._io(tls.do_handshake)

    def pending(self) -> int:
        """Decrypted bytes buffered above the OS socket (TLS only; 0 otherwise)."""
        return self._sock.pending() if isinstance(self._sock, ssl.SSLSocket) else 0


def _open_socket(connection: Connection) -> HubSocket:
    """Connect a TCP :class:`HubSocket` to the connection's host and port, cooperatively."""
    error: OSError | None = None
    addresses = resolve(connection.host, connection.port, timeout=connection.socket_connect_timeout)
    for family, kind, proto, _name, address in addresses:
        raw = socket.socket(family, kind, proto)
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if connection.socket_keepalive:
                raw.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                for option, value in connection.socket_keepalive_options.items():
                    raw.setsockopt(socket.IPPROTO_TCP, option, value)
            sock = HubSocket(raw)
            sock.settimeout(connection.socket_connect_timeout)
            sock.connect(address)
            sock.settimeout(connection.socket_timeout)
            return sock
        except OSError as failure:
            error = failure
            raw.close()
    raise error if error is not None else OSError(f"no address found for {connection.host}")


class DurabilityLost(ConnectionError):
    """A (re)connected server no longer runs ``appendonly yes`` with ``appendfsync always``."""


def _config_value(connection: Connection, name: str) -> str:
    connection.send_command("CONFIG", "GET", name, check_health=False)  # type: ignore[no-untyped-call]
    reply = connection.read_response()
    items = [item.decode() if isinstance(item, bytes) else str(item) for item in reply]
    return dict(zip(items[0::2], items[1::2], strict=True)).get(name, "?")


def _check_aof(connection: Connection) -> None:
    """Refuse a connection whose server cannot fsync every append (it may have restarted otherwise)."""
    appendonly = _config_value(connection, "appendonly")
    appendfsync = _config_value(connection, "appendfsync")
    if appendonly != "yes" or appendfsync != "always":
        raise DurabilityLost(
            f"redis {connection.host}:{connection.port} now has appendonly {appendonly} and "
            f"appendfsync {appendfsync}"
        )


class AofPolicy:
    """Whether a store's connections must re-verify AOF ``always`` whenever they (re)connect."""

    __slots__ = ("required",)

    def __init__(self) -> None:
        self.required = False


class HubConnection(Connection):
    """A redis-py TCP connection whose socket parks on the hub; always the pure-Python parser.

    On a subclass made by :func:`bound_to` whose policy is ``required``, every
    (re)connection re-reads the server's AOF settings after its handshake, so a
    server restarted without ``appendfsync always`` is refused
    (``DurabilityLost``) instead of acknowledging appends.
    """

    aof_policy: AofPolicy | None = None

    def __init__(self, **kwargs: Any) -> None:
        kwargs["parser_class"] = _RESP2Parser
        kwargs["protocol"] = 2
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]  # redis-py leaves it untyped

    def _connect(self) -> Any:
        return _open_socket(self)

    def on_connect_check_health(self, check_health: bool = True) -> None:
        """Authenticate and select the database, then verify AOF if the store requires it."""
        super().on_connect_check_health(check_health)
        if self.aof_policy is not None and self.aof_policy.required:
            _check_aof(self)


class HubSSLConnection(SSLConnection):
    """A redis-py TLS connection: cooperative TCP connect, handshake and reads; AOF re-checked like TCP."""

    aof_policy: AofPolicy | None = None

    def __init__(self, **kwargs: Any) -> None:
        kwargs["parser_class"] = _RESP2Parser
        kwargs["protocol"] = 2
        super().__init__(**kwargs)

    def on_connect_check_health(self, check_health: bool = True) -> None:
        """Authenticate and select the database, then verify AOF if the store requires it."""
        super().on_connect_check_health(check_health)
        if self.aof_policy is not None and self.aof_policy.required:
            _check_aof(self)

    def _connect(self) -> Any:
        plain = _open_socket(self)
        try:
            context = ssl.create_default_context()
            context.check_hostname = bool(self.check_hostname)
            context.verify_mode = self.cert_reqs
            if self.certfile or self.keyfile:
                context.load_cert_chain(certfile=self.certfile, keyfile=self.keyfile)
            if self.ca_certs is not None or self.ca_path is not None or self.ca_data is not None:
                context.load_verify_locations(cafile=self.ca_certs, capath=self.ca_path, cadata=self.ca_data)
            wrapped = context.wrap_socket(plain.raw, server_hostname=self.host, do_handshake_on_connect=False)
        except (OSError, ValueError):
            plain.close()
            raise
        sock = HubSocket(wrapped)
        sock.settimeout(self.socket_connect_timeout)
        try:
            sock.handshake()
        except OSError:
            sock.close()
            raise
        sock.settimeout(self.socket_timeout)
        return sock


def bound_to(
    connection_class: type[HubConnection] | type[HubSSLConnection], policy: AofPolicy
) -> type[HubConnection] | type[HubSSLConnection]:
    """Return a subclass of ``connection_class`` whose connections all follow ``policy``.

    A class attribute reaches every connection of the store, those already
    pooled and those redis-py creates later (also for Cluster nodes found
    after a failover), which per-connection keyword arguments cannot.
    """
    return type(connection_class.__name__, (connection_class,), {"aof_policy": policy})
