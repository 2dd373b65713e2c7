"""``mayfly ui``: a read-only web console over a journal, served from the hub.

:class:`Console` is the WSGI application (runs, one run's graph and
attempts, its timeline, workers and queues, ``/metrics``), and
:class:`HttpServer` a small HTTP/1.1 server whose sockets park on the hub
(no asyncio, no thread per connection). :func:`serve` runs both on a hub
until SIGTERM or SIGINT. Nothing a handler put in a run (input, outputs,
signal decisions, tokens) ever reaches a page.
"""

from mayfly.console._graph import STATE_COLOURS, StateColour, render_graph
from mayfly.console._http import MAX_BODY_BYTES, MAX_HEADER_BYTES, HttpServer
from mayfly.console._serve import serve
from mayfly.console._web import Console

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_HEADER_BYTES",
    "STATE_COLOURS",
    "Console",
    "HttpServer",
    "StateColour",
    "render_graph",
    "serve",
]
