"""Contract of the greenlet hub (mayfly.substrate._hub): scheduling, timers, joins, cancellation,
fd readiness, deadlock detection and clean shutdown."""

from __future__ import annotations

import contextlib
import contextvars
import gc
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import greenlet  # type: ignore[import-untyped,unused-ignore]  # no stubs shipped
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mayfly.substrate import (
    FAILURE_MESSAGE_LIMIT,
    Channel,
    Deadlock,
    Event,
    Hub,
    HubAlreadyRunning,
    HubNotRunning,
    RealClock,
    SubstrateError,
    TaskCancelled,
    TaskFailed,
    TaskNotDone,
    VirtualClock,
    WaitTimeout,
    checkpoint,
    current_hub,
    current_task,
    now_ms,
    offload,
    sleep,
    sleep_until,
    spawn,
    wait_fd,
    wait_readable,
    wait_writable,
)


def _live_task_greenlets() -> list[Any]:
    gc.collect()
    return [
        g
        for g in gc.get_objects()
        if isinstance(g, greenlet.greenlet) and g.parent is not None and not g.dead
    ]


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Every test must leave no offload thread and no live task greenlet behind."""
    threads_before = threading.active_count()
    greenlets_before = {id(g) for g in _live_task_greenlets()}  # others' leftovers are not ours
    yield
    assert threading.active_count() == threads_before
    assert [g for g in _live_task_greenlets() if id(g) not in greenlets_before] == []


@pytest.fixture(params=["real", "virtual"])
def make_hub(request: pytest.FixtureRequest) -> Callable[[], Hub]:
    """A hub factory on either clock."""
    if request.param == "real":
        return lambda: Hub(RealClock())
    return lambda: Hub(VirtualClock())


# ------------------------------------------------------------------ scheduling


def test_run_returns_the_main_task_result_with_arguments() -> None:
    """Hub.run calls fn(*args, **kwargs) as the main task and returns its value."""

    def main(a: int, *, b: int) -> int:
        return a + b

    assert Hub().run(main, 1, b=2) == 3


def test_run_reraises_the_main_task_exception_unchanged() -> None:
    """An exception escaping the main task is re-raised by Hub.run as itself."""

    def main() -> None:
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        Hub().run(main)


def test_only_one_task_ever_runs_at_a_time() -> None:
    """Tasks interleave only at park points and all run on the hub's thread."""
    active = 0
    max_active = 0
    threads: set[int] = set()
    steps = 0

    def worker(kind: int) -> None:
        nonlocal active, max_active, steps
        for _ in range(20):
            active += 1
            max_active = max(max_active, active)
            threads.add(threading.get_ident())
            steps += 1
            active -= 1
            if kind == 0:
                checkpoint()
            elif kind == 1:
                sleep(0.001)
            else:
                offload(time.sleep, 0.001)

    def main() -> None:
        tasks = [spawn(worker, i % 3) for i in range(9)]
        for task in tasks:
            task.join()

    Hub().run(main)
    assert steps == 9 * 20
    assert max_active == 1
    assert threads == {threading.get_ident()}


def test_ready_tasks_run_in_fifo_order_and_checkpoint_round_robins() -> None:
    """Spawned tasks start in spawn order; checkpoint puts a task at the back of the queue."""
    order: list[str] = []

    def worker(name: str) -> None:
        order.append(name + "1")
        checkpoint()
        order.append(name + "2")

    def main() -> None:
        tasks = [spawn(worker, name) for name in "abc"]
        for task in tasks:
            task.join()

    Hub().run(main)
    assert order == ["a1", "b1", "c1", "a2", "b2", "c2"]


def test_spawn_does_not_switch_to_the_new_task() -> None:
    """spawn only queues the task: the spawner keeps running until it parks."""
    order: list[str] = []

    def main() -> None:
        spawn(order.append, "child")
        order.append("parent")
        checkpoint()
        order.append("parent again")

    Hub().run(main)
    assert order == ["parent", "child", "parent again"]


