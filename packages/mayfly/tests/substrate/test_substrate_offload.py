"""Contract of the offload boundary (mayfly.substrate._offload): the only place threads run."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from mayfly.substrate import (
    Hub,
    OffloadTimeout,
    RealClock,
    TaskCancelled,
    VirtualClock,
    WaitTimeout,
    current_hub,
    now_ms,
    offload,
    sleep,
    spawn,
)


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Every test must end with the thread count it started with."""
    before = threading.active_count()
    yield
    assert threading.active_count() == before


def _wait_for_discard(count: int) -> int:
    """Park (in real time) until the hub has drained ``count`` discarded late results."""
    hub = current_hub()
    for _ in range(500):
        if hub.stats().offloads_discarded >= count:
            break
        sleep(0.01)
    return hub.stats().offloads_discarded


def test_offload_returns_the_result_computed_on_a_worker_thread() -> None:
    """offload runs fn on a mayfly-offload thread and hands its result back to the task."""

    def main() -> tuple[str, int]:
        return offload(lambda x: (threading.current_thread().name, x * 2), 21)

    name, value = Hub().run(main)
    assert name == "mayfly-offload-1"
    assert value == 42


def test_offload_reraises_the_exception_in_the_task() -> None:
    """An exception raised by the offloaded function is re-raised in the calling task."""

    def boom() -> None:
        raise OSError("disk full")

    def main() -> str:
        try:
            offload(boom)
        except OSError as exc:
            return str(exc)
        return "no error"

    assert Hub().run(main) == "disk full"


def test_two_offloaded_calls_overlap_in_real_time() -> None:
    """Two tasks offloading at once run their calls concurrently (both reach a 2-party barrier)."""
    barrier = threading.Barrier(2, timeout=5)

    def blocking(tag: str) -> str:
        barrier.wait()  # raises BrokenBarrierError unless the other call runs at the same time
        return tag

    def main() -> list[str]:
        tasks = [spawn(offload, blocking, tag) for tag in ("a", "b")]
        return [task.join() for task in tasks]

    assert Hub().run(main) == ["a", "b"]


def test_the_pool_is_bounded_and_started_lazily() -> None:
    """No thread starts until the first offload, and never more than offload_workers run."""
    lock = threading.Lock()
    running = 0
    peak = 0

    def blocking() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.02)
        with lock:
            running -= 1

    def main() -> int:
        started = current_hub().stats().offload_threads_started
        tasks = [spawn(offload, blocking) for _ in range(6)]
        for task in tasks:
            task.join()
        return started

    hub = Hub(offload_workers=2)
    assert hub.run(main) == 0
    assert peak == 2
    assert hub.stats().offload_threads_started == 2
    assert hub.stats().offloads_completed == 6


def test_a_hub_that_never_offloads_starts_no_thread() -> None:
    """Threads are created lazily: a run without offload creates none."""
    hub = Hub()
    hub.run(sleep, 0.001)
    assert hub.stats().offload_threads_started == 0


def test_offload_timeout_releases_the_caller_and_discards_the_late_result() -> None:
    """A timed-out offload raises OffloadTimeout; the call runs on and its result is dropped."""
    release = threading.Event()
    finished = threading.Event()

    def slow() -> str:
        release.wait(5)
        finished.set()
        return "late"

    def main() -> tuple[str, int, int]:
        offload(_noop)  # warm an idle worker so the slow call starts well inside its timeout
        with pytest.raises(OffloadTimeout) as info:
            offload(slow, timeout=0.2)
        assert isinstance(info.value, WaitTimeout)
        assert isinstance(info.value, TimeoutError)
        release.set()
        discarded = _wait_for_discard(1)
        return str(info.value), discarded, current_hub().stats().offloads_completed

    message, discarded, completed = Hub().run(main)
    assert "did not finish within 0.2 s" in message
    assert "late result will be discarded" in message
    assert finished.is_set()  # the call did run to its end ...
    assert discarded == 1  # ... and its result was dropped
    assert completed == 1  # only the warm-up call delivered a result


def _noop() -> None:
    return None


