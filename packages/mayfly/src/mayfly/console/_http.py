"""A small HTTP/1.1 server on the hub's fd readiness, calling a WSGI application (PEP 3333).

No asyncio, no thread per connection: the listening socket and every
connection are non-blocking and park on the hub (:func:`~mayfly.substrate.wait_readable`,
:func:`~mayfly.substrate.wait_writable`); each connection is one hub task.
Requests are bounded (header bytes, body bytes, time to arrive), answered
with 400, 405, 408, 413, 431 or 501 when they are malformed or too large, and
a connection is kept alive between requests unless the client asks to close.
"""

from __future__ import annotations

import contextlib
import errno
import io
import socket
import sys
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any, Final, final
from urllib.parse import unquote

from mayfly.model.errors import TaskCancelled, WaitTimeout
from mayfly.substrate import Task, sleep, spawn, wait_readable, wait_writable

__all__ = ["MAX_BODY_BYTES", "MAX_HEADER_BYTES", "HttpServer", "WsgiApp"]

WsgiApp = Callable[[dict[str, Any], Callable[..., Callable[[bytes], object]]], Iterable[bytes]]
"""A PEP 3333 application."""

MAX_HEADER_BYTES: Final = 16 * 1024
"""The longest request line plus headers accepted (431 beyond)."""

MAX_BODY_BYTES: Final = 64 * 1024
"""The largest request body accepted (413 beyond): the console's forms are small."""

_READ_CHUNK: Final = 16 * 1024
_METHODS: Final = frozenset({"GET", "HEAD", "POST"})