def test_current_task_and_hub_are_visible_inside_tasks() -> None:
    """current_task() names the running task and current_hub() the running hub."""
    hub = Hub()
    seen: list[object] = []

    def child() -> None:
        seen.append(current_task().name)

    def main() -> None:
        seen.append(current_hub() is hub)
        seen.append(current_task().name)
        spawn(child, name="kid").join()

    hub.run(main)
    assert seen == [True, "main", "kid"]


def test_context_variables_do_not_leak_from_one_task_to_the_next() -> None:
    """Every task starts with an empty contextvars context, even on a reused greenlet."""
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    seen: list[str] = []

    def setter(value: str) -> None:
        seen.append(var.get())
        var.set(value)

    def main() -> None:
        var.set("main")
        for value in ("a", "b", "c"):
            spawn(setter, value).join()
        seen.append(var.get())

    Hub().run(main)
    assert seen == ["unset", "unset", "unset", "main"]


def test_a_hub_can_be_run_again_after_a_run_ends() -> None:
    """A hub releases everything at the end of a run and can run again."""
    hub = Hub()
    assert hub.run(lambda: 1) == 1
    assert hub.run(lambda: 2) == 2
    assert not hub.running


# ---------------------------------------------------------------------- timers


def test_timers_fire_in_deadline_order(make_hub: Callable[[], Hub]) -> None:
    """Sleepers wake in deadline order regardless of the order they parked in, on either clock."""
    woke: list[int] = []

    def sleeper(deadline: int, ms: int) -> None:
        sleep_until(deadline)
        woke.append(ms)

    def main() -> None:
        base = now_ms()  # one base: a loaded machine cannot reorder the deadlines
        tasks = [spawn(sleeper, base + ms, ms) for ms in (200, 50, 150, 100)]
        for task in tasks:
            task.join()

    make_hub().run(main)
    assert woke == [50, 100, 150, 200]


def test_equal_deadlines_fire_fifo(make_hub: Callable[[], Hub]) -> None:
    """Tasks sleeping until the same deadline wake in the order they parked."""
    woke: list[str] = []

    def sleeper(name: str, deadline: int) -> None:
        sleep_until(deadline)
        woke.append(name)

    def main() -> None:
        # Far enough ahead that even a loaded machine parks all five before it passes
        # (a deadline already past would only yield, not park on the timer).
        deadline = now_ms() + 250
        tasks = [spawn(sleeper, name, deadline) for name in "abcde"]
        for task in tasks:
            task.join()

    make_hub().run(main)
    assert woke == list("abcde")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=40))
def test_virtual_sleepers_wake_sorted_by_deadline_then_park_order(durations: list[int]) -> None:
    """On a VirtualClock, any set of sleepers wakes in (deadline, park order) at exactly its deadline."""
    woke: list[tuple[int, int, int]] = []

    def sleeper(index: int, ms: int) -> None:
        sleep_until(ms)
        woke.append((ms, index, now_ms()))

    def main() -> None:
        tasks = [spawn(sleeper, index, ms) for index, ms in enumerate(durations)]
        for task in tasks:
            task.join()

    Hub(VirtualClock()).run(main)
    # A deadline of 0 is already due: such sleepers only yield, in spawn order, before any timer.
    assert woke == sorted((ms, index, ms) for index, ms in enumerate(durations))


def test_sleep_waits_at_least_the_requested_time_on_a_real_clock() -> None:
    """sleep(0.05) on a RealClock parks for at least 50 ms of hub time."""

    def main() -> int:
        start = now_ms()
        sleep(0.05)
        return now_ms() - start

    assert Hub(RealClock()).run(main) >= 50


def test_virtual_clock_skips_an_hour_of_sleep_in_no_time() -> None:
    """With a VirtualClock, an hour-long sleep ends in well under a second of wall time."""

    def main() -> int:
        sleep(3600)
        return now_ms()

    started = time.perf_counter()
    assert Hub(VirtualClock()).run(main) == 3_600_000
    assert time.perf_counter() - started < 1.0


