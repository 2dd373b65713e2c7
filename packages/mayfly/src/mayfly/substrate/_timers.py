"""The hub's timer heap: deadlines in integer milliseconds, equal deadlines fire in insertion order.

A timer is never removed from the middle of the heap: cancelling only marks
it dead, and dead entries are skipped when they reach the top (or swept out
in one pass once they are the majority, so a task that keeps re-arming
timeouts cannot grow the heap without bound).
"""

from __future__ import annotations

import heapq
from typing import final

__all__ = ["Timer", "TimerHeap"]

# Sweep only when there is real garbage: below this the lazy skip is cheaper.
_SWEEP_MIN_DEAD = 1024


@final
class Timer:
    """One pending deadline: when it fires, ``owner`` is woken with ``token`` (if still current)."""

    __slots__ = ("deadline_ms", "live", "owner", "token")

    def __init__(self, deadline_ms: int, owner: object, token: int) -> None:
        self.deadline_ms = deadline_ms
        self.owner = owner
        self.token = token
        self.live = True


@final
class TimerHeap:
    """A min-heap of timers keyed by ``(deadline_ms, insertion counter)``."""

    __slots__ = ("_counter", "_dead", "_heap")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Timer]] = []
        self._counter = 0
        self._dead = 0

    def __len__(self) -> int:
        """Return how many live timers are pending."""
        return len(self._heap) - self._dead

    def push(self, deadline_ms: int, owner: object, token: int) -> Timer:
        """Schedule a timer; among equal deadlines, earlier pushes fire first."""
        timer = Timer(deadline_ms, owner, token)
        self._counter += 1
        heapq.heappush(self._heap, (deadline_ms, self._counter, timer))
        return timer

    def cancel(self, timer: Timer) -> None:
        """Mark ``timer`` dead so it never fires; cancelling twice or after firing is a no-op."""
        if not timer.live:
            return
        timer.live = False
        self._dead += 1
        if self._dead >= _SWEEP_MIN_DEAD and self._dead * 2 > len(self._heap):
            self._heap = [entry for entry in self._heap if entry[2].live]
            heapq.heapify(self._heap)
            self._dead = 0

    def next_deadline(self) -> int | None:
        """Return the earliest live deadline, or ``None`` when no timer is pending."""
        heap = self._heap
        while heap and not heap[0][2].live:
            heapq.heappop(heap)
            self._dead -= 1
        return heap[0][0] if heap else None

    def pop_due(self, now_ms: int) -> Timer | None:
        """Remove and return the next live timer whose deadline is at or before ``now_ms``."""
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            timer = heapq.heappop(heap)[2]
            if timer.live:
                timer.live = False
                return timer
            self._dead -= 1
        return None

    def clear(self) -> None:
        """Drop every timer (used when a hub run ends)."""
        for _, _, timer in self._heap:
            timer.live = False
        self._heap.clear()
        self._dead = 0
