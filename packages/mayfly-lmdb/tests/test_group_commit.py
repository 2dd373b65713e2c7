"""Group commit: writes from many hub tasks share one LMDB transaction and one sync, and the hub never waits."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pytest
from lmdb_support import Worker, batch, new_id

from mayfly.errors import AppendConflict
from mayfly.runindex import IndexEntry, IndexStatus
from mayfly.substrate import Hub, TaskCancelled, TaskFailed, sleep, spawn
from mayfly_lmdb import LmdbJournal


def test_appends_queued_behind_a_sync_share_one_commit_while_the_hub_runs(
    url: str, workers: list[Worker]
) -> None:
    """40 hub tasks append while another process holds LMDB's writer lock: the hub keeps ticking, one commit acks all."""
    with LmdbJournal(url) as journal:  # durability=sync: every commit waits for the disk
        shared = journal._env
        assert shared.sync
        # Opened first: opening writes the format marker, which would wait for the holder's lock.
        holder = Worker("write-hold", url=url)
        workers.append(holder)
        assert holder.readline().startswith("writing")
        runs = [new_id() for _ in range(40)]
        commits, writes = shared.commits, shared.writes
        ticks_while_blocked: list[int] = []

        def append(run: str) -> int:
            entry = IndexEntry(run_id=run, status=IndexStatus.NEW, ready_at_ms=1, sequence=1)
            return journal.append_indexed(run, 1, batch(run, 1), None, lambda: entry).last_sequence

        def main() -> list[int]:
            tasks = [spawn(append, run) for run in runs]
            ticks = 0
            # Every append waits on an offload thread: the leader for the writer lock, the rest for it.
            while len(shared._pending) < len(runs):
                sleep(0.001)
                ticks += 1
            for _ in range(20):
                sleep(0.001)  # the hub still runs timers while the appends wait
                ticks += 1
            ticks_while_blocked.append(ticks)
            assert all(not task.done for task in tasks)
            assert holder.process.stdin is not None
            holder.process.stdin.write("release\n")
            holder.process.stdin.flush()
            return [task.join() for task in tasks]

        assert Hub(offload_workers=64).run(main) == [1] * len(runs)
        assert holder.readline() == "released"
        assert ticks_while_blocked[0] >= 20
        assert shared.commits - commits == 1  # one transaction, one sync, for all 40 appends
        assert shared.writes - writes == len(runs)
        for run in runs:
            assert journal.next_sequence(run) == 2
            stored = journal.index_get(run)
            assert stored is not None and stored.status is IndexStatus.NEW


def test_a_write_that_fails_in_a_group_writes_nothing_and_the_others_commit(tmp_path: Path) -> None:
    """A refused append inside a shared commit aborts only its own nested transaction."""
    url = f"lmdb://{tmp_path}/env?durability=nosync"
    with LmdbJournal(url) as journal:
        shared = journal._env
        good = [new_id() for _ in range(8)]
        bad = new_id()
        journal.append(bad, 1, batch(bad, 1))
        start = threading.Barrier(len(good) + 1)
        errors: list[BaseException] = []

        def append(run: str, expected: int) -> None:
            start.wait()
            try:
                journal.append(run, expected, batch(run, expected, 3))
            except AppendConflict as error:
                errors.append(error)

        # Plain threads (no hub): group commit serves them too. Hold the writer lock so they all queue.
        txn = shared.env.begin(write=True)
        threads = [threading.Thread(target=append, args=(run, 1)) for run in good]
        threads.append(threading.Thread(target=append, args=(bad, 1)))  # sequence 1 is taken
        for thread in threads:
            thread.start()
        while len(shared._pending) < len(threads):
            threading.Event().wait(0.001)
        commits = shared.commits
        txn.abort()
        for thread in threads:
            thread.join(timeout=30)
        assert shared.commits - commits == 1
        assert len(errors) == 1 and bad in str(errors[0])
        assert journal.next_sequence(bad) == 2
        for run in good:
            assert [r.sequence for r in journal.read(run)] == [1, 2, 3]