def test_virtual_time_only_moves_to_the_earliest_timer_when_every_task_is_parked() -> None:
    """The VirtualClock jumps timer by timer, so each sleeper sees exactly its deadline."""
    seen: list[tuple[str, int]] = []

    def sleeper(name: str, seconds: float) -> None:
        sleep(seconds)
        seen.append((name, now_ms()))

    def main() -> None:
        tasks = [spawn(sleeper, "b", 7200), spawn(sleeper, "a", 60), spawn(sleeper, "c", 7200)]
        for task in tasks:
            task.join()

    Hub(VirtualClock(start_ms=1000)).run(main)
    assert seen == [("a", 61_000), ("b", 7_201_000), ("c", 7_201_000)]


def test_sleep_zero_and_past_deadlines_just_yield() -> None:
    """sleep(0) and sleep_until(a past time) let other ready tasks run and return."""
    order: list[str] = []

    def main() -> None:
        spawn(order.append, "other")
        sleep(0)
        order.append("after sleep(0)")
        spawn(order.append, "other2")
        sleep_until(now_ms() - 5)
        order.append("after sleep_until")

    Hub(VirtualClock()).run(main)
    assert order == ["other", "after sleep(0)", "other2", "after sleep_until"]


def test_negative_or_nan_durations_are_rejected() -> None:
    """sleep and timeouts refuse negative or NaN durations with ValueError."""

    def main() -> list[str]:
        errors = []
        for bad in (-1.0, float("nan")):
            try:
                sleep(bad)
            except ValueError as exc:
                errors.append(str(exc))
            try:
                Event().wait(timeout=bad)
            except ValueError as exc:
                errors.append(str(exc))
        return errors

    errors = Hub(VirtualClock()).run(main)
    assert len(errors) == 4


# ------------------------------------------------------------------------ join


def test_join_returns_the_result_of_another_task(make_hub: Callable[[], Hub]) -> None:
    """join parks until the task finishes and returns its result."""

    def child() -> str:
        sleep(0.01)
        return "done"

    def main() -> tuple[str, str, bool]:
        task = spawn(child)
        return task.join(), task.result(), task.done

    assert make_hub().run(main) == ("done", "done", True)


def test_join_surfaces_a_failure_as_task_failed_with_the_cause() -> None:
    """A task that raised is joined as TaskFailed carrying the original exception as __cause__."""
    original = ValueError("bad input 42")

    def child() -> None:
        raise original

    def main() -> TaskFailed:
        task = spawn(child, name="validator")
        with pytest.raises(TaskFailed) as info:
            task.join()
        return info.value

    failure = Hub().run(main)
    assert failure.__cause__ is original
    assert failure.task_name == "validator"
    assert failure.error_type == "ValueError"
    assert failure.error_message == "bad input 42"
    assert str(failure) == "task 'validator' failed with ValueError: bad input 42"


def test_failure_message_is_bounded_to_4_kib_of_utf8() -> None:
    """A huge exception message is cut to at most 4 KiB of UTF-8 without splitting a character."""

    class HugeError(Exception):
        pass

    def child() -> None:
        raise HugeError("é" * 10_000)

    def main() -> TaskFailed:
        task = spawn(child)
        with pytest.raises(TaskFailed) as info:
            task.join()
        return info.value

    failure = Hub().run(main)
    encoded = failure.error_message.encode("utf-8")
    assert len(encoded) <= FAILURE_MESSAGE_LIMIT == 4096
    assert failure.error_message == "é" * 2048
    assert failure.error_type.endswith("test_failure_message_is_bounded_to_4_kib_of_utf8.<locals>.HugeError")


