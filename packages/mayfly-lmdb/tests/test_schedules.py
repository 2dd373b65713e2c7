"""Stored schedules in LMDB: damaged bytes fail closed, an old read-only environment has none, a worker serves them."""

from __future__ import annotations

import pytest

from mayfly import HandlerRegistry, Node, Succeeded, WorkflowSpec
from mayfly.errors import CompatibilityError, CorruptionError
from mayfly.runtime import WorkflowRuntime
from mayfly.schedules import Schedule, add_schedule, encode_schedule, list_schedules, tick_run_id
from mayfly.worker import Worker
from mayfly_lmdb import LmdbJournal

SPEC = WorkflowSpec(workflow_id="sched.lmdb", version=1, nodes=(Node("n", handler="n@1"),))


def _raw(journal: LmdbJournal, key: bytes, value: bytes) -> None:
    """Write bytes into the schedules database behind the store's checks (as a disk or an operator might)."""
    shared = journal._env
    shared.write(lambda txn: txn.put(key, value, db=shared.schedules), "damaging a schedule")


def test_damaged_bytes_fail_closed_and_a_damaged_schedule_can_be_removed(url: str) -> None:
    with LmdbJournal(url) as journal:
        stored = journal.schedule_put(Schedule(name="flip", spec=SPEC, every_ms=60_000), now_ms=1_000)
        data = bytearray(encode_schedule(stored))
        data[data.index(b"60000")] ^= 0x01  # still JSON, no longer the checksummed body
        _raw(journal, b"d/flip", bytes(data))
        with pytest.raises(CorruptionError, match="fails its checksum"):
            journal.schedule_get("flip")
        with pytest.raises(CorruptionError):
            journal.schedule_list()
        _raw(journal, b"d/flip", b'{"format":9,"sha256":"","body":{}}')
        with pytest.raises(CompatibilityError, match="schedule format 9"):
            journal.schedule_get("flip")
        _raw(journal, b"d/flip", encode_schedule(stored))
        _raw(journal, b"t/flip", b"\x01\x02\x03")
        with pytest.raises(CorruptionError, match="last tick"):
            journal.schedule_get("flip")
        assert journal.schedule_remove("flip") is True
        assert journal.schedule_list() == []


def test_a_worker_serves_a_schedule_added_from_python(url: str) -> None:
    """add_schedule on the LMDB journal: an in-process worker starts the tick runs and records the last tick."""
    registry = HandlerRegistry()
    registry.register("n", 1, lambda request: Succeeded())
    with LmdbJournal(url) as journal:
        add_schedule(journal, Schedule(name="every-second", spec=SPEC, every_ms=1_000))
    worker = Worker(url, registry, poll_interval_ms=100, log=lambda record: None)
    worker.run(until=lambda: worker.ended >= 2)
    runtime = WorkflowRuntime(url)
    [stored] = list_schedules(runtime.journal)
    runs = runtime.journal.list_runs()
    assert stored.last_tick_ms is not None
    assert sum(runtime.summary(run).status.value == "succeeded" for run in runs) >= 2
    ticks = {run: runtime.inspect(run).state.input["scheduled_at_ms"] for run in runs}  # type: ignore[index, call-overload]
    assert all(run == tick_run_id("every-second", tick) for run, tick in ticks.items())  # type: ignore[arg-type]
    assert stored.last_tick_ms == max(ticks.values())  # type: ignore[type-var]
    runtime.journal.close()
