"""The run index: entries, claim order, claims with their leases, wakes, next_wake and wake-ups."""

from __future__ import annotations

import select
import time
from collections.abc import Iterator

import msgspec
import pytest
from lmdb_support import Worker, batch, new_id

from mayfly.errors import (
    AppendConflict,
    ConflictingRecord,
    FencingRejected,
    InvalidIdentifier,
    InvalidRecord,
    JournalUnavailable,
    LeaseHeld,
    LeaseLost,
)
from mayfly.journal import JournalRecord
from mayfly.runindex import RUN_INDEX, RUN_WAKEUPS, IndexEntry, IndexStatus
from mayfly_lmdb import LmdbJournal, LmdbLeaseGuard, LmdbLeaseStore

NOW = 1_000_000
LONG = 60_000


@pytest.fixture
def journal(url: str) -> Iterator[LmdbJournal]:
    with LmdbJournal(url) as opened:
        yield opened


def entry(
    run_id: str | None = None,
    status: IndexStatus = IndexStatus.NEW,
    ready_at: int | None = NOW,
    *,
    sequence: int = 1,
    queue: str = "default",
    wake: bool = False,
    parent: str | None = None,
    priority: int = 0,
) -> IndexEntry:
    return IndexEntry(
        run_id=run_id or new_id(),
        queue=queue,
        status=status,
        ready_at_ms=ready_at,
        sequence=sequence,
        wake=wake,
        parent=parent,
        priority=priority,
    )


def claimed(journal: LmdbJournal, limit: int = 100, now: int = NOW, **kwargs: object) -> list[str]:
    guards = journal.claim("tester", limit=limit, ttl_ms=LONG, now_ms=now, **kwargs)  # type: ignore[arg-type]
    return [guard.run_id for guard in guards]


def test_the_journal_declares_and_serves_the_run_index_and_wake_ups(journal: LmdbJournal) -> None:
    """run_index and run_wakeups are declared capabilities, each served by its Protocol."""
    assert journal.capabilities.run_index and journal.capabilities.run_wakeups
    assert RUN_INDEX.of(journal) is journal
    assert RUN_WAKEUPS.of(journal) is journal


def test_an_entry_is_stored_and_read_back_exactly(journal: LmdbJournal) -> None:
    """index_put then index_get returns every field as given, children and priorities included."""
    parent = new_id()
    stored = [
        entry(status=IndexStatus.WAITING, ready_at=None, sequence=7, queue="mail", wake=True, priority=-3),
        entry(status=IndexStatus.RUNNING, ready_at=-5, parent=parent, priority=2**63 - 1),
        entry(status=IndexStatus.TERMINAL, ready_at=None, sequence=2**63 - 1, priority=-(2**63)),
    ]
    journal.index_put(stored)
    for expected in stored:
        assert journal.index_get(expected.run_id) == expected
    assert journal.index_get(new_id()) is None


def test_a_lower_sequence_never_replaces_an_entry_and_a_stored_wake_is_kept(journal: LmdbJournal) -> None:
    """A late writer cannot undo a newer fact; an equal or higher sequence replaces; only a claim clears wake."""
    run = new_id()
    journal.index_put([entry(run, IndexStatus.WAITING, None, sequence=5)])
    journal.index_put([entry(run, IndexStatus.NEW, sequence=4)])
    assert journal.index_get(run) == entry(run, IndexStatus.WAITING, None, sequence=5)
    assert journal.index_wake(run)
    journal.index_put([entry(run, IndexStatus.WAITING, NOW + 50, sequence=6)])
    assert journal.index_get(run) == entry(run, IndexStatus.WAITING, NOW + 50, sequence=6, wake=True)
    journal.index_put([entry(run, IndexStatus.RUNNING, sequence=6)])
    assert journal.index_get(run) == entry(run, IndexStatus.RUNNING, sequence=6, wake=True)
    assert claimed(journal) == [run]
    assert journal.index_get(run) == entry(run, IndexStatus.RUNNING, sequence=6)


