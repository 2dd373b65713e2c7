"""The Redis run index: entries stored with appends, claims in order with leases, wake-ups (real Redis)."""

from __future__ import annotations

import select
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from mayfly.errors import (
    AppendConflict,
    CompatibilityError,
    FencingRejected,
    InvalidIdentifier,
    InvalidRecord,
    LeaseLost,
)
from mayfly.runindex import RUN_INDEX, RUN_WAKEUPS, IndexEntry, IndexStatus
from mayfly_redis import RedisJournal, RedisLeaseStore
from mayfly_redis.testing import RedisClusterNodes, RedisServer, legacy_cluster_store

if TYPE_CHECKING:
    from conftest import Records

NOW = 1_800_000_000_000


@pytest.fixture
def journal(aof_server: RedisServer) -> Iterator[RedisJournal]:
    """A journal under a prefix of this test alone."""
    with RedisJournal(f"{aof_server.url}?prefix=ri.{uuid.uuid4().hex[:12]}") as opened:
        yield opened


def entry(run_id: str, status: str = "new", ready: int | None = NOW, **fields: object) -> IndexEntry:
    return IndexEntry(
        run_id=run_id,
        status=IndexStatus(status),
        ready_at_ms=ready,
        sequence=int(fields.pop("sequence", 1)),  # type: ignore[call-overload]
        **fields,  # type: ignore[arg-type]
    )


def claimed(journal: RedisJournal, *, limit: int = 100, now: int = NOW, **kw: object) -> list[str]:
    guards = journal.claim("tester", limit=limit, ttl_ms=60_000, now_ms=now, **kw)  # type: ignore[arg-type]
    return [guard.run_id for guard in guards]


def test_a_standalone_journal_declares_the_index_and_wakeups(journal: RedisJournal) -> None:
    """run_index and run_wakeups are declared and their Protocols implemented."""
    assert journal.capabilities.run_index and journal.capabilities.run_wakeups
    assert RUN_INDEX.of(journal) is journal and RUN_WAKEUPS.of(journal) is journal


def test_claims_follow_priority_then_ready_at_with_none_last_then_run_id(
    journal: RedisJournal, records: Records
) -> None:
    """Claim order is priority descending, then ready_at (a woken run with none last), then run id."""
    ids = sorted(records.new_id() for _ in range(6))
    journal.index_put(
        [
            entry(ids[0], ready=NOW - 10),
            entry(ids[1], ready=NOW - 20),
            entry(ids[2], ready=NOW - 20),  # same ready_at as ids[1]: run id decides
            entry(ids[3], "waiting", None, wake=True),  # woken, no wake time: after every timed one
            entry(ids[4], ready=NOW + 5, priority=3),  # higher priority first even if later
            entry(ids[5], "waiting", NOW - 15),  # due waiting run, merged into the order
        ]
    )
    assert claimed(journal, limit=2) == [ids[4], ids[1]]
    assert claimed(journal) == [ids[2], ids[5], ids[0], ids[3]]
    assert claimed(journal) == []


def test_waiting_runs_are_claimable_when_due_or_woken_and_a_claim_clears_the_wake(
    journal: RedisJournal, records: Records
) -> None:
    """A waiting run is claimed once its ready_at is due, or when woken; the claim clears the wake."""
    later, parked = records.new_id(), records.new_id()
    journal.index_put([entry(later, "waiting", NOW + 1_000), entry(parked, "waiting", None)])
    assert claimed(journal) == []
    assert journal.next_wake(now_ms=NOW) == NOW + 1_000
    assert claimed(journal, now=NOW + 1_000) == [later]
    assert journal.index_wake(parked) is True
    assert journal.index_get(parked).wake  # type: ignore[union-attr]
    assert claimed(journal) == [parked]
    assert journal.index_get(parked).wake is False  # type: ignore[union-attr]


