"""Park/wake primitives built on the hub: :class:`Event` and a FIFO :class:`Channel`.

These are hub-thread objects: set, send, wait and receive only from tasks of
the hub that runs on this thread (an offloaded function must return its value
instead of touching them). A waiter that times out or is cancelled removes
itself, so waiting in a loop never grows them.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Generic, TypeVar, final

from mayfly.model.errors import WaitTimeout
from mayfly.substrate._hub import _TIMED_OUT, Task, _running

__all__ = ["Channel", "Event"]

T = TypeVar("T")


@final
class Event:
    """A flag tasks can wait on: ``set`` wakes every waiter, in the order they started waiting."""

    __slots__ = ("_flag", "_waiters")

    def __init__(self) -> None:
        self._flag = False
        self._waiters: dict[Task[Any], int] = {}

    def is_set(self) -> bool:
        """Whether the event is set."""
        return self._flag

    def set(self) -> None:
        """Set the event and wake every task waiting on it (they run in FIFO order)."""
        if self._flag:
            return
        self._flag = True
        waiters, self._waiters = self._waiters, {}
        for task, token in waiters.items():
            task._hub._wake(task, token, None)

    def clear(self) -> None:
        """Reset the event so later ``wait`` calls park again."""
        self._flag = False

    def wait(self, timeout: float | None = None) -> None:
        """Park until the event is set; ``WaitTimeout`` if not set within ``timeout`` seconds."""
        if self._flag:
            return
        hub = _running("Event.wait")
        task = hub._caller("Event.wait")
        deadline = hub._deadline(timeout)
        token = hub._arm(task)
        self._waiters[task] = token
        try:
            value = hub._suspend(task, token, deadline)
        finally:
            if self._waiters.get(task) == token:
                del self._waiters[task]
        if value is _TIMED_OUT:
            raise WaitTimeout(f"event was not set within {timeout} s (task {task.name!r})")

    def __repr__(self) -> str:
        return f"<Event set={self._flag} waiters={len(self._waiters)}>"


@final
class Channel(Generic[T]):
    """An unbounded FIFO queue between tasks: ``send`` never parks, ``receive`` parks until an item.

    Items go to receivers in the order they started waiting. To wait for
    whichever of many tasks finishes first, spawn them with ``notify=channel``
    and ``receive()`` the finished :class:`Task`.
    """

    __slots__ = ("_items", "_receivers")

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._receivers: dict[Task[Any], int] = {}

    def __len__(self) -> int:
        """Return how many items are buffered (not yet received)."""
        return len(self._items)

    def send(self, item: T) -> None:
        """Hand ``item`` to the longest-waiting receiver, or buffer it if nobody waits."""
        receivers = self._receivers
        while receivers:
            task = next(iter(receivers))
            token = receivers.pop(task)
            if task._hub._wake(task, token, item):
                return
        self._items.append(item)

    def receive(self, timeout: float | None = None) -> T:
        """Return the next item, parking until one arrives; ``WaitTimeout`` after ``timeout`` s."""
        if self._items:
            return self._items.popleft()
        hub = _running("Channel.receive")
        task = hub._caller("Channel.receive")
        deadline = hub._deadline(timeout)
        token = hub._arm(task)
        self._receivers[task] = token
        try:
            value = hub._suspend(task, token, deadline)
        finally:
            if self._receivers.get(task) == token:
                del self._receivers[task]
        if value is _TIMED_OUT:
            raise WaitTimeout(f"nothing was received within {timeout} s (task {task.name!r})")
        item: T = value
        return item

    def __repr__(self) -> str:
        return f"<Channel items={len(self._items)} receivers={len(self._receivers)}>"