@pytest.mark.parametrize("durability", ["sync", "nosync"])
def test_many_hub_tasks_appending_at_once_share_commits(tmp_path: Path, durability: str) -> None:
    """100 tasks append 5 batches each: every append is acknowledged and stored; synced commits are shared."""
    url = f"lmdb://{tmp_path}/env?durability={durability}"
    with LmdbJournal(url) as journal:
        shared = journal._env
        runs = [new_id() for _ in range(100)]
        commits, writes = shared.commits, shared.writes

        def drive(run: str) -> int:
            for sequence in range(1, 6):
                journal.append(run, sequence, batch(run, sequence))
            return journal.next_sequence(run)

        def main() -> list[int]:
            return [task.join() for task in [spawn(drive, run) for run in runs]]

        assert Hub(offload_workers=64).run(main) == [6] * len(runs)
        assert shared.writes - writes == 500
        for run in runs:
            assert [r.sequence for r in journal.read(run)] == [1, 2, 3, 4, 5]
        if durability == "sync":
            # 64 offload threads wait on ~0.1-10 ms syncs one leader at a time: groups form.
            assert shared.commits - commits < 500


def test_writes_of_one_hub_turn_travel_in_one_batch(tmp_path: Path) -> None:
    """Tasks that append in the same turn of the hub share one offload and one commit."""
    url = f"lmdb://{tmp_path}/env?durability=nosync"
    with LmdbJournal(url) as journal:
        shared = journal._env
        runs = [new_id() for _ in range(30)]
        journal.append(runs[0], 1, batch(runs[0], 1))  # the environment exists: nothing else writes now
        commits = shared.commits

        def append(run: str) -> int:
            first = journal.next_sequence(run)
            return journal.append(run, first, batch(run, first)).last_sequence

        def main() -> list[int]:
            tasks = [spawn(append, run) for run in runs]
            return [task.join() for task in tasks]

        assert Hub().run(main) == [2] + [1] * 29
        assert shared.commits - commits == 1


def test_a_batch_whose_opener_is_cancelled_before_submitting_is_written_without_its_write(
    tmp_path: Path,
) -> None:
    """The opener is cancelled while it waits for the batch to fill: the others' writes commit, its own is not made."""
    url = f"lmdb://{tmp_path}/env?durability=nosync"
    with LmdbJournal(url) as journal:
        opener_run, *member_runs = [new_id() for _ in range(4)]
        outcome: dict[str, object] = {}

        def append(run: str) -> None:
            try:
                outcome[run] = journal.append(run, 1, batch(run, 1)).last_sequence
            except TaskCancelled:
                outcome[run] = "cancelled"
                raise

        def main() -> None:
            opener = spawn(append, opener_run)
            members = [spawn(append, run) for run in member_runs]
            # Runs after the opener opened the batch and the members joined it, before it resumes.
            spawn(lambda: opener.cancel("test: cancel the opener"))
            for task in members:
                task.join()
            with contextlib.suppress(TaskCancelled, TaskFailed):
                opener.join()

        Hub().run(main)
        assert outcome == {opener_run: "cancelled", **{run: 1 for run in member_runs}}
        assert journal.next_sequence(opener_run) == 1  # never submitted: not made
        for run in member_runs:
            assert journal.next_sequence(run) == 2


def test_a_batch_whose_owner_is_cancelled_in_flight_still_wakes_its_members(
    url: str, workers: list[Worker]
) -> None:
    """The owner is cancelled while its batch waits for the writer lock: a member takes over, every write commits."""
    with LmdbJournal(url) as journal:
        shared = journal._env
        holder = Worker("write-hold", url=url)
        workers.append(holder)
        assert holder.readline().startswith("writing")
        owner_run, *member_runs = [new_id() for _ in range(4)]
        outcome: dict[str, object] = {}

        def append(run: str) -> None:
            try:
                outcome[run] = journal.append(run, 1, batch(run, 1)).last_sequence
            except TaskCancelled:
                outcome[run] = "cancelled"
                raise

        def main() -> None:
            owner = spawn(append, owner_run)
            members = [spawn(append, run) for run in member_runs]
            while len(shared._pending) < 4:
                sleep(0.001)  # the batch is in flight, behind the other process's writer lock
            owner.cancel("test: cancel the owner in flight")
            with contextlib.suppress(TaskCancelled, TaskFailed):
                owner.join()
            assert holder.process.stdin is not None
            holder.process.stdin.write("release\n")
            holder.process.stdin.flush()
            for task in members:
                task.join()

        Hub(offload_workers=8).run(main)
        assert outcome == {owner_run: "cancelled", **{run: 1 for run in member_runs}}
        for run in [owner_run, *member_runs]:
            assert journal.next_sequence(run) == 2  # submitted before the cancel: committed
