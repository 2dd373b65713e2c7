"""Pipelined scripts: hub tasks appending at once share round trips, each answered by its own reply.

Every verdict is read back from the server; the pipelines' counters only show
that commands were batched at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from mayfly.errors import AppendConflict, FencingRejected, JournalUnavailable
from mayfly.substrate import Hub, spawn
from mayfly_redis import RedisJournal, RedisLeaseStore
from mayfly_redis.testing import RedisClusterNodes, RedisServer

if TYPE_CHECKING:
    from conftest import Records


def _together(calls: list[Any]) -> list[Any]:
    """Run every call as its own hub task at once; each one's result or exception, in order."""

    def main() -> list[Any]:
        def guarded(call: Any) -> Any:
            try:
                return call()
            except Exception as error:  # the test inspects each outcome
                return error

        tasks = [spawn(guarded, call) for call in calls]
        return [task.join() for task in tasks]

    return Hub().run(main)


def _appends(journal: RedisJournal, records: Records, runs: list[str], rounds: int) -> list[Any]:
    def drive(run: str) -> int:
        for first in range(1, 2 * rounds + 1, 2):
            journal.append(run, first, records.batch(run, first, 2))
        return journal.next_sequence(run)

    return _together([lambda run=run: drive(run) for run in runs])


def _depth(journal: RedisJournal) -> tuple[int, int]:
    pipelines = journal._store._pipelines
    return sum(p.commands for p in pipelines), sum(p.flushes for p in pipelines)


def test_fifty_tasks_appending_at_once_share_round_trips_and_every_record_lands(
    aof_server: RedisServer, records: Records
) -> None:
    """50 runs x 10 batches from 50 hub tasks: all acknowledged, in order, in fewer round trips than commands."""
    with RedisJournal(aof_server.url + "?prefix=pipe.many") as journal:
        runs = [records.new_id() for _ in range(50)]
        assert _appends(journal, records, runs, 10) == [21] * 50
        commands, flushes = _depth(journal)
        assert commands >= 500 and flushes < commands, (commands, flushes)
    with RedisJournal(aof_server.url + "?prefix=pipe.many&pipeline=off") as reader:
        for run in runs:
            assert [r.sequence for r in reader.read(run)] == list(range(1, 21))


def test_pipeline_off_sends_every_script_alone(aof_server: RedisServer, records: Records) -> None:
    """?pipeline=off: no pipeline is made, the appends still land."""
    with RedisJournal(aof_server.url + "?prefix=pipe.off&pipeline=off") as journal:
        runs = [records.new_id() for _ in range(10)]
        assert _appends(journal, records, runs, 3) == [7] * 10
        assert journal._store._pipelines == []


def test_a_refusal_in_a_pipeline_concerns_only_its_own_run(aof_server: RedisServer, records: Records) -> None:
    """A stale fence and a CAS conflict sent in the same flushes as good appends: only they are refused."""
    url = aof_server.url + "?prefix=pipe.refusal"
    with RedisJournal(url) as journal, RedisLeaseStore(url) as leases:
        fenced, conflicted = records.new_id(), records.new_id()
        good = [records.new_id() for _ in range(20)]
        old = leases.acquire(fenced, "old", ttl_ms=60_000)
        stale = old.fencing_token
        old.release()
        leases.acquire(fenced, "new", ttl_ms=60_000)  # a newer token: the old one is stale
        journal.append(conflicted, 1, records.batch(conflicted, 1))
        calls: list[Any] = [
            lambda: journal.append(fenced, 1, records.batch(fenced, 1), fence=stale),
            lambda: journal.append(conflicted, 1, records.batch(conflicted, 1)),  # expects 1, is at 2
        ]
        calls += [
            lambda run=run: journal.append(run, 1, records.batch(run, 1, 3)).last_sequence for run in good
        ]
        outcomes = _together(calls)
        assert isinstance(outcomes[0], FencingRejected)
        assert isinstance(outcomes[1], AppendConflict)
        assert outcomes[2:] == [3] * len(good)
        assert journal.next_sequence(fenced) == 1 and journal.next_sequence(conflicted) == 2
        assert all(journal.next_sequence(run) == 4 for run in good)


def test_scripts_flushed_from_the_server_are_loaded_again_for_every_pipelined_command(
    aof_server: RedisServer, records: Records
) -> None:
    """SCRIPT FLUSH: every command of the next flush answers NOSCRIPT alone; each reloads and lands."""
    with RedisJournal(aof_server.url + "?prefix=pipe.noscript") as journal:
        runs = [records.new_id() for _ in range(20)]
        assert _appends(journal, records, runs, 1) == [3] * 20
        journal._store.call("flush scripts", "SCRIPT", "FLUSH")
        outcomes = _together(
            [lambda run=run: journal.append(run, 3, records.batch(run, 3)).last_sequence for run in runs]
        )
        assert outcomes == [3] * 20


def test_a_server_killed_under_a_pipeline_fails_every_waiting_append_closed(
    fresh_server: RedisServer, records: Records
) -> None:
    """Tasks parked on a flush when the server dies each get JournalUnavailable; none hangs or is acknowledged."""
    with RedisJournal(fresh_server.url + "?prefix=pipe.kill&timeout=5") as journal:
        runs = [records.new_id() for _ in range(30)]
        acknowledged: dict[str, int] = {}

        def drive(run: str) -> None:
            first = 1
            while True:
                journal.append(run, first, records.batch(run, first))
                acknowledged[run] = first
                first += 1
                if first == 20 and run == runs[0]:
                    fresh_server.kill()

        outcomes = _together([lambda run=run: drive(run) for run in runs])
        assert all(isinstance(outcome, JournalUnavailable) for outcome in outcomes), outcomes
    fresh_server.start()
    with RedisJournal(fresh_server.url + "?prefix=pipe.kill&pipeline=off") as reader:
        for run in runs:
            assert reader.next_sequence(run) - 1 >= acknowledged.get(run, 0), (
                "an acknowledged append was lost"
            )


def test_a_cluster_pipelines_per_node(aof_cluster: RedisClusterNodes, records: Records) -> None:
    """On a Cluster the commands are grouped per primary: one pipeline per node, every record lands."""
    with RedisJournal(aof_cluster.url + "?prefix=pipe.cluster") as journal:
        runs = [records.new_id() for _ in range(60)]
        assert _appends(journal, records, runs, 5) == [11] * 60
        pipelines = journal._store._pipelines
        assert len(pipelines) == 3
        commands, flushes = _depth(journal)
        assert flushes < commands, (commands, flushes)
        for run in runs:
            assert [r.sequence for r in journal.read(run)] == list(range(1, 11))


@pytest.mark.parametrize("pipeline", ["on", "off"])
def test_reads_off_the_hub_never_use_a_pipeline(
    aof_server: RedisServer, records: Records, pipeline: str
) -> None:
    """A plain thread's appends go on their own (the pipeline serves hub tasks only)."""
    with RedisJournal(aof_server.url + f"?prefix=pipe.thread&pipeline={pipeline}") as journal:
        run = records.new_id()
        journal.append(run, 1, records.batch(run, 1, 2))
        assert [r.sequence for r in journal.read(run)] == [1, 2]
        assert journal._store._pipelines == []