def test_claims_follow_priority_then_ready_at_with_absent_times_last_then_run_id(
    journal: LmdbJournal,
) -> None:
    """Claim order: priority descending, then ready_at ascending (None last), then run id, across statuses."""
    ids = sorted(new_id() for _ in range(9))
    entries = [
        entry(ids[8], IndexStatus.NEW, NOW - 10, priority=0),
        entry(ids[7], IndexStatus.WAITING, NOW - 20, priority=0),  # due
        entry(ids[6], IndexStatus.WAITING, None, wake=True, priority=0),  # woken, no time: last of its band
        entry(ids[5], IndexStatus.RUNNING, NOW - 10, priority=0),  # same time as ids[8]: run id decides
        entry(ids[4], IndexStatus.NEW, NOW + 500, priority=0),  # runnable although its time is ahead
        entry(ids[3], IndexStatus.WAITING, NOW + 9_000, wake=True, priority=0),
        entry(ids[2], IndexStatus.RUNNING, NOW, priority=5),
        entry(ids[1], IndexStatus.WAITING, NOW - 1, priority=-1),
        entry(ids[0], IndexStatus.WAITING, NOW + 1, priority=9),  # not due, not woken: not claimable
    ]
    journal.index_put(entries)
    expected = [ids[2], ids[7], ids[5], ids[8], ids[4], ids[3], ids[6], ids[1]]
    assert claimed(journal, limit=3) == expected[:3]
    assert claimed(journal, limit=2) == expected[3:5]
    assert claimed(journal) == expected[5:]
    assert claimed(journal) == []
    assert claimed(journal, now=NOW + 1) == [ids[0]]


def test_children_terminal_runs_and_future_waits_are_not_claimed(journal: LmdbJournal) -> None:
    """Child runs are driven by their parents; ended runs and runs waiting for a later time are left."""
    parent = new_id()
    child = entry(status=IndexStatus.RUNNING, parent=parent)
    woken_child = entry(status=IndexStatus.WAITING, ready_at=NOW - 1, wake=True, parent=parent)
    ended = entry(status=IndexStatus.TERMINAL, ready_at=None)
    later = entry(status=IndexStatus.WAITING, ready_at=NOW + 1)
    forever = entry(status=IndexStatus.WAITING, ready_at=None)
    journal.index_put([child, woken_child, ended, later, forever])
    assert claimed(journal) == []
    assert claimed(journal, now=NOW + 1) == [later.run_id]
    assert not journal.index_wake(ended.run_id)
    assert journal.index_wake(forever.run_id)
    assert claimed(journal) == [forever.run_id]


def test_a_claim_takes_only_the_queues_it_names(journal: LmdbJournal) -> None:
    """queues= limits a claim and next_wake to those queues; None means every queue."""
    mail = entry(queue="mail")
    bulk = entry(queue="bulk")
    other = entry(queue="other", status=IndexStatus.WAITING, ready_at=NOW + 100)
    journal.index_put([mail, bulk, other])
    assert claimed(journal, queues=["nothing-here"]) == []
    assert claimed(journal, queues=("bulk",)) == [bulk.run_id]
    assert journal.next_wake(now_ms=NOW, queues=["mail", "bulk"]) is None
    assert journal.next_wake(now_ms=NOW, queues=["other"]) == NOW + 100
    assert claimed(journal, queues=None) == [mail.run_id]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"limit": 0}, "claim limit"),
        ({"limit": True}, "claim limit"),
        ({"limit": 10_001}, "claim limit"),
        ({"queues": "default"}, "sequence of queue names"),
        ({"queues": []}, "at least one queue"),
        ({"queues": ["bad queue!"]}, "queue name"),
        ({"owner": ""}, "lease owner"),
        ({"ttl_ms": 0}, "ttl_ms"),
        ({"now_ms": "soon"}, "now_ms"),
        ({"now_ms": 1.5}, "now_ms"),
    ],
)
def test_invalid_claim_arguments_are_refused(
    journal: LmdbJournal, arguments: dict[str, object], message: str
) -> None:
    """Every claim argument is checked before anything is read or leased."""
    run = entry()
    journal.index_put([run])
    call: dict[str, object] = {"owner": "tester", "limit": 1, "ttl_ms": LONG, "now_ms": NOW, **arguments}
    owner = call.pop("owner")
    with pytest.raises(InvalidRecord, match=message):
        journal.claim(owner, **call)  # type: ignore[arg-type]
    assert claimed(journal) == [run.run_id]  # nothing was leased by the refused claims


