"""GroupCommit: queued appends flushed in groups, each caller woken with its own outcome after its flush."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from mayfly.substrate import GroupCommit, Hub, TaskCancelled, TaskFailed, sleep, spawn


class Recorder:
    """A flush that records its groups, refuses odd items, and can be held on an event."""

    def __init__(self) -> None:
        self.groups: list[list[tuple[str, int]]] = []
        self.threads: set[str] = set()
        self.release = threading.Event()
        self.release.set()
        self.lock = threading.Lock()
        self.active: set[str] = set()
        self.overlaps: list[set[str]] = []  # keys flushed by two flushes at once

    def flush(self, items: Sequence[tuple[str, int]]) -> list[int | BaseException]:
        keys = {key for key, _ in items}
        with self.lock:
            if keys & self.active:
                self.overlaps.append(keys & self.active)
            self.active |= keys
        self.release.wait(10)
        self.threads.add(threading.current_thread().name)
        with self.lock:
            self.groups.append(list(items))
            self.active -= keys
        return [ValueError(f"odd {n}") if n % 2 else n * 10 for _, n in items]


def test_outside_a_hub_the_item_is_flushed_inline() -> None:
    recorder = Recorder()
    group: GroupCommit[tuple[str, int], int] = GroupCommit(recorder.flush, name="t")
    assert group.submit(("a", 2)) == 20
    with pytest.raises(ValueError, match="odd 3"):
        group.submit(("a", 3))
    assert recorder.groups == [[("a", 2)], [("a", 3)]]
    assert recorder.threads == {threading.current_thread().name}


def test_items_queued_behind_a_flush_share_the_next_one_and_a_refusal_fails_only_its_caller() -> None:
    recorder = Recorder()
    group: GroupCommit[tuple[str, int], int] = GroupCommit(recorder.flush, name="t")

    def submit(item: tuple[str, int]) -> int | str:
        try:
            return group.submit(item)
        except ValueError as error:
            return str(error)

    def main() -> list[int | str]:
        recorder.release.clear()
        first = spawn(submit, ("r0", 0))
        sleep(0.05)  # the first flush is on its thread, held
        rest = [spawn(submit, (f"r{n}", n)) for n in range(1, 9)]
        sleep(0.05)
        recorder.release.set()
        return [task.join() for task in [first, *rest]]

    assert Hub().run(main) == [0, "odd 1", 20, "odd 3", 40, "odd 5", 60, "odd 7", 80]
    assert [len(g) for g in recorder.groups] == [1, 8]  # the eight queued meanwhile went in one flush
    assert all(name.startswith("mayfly-offload") for name in recorder.threads)


def test_one_key_per_group_keeps_a_keys_items_in_order() -> None:
    recorder = Recorder()
    group: GroupCommit[tuple[str, int], int] = GroupCommit(recorder.flush, name="t", key=lambda item: item[0])

    def main() -> list[int]:
        recorder.release.clear()
        tasks = [spawn(group.submit, ("a", 0))]
        sleep(0.05)
        tasks += [spawn(group.submit, item) for item in [("a", 2), ("b", 2), ("a", 4), ("b", 4), ("c", 6)]]
        sleep(0.05)
        recorder.release.set()
        return [task.join() for task in tasks]

    assert Hub().run(main) == [0, 20, 20, 40, 40, 60]
    assert recorder.groups == [[("a", 0)], [("a", 2), ("b", 2), ("c", 6)], [("a", 4), ("b", 4)]]


def test_a_cancelled_caller_not_yet_taken_is_never_flushed() -> None:
    recorder = Recorder()
    group: GroupCommit[tuple[str, int], int] = GroupCommit(recorder.flush, name="t")

    def main() -> int:
        recorder.release.clear()
        first = spawn(group.submit, ("a", 0))
        sleep(0.05)
        doomed = spawn(group.submit, ("b", 2))
        sleep(0.01)
        doomed.cancel("test")
        with pytest.raises((TaskCancelled, TaskFailed)):
            doomed.join()
        recorder.release.set()
        return first.join()

    assert Hub().run(main) == 0
    assert recorder.groups == [[("a", 0)]]


def test_a_key_being_flushed_is_not_taken_by_a_second_flusher() -> None:
    recorder = Recorder()
    group: GroupCommit[tuple[str, int], int] = GroupCommit(
        recorder.flush, name="t", key=lambda item: item[0], flushers=2
    )

    def main() -> list[int]:
        recorder.release.clear()
        tasks = [spawn(group.submit, ("a", 0))]
        sleep(0.05)  # the first flusher holds "a"
        tasks += [spawn(group.submit, ("a", 2)), spawn(group.submit, ("b", 2))]
        sleep(0.05)  # the second flusher took "b" alone: "a" is busy
        recorder.release.set()
        return [task.join() for task in tasks]

    assert Hub().run(main) == [0, 20, 20]
    assert sorted(recorder.groups) == [[("a", 0)], [("a", 2)], [("b", 2)]]
    assert recorder.overlaps == []  # ("a", 2) was flushed only once the flush holding "a" ended


def test_a_lone_append_is_flushed_from_its_callers_task() -> None:
    """With nothing queued or being flushed, the caller flushes its own item: no flusher task starts."""
    recorder = Recorder()
    group: GroupCommit[tuple[str, int], int] = GroupCommit(recorder.flush, name="t")

    def main() -> list[int]:
        return [group.submit(("a", n)) for n in (0, 2, 4)]

    hub = Hub()
    assert hub.run(main) == [0, 20, 40]
    assert recorder.groups == [[("a", 0)], [("a", 2)], [("a", 4)]]
    assert all(name.startswith("mayfly-offload") for name in recorder.threads)  # still off the hub
    assert hub.stats().tasks_spawned == 1  # main alone


def test_a_lone_caller_cancelled_mid_flush_leaves_what_queued_behind_it_to_a_flusher() -> None:
    """Cancelling the caller of a lone flush neither fails nor strands the appends queued meanwhile."""
    recorder = Recorder()
    group: GroupCommit[tuple[str, int], int] = GroupCommit(recorder.flush, name="t", flushers=1)

    def main() -> int:
        recorder.release.clear()
        lone = spawn(group.submit, ("a", 0))
        sleep(0.05)  # its flush is on its thread, held
        queued = spawn(group.submit, ("b", 2))
        sleep(0.05)
        lone.cancel("test")
        with pytest.raises((TaskCancelled, TaskFailed)):
            lone.join()
        recorder.release.set()
        return queued.join()

    assert Hub().run(main) == 20
    assert sorted(recorder.groups) == [[("a", 0)], [("b", 2)]]