def test_cancelling_a_task_waiting_on_offload_discards_the_late_result() -> None:
    """A task cancelled during offload ends cancelled; the result arriving later reaches no one."""
    started = threading.Event()
    release = threading.Event()
    returned: list[str] = []

    def slow() -> str:
        started.set()
        release.wait(5)
        returned.append("returned")
        return "late result"

    def caller() -> str:
        return offload(slow)

    def main() -> tuple[int, int]:
        task = spawn(caller, name="caller")
        assert offload(started.wait, 5)  # the call is running on its worker now
        task.cancel("user cancelled the run")
        with pytest.raises(TaskCancelled, match="user cancelled the run"):
            task.join()
        release.set()
        discarded = _wait_for_discard(1)
        assert task.done
        with pytest.raises(TaskCancelled):
            task.result()
        return discarded, current_hub().stats().offloads_completed

    assert Hub().run(main) == (1, 1)  # one discarded (slow), one delivered (started.wait)
    assert returned == ["returned"]  # the call did run to the end; only its result was dropped


def test_a_call_abandoned_before_a_worker_takes_it_never_runs() -> None:
    """With the only worker busy, a queued call whose caller is cancelled is never started."""
    release = threading.Event()
    ran: list[str] = []

    def main() -> int:
        busy = spawn(offload, release.wait, 5)
        queued = spawn(offload, ran.append, "queued call ran")
        sleep(0.01)
        queued.cancel("not needed")
        with pytest.raises(TaskCancelled):
            queued.join()
        release.set()
        busy.join()
        return _wait_for_discard(1)

    assert Hub(offload_workers=1).run(main) == 1
    assert ran == []


def test_offload_from_a_cancelled_task_submits_nothing() -> None:
    """A cancelled task calling offload gets TaskCancelled and the function never runs."""
    ran: list[str] = []

    def main() -> None:
        from mayfly.substrate import current_task

        current_task().cancel("stop")
        offload(ran.append, "ran")

    with pytest.raises(TaskCancelled):
        Hub().run(main)
    assert ran == []


def test_virtual_time_stands_still_while_an_offload_is_pending() -> None:
    """With a VirtualClock the hub waits for the offload in real time without moving virtual time."""

    def main() -> tuple[int, bool, int]:
        sleeper = spawn(sleep, 60)
        offload(time.sleep, 0.05)
        during = (now_ms(), sleeper.done)
        sleeper.join()
        return during[0], during[1], now_ms()

    assert Hub(VirtualClock()).run(main) == (0, False, 60_000)


def test_timers_keep_firing_while_a_blocking_call_runs() -> None:
    """A blocking offloaded call does not freeze the hub: other tasks' timers still fire."""
    ticks: list[int] = []
    ticked = threading.Event()

    def ticker() -> None:
        for _ in range(5):
            sleep(0.01)
            ticks.append(now_ms())
        ticked.set()

    def main() -> bool:
        task = spawn(ticker)
        # Blocks its worker until the ticker is done: only a free-running hub can finish it.
        finished_in_time = offload(ticked.wait, 10)
        task.join()
        return finished_in_time

    assert Hub(RealClock()).run(main) is True
    assert len(ticks) == 5


def test_a_call_still_blocking_at_shutdown_is_reported_and_its_thread_exits_later() -> None:
    """Shutdown waits a bounded time; a thread still blocked is named in leaked_threads."""
    started = threading.Event()
    release = threading.Event()

    def blocking() -> None:
        started.set()
        release.wait(5)

    def main() -> None:
        spawn(offload, blocking)
        assert offload(started.wait, 5)  # on a second worker: the blocking call is running
        # main returns now; the blocked caller is cancelled, its thread cannot be

    hub = Hub(shutdown_timeout=0.05)
    hub.run(main)
    try:
        # Exactly the one thread still inside blocking() (which of the two took it is up to them).
        assert len(hub.leaked_threads) == 1
        assert hub.leaked_threads[0].startswith("mayfly-offload-")
    finally:
        release.set()
        for thread in threading.enumerate():
            if thread.name.startswith("mayfly-offload-"):
                thread.join(5)


def test_offload_accepts_arguments_and_returns_any_value() -> None:
    """Positional arguments are passed through and any return value comes back as is."""
    marker: Any = object()

    def main() -> Any:
        return offload(lambda a, b: (a, b), marker, 2)

    assert Hub().run(main) == (marker, 2)
