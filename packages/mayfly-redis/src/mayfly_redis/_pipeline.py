"""Pipelining: the commands hub tasks send to one server at the same time share one round trip.

When many runs on one worker append at once, each task's script would be a
round trip of its own. A :class:`Pipeline` (one per server and hub thread)
queues every command sent while a flush is in flight; the task that finds no
flush in flight leads: it writes the whole queue on one connection and reads
the replies in order, handing each to the task that sent that command (which
parks on a hub :class:`~mayfly.substrate.Event` meanwhile). So the first
command goes out at once, alone, and the ones that arrive while it is in
flight go out together next: nothing waits for a batch to fill.

Each task gets exactly its own command's reply: an acknowledgement is its own
script's ``ok``, which Redis sends only after the write is in the AOF and,
with ``appendfsync always``, fsynced (Redis fsyncs before it replies to the
batch it executed). A refusal or an error reply concerns its command only; a
broken connection is retried once on a new one for the commands not yet
answered (scripts are safe to send again: an applied append answers as an
exact replay), then fails each of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, final

import redis.exceptions as driver

from mayfly.substrate import Event

__all__ = ["Pipeline"]


@final
class _Command:
    __slots__ = ("answered", "error", "event", "lead", "packed", "replies")

    def __init__(self, packed: list[bytes]) -> None:
        self.packed = packed
        self.replies: list[Any] = []  # a reply or the ResponseError of each packed command
        self.error: BaseException | None = None
        self.answered = False
        self.lead = False
        self.event: Event | None = None

    def results(self) -> list[Any]:
        if self.error is not None:
            raise self.error
        return self.replies


@final
class Pipeline:
    """The commands of one hub thread's tasks to one server, flushed together on one connection.

    ``connect`` makes a new connected redis-py connection (of the store's
    class, so a reconnection re-verifies AOF).
    """

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._connection: Any = None
        self._queue: list[_Command] = []
        self._busy = False
        self.flushes = 0
        """Round trips made (for benchmarks)."""
        self.commands = 0
        """Commands sent (for benchmarks)."""

    def call(self, packed: bytes) -> Any:
        """Send one packed command with whatever else is waiting; return its reply or raise its error."""
        (reply,) = self.call_many([packed])
        if isinstance(reply, driver.ResponseError):
            raise reply
        return reply

    def call_many(self, packed: list[bytes]) -> list[Any]:
        """Send packed commands together, with whatever else is waiting; each one's reply or error reply.

        A broken connection raises (for all of them), as for :meth:`call`.
        """
        command = _Command(packed)
        self._queue.append(command)
        if self._busy:
            event = command.event = Event()
            try:
                event.wait()
            except BaseException:
                # Cancelled: a command not sent yet is never sent; if it was its turn to lead, the
                # turn passes on (one already sent is answered to no one).
                if not command.answered and command in self._queue:
                    self._queue.remove(command)
                    if command.lead:
                        self._hand_off()
                raise
            if not command.lead:
                return command.results()
        self._busy = True
        try:
            while not command.answered:
                batch, self._queue = self._queue, []
                self._flush(batch)
        finally:
            self._hand_off()
        return command.results()

    def _hand_off(self) -> None:
        """The next queued command's task leads the next flush; no flush is in flight if none is queued."""
        while self._queue:
            successor = self._queue[0]
            if successor.event is not None:
                successor.lead = True
                successor.event.set()
                return
            self._queue.pop(0)  # cannot happen: queued while busy means an event; never strand one
        self._busy = False

    def _flush(self, batch: list[_Command]) -> None:
        self.flushes += 1
        self.commands += len(batch)
        pending = batch
        for attempt in (0, 1):
            try:
                self._exchange(pending)
                return
            except (driver.ConnectionError, driver.TimeoutError) as error:
                self._drop()
                pending = [command for command in pending if not command.answered]
                if attempt == 1:
                    self._answer_all(pending, error)
            except BaseException as error:  # cancelled mid-exchange: the connection is out of step
                self._drop()
                failure = driver.ConnectionError(f"pipeline flush interrupted ({type(error).__name__})")
                self._answer_all([command for command in pending if not command.answered], failure)
                raise

    def _exchange(self, batch: list[_Command]) -> None:
        if self._connection is None:
            self._connection = self._connect()
        connection = self._connection
        connection.send_packed_command(
            [part for command in batch for part in command.packed], check_health=False
        )
        for command in batch:
            replies: list[Any] = []
            for _ in command.packed:
                try:
                    replies.append(connection.read_response())
                except driver.ResponseError as error:  # this command's error reply; the stream stays in step
                    replies.append(error)
            command.replies = replies
            command.answered = True
            if command.event is not None:
                command.event.set()

    @staticmethod
    def _answer_all(commands: list[_Command], error: BaseException) -> None:
        for command in commands:
            command.error = error
            command.answered = True
            if command.event is not None:
                command.event.set()

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.disconnect()
            self._connection = None

    def close(self) -> None:
        """Close the connection (commands still queued are answered by their leader's flush)."""
        self._drop()