def test_join_with_timeout_raises_wait_timeout(make_hub: Callable[[], Hub]) -> None:
    """A join that outlasts its timeout raises WaitTimeout (a TimeoutError); the task goes on."""

    def main() -> bool:
        task = spawn(sleep, 10)
        with pytest.raises(TimeoutError, match=r"did not finish within 0\.02 s"):
            task.join(timeout=0.02)
        assert not task.done
        task.cancel("test over")
        return True

    assert make_hub().run(main)


def test_an_invalid_join_timeout_is_rejected_without_parking() -> None:
    """join(timeout=-1) raises ValueError and the caller can still join normally afterwards."""

    def main() -> int:
        task = spawn(lambda: 5)
        with pytest.raises(ValueError, match="timeout must be a non-negative number"):
            task.join(timeout=-1)
        sleep(0)
        return task.join()

    assert Hub().run(main) == 5


def test_a_task_cannot_join_itself() -> None:
    """Joining the current task is refused instead of hanging."""

    def main() -> None:
        current_task().join()

    with pytest.raises(SubstrateError, match="cannot join itself"):
        Hub().run(main)


def test_result_of_an_unfinished_task_raises_task_not_done() -> None:
    """result() and exception() before the task finishes raise TaskNotDone."""

    def main() -> int:
        task = spawn(sleep, 1)
        raised = 0
        for probe in (task.result, task.exception):
            try:
                probe()
            except TaskNotDone:
                raised += 1
        task.join()
        return raised

    assert Hub(VirtualClock()).run(main) == 2


def test_unjoined_failed_task_does_not_break_the_run() -> None:
    """A failing task nobody joins is recorded on the task and the run still returns."""
    holder: list[Any] = []

    def main() -> str:
        holder.append(spawn(lambda: 1 / 0))
        sleep(0)
        return "ok"

    assert Hub().run(main) == "ok"
    failure = holder[0].exception()
    assert isinstance(failure, TaskFailed)
    assert failure.error_type == "ZeroDivisionError"


# ---------------------------------------------------------------- cancellation


def test_cancelling_a_parked_task_raises_task_cancelled_at_its_park_point() -> None:
    """A task parked on an Event wakes with TaskCancelled carrying the reason."""
    seen: list[str] = []

    def waiter(event: Event) -> None:
        try:
            event.wait()
        except TaskCancelled as exc:
            seen.append(exc.reason)
            raise

    def main() -> None:
        task = spawn(waiter, Event(), name="w")
        sleep(0)
        task.cancel("operator asked")
        with pytest.raises(TaskCancelled, match="task 'w' was cancelled: operator asked"):
            task.join()
        assert task.cancellation.is_cancelled
        assert task.cancellation.reason == "operator asked"

    Hub().run(main)
    assert seen == ["operator asked"]


def test_cancelling_a_sleeping_task_wakes_it_immediately() -> None:
    """Cancelling a task in an hour-long real sleep ends it without waiting for its timer."""

    def main() -> int:
        started = now_ms()
        task = spawn(sleep, 3600)
        sleep(0)
        task.cancel("shutdown")
        with pytest.raises(TaskCancelled):
            task.join()
        return now_ms() - started

    assert Hub(RealClock()).run(main) < 3_600_000


def test_a_running_task_sees_cancellation_at_its_next_checkpoint() -> None:
    """Cancellation is cooperative: a running task notices at its next park point."""
    progress: list[int] = []

    def main() -> None:
        me = current_task()
        me.cancel("self-cancel")
        progress.append(1)  # still running: cancel does not interrupt
        checkpoint()
        progress.append(2)

    with pytest.raises(TaskCancelled, match="self-cancel"):
        Hub().run(main)
    assert progress == [1]


def test_cancellation_is_level_triggered() -> None:
    """A task that swallows TaskCancelled gets it again at its next park point."""
    caught: list[str] = []

    def stubborn() -> None:
        try:
            sleep(10)
        except TaskCancelled:
            caught.append("first")
        sleep(10)  # raises again: the task stays cancelled

    def main() -> None:
        task = spawn(stubborn)
        sleep(0)
        task.cancel("stop")
        with pytest.raises(TaskCancelled):
            task.join()

    Hub(VirtualClock()).run(main)
    assert caught == ["first"]


