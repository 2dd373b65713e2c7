"""Contract of the park/wake primitives (mayfly.substrate._sync): Event and Channel."""

from __future__ import annotations

from typing import Any

import pytest

from mayfly.substrate import (
    Channel,
    Event,
    Hub,
    Task,
    TaskCancelled,
    TaskFailed,
    VirtualClock,
    WaitTimeout,
    sleep,
    spawn,
)


def _run(fn: Any) -> Any:
    return Hub(VirtualClock()).run(fn)


def test_event_set_wakes_every_waiter_in_fifo_order() -> None:
    """set() wakes all waiters, and they resume in the order they started waiting."""
    woke: list[str] = []

    def waiter(event: Event, name: str) -> None:
        event.wait()
        woke.append(name)

    def main() -> None:
        event = Event()
        tasks = [spawn(waiter, event, name) for name in "xyz"]
        sleep(0)
        assert woke == []
        event.set()
        for task in tasks:
            task.join()

    _run(main)
    assert woke == ["x", "y", "z"]


def test_event_wait_on_a_set_event_returns_at_once_and_clear_resets_it() -> None:
    """A set event does not park its waiters; clear() makes them park again."""

    def main() -> bool:
        event = Event()
        event.set()
        event.wait()
        assert event.is_set()
        event.clear()
        with pytest.raises(WaitTimeout):
            event.wait(timeout=1)
        return event.is_set()

    assert _run(main) is False


def test_event_wait_timeout_raises_and_leaves_no_waiter_behind() -> None:
    """A timed-out Event.wait raises WaitTimeout and removes itself from the event."""

    def main() -> str:
        event = Event()
        for _ in range(100):
            with pytest.raises(WaitTimeout, match="event was not set within 5 s"):
                event.wait(timeout=5)
        return repr(event)

    assert _run(main) == "<Event set=False waiters=0>"


def test_a_cancelled_event_waiter_is_removed() -> None:
    """Cancelling a task waiting on an event removes its registration."""

    def main() -> str:
        event = Event()
        task = spawn(event.wait)
        sleep(0)
        task.cancel("no longer needed")
        with pytest.raises(TaskCancelled):
            task.join()
        return repr(event)

    assert _run(main) == "<Event set=False waiters=0>"


def test_channel_items_are_received_in_send_order() -> None:
    """Items sent before anyone receives are buffered and received FIFO."""

    def main() -> list[int]:
        channel: Channel[int] = Channel()
        for item in (3, 1, 2):
            channel.send(item)
        assert len(channel) == 3
        return [channel.receive() for _ in range(3)]

    assert _run(main) == [3, 1, 2]


def test_channel_receivers_are_served_in_the_order_they_waited() -> None:
    """Parked receivers get items in the order they started receiving."""
    got: list[tuple[str, int]] = []

    def receiver(channel: Channel[int], name: str) -> None:
        got.append((name, channel.receive()))

    def main() -> None:
        channel: Channel[int] = Channel()
        tasks = [spawn(receiver, channel, name) for name in "abc"]
        sleep(0)
        for item in (10, 20, 30):
            channel.send(item)
        for task in tasks:
            task.join()

    _run(main)
    assert got == [("a", 10), ("b", 20), ("c", 30)]


def test_channel_receive_timeout_raises_wait_timeout() -> None:
    """receive() with nothing sent before its timeout raises WaitTimeout (a TimeoutError)."""

    def main() -> str:
        channel: Channel[str] = Channel()
        try:
            channel.receive(timeout=2.5)
        except TimeoutError as exc:
            assert isinstance(exc, WaitTimeout)
            return repr(channel)
        return "no timeout"

    assert _run(main) == "<Channel items=0 receivers=0>"


def test_an_item_is_never_lost_to_a_receiver_whose_timeout_already_fired() -> None:
    """A send that races a receiver's fired timeout goes to the next receiver instead."""
    got: list[object] = []

    def timing_out(channel: Channel[str]) -> None:
        try:
            channel.receive(timeout=1)
        except WaitTimeout:
            got.append("timed out")

    def patient(channel: Channel[str]) -> None:
        got.append(channel.receive())

    def main() -> None:
        channel: Channel[str] = Channel()
        sender = spawn(_send_at_one_second, channel)  # its timer is older, so it fires first
        first = spawn(timing_out, channel)
        second = spawn(patient, channel)
        for task in (sender, first, second):
            task.join()

    _run(main)
    assert sorted(map(str, got)) == ["item", "timed out"]


def _send_at_one_second(channel: Channel[str]) -> None:
    sleep(1)
    channel.send("item")


def test_notify_channel_reports_whichever_task_finishes_first() -> None:
    """Tasks spawned with notify=channel are received as they finish: wait for any of N."""

    def work(seconds: float) -> float:
        sleep(seconds)
        if seconds == 2:
            raise RuntimeError("two failed")
        return seconds

    def main() -> list[object]:
        done: Channel[Task[Any]] = Channel()
        for seconds in (3, 1, 2):
            spawn(work, seconds, notify=done)
        outcomes: list[object] = []
        for _ in range(3):
            task = done.receive()
            try:
                outcomes.append(task.result())
            except TaskFailed as failure:
                outcomes.append(failure.error_message)
        return outcomes

    assert _run(main) == [1, "two failed", 3]
