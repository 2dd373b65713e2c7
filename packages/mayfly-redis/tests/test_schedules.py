"""Stored schedules on Redis: damaged bytes fail closed, a Cluster keeps them too, AOF keeps them across a kill."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from mayfly import HandlerRegistry, Node, Succeeded, WorkflowSpec
from mayfly.errors import CompatibilityError, CorruptionError
from mayfly.runtime import WorkflowRuntime
from mayfly.schedules import (
    SCHEDULE_STORE,
    Schedule,
    add_schedule,
    encode_schedule,
    list_schedules,
    tick_run_id,
)
from mayfly.worker import Worker
from mayfly_redis import RedisJournal
from mayfly_redis.testing import RedisClusterNodes, RedisServer

SPEC = WorkflowSpec(workflow_id="sched.redis", version=1, nodes=(Node("n", handler="n@1"),))


@pytest.fixture
def journal(aof_server: RedisServer) -> Iterator[RedisJournal]:
    """A journal under a prefix of this test alone."""
    with RedisJournal(f"{aof_server.url}?prefix=sched.{uuid.uuid4().hex[:12]}") as opened:
        yield opened


def test_damaged_bytes_fail_closed_and_a_damaged_schedule_can_be_removed(journal: RedisJournal) -> None:
    stored = journal.schedule_put(Schedule(name="flip", spec=SPEC, every_ms=60_000), now_ms=1_000)
    definitions, ticks = journal._schedule_keys()
    data = bytearray(encode_schedule(stored))
    data[data.index(b"60000")] ^= 0x01  # still JSON, no longer the checksummed body
    journal._store.call("damage", "HSET", definitions, "flip", bytes(data))
    with pytest.raises(CorruptionError, match="fails its checksum"):
        journal.schedule_get("flip")
    with pytest.raises(CorruptionError):
        journal.schedule_list()
    journal._store.call("damage", "HSET", definitions, "flip", b'{"format":3,"sha256":"","body":{}}')
    with pytest.raises(CompatibilityError, match="schedule format 3"):
        journal.schedule_get("flip")
    journal._store.call("repair", "HSET", definitions, "flip", encode_schedule(stored))
    journal._store.call("damage", "HSET", ticks, "flip", "soon")
    with pytest.raises(CorruptionError, match="last tick"):
        journal.schedule_get("flip")
    assert journal.schedule_remove("flip") is True
    assert journal.schedule_list() == []


def test_a_schedule_survives_the_server_being_killed_with_aof(fresh_server: RedisServer) -> None:
    """Acknowledged puts and marks are in the AOF (appendfsync always): a SIGKILLed server keeps them."""
    url = f"{fresh_server.url}?prefix=sched.restart"
    with RedisJournal(url) as journal:
        journal.schedule_put(Schedule(name="kept", spec=SPEC, cron="0 9 * * 1-5"), now_ms=1_000)
        journal.schedule_mark("kept", 5_000)
    fresh_server.kill()
    fresh_server.start()
    with RedisJournal(url) as journal:
        got = journal.schedule_get("kept")
        assert got is not None and (got.schedule.cron, got.last_tick_ms) == ("0 9 * * 1-5", 5_000)


def test_a_sharded_cluster_store_keeps_schedules_in_one_slot(aof_cluster: RedisClusterNodes) -> None:
    """On a Cluster (a new prefix: run-index sharding) schedules are stored, versioned and marked alike."""
    with RedisJournal(f"{aof_cluster.url}?prefix=sched.cluster.{uuid.uuid4().hex[:8]}") as journal:
        store = SCHEDULE_STORE.of(journal)
        assert store is not None
        created = store.schedule_put(
            Schedule(name="c", spec=SPEC, every_ms=2_000), now_ms=1_000, expected_version=0
        )
        assert store.schedule_mark("c", 4_000) and not store.schedule_mark("other", 4_000)
        replaced = store.schedule_put(
            Schedule(name="c", spec=SPEC, every_ms=4_000), now_ms=2_000, expected_version=1
        )
        assert (created.version, replaced.version) == (1, 2)
        [listed] = store.schedule_list()
        assert (listed.schedule.every_ms, listed.last_tick_ms, listed.created_ms) == (4_000, 4_000, 1_000)
        assert store.schedule_remove("c") and store.schedule_get("c") is None


def test_a_worker_serves_a_schedule_added_from_python(aof_server: RedisServer) -> None:
    """add_schedule on a standalone Redis: an in-process worker starts the tick runs and records the last tick."""
    url = f"{aof_server.url}?prefix=sched.worker.{uuid.uuid4().hex[:8]}"
    registry = HandlerRegistry()
    registry.register("n", 1, lambda request: Succeeded())
    with RedisJournal(url) as journal:
        add_schedule(journal, Schedule(name="every-second", spec=SPEC, every_ms=1_000))
    worker = Worker(url, registry, poll_interval_ms=100, log=lambda record: None)
    worker.run(until=lambda: worker.ended >= 2)
    runtime = WorkflowRuntime(url)
    [stored] = list_schedules(runtime.journal)
    runs = runtime.journal.list_runs()
    assert sum(runtime.summary(run).status.value == "succeeded" for run in runs) >= 2
    ticks = {run: runtime.inspect(run).state.input["scheduled_at_ms"] for run in runs}  # type: ignore[index, call-overload]
    assert all(run == tick_run_id("every-second", tick) for run, tick in ticks.items())  # type: ignore[arg-type]
    assert stored.last_tick_ms == max(ticks.values())  # type: ignore[type-var]
    runtime.journal.close()