def test_a_task_cancelled_before_it_starts_never_runs() -> None:
    """Cancelling a queued task means its function is never called."""
    ran: list[str] = []

    def main() -> None:
        task = spawn(ran.append, "ran")
        task.cancel("changed my mind")
        with pytest.raises(TaskCancelled):
            task.join()

    Hub().run(main)
    assert ran == []


def test_joining_a_cancelled_task_from_an_uncancelled_task_fails_the_joiner() -> None:
    """TaskCancelled escaping a task that was not itself cancelled is that task's failure."""

    def victim() -> None:
        sleep(10)

    def joiner(task: Any) -> None:
        task.join()

    def main() -> TaskFailed:
        victim_task = spawn(victim)
        joiner_task = spawn(joiner, victim_task)
        sleep(0)
        victim_task.cancel("gone")
        with pytest.raises(TaskFailed) as info:
            joiner_task.join()
        return info.value

    failure = Hub(VirtualClock()).run(main)
    assert isinstance(failure.__cause__, TaskCancelled)


def test_first_cancellation_reason_wins_and_cancelling_a_finished_task_is_a_no_op() -> None:
    """Only the first cancel reason is kept; cancel after completion changes nothing."""

    def main() -> tuple[str | None, int]:
        slow = spawn(sleep, 5)
        sleep(0)
        slow.cancel("first")
        slow.cancel("second")
        quick = spawn(lambda: 7)
        quick.join()
        quick.cancel("too late")
        assert not quick.cancellation.is_cancelled
        return slow.cancellation.reason, quick.result()

    assert Hub(VirtualClock()).run(main) == ("first", 7)


def test_an_oversized_or_non_string_cancel_reason_is_rejected_and_changes_nothing() -> None:
    """cancel() refuses a reason over 4 KiB of UTF-8 or not a str, and the task stays uncancelled."""
    from mayfly.model.errors import LimitExceeded

    def main() -> None:
        task = spawn(sleep, 1)
        with pytest.raises(LimitExceeded, match="over the limit of 4096 bytes"):
            task.cancel("é" * 2049)
        with pytest.raises(TypeError, match="must be a str"):
            task.cancel(42)  # type: ignore[arg-type]
        assert not task.cancellation.is_cancelled
        task.cancel("é" * 2048)  # exactly 4 KiB is fine
        assert task.cancellation.is_cancelled

    Hub(VirtualClock()).run(main)


def test_cancellation_handle_is_read_only() -> None:
    """Handlers get a handle that can observe cancellation but never set or trigger it."""

    def main() -> None:
        handle = current_task().cancellation
        assert not handle.is_cancelled
        assert handle.reason is None
        with pytest.raises(AttributeError):
            handle.reason = "forged"  # type: ignore[misc]
        with pytest.raises(AttributeError):
            handle.is_cancelled = True  # type: ignore[misc]
        with pytest.raises(AttributeError):
            handle.extra = 1  # type: ignore[attr-defined]
        assert not hasattr(handle, "cancel")
        assert not handle.is_cancelled

    Hub().run(main)


# --------------------------------------------------------------- fd readiness


def test_wait_readable_parks_until_data_arrives() -> None:
    """A task waiting on a socket is woken when the peer writes to it."""
    left, right = socket.socketpair()
    left.setblocking(False)
    try:

        def reader() -> bytes:
            wait_readable(left)
            return left.recv(16)

        def main() -> bytes:
            task = spawn(reader)
            sleep(0.02)
            assert not task.done
            right.send(b"ping")
            return task.join()

        assert Hub().run(main) == b"ping"
    finally:
        left.close()
        right.close()