def test_invalid_index_arguments_are_refused(journal: LmdbJournal) -> None:
    """index_put, index_get, index_wake and next_wake refuse what they cannot store or name."""
    good = entry()
    bad = [
        "not an entry",
        entry(queue="bad queue!"),
        IndexEntry(run_id="not-a-uuid", status=IndexStatus.NEW, ready_at_ms=NOW, sequence=1),
        entry(parent="nope"),
        entry(priority=2**63),
        entry(ready_at=2**64),
        entry(sequence=-1),
    ]
    for value in bad:
        with pytest.raises(InvalidRecord):
            journal.index_put([good, value])  # type: ignore[list-item]
    with pytest.raises(InvalidRecord):
        journal.index_put(good)  # type: ignore[arg-type]
    assert journal.index_get(good.run_id) is None  # a refused batch stores none of its entries
    for method in (journal.index_get, journal.index_wake):
        with pytest.raises(InvalidIdentifier):  # as every run-id argument of the journal
            method("not-a-run-id")
    with pytest.raises(InvalidRecord):
        journal.next_wake(now_ms=NOW, queues=["bad queue!"])
    with pytest.raises(InvalidRecord):
        journal.next_wake(now_ms="now")  # type: ignore[arg-type]


def test_next_wake_is_the_earliest_later_wait_of_a_root_run(journal: LmdbJournal) -> None:
    """Only waiting root runs count, and only times after now; children, runnable and ended runs do not."""
    assert journal.next_wake(now_ms=NOW) is None
    journal.index_put(
        [
            entry(status=IndexStatus.WAITING, ready_at=NOW + 300),
            entry(status=IndexStatus.WAITING, ready_at=NOW + 200, wake=True),
            entry(status=IndexStatus.WAITING, ready_at=NOW + 100, parent=new_id()),
            entry(status=IndexStatus.NEW, ready_at=NOW + 50),
            entry(status=IndexStatus.WAITING, ready_at=NOW - 5),
            entry(status=IndexStatus.WAITING, ready_at=None),
        ]
    )
    assert journal.next_wake(now_ms=NOW) == NOW + 200
    assert journal.next_wake(now_ms=NOW + 200) == NOW + 300
    assert journal.next_wake(now_ms=NOW + 300) is None


def test_a_run_under_a_live_lease_is_skipped_and_an_expired_one_is_claimed(
    url: str, journal: LmdbJournal
) -> None:
    """A claim skips a run someone holds; once that lease expires unrenewed, the claim takes it over."""
    held, free = entry(ready_at=NOW - 1), entry()
    journal.index_put([held, free])
    with LmdbLeaseStore(url) as leases:
        old = leases.acquire(held.run_id, "hung", 150)
        assert claimed(journal) == [free.run_id]
        time.sleep(0.3)
        (guard,) = journal.claim("taker", limit=5, ttl_ms=LONG, now_ms=NOW)
        assert guard.run_id == held.run_id and guard.fencing_token == old.fencing_token + 1
        with pytest.raises(LeaseLost, match="taken over by taker"):
            old.renew()
        assert leases.current_fence(held.run_id) == guard.fencing_token
        guard.release()