def test_next_wake_is_the_earliest_future_wake_of_a_waiting_root_run(
    journal: RedisJournal, records: Records
) -> None:
    """next_wake ignores due, runnable, child and other-queue runs, and is None with nothing to wait for."""
    ids = [records.new_id() for _ in range(5)]
    assert journal.next_wake(now_ms=NOW) is None
    journal.index_put(
        [
            entry(ids[0], "waiting", NOW + 500),
            entry(ids[1], "waiting", NOW - 500),
            entry(ids[2], "waiting", NOW + 100, parent=ids[0]),
            entry(ids[3], "waiting", NOW + 200, queue="other"),
            entry(ids[4], "running", NOW + 50),
        ]
    )
    assert journal.next_wake(now_ms=NOW) == NOW + 200
    assert journal.next_wake(now_ms=NOW, queues=["default"]) == NOW + 500
    assert journal.next_wake(now_ms=NOW + 500) is None


def test_child_runs_and_ended_runs_are_never_claimed(journal: RedisJournal, records: Records) -> None:
    """Entries with a parent, and terminal entries, are never handed out, whatever their status."""
    parent, child, ended = records.new_id(), records.new_id(), records.new_id()
    journal.index_put(
        [
            entry(child, "running", parent=parent),
            entry(ended, "terminal", None),
            entry(parent, "waiting", None),
        ]
    )
    assert journal.index_wake(child) is True  # a child's flag is set, yet it is never claimed
    assert claimed(journal) == []
    assert journal.index_wake(ended) is False
    assert journal.index_wake(records.new_id()) is False


def test_queues_filter_claims(journal: RedisJournal, records: Records) -> None:
    """A claim of some queues takes only their runs; None takes every queue's."""
    a, b = sorted([records.new_id(), records.new_id()])
    journal.index_put([entry(a, queue="alpha"), entry(b, queue="beta")])
    assert claimed(journal, queues=["beta"]) == [b]
    assert claimed(journal, queues=["beta"]) == []
    assert claimed(journal) == [a]


def test_a_lower_sequence_never_replaces_an_entry_and_a_stored_wake_is_kept(
    journal: RedisJournal, records: Records
) -> None:
    """index_put keeps the newer entry, replaces on an equal or higher sequence, and keeps a stored wake."""
    run = records.new_id()
    journal.index_put([entry(run, "waiting", NOW + 9, sequence=5)])
    journal.index_put([entry(run, "running", NOW, sequence=4)])
    assert journal.index_get(run) == entry(run, "waiting", NOW + 9, sequence=5)
    assert journal.index_wake(run)
    journal.index_put([entry(run, "waiting", NOW + 7, sequence=6)])
    stored = journal.index_get(run)
    assert stored == entry(run, "waiting", NOW + 7, sequence=6, wake=True)


def test_invalid_arguments_are_refused_with_invalid_record(journal: RedisJournal, records: Records) -> None:
    """Bad limits, queues, owners, ttls, clocks and entries raise InvalidRecord and change nothing."""
    run = records.new_id()
    journal.index_put([entry(run)])
    bad_claims: list[dict[str, object]] = [
        {"limit": 0},
        {"limit": True},
        {"limit": 10_001},
        {"queues": "default"},
        {"queues": []},
        {"queues": ["Bad Queue"]},
        {"owner": ""},
        {"ttl_ms": 0},
        {"now_ms": "soon"},
    ]
    for bad in bad_claims:
        arguments: dict[str, object] = {"owner": "w", "limit": 1, "ttl_ms": 1000, "now_ms": NOW, **bad}
        with pytest.raises(InvalidRecord):
            journal.claim(**arguments)  # type: ignore[arg-type]
    for bad_entry in (
        "nope",
        entry(run, priority=1 << 63),
        entry(run, queue="Bad Queue"),
        entry(run, sequence=-1),
    ):
        with pytest.raises(InvalidRecord):
            journal.index_put([bad_entry])  # type: ignore[list-item]
    # Malformed run ids are refused as the local journal refuses them (InvalidIdentifier).
    for bad_id in (entry("not-a-uuid"), entry(run, parent="x")):
        with pytest.raises(InvalidIdentifier):
            journal.index_put([bad_id])
    with pytest.raises(InvalidIdentifier):
        journal.index_get("not-a-uuid")
    with pytest.raises(InvalidRecord):
        journal.next_wake(now_ms=NOW, queues="default")
    assert journal.index_get(run) == entry(run)
    assert claimed(journal) == [run]