def test_several_tasks_wait_on_different_fds() -> None:
    """Each task waiting on its own fd is woken when that fd becomes readable."""
    pairs = [socket.socketpair() for _ in range(3)]
    order: list[int] = []
    try:

        def reader(index: int) -> None:
            wait_readable(pairs[index][0].fileno())
            order.append(index)

        def main() -> None:
            tasks = [spawn(reader, i) for i in range(3)]
            sleep(0.01)
            for index in (2, 0, 1):
                pairs[index][1].send(b"x")
                sleep(0.01)
            for task in tasks:
                task.join(timeout=5)

        Hub().run(main)
        assert order == [2, 0, 1]
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_wait_readable_times_out_and_the_fd_can_be_awaited_again() -> None:
    """An fd wait past its timeout raises WaitTimeout and leaves no stale registration."""
    left, right = socket.socketpair()
    try:

        def main() -> bytes:
            with pytest.raises(WaitTimeout, match=f"fd {left.fileno()} did not become readable"):
                wait_readable(left, timeout=0.02)
            right.send(b"later")
            wait_readable(left, timeout=5)
            return left.recv(16)

        assert Hub().run(main) == b"later"
    finally:
        left.close()
        right.close()


def test_wait_writable_and_readable_on_one_fd_from_two_tasks() -> None:
    """One task may wait for writability while another waits for readability of the same fd."""
    left, right = socket.socketpair()
    try:

        def reader() -> bytes:
            wait_readable(left, timeout=5)
            return left.recv(16)

        def main() -> bytes:
            task = spawn(reader)
            sleep(0)
            wait_writable(left, timeout=5)
            right.send(b"both")
            return task.join()

        assert Hub().run(main) == b"both"
    finally:
        left.close()
        right.close()


def test_wait_fd_reports_which_of_read_and_write_is_ready() -> None:
    """wait_fd(fd, READ|WRITE) returns the ready subset, with psycopg's Wait/Ready bit values."""
    left, right = socket.socketpair()
    try:

        def main() -> list[int]:
            both = selectors.EVENT_READ | selectors.EVENT_WRITE
            seen = [wait_fd(left, both, timeout=5)]  # nothing to read yet: writable only
            right.send(b"x")
            wait_fd(left, selectors.EVENT_READ, timeout=5)
            seen.append(wait_fd(left, both, timeout=5))  # now readable and writable
            seen.append(wait_fd(left, selectors.EVENT_READ, timeout=5))
            return seen

        assert Hub().run(main) == [2, 3, 1]
    finally:
        left.close()
        right.close()


def test_wait_fd_rejects_an_empty_or_unknown_event_mask() -> None:
    """wait_fd refuses events other than 1, 2 or 3 without parking."""
    left, right = socket.socketpair()
    try:

        def main() -> int:
            for bad in (0, 4, 7):
                with pytest.raises(ValueError, match="events must be EVENT_READ, EVENT_WRITE or both"):
                    wait_fd(left, bad)
            return wait_fd(left, selectors.EVENT_WRITE, timeout=5)

        assert Hub().run(main) == 2
    finally:
        left.close()
        right.close()


def test_two_readers_on_one_fd_are_refused() -> None:
    """A second task waiting to read the same fd gets a SubstrateError."""
    left, right = socket.socketpair()
    try:

        def main() -> str:
            first = spawn(wait_readable, left)
            sleep(0)
            with pytest.raises(SubstrateError, match="already awaited by task") as info:
                wait_readable(left)
            first.cancel("done")
            with pytest.raises(TaskCancelled):
                first.join()
            return str(info.value)

        assert "one connection per task" in Hub().run(main)
    finally:
        left.close()
        right.close()