def test_claimed_guards_renew_release_and_fence_like_acquired_ones(url: str, journal: LmdbJournal) -> None:
    """A claim's guard is an LmdbLeaseGuard: it holds the file lock, renews, releases, and its token fences."""
    run = entry()
    journal.index_put([run])
    (guard,) = journal.claim("tester", limit=1, ttl_ms=200, now_ms=NOW)
    assert isinstance(guard, LmdbLeaseGuard) and guard.holds_lock and guard.owner == "tester"
    with LmdbLeaseStore(url) as leases:
        assert leases.current_fence(run.run_id) == guard.fencing_token
        with pytest.raises(LeaseHeld, match="tester"):
            leases.acquire(run.run_id, "other", LONG)
        for _ in range(3):
            time.sleep(0.1)
            guard.renew()  # kept past its first ttl by renewing
        with pytest.raises(LeaseHeld):
            leases.acquire(run.run_id, "other", LONG)
        journal.append(run.run_id, 1, batch(run.run_id, 1), fence=guard.fencing_token)
        guard.release()
        assert not guard.held
        with pytest.raises(LeaseLost, match="was released"):
            guard.renew()
        assert claimed(journal) == [run.run_id]  # claimable again at once


def test_closing_the_journal_releases_the_leases_its_claims_hold(url: str) -> None:
    """Guards a claim returned are released when the journal closes, like a lease store's on close."""
    run = entry()
    with LmdbJournal(url) as first:
        first.index_put([run])
        assert claimed(first) == [run.run_id]
    with LmdbJournal(url) as second:
        assert claimed(second) == [run.run_id]


def test_an_append_fenced_by_a_claim_that_was_taken_over_is_refused(journal: LmdbJournal) -> None:
    """After a re-claim, the first claimant's token is stale: its append is refused and stores nothing."""
    run = entry()
    journal.index_put([run])
    (first,) = journal.claim("first", limit=1, ttl_ms=100, now_ms=NOW)
    time.sleep(0.25)
    (second,) = journal.claim("second", limit=1, ttl_ms=LONG, now_ms=NOW)
    assert second.fencing_token == first.fencing_token + 1
    calls: list[int] = []

    def new_entry() -> IndexEntry:
        calls.append(1)
        return entry(run.run_id, IndexStatus.TERMINAL, None, sequence=1)

    with pytest.raises(FencingRejected):
        journal.append_indexed(run.run_id, 1, batch(run.run_id, 1), first.fencing_token, new_entry)
    assert calls == []
    started = msgspec.structs.replace(run, started_ms=NOW)  # the first claim recorded the run's start
    assert journal.index_get(run.run_id) == started
    assert journal.next_sequence(run.run_id) == 1
    journal.append_indexed(run.run_id, 1, batch(run.run_id, 1), second.fencing_token, new_entry)
    assert calls == [1]
    ended = entry(run.run_id, IndexStatus.TERMINAL, None, sequence=1)
    assert journal.index_get(run.run_id) == msgspec.structs.replace(ended, started_ms=NOW)
    second.release()


def test_an_append_stores_its_entry_in_the_same_transaction(journal: LmdbJournal) -> None:
    """The entry is asked for once, after the checks, and stored with the records; a refused one stores neither."""
    run = new_id()
    calls: list[int] = []

    def at(sequence: int, status: IndexStatus = IndexStatus.RUNNING) -> IndexEntry:
        calls.append(sequence)
        return entry(run, status, NOW + sequence, sequence=sequence)

    journal.append_indexed(run, 1, batch(run, 1, 2), None, lambda: at(2))
    assert calls == [2] and journal.index_get(run) == entry(run, IndexStatus.RUNNING, NOW + 2, sequence=2)
    with pytest.raises(AppendConflict):
        journal.append_indexed(run, 2, batch(run, 2), None, lambda: at(99))
    taken = batch(run, 3)
    journal.append_indexed(run, 3, taken, None, lambda: at(3, IndexStatus.WAITING))
    reused = JournalRecord.seal(
        run_id=run,
        sequence=4,
        event_id=taken[0].event_id,
        event_type="Probe",
        schema_version=1,
        payload=b"{}",
    )
    with pytest.raises(ConflictingRecord):  # an event id the run already used
        journal.append_indexed(run, 4, [reused], None, lambda: at(98))
    assert calls == [2, 3]
    assert journal.next_sequence(run) == 4
    assert journal.index_get(run) == entry(run, IndexStatus.WAITING, NOW + 3, sequence=3)

    def broken() -> IndexEntry:
        return entry(run, queue="bad queue!", sequence=4)

    with pytest.raises(InvalidRecord):
        journal.append_indexed(run, 4, batch(run, 4), None, broken)
    assert journal.next_sequence(run) == 4  # the records went with the refused entry
    assert journal.index_get(run) == entry(run, IndexStatus.WAITING, NOW + 3, sequence=3)


