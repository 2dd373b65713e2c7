"""Prompt wake-ups for idle workers: a pub/sub channel per database and prefix.

Whoever makes a run claimable now publishes on ``P:wakeups:<db>`` (pub/sub
channels are server-wide, so the name carries the database; a Cluster forwards
every message to every node, so a listener there subscribes on any primary): the append and
index scripts when a run enters its queue's ready set (a new run, a wake),
and :meth:`~mayfly_redis.RedisJournal.notify_wakeups` (a released run). An
idle worker subscribes on a connection of its own and waits on its socket on
the hub. Nothing here is needed for correctness, only for latency: a worker
that misses a message finds the run at its next poll.
"""

from __future__ import annotations

import ssl
from typing import Any, final

from mayfly_redis._client import RedisStore

__all__ = ["RedisWakeupListener"]

_CHUNK = 65536


@final
class RedisWakeupListener:
    """One worker's subscription: readable when a run became claimable; :meth:`drain` it, :meth:`close` it.

    The messages themselves carry nothing, so :meth:`drain` reads and drops
    whatever bytes arrived without parsing them. A connection the server
    closed is subscribed again; if that fails, ``JournalUnavailable`` says so.
    """

    def __init__(self, store: RedisStore, channel: str) -> None:
        self._store = store
        self._channel = channel
        self._connection: Any = None
        self._subscribe()

    def _subscribe(self) -> None:
        with self._store.errors(f"subscribe to wake-ups ({self._channel})"):
            connection = self._store.dedicated_connection()
            try:
                connection.send_command("SUBSCRIBE", self._channel)
                connection.read_response()
            except BaseException:
                connection.disconnect()
                raise
        self._connection = connection

    def fileno(self) -> int:
        """The subscription socket's descriptor, to wait on for readability."""
        return int(self._connection._sock.fileno())

    def drain(self) -> None:
        """Consume every pending wake-up, without waiting; listen again if the server hung up."""
        raw = self._connection._sock.raw
        while True:
            try:
                data = raw.recv(_CHUNK)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except OSError:
                data = b""
            if not data:  # end of stream: the server restarted or dropped us
                self._connection.disconnect()
                self._subscribe()
                return

    def close(self) -> None:
        """Stop listening (closes the dedicated connection)."""
        if self._connection is not None:
            self._connection.disconnect()
