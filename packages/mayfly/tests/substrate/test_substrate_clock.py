"""Contract of the hub clocks (mayfly.substrate._clock)."""

from __future__ import annotations

import time

import pytest

from mayfly.substrate import Clock, RealClock, VirtualClock


def test_real_clock_starts_near_zero_and_never_goes_backwards() -> None:
    """A RealClock counts integer milliseconds from its creation and is monotonic."""
    clock = RealClock()
    first = clock.now_ms()
    assert isinstance(first, int)
    assert 0 <= first < 1000
    time.sleep(0.02)
    second = clock.now_ms()
    assert second >= first + 19


def test_virtual_clock_moves_only_when_advanced() -> None:
    """A VirtualClock holds still until advance_to moves it forward."""
    clock = VirtualClock(start_ms=500)
    assert clock.now_ms() == 500
    time.sleep(0.01)
    assert clock.now_ms() == 500
    clock.advance_to(3_600_500)
    assert clock.now_ms() == 3_600_500


def test_virtual_clock_refuses_to_go_backwards() -> None:
    """advance_to an earlier time raises and leaves the clock unchanged."""
    clock = VirtualClock(start_ms=100)
    with pytest.raises(ValueError, match="cannot go backwards: now 100 ms, asked for 99 ms"):
        clock.advance_to(99)
    assert clock.now_ms() == 100


def test_virtual_clock_rejects_a_negative_start() -> None:
    """A VirtualClock cannot start before zero."""
    with pytest.raises(ValueError, match="start_ms must be >= 0"):
        VirtualClock(start_ms=-1)


def test_both_clocks_satisfy_the_clock_protocol() -> None:
    """RealClock and VirtualClock are both Clocks to the hub."""
    assert isinstance(RealClock(), Clock)
    assert isinstance(VirtualClock(), Clock)


def test_real_clock_reads_the_system_wall_clock() -> None:
    """RealClock.wall_ms is Unix milliseconds from the system clock, beside the monotonic reading."""
    clock = RealClock()
    before = time.time_ns() // 1_000_000
    wall = clock.wall_ms()
    after = time.time_ns() // 1_000_000
    assert isinstance(wall, int)
    assert before <= wall <= after


def test_virtual_clock_wall_time_is_its_origin_plus_virtual_time() -> None:
    """A VirtualClock's wall reading is deterministic: wall_origin_ms plus its virtual now."""
    clock = VirtualClock(start_ms=500, wall_origin_ms=1_000_000)
    assert clock.wall_ms() == 1_000_500
    time.sleep(0.01)
    assert clock.wall_ms() == 1_000_500
    clock.advance_to(2_500)
    assert clock.wall_ms() == 1_002_500
    assert VirtualClock().wall_ms() == 0


def test_virtual_clock_rejects_a_negative_wall_origin() -> None:
    """The wall origin is Unix milliseconds, so it cannot be negative."""
    with pytest.raises(ValueError, match="wall_origin_ms must be >= 0"):
        VirtualClock(wall_origin_ms=-1)
