"""Contract of the timer heap (mayfly.substrate._timers)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mayfly.substrate._timers import TimerHeap


def _drain(heap: TimerHeap, now_ms: int) -> list[object]:
    fired = []
    while (timer := heap.pop_due(now_ms)) is not None:
        fired.append(timer.owner)
    return fired


def test_timers_fire_in_deadline_order_and_equal_deadlines_fifo() -> None:
    """Timers fire by deadline; timers with the same deadline fire in insertion order."""
    heap = TimerHeap()
    heap.push(30, "c", 0)
    heap.push(10, "a1", 0)
    heap.push(20, "b", 0)
    heap.push(10, "a2", 0)
    heap.push(10, "a3", 0)
    assert heap.next_deadline() == 10
    assert _drain(heap, 15) == ["a1", "a2", "a3"]
    assert _drain(heap, 100) == ["b", "c"]
    assert heap.next_deadline() is None


def test_cancelled_timers_never_fire_and_are_not_counted() -> None:
    """A cancelled timer is skipped lazily and is not reported as pending."""
    heap = TimerHeap()
    first = heap.push(10, "first", 0)
    heap.push(20, "second", 0)
    heap.cancel(first)
    heap.cancel(first)  # a second cancel is a no-op
    assert len(heap) == 1
    assert heap.next_deadline() == 20
    assert _drain(heap, 100) == ["second"]
    assert len(heap) == 0


def test_mass_cancellation_is_swept_so_the_heap_stays_bounded() -> None:
    """Re-arming timeouts that are cancelled early does not grow the heap without bound."""
    heap = TimerHeap()
    for i in range(10_000):
        heap.cancel(heap.push(1_000_000 + i, i, 0))
    assert len(heap) == 0
    assert len(heap._heap) < 2048
    heap.push(5, "live", 0)
    assert _drain(heap, 5) == ["live"]


def test_clear_drops_every_timer() -> None:
    """clear() leaves nothing to fire."""
    heap = TimerHeap()
    heap.push(1, "x", 0)
    heap.clear()
    assert heap.pop_due(10) is None
    assert len(heap) == 0


@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=50), st.booleans()),
        max_size=200,
    ),
    st.integers(min_value=0, max_value=60),
)
def test_heap_matches_a_sorted_reference_model(entries: list[tuple[int, bool]], now_ms: int) -> None:
    """Any mix of pushes and cancels fires exactly the live due timers, by (deadline, push order)."""
    heap = TimerHeap()
    expected = []
    for index, (deadline, cancel) in enumerate(entries):
        timer = heap.push(deadline, index, 0)
        if cancel:
            heap.cancel(timer)
        else:
            expected.append((deadline, index))
    expected.sort()
    due = [index for deadline, index in expected if deadline <= now_ms]
    assert _drain(heap, now_ms) == due
    assert len(heap) == len(expected) - len(due)
    later = [deadline for deadline, _ in expected if deadline > now_ms]
    assert heap.next_deadline() == (min(later) if later else None)
