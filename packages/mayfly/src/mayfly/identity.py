"""Runtime identity generation: RFC 9562 UUIDv7 ids from the clock and ``os.urandom``.

The grammar of identities and the :class:`~mayfly.model.ids.IdSource`
protocol live in the pure model; this module reads a clock and randomness, so
it sits above it. No correctness rule depends on the time order of ids (the
journal sequence is authoritative), but operators like ids that sort roughly
by creation time, and a process never hands out the same id twice.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Final, final

__all__ = ["Uuid7IdSource"]

_COUNTER_BITS: Final = 12
_COUNTER_MAX: Final = (1 << _COUNTER_BITS) - 1
# A fresh millisecond seeds the counter with 11 random bits, leaving at least
# 2048 increments of headroom before the counter has to borrow the next ms.
_SEED_MASK: Final = (1 << (_COUNTER_BITS - 1)) - 1
# The first hex digit of rand_b's 8 random bytes -> that digit under the variant bits 10.
_VARIANT: Final = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}
_MS_MASK: Final = (1 << 48) - 1


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


_POOL_BYTES: Final = 4096


class _RandomPool:
    """``os.urandom`` bytes drawn 4 KiB at a time, dropped in a forked child.

    A ``getrandom`` call per id cost more than the rest of the id (a system
    call, and the GIL handed over and back while many threads run); one call
    per 400 ids does not. A child process must never hand out its parent's
    bytes, so a fork empties the pool.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = b""
        self._at = 0

    def take(self, count: int) -> bytes:
        with self._lock:
            if self._at + count > len(self._bytes):
                self._bytes = os.urandom(max(_POOL_BYTES, count))
                self._at = 0
            start = self._at
            self._at = start + count
            return self._bytes[start : start + count]

    def forget(self) -> None:
        self._bytes = b""
        self._at = 0
        self._lock = threading.Lock()  # a lock held in the parent at the fork stays held in the child


_POOL: Final = _RandomPool()
os.register_at_fork(after_in_child=_POOL.forget)


@final
class Uuid7IdSource:
    """An :class:`~mayfly.model.ids.IdSource` of RFC 9562 UUIDv7 ids, monotonic within a process.

    Layout: 48-bit Unix milliseconds, version 7, 12-bit ``rand_a`` used as a
    counter within the same millisecond (RFC 9562 §6.2 method 1, seeded
    randomly on each new millisecond), variant ``10``, 62 random bits. When
    the clock stalls or steps back, the last millisecond is reused and the
    counter keeps ids increasing; when the counter overflows, the timestamp
    advances by one millisecond. Safe to share between threads.
    """

    __slots__ = ("_clock_ms", "_counter", "_last_ms", "_lock", "_prefix", "_random_bytes")

    def __init__(
        self,
        clock_ms: Callable[[], int] = _wall_clock_ms,
        random_bytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self._clock_ms = clock_ms
        # The system's randomness, drawn in blocks (see _RandomPool); an injected source is called as given.
        self._random_bytes = _POOL.take if random_bytes is os.urandom else random_bytes
        self._lock = threading.Lock()
        self._last_ms = -1
        self._counter = 0
        self._prefix = ""

    def new_id(self) -> str:
        """Return a fresh canonical lowercase UUIDv7 string, greater than every earlier one."""
        now = self._clock_ms() & _MS_MASK
        with self._lock:
            if now > self._last_ms:
                self._last_ms = now
                self._counter = int.from_bytes(self._random_bytes(2), "big") & _SEED_MASK
                self._prefix = ""
            else:
                self._counter += 1
                if self._counter > _COUNTER_MAX:
                    self._last_ms += 1
                    self._counter = int.from_bytes(self._random_bytes(2), "big") & _SEED_MASK
                    self._prefix = ""
            prefix = self._prefix
            if not prefix:
                # The millisecond's 12 hex digits and the version digit, formatted once per millisecond.
                millis = f"{self._last_ms:012x}"
                prefix = self._prefix = f"{millis[:8]}-{millis[8:]}-7"
            counter = self._counter
        # rand_b: the low 62 bits of 8 random bytes under the variant bits 10, so the first of
        # their 16 hex digits becomes 8, 9, a or b (its own low two bits kept) and the rest stay.
        rand = self._random_bytes(8).hex()
        return f"{prefix}{counter:03x}-{_VARIANT[rand[0]]}{rand[1:4]}-{rand[4:]}"