def test_a_run_whose_lease_expired_is_claimable_again_with_a_higher_token(
    journal: RedisJournal, records: Records
) -> None:
    """A claimed run is not claimed again while its lease lives; once it expires the next claim takes it."""
    run = records.new_id()
    journal.index_put([entry(run)])
    (first,) = journal.claim("a", limit=5, ttl_ms=150, now_ms=NOW)
    assert journal.claim("b", limit=5, ttl_ms=150, now_ms=NOW) == []
    time.sleep(0.3)
    (second,) = journal.claim("b", limit=5, ttl_ms=60_000, now_ms=NOW)
    assert second.run_id == run and second.fencing_token > first.fencing_token
    with pytest.raises(LeaseLost):
        first.renew()


def test_claimed_guards_renew_and_release_like_acquired_ones(
    aof_server: RedisServer, journal: RedisJournal, records: Records
) -> None:
    """A renewed claim outlives its first ttl; a released one is claimable at once and acquirable by the store."""
    run = records.new_id()
    journal.index_put([entry(run)])
    (guard,) = journal.claim("a", limit=1, ttl_ms=300, now_ms=NOW)
    with RedisLeaseStore(journal.url) as leases:
        assert leases.current_fence(run) == guard.fencing_token
        for _ in range(4):
            time.sleep(0.15)
            guard.renew()
        assert journal.claim("b", limit=1, ttl_ms=300, now_ms=NOW) == []  # 600 ms in: still held
        guard.release()
        (again,) = journal.claim("b", limit=1, ttl_ms=60_000, now_ms=NOW)
        assert again.fencing_token == guard.fencing_token + 1
        again.release()
        leases.acquire(run, "store", 1_000).release()
    with pytest.raises(LeaseLost):
        guard.renew()


def test_appends_store_the_entry_and_a_fenced_append_after_a_reclaim_stores_none(
    journal: RedisJournal, records: Records
) -> None:
    """Appends under a claim store their entries; once the run is claimed again the old owner's append is refused
    (its entry, sent with it, is not stored), and the stored entry is the new owner's."""
    run = records.new_id()
    asked: list[int] = []

    def indexed(status: str, sequence: int) -> IndexEntry:
        asked.append(sequence)
        return entry(run, status, NOW + sequence, sequence=sequence)

    journal.append_indexed(run, 1, records.batch(run, 1), None, lambda: indexed("new", 1))
    (old,) = journal.claim("old", limit=1, ttl_ms=200, now_ms=NOW)
    for sequence in (2, 3, 4):  # each asks for its entry once, sent with its records
        journal.append_indexed(
            run,
            sequence,
            records.batch(run, sequence),
            old.fencing_token,
            lambda s=sequence: indexed("running", s),
        )
    assert asked == [1, 2, 3, 4]
    # The claim of the new run recorded its start (queue_control); later appends keep it.
    assert journal.index_get(run) == entry(run, "running", NOW + 4, sequence=4, started_ms=NOW)
    time.sleep(0.35)
    (new,) = journal.claim("new", limit=1, ttl_ms=60_000, now_ms=NOW)
    with pytest.raises(FencingRejected):
        journal.append_indexed(
            run, 5, records.batch(run, 5), old.fencing_token, lambda: indexed("waiting", 5)
        )
    assert asked == [1, 2, 3, 4, 5]
    assert journal.index_get(run) == entry(run, "running", NOW + 4, sequence=4, started_ms=NOW)
    journal.append_indexed(run, 5, records.batch(run, 5), new.fencing_token, lambda: indexed("terminal", 5))
    assert journal.index_get(run) == entry(run, "terminal", NOW + 5, sequence=5, started_ms=NOW)
    new.release()
    assert claimed(journal) == []


