"""Hub clocks: integer monotonic milliseconds, real or virtual, and the wall time beside them.

The hub reads time only through a :class:`Clock`, so the same workflow code
runs against wall time in production and against a :class:`VirtualClock` in
tests, where an hour of backoff takes no wall time at all.

Timers use the monotonic reading, which never jumps. The wall reading is what
ties a run's virtual time to the calendar across processes (ARCHITECTURE
section 11, "Time across downtime"): the runtime records a run's epoch in wall
milliseconds, and a later process measures the time elapsed since then.
"""

from __future__ import annotations

import time
from typing import Protocol, final, runtime_checkable

__all__ = ["Clock", "RealClock", "VirtualClock"]

_NS_PER_MS = 1_000_000


@runtime_checkable
class Clock(Protocol):
    """A monotonic source of integer milliseconds, plus a wall-clock reading."""

    def now_ms(self) -> int:
        """Return the current monotonic time in whole milliseconds; never goes backwards."""
        ...

    def wall_ms(self) -> int:
        """Return the wall-clock time in whole milliseconds since the Unix epoch (it may jump)."""
        ...


@final
class RealClock:
    """Monotonic wall time in milliseconds since the clock was created (so it starts near 0)."""

    __slots__ = ("_origin_ns",)

    def __init__(self) -> None:
        self._origin_ns = time.monotonic_ns()

    def now_ms(self) -> int:
        """Return whole milliseconds elapsed since this clock was created."""
        return (time.monotonic_ns() - self._origin_ns) // _NS_PER_MS

    def wall_ms(self) -> int:
        """Return the system's wall-clock time in milliseconds since the Unix epoch.

        Unlike :meth:`now_ms` this follows clock adjustments, backwards too;
        callers that derive durations from it must clamp them.
        """
        return time.time_ns() // _NS_PER_MS

    def __repr__(self) -> str:
        return f"RealClock(now_ms={self.now_ms()})"


@final
class VirtualClock:
    """Time that moves only when told: a hub jumps it to the next timer once every task is parked.

    With a virtual clock, time never advances while an offloaded call or an fd
    wait is in flight: the hub waits for those in real time first, so a result
    can never arrive "after" a timer that logically fires later.

    Its wall reading is deterministic too: ``wall_origin_ms`` plus the
    virtual time. A fresh clock per process therefore counts no downtime
    between processes; a test simulates downtime by giving the later process
    a clock with a later ``wall_origin_ms``.
    """

    __slots__ = ("_now_ms", "_wall_origin_ms")

    def __init__(self, start_ms: int = 0, *, wall_origin_ms: int = 0) -> None:
        if start_ms < 0:
            raise ValueError(f"VirtualClock start_ms must be >= 0, got {start_ms}")
        if wall_origin_ms < 0:
            raise ValueError(f"VirtualClock wall_origin_ms must be >= 0, got {wall_origin_ms}")
        self._now_ms = start_ms
        self._wall_origin_ms = wall_origin_ms

    def now_ms(self) -> int:
        """Return the current virtual time in whole milliseconds."""
        return self._now_ms

    def wall_ms(self) -> int:
        """Return ``wall_origin_ms`` plus the current virtual time."""
        return self._wall_origin_ms + self._now_ms

    def advance_to(self, deadline_ms: int) -> None:
        """Move time forward to ``deadline_ms``; moving it backwards raises ``ValueError``."""
        if deadline_ms < self._now_ms:
            raise ValueError(
                f"VirtualClock cannot go backwards: now {self._now_ms} ms, asked for {deadline_ms} ms"
            )
        self._now_ms = deadline_ms

    def __repr__(self) -> str:
        return f"VirtualClock(now_ms={self._now_ms}, wall_origin_ms={self._wall_origin_ms})"