def test_a_purged_run_leaves_the_index(journal: LmdbJournal) -> None:
    """Purging a run deletes its entry and its place in the claim order."""
    run = new_id()
    journal.append_indexed(run, 1, batch(run, 1), None, lambda: entry(run))
    assert journal.purge_run(run)
    assert journal.index_get(run) is None
    assert claimed(journal) == []


def test_wake_ups_reach_listeners_when_a_run_becomes_claimable(journal: LmdbJournal) -> None:
    """A listener's FIFO turns readable on notify, and on a wake or append that leaves an unleased run claimable."""
    listener = journal.listen_wakeups()
    try:

        def readable() -> bool:
            ready, _, _ = select.select([listener.fileno()], [], [], 0)
            listener.drain()
            return bool(ready)

        assert not readable()
        journal.notify_wakeups()
        assert readable()
        assert not readable()  # drained
        parked = entry(status=IndexStatus.WAITING, ready_at=None)
        journal.index_put([parked])
        assert not readable()  # waiting for a wake: nothing to claim
        assert journal.index_wake(parked.run_id)
        assert readable()
        run = new_id()
        journal.append_indexed(run, 1, batch(run, 1), None, lambda: entry(run))
        assert readable()
        (guard,) = journal.claim("tester", limit=1, ttl_ms=LONG, now_ms=NOW, queues=None)
        assert guard.run_id in (parked.run_id, run)
        held = guard.run_id
        first = journal.next_sequence(held)
        journal.append_indexed(
            held, first, batch(held, first), guard.fencing_token, lambda: entry(held, sequence=9)
        )
        assert not readable()  # its owner appended: nobody else can claim it
        guard.release()
    finally:
        listener.close()


def test_a_read_only_journal_reads_the_index_but_claims_nothing(url: str, env_dir: object) -> None:
    """readonly=true serves index_get and next_wake; claim, index_put and index_wake are refused."""
    run = entry(status=IndexStatus.WAITING, ready_at=NOW + 5)
    with LmdbJournal(url) as writer:
        writer.index_put([run])
    with LmdbJournal(f"{url}?readonly=true") as reader:
        assert reader.index_get(run.run_id) == run
        assert reader.next_wake(now_ms=NOW) == NOW + 5
        with pytest.raises(JournalUnavailable, match="readonly"):
            reader.claim("tester", limit=1, ttl_ms=LONG, now_ms=NOW)
        with pytest.raises(JournalUnavailable, match="readonly"):
            reader.index_put([run])
        with pytest.raises(JournalUnavailable, match="readonly"):
            reader.index_wake(run.run_id)


def test_a_claimant_killed_while_holding_claims_frees_them_at_once(url: str, workers: list[Worker]) -> None:
    """The OS drops a SIGKILLed claimant's file locks: its runs are claimable again before their ttl ends."""
    runs = [entry() for _ in range(3)]
    with LmdbJournal(url) as journal:
        journal.index_put(runs)
        claimant = Worker("claim", url=url, owner="doomed", seed=1)
        workers.append(claimant)
        assert claimant.readline() == "ready"
        assert claimant.process.stdin is not None
        claimant.process.stdin.write("go\n")
        lines = []
        while not (line := claimant.readline()).startswith("done"):
            lines.append(line.split()[1])
        assert sorted(lines) == sorted(r.run_id for r in runs)
        assert claimed(journal) == []
        claimant.kill()
        assert sorted(claimed(journal)) == sorted(r.run_id for r in runs)