def test_a_refused_append_stores_no_entry(journal: RedisJournal, records: Records) -> None:
    """A compare failure, a fence mismatch or an exact replay leaves the stored entry as it was."""
    run = records.new_id()
    batch = records.batch(run, 1)

    def never() -> IndexEntry:  # asked for (it is sent with the records), never stored
        return entry(run, "waiting", NOW + 99, sequence=99)

    with pytest.raises(AppendConflict):
        journal.append_indexed(run, 2, records.batch(run, 2), None, never)
    assert journal.index_get(run) is None
    journal.append_indexed(run, 1, batch, None, lambda: entry(run))
    assert journal.append_indexed(run, 1, batch, None, never).already_committed
    (guard,) = journal.claim("w", limit=1, ttl_ms=60_000, now_ms=NOW)
    with pytest.raises(FencingRejected):
        journal.append_indexed(run, 2, records.batch(run, 2), guard.fencing_token + 1, never)
    with pytest.raises(AppendConflict):
        journal.append_indexed(run, 3, records.batch(run, 3), guard.fencing_token, never)
    assert journal.index_get(run) == entry(run, started_ms=NOW)  # the claim recorded the start
    assert journal.next_sequence(run) == 2


def test_a_purged_run_leaves_the_index(journal: RedisJournal, records: Records) -> None:
    """purge_run removes the run's entry with its records, so it is never claimed again."""
    run = records.new_id()
    journal.append_indexed(run, 1, records.batch(run, 1), None, lambda: entry(run))
    assert journal.purge_run(run)
    assert journal.index_get(run) is None
    assert claimed(journal) == []


def readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def test_wakeups_arrive_for_new_runs_wakes_and_notifications(journal: RedisJournal, records: Records) -> None:
    """A listener becomes readable when a run becomes claimable now or on notify, and drains to quiet."""
    listener = journal.listen_wakeups()
    try:
        assert not readable(listener.fileno(), 0.05)
        run = records.new_id()
        journal.append_indexed(run, 1, records.batch(run, 1), None, lambda: entry(run))
        assert readable(listener.fileno(), 2.0)
        listener.drain()
        assert not readable(listener.fileno(), 0.05)
        parked = records.new_id()
        journal.index_put([entry(parked, "waiting", None)])
        assert not readable(listener.fileno(), 0.05)  # a parked run is not claimable: nothing said
        journal.index_wake(parked)
        assert readable(listener.fileno(), 2.0)
        listener.drain()
        journal.notify_wakeups()
        assert readable(listener.fileno(), 2.0)
        listener.drain()
        assert not readable(listener.fileno(), 0.05)
    finally:
        listener.close()


def test_a_listener_subscribes_again_after_the_server_restarts(
    fresh_server: RedisServer, records: Records
) -> None:
    """A dropped subscription is renewed by drain(), and wake-ups arrive again."""
    with RedisJournal(fresh_server.url) as journal:
        listener = journal.listen_wakeups()
        try:
            fresh_server.kill()
            fresh_server.start()
            assert readable(listener.fileno(), 5.0)  # end of stream
            listener.drain()
            journal.notify_wakeups()
            assert readable(listener.fileno(), 2.0)
        finally:
            listener.close()


def test_an_unreachable_server_surfaces_as_journal_unavailable(
    fresh_server: RedisServer, records: Records
) -> None:
    """Claims, index reads and subscriptions against a stopped server raise JournalUnavailable."""
    from mayfly.errors import JournalUnavailable

    with RedisJournal(fresh_server.url + "?timeout=1") as journal:
        fresh_server.kill()
        with pytest.raises(JournalUnavailable):
            journal.claim("w", limit=1, ttl_ms=1000, now_ms=NOW)
        with pytest.raises(JournalUnavailable):
            journal.index_get(records.new_id())
        with pytest.raises(JournalUnavailable):
            journal.listen_wakeups()
        fresh_server.start()


def test_a_cluster_store_from_before_sharding_declares_no_run_index(aof_cluster: RedisClusterNodes) -> None:
    """A Cluster store written before sharding keeps working as a journal and refuses claims by name."""
    legacy_cluster_store(aof_cluster, "clusterindex")
    with RedisJournal(aof_cluster.url + "?prefix=clusterindex") as journal:
        assert not journal.capabilities.run_index and not journal.capabilities.run_wakeups
        with pytest.raises(CompatibilityError, match="before run-index sharding"):
            journal.claim("w", limit=1, ttl_ms=1000, now_ms=NOW)