def test_cancelling_an_fd_wait_unregisters_it() -> None:
    """A task cancelled while waiting on an fd releases it for another waiter."""
    left, right = socket.socketpair()
    try:

        def main() -> bytes:
            task = spawn(wait_readable, left)
            sleep(0)
            task.cancel("abandon")
            with pytest.raises(TaskCancelled):
                task.join()
            right.send(b"again")
            wait_readable(left, timeout=5)
            return left.recv(16)

        assert Hub().run(main) == b"again"
    finally:
        left.close()
        right.close()


def test_virtual_time_stands_still_while_an_fd_wait_is_pending() -> None:
    """With a VirtualClock, an fd wait is awaited in real time and virtual time does not jump."""
    left, right = socket.socketpair()
    try:

        def writer_thread_free_main() -> tuple[int, bool]:
            sleeper = spawn(sleep, 60)
            threading_free_delay = spawn(_send_after_offload, right)
            wait_readable(left)
            result = (now_ms(), sleeper.done)
            threading_free_delay.join()
            sleeper.join()
            return result

        assert Hub(VirtualClock()).run(writer_thread_free_main) == (0, False)
    finally:
        left.close()
        right.close()


def _send_after_offload(sock: socket.socket) -> None:
    offload(time.sleep, 0.05)
    sock.send(b"x")


# -------------------------------------------------------------------- deadlock


def test_deadlock_is_detected_and_names_the_parked_tasks(make_hub: Callable[[], Hub]) -> None:
    """Every task parked with nothing to wake it raises Deadlock instead of hanging."""

    def main() -> None:
        spawn(Event().wait, name="waiting-for-approval")
        Channel[int]().receive()

    with pytest.raises(Deadlock) as info:
        make_hub().run(main)
    assert set(info.value.parked) == {"main", "waiting-for-approval"}
    assert "2 task(s) parked" in str(info.value)


def test_a_timer_prevents_deadlock_detection(make_hub: Callable[[], Hub]) -> None:
    """A parked task with a pending timer is not a deadlock: the timer will wake it."""

    def main() -> str:
        event = Event()

        def later() -> None:
            sleep(0.01)
            event.set()

        spawn(later)
        event.wait()
        return "woken"

    assert make_hub().run(main) == "woken"


# -------------------------------------------------------------------- shutdown


def test_shutdown_cancels_leftover_tasks_and_leaks_nothing() -> None:
    """When main returns, leftover tasks are cancelled and joined, and the pool is stopped."""
    tasks: list[Any] = []
    release = threading.Event()

    def main() -> str:
        tasks.append(spawn(sleep, 3600, name="sleeper"))
        tasks.append(spawn(Event().wait, name="waiter"))
        # Still blocked when main returns; it returns on its own 0.1 s later,
        # well inside the shutdown wait, so its thread is joined.
        tasks.append(spawn(offload, release.wait, 0.1, name="offloader"))
        tasks.append(spawn(checkpoint, name="never-started"))
        sleep(0.01)
        return "main done"

    hub = Hub(offload_workers=2)
    try:
        assert hub.run(main) == "main done"
    finally:
        release.set()
    for task in tasks:
        assert task.done
    for task in tasks[:3]:
        assert task.cancellation.reason == "the hub is shutting down"
        assert isinstance(task.exception(), TaskCancelled)
    assert hub.leaked_threads == ()


def test_a_task_that_swallows_cancellation_forever_is_killed_at_shutdown() -> None:
    """A task that keeps catching TaskCancelled cannot stop the hub from shutting down."""
    holder: list[Any] = []

    def stubborn() -> None:
        while True:
            with contextlib.suppress(TaskCancelled):
                checkpoint()

    def main() -> None:
        holder.append(spawn(stubborn, name="stubborn"))
        sleep(0)

    Hub().run(main)
    assert holder[0].done
    assert isinstance(holder[0].exception(), TaskCancelled)


def test_keyboard_interrupt_in_a_task_stops_the_hub_and_propagates() -> None:
    """A BaseException such as KeyboardInterrupt in any task ends the run and is re-raised."""

    def main() -> None:
        spawn(_interrupt)
        sleep(3600)

    with pytest.raises(KeyboardInterrupt):
        Hub(VirtualClock()).run(main)