class _BadRequest(Exception):
    """A request the server refuses before the application sees it."""

    def __init__(self, status: HTTPStatus, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


class _Closed(Exception):
    """The peer closed the connection (or it failed) between or during requests."""


@final
class _Connection:
    """One client connection: buffered non-blocking reads and writes that park on the hub."""

    __slots__ = ("_buffer", "_sock", "_timeout")

    def __init__(self, sock: socket.socket, timeout: float) -> None:
        self._sock = sock
        self._timeout = timeout
        self._buffer = bytearray()

    def _fill(self) -> None:
        while True:
            try:
                chunk = self._sock.recv(_READ_CHUNK)
            except (BlockingIOError, InterruptedError):
                wait_readable(self._sock, timeout=self._timeout)
                continue
            except OSError as exc:
                raise _Closed(str(exc)) from None
            if not chunk:
                raise _Closed("peer closed the connection")
            self._buffer += chunk
            return

    def read_head(self) -> bytes:
        """The request line and headers (without the blank line); ``_Closed`` on a clean close."""
        while True:
            end = self._buffer.find(b"\r\n\r\n", 0, MAX_HEADER_BYTES + 4)
            if end >= 0:
                head = bytes(self._buffer[:end])
                del self._buffer[: end + 4]
                return head
            if len(self._buffer) >= MAX_HEADER_BYTES + 4:
                raise _BadRequest(
                    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                    f"request headers exceed {MAX_HEADER_BYTES} bytes",
                )
            self._fill()

    def read_body(self, length: int) -> bytes:
        """Exactly ``length`` body bytes."""
        while len(self._buffer) < length:
            self._fill()
        body = bytes(self._buffer[:length])
        del self._buffer[:length]
        return body

    def send(self, data: bytes) -> None:
        """Write all of ``data``, parking while the socket's buffer is full."""
        view = memoryview(data)
        while view:
            try:
                sent = self._sock.send(view)
            except (BlockingIOError, InterruptedError):
                wait_writable(self._sock, timeout=self._timeout)
                continue
            except OSError as exc:
                raise _Closed(str(exc)) from None
            view = view[sent:]


def _parse_head(head: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
    try:
        text = head.decode("iso-8859-1")
    except UnicodeDecodeError:  # pragma: no cover - iso-8859-1 decodes every byte
        raise _BadRequest(HTTPStatus.BAD_REQUEST, "undecodable request head") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1]:
        raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed request line")
    method, target, version = parts
    if not method.isalpha() or not method.isupper():
        raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed request method")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or " " in name:
            raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed header line")
        headers.append((name.lower(), value.strip()))
    return method, target, version, headers


@final
class HttpServer:
    """Serve a WSGI application on ``host:port`` from hub tasks; bind in the constructor.

    ``port=0`` binds a free port (read it from :attr:`port`). :meth:`serve`
    runs the accept loop on the current hub until its task is cancelled or
    :meth:`close` is called; each connection is a task of that hub, idle
    ones closed after ``timeout`` seconds. ``log`` is told one line per
    request answered (peer, request line, status, bytes, milliseconds).
    """

    def __init__(
        self,
        app: WsgiApp,
        host: str = "127.0.0.1",
        port: int = 8080,
        *,
        timeout: float = 15.0,
        max_connections: int = 64,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self._app = app
        self._timeout = timeout
        self._max_connections = max_connections
        self._log = log
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(128)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self.host: str = host
        self.port: int = listener.getsockname()[1]
        self._tasks: dict[Task[None], socket.socket] = {}

    @property
    def url(self) -> str:
        """The base URL the server answers on."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def serve(self) -> None:
        """Accept connections and serve each in its own hub task (call from a hub task)."""
        try:
            while True:
                try:
                    sock, address = self._listener.accept()
                except (BlockingIOError, InterruptedError):
                    wait_readable(self._listener)
                    continue
                except OSError as exc:
                    if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                        sleep(0.1)  # out of descriptors: let connections finish, then accept again
                        continue
                    raise
                sock.setblocking(False)
                if len(self._tasks) >= self._max_connections:
                    with contextlib.suppress(OSError):
                        sock.send(_simple(HTTPStatus.SERVICE_UNAVAILABLE, "too many connections"))
                    sock.close()
                    continue
                peer = address[0] if isinstance(address, tuple) else str(address)
                task = spawn(self._connection, sock, peer, name=f"console connection {peer}")
                self._tasks[task] = sock
        finally:
            self.close()

    def close(self) -> None:
        """Stop listening and close every open connection (their tasks end at their next wait)."""
        with contextlib.suppress(OSError):
            self._listener.close()
        for task, sock in list(self._tasks.items()):
            if not task.done:
                task.cancel("console server closed")
            with contextlib.suppress(OSError):
                sock.close()

    # -- one connection ----------------------------------------------------------------

    def _connection(self, sock: socket.socket, peer: str) -> None:
        conn = _Connection(sock, self._timeout)
        try:
            keep_alive = True
            while keep_alive:
                keep_alive = self._one_request(conn, peer)
        except (_Closed, WaitTimeout):
            pass
        except TaskCancelled:
            raise
        finally:
            with contextlib.suppress(OSError):
                sock.close()
            for task, known in list(self._tasks.items()):
                if known is sock:
                    del self._tasks[task]

    def _one_request(self, conn: _Connection, peer: str) -> bool:
        try:
            head = conn.read_head()
        except _BadRequest as exc:
            conn.send(_simple(exc.status, exc.detail))
            return False
        try:
            method, target, version, headers = _parse_head(head)
            found = dict(headers)
            if "transfer-encoding" in found:
                raise _BadRequest(HTTPStatus.NOT_IMPLEMENTED, "chunked request bodies are not accepted")
            length_text = found.get("content-length", "0")
            if not length_text.isdigit():
                raise _BadRequest(HTTPStatus.BAD_REQUEST, "malformed Content-Length")
            length = int(length_text)
            if length > MAX_BODY_BYTES:
                raise _BadRequest(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body exceeds {MAX_BODY_BYTES} bytes"
                )
            if method not in _METHODS:
                raise _BadRequest(HTTPStatus.METHOD_NOT_ALLOWED, f"method {method} is not allowed")
            body = conn.read_body(length)
        except _BadRequest as exc:
            conn.send(_simple(exc.status, exc.detail, allow=exc.status is HTTPStatus.METHOD_NOT_ALLOWED))
            return False
        connection = found.get("connection", "").lower()
        keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        environ = self._environ(method, target, version, headers, body, peer)
        started = time.perf_counter()
        status, response_headers, payload = _call(self._app, environ)
        if self._log is not None:
            took = (time.perf_counter() - started) * 1000
            self._log(
                f'{peer} "{method} {target[:200]}" {status.partition(" ")[0]} {len(payload)} {took:.1f}ms'
            )
        names = {name.lower() for name, _ in response_headers}
        if "content-length" not in names:
            response_headers.append(("Content-Length", str(len(payload))))
        response_headers.append(("Connection", "keep-alive" if keep_alive else "close"))
        lines = [f"HTTP/1.1 {status}"] + [f"{name}: {value}" for name, value in response_headers]
        head_bytes = ("\r\n".join(lines) + "\r\n\r\n").encode("iso-8859-1")
        conn.send(head_bytes if method == "HEAD" else head_bytes + payload)
        return keep_alive

    def _environ(  # noqa: PLR0917  # the parts of one parsed request
        self, method: str, target: str, version: str, headers: list[tuple[str, str]], body: bytes, peer: str
    ) -> dict[str, Any]:
        path, _, query = target.partition("?")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": method,
            "SCRIPT_NAME": "",
            "PATH_INFO": unquote(path, encoding="iso-8859-1"),
            "QUERY_STRING": query,
            "SERVER_NAME": self.host,
            "SERVER_PORT": str(self.port),
            "SERVER_PROTOCOL": version,
            "REMOTE_ADDR": peer,
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": False,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
            "CONTENT_LENGTH": str(len(body)) if body else "",
        }
        for name, value in headers:
            if name == "content-type":
                environ["CONTENT_TYPE"] = value
            elif name != "content-length":
                key = "HTTP_" + name.upper().replace("-", "_")
                environ[key] = f"{environ[key]},{value}" if key in environ else value
        return environ


def _call(app: WsgiApp, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
    """Run the application; a failure inside it is a 500 (with nothing of the request echoed)."""
    started: list[tuple[str, list[tuple[str, str]]]] = []
    written: list[bytes] = []

    def start_response(
        status: str, headers: list[tuple[str, str]], exc_info: object = None
    ) -> Callable[[bytes], object]:
        if started and exc_info is None:
            raise AssertionError("start_response called twice without exc_info")
        started[:] = [(status, list(headers))]
        return written.append

    try:
        result = app(environ, start_response)
        try:
            written.extend(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
    except TaskCancelled:
        raise
    except Exception as exc:  # the application failed: answer 500 and keep serving others
        environ["wsgi.errors"].write(
            f"mayfly ui: error serving {environ['PATH_INFO']}: {type(exc).__name__}: {exc}\n"
        )
        message = "internal error; the console's standard error says why"
        return "500 Internal Server Error", [("Content-Type", "text/plain; charset=utf-8")], message.encode()
    if not started:
        return "500 Internal Server Error", [("Content-Type", "text/plain; charset=utf-8")], b"no response"
    status, headers = started[0]
    return status, headers, b"".join(written)


def _simple(status: HTTPStatus, detail: str, *, allow: bool = False) -> bytes:
    body = f"{status.value} {status.phrase}: {detail}\n".encode()
    extra = "Allow: GET, HEAD, POST\r\n" if allow else ""
    return (
        f"HTTP/1.1 {status.value} {status.phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
    ).encode() + body
