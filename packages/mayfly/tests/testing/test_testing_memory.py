"""The memory:// backend beyond the contract suite: URLs, named stores, its clock, and a Worker on it."""

from __future__ import annotations

import pytest

from mayfly import HandlerRegistry, Node, RetryableFailure, RetryPolicy, RunStatus, Succeeded, WorkflowSpec
from mayfly.errors import InvalidBackendURL, LeaseHeld
from mayfly.journal import Durability
from mayfly.plugins import list_backends, open_journal, open_leases
from mayfly.runindex import RUN_INDEX, RUN_WAKEUPS
from mayfly.substrate import VirtualClock
from mayfly.testing import MEMORY_CAPABILITIES, MemoryJournal, MemoryStore, drop_store, memory_store
from mayfly.worker import Worker


def test_memory_urls_open_one_named_store_shared_by_journal_and_leases() -> None:
    """memory://NAME opens the same store for journal and leases; closing and reopening keeps its runs."""
    store = MemoryStore()
    try:
        journal = open_journal(store.url)
        leases = open_leases(store.url)
        assert isinstance(journal, MemoryJournal) and journal.url == store.url
        assert journal.durability is Durability.MEMORY and journal.capabilities == MEMORY_CAPABILITIES
        assert not journal.capabilities.cross_process and not journal.capabilities.crash_durable
        assert RUN_INDEX.of(journal) is journal and RUN_WAKEUPS.of(journal) is None
        with leases.acquire("0193a5c4-7b1e-7c3d-9f00-1234567890ab", "me", 60_000) as guard:
            assert journal.store.fences["0193a5c4-7b1e-7c3d-9f00-1234567890ab"] == guard.fencing_token
        journal.close()
        assert memory_store(store.name) is store
    finally:
        assert drop_store(store.name)
    assert not drop_store(store.name)


@pytest.mark.parametrize(
    "url",
    [
        "memory://_under",
        "memory://name/path",
        "memory://name:80",
        "memory://user@name",
        "memory://x?durability=write",
    ],
)
def test_malformed_memory_urls_are_refused(url: str) -> None:
    """A memory URL that names more than a store, or a bad store name, raises InvalidBackendURL."""
    with pytest.raises(InvalidBackendURL, match="memory"):
        open_journal(url)


def test_memory_backend_is_listed_with_the_core_distribution() -> None:
    """`mayfly backends` lists memory:// journal and leases from mayfly-runtime."""
    rows = {(row.kind, row.scheme, row.distribution) for row in list_backends()}
    assert {("journal", "memory", "mayfly-runtime"), ("lease", "memory", "mayfly-runtime")} <= rows


def test_lease_expiry_follows_the_store_clock() -> None:
    """A lease outlives its ttl in wall time until the store's (virtual) clock passes the ttl."""
    clock = VirtualClock(wall_origin_ms=1_000)
    store = MemoryStore(clock=clock.wall_ms)
    try:
        leases = store.leases()
        run = "0193a5c4-7b1e-7c3d-9f00-1234567890ab"
        held = leases.acquire(run, "first", 1_000)
        clock.advance_to(999)
        with pytest.raises(LeaseHeld):
            leases.acquire(run, "second", 1_000)
        clock.advance_to(1_000)
        taken = leases.acquire(run, "second", 1_000)
        assert taken.fencing_token == held.fencing_token + 1
        leases.close()
    finally:
        drop_store(store.name)


def test_a_worker_drives_runs_on_the_memory_store() -> None:
    """A Worker claims runs from the memory store's run index and drives them (a retry included) to the end."""
    registry = HandlerRegistry()

    @registry.handler("flaky", version=1)
    def flaky(req: object) -> object:
        return RetryableFailure(reason="first try") if req.attempt == 1 else Succeeded(output={"ok": True})  # type: ignore[attr-defined]

    spec = WorkflowSpec(
        "memory.worker",
        1,
        (Node("flaky", handler="flaky@1", retry=RetryPolicy(max_attempts=3)),),
    )
    store = MemoryStore()
    try:
        journal, leases = store.journal(), store.leases()
        events: list[dict[str, object]] = []
        worker = Worker(journal, registry, leases=leases, log=events.append, clock=VirtualClock)
        runs = [worker.runtime.start(spec).run_id for _ in range(3)]

        def done() -> bool:
            return all(worker.runtime.summary(run).status.is_terminal for run in runs)

        worker.run(until=done)
        assert [worker.runtime.summary(run).status for run in runs] == [RunStatus.SUCCEEDED] * 3
        assert {e["run_id"] for e in events if e["event"] == "ended"} == set(runs)
        journal.close()
        leases.close()
    finally:
        drop_store(store.name)