def _interrupt() -> None:
    raise KeyboardInterrupt


# --------------------------------------------------------------- misuse errors


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("current_hub", current_hub),
        ("current_task", current_task),
        ("spawn", lambda: spawn(print)),
        ("sleep", lambda: sleep(1)),
        ("sleep_until", lambda: sleep_until(1)),
        ("now_ms", now_ms),
        ("offload", lambda: offload(print)),
        ("wait_readable", lambda: wait_readable(0)),
        ("wait_writable", lambda: wait_writable(0)),
        ("wait_fd", lambda: wait_fd(0, selectors.EVENT_READ)),
        ("checkpoint", checkpoint),
        ("Event.wait", lambda: Event().wait()),
        ("Channel.receive", lambda: Channel[int]().receive()),
    ],
)
def test_substrate_calls_outside_a_hub_raise_hub_not_running(name: str, call: Callable[[], object]) -> None:
    """Every substrate function called outside a running hub raises HubNotRunning naming it."""
    with pytest.raises(HubNotRunning, match=rf"^{name}\(\) needs a running hub"):
        call()


def test_nested_hub_run_is_rejected() -> None:
    """Hub.run inside a task of a running hub raises HubAlreadyRunning; the outer hub goes on."""

    def main() -> str:
        with pytest.raises(HubAlreadyRunning, match="already running on this thread"):
            Hub().run(lambda: None)
        sleep(0)
        return "outer still fine"

    assert Hub().run(main) == "outer still fine"


def test_hubs_on_different_threads_run_independently() -> None:
    """A second hub may run on another thread (here an offload worker) at the same time."""

    def inner() -> tuple[str, int]:
        sleep(10)
        return threading.current_thread().name, now_ms()

    def main() -> tuple[tuple[str, int], int]:
        inner_result = offload(Hub(VirtualClock()).run, inner)
        return inner_result, now_ms()

    (thread_name, inner_now), outer_now = Hub(VirtualClock()).run(main)
    assert thread_name == "mayfly-offload-1"
    assert inner_now == 10_000
    assert outer_now == 0


def test_one_hub_cannot_run_on_two_threads_at_once() -> None:
    """Running a Hub that is already running elsewhere raises HubAlreadyRunning."""
    hub = Hub()

    def main() -> str:
        try:
            offload(hub.run, lambda: None)
        except HubAlreadyRunning as exc:
            return str(exc)
        return "no error"

    assert "already running on another thread" in hub.run(main)


def test_hub_spawn_outside_a_run_is_rejected() -> None:
    """Hub.spawn on a hub that is not running raises HubNotRunning."""
    with pytest.raises(HubNotRunning):
        Hub().spawn(print)


def test_parking_from_a_foreign_greenlet_is_refused() -> None:
    """A raw greenlet the hub does not own cannot park on the hub."""

    def main() -> str:
        glet = greenlet.greenlet(lambda: sleep(1))
        with pytest.raises(SubstrateError, match="greenlet the hub does not own"):
            glet.switch()
        return "ok"

    assert Hub().run(main) == "ok"


def test_invalid_hub_configuration_is_rejected() -> None:
    """A hub needs at least one offload worker and a non-negative shutdown wait."""
    with pytest.raises(ValueError, match="offload_workers must be at least 1"):
        Hub(offload_workers=0)
    with pytest.raises(ValueError, match="shutdown_timeout"):
        Hub(shutdown_timeout=-1)


def test_stats_count_the_run() -> None:
    """Hub.stats reports spawned tasks, switches and fired timers of the run."""
    hub = Hub(VirtualClock())

    def main() -> None:
        spawn(sleep, 1).join()

    hub.run(main)
    stats = hub.stats()
    assert stats.tasks_spawned == 2
    assert stats.timers_fired == 1
    assert stats.switches >= 3
