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
