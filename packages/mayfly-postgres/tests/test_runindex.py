"""The run index on PostgreSQL: entries, claims, leases they grant, wake-ups (each test on a schema of its own)."""

from __future__ import annotations

import random
import select
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import msgspec
import psycopg
import pytest
from pgserver import IDS, batch, drop_schema, with_options

from mayfly.errors import (
    ConflictingRecord,
    FencingRejected,
    InvalidIdentifier,
    InvalidRecord,
    JournalUnavailable,
    LeaseLost,
)
from mayfly.journal import JournalCapabilities, JournalRecord
from mayfly.runindex import RUN_INDEX, RUN_WAKEUPS, IndexEntry, IndexStatus
from mayfly_postgres import PostgresJournal, PostgresLeaseStore
from mayfly_postgres._index import claimable_now
from mayfly_postgres._schema import MIGRATIONS, applied_version

NOW = 1_700_000_000_000


def entry(
    run_id: str, status: IndexStatus = IndexStatus.NEW, ready_at: int | None = NOW, **fields: Any
) -> IndexEntry:
    return IndexEntry(
        run_id=run_id, status=status, ready_at_ms=ready_at, sequence=fields.pop("sequence", 1), **fields
    )


@pytest.fixture
def index_url(server: str) -> Iterator[str]:
    """A schema of this test's own (claims see every run of a schema)."""
    schema = f"mayfly_pgidx_{uuid.uuid4().hex[:12]}"
    yield with_options(server, schema=schema)
    drop_schema(server, schema)


@pytest.fixture
def index(index_url: str) -> Iterator[PostgresJournal]:
    with PostgresJournal(index_url) as opened:
        yield opened


def claimed(journal: PostgresJournal, owner: str = "w1", limit: int = 100, **kwargs: Any) -> list[str]:
    """Claim and release at once; the run ids claimed, in the order given."""
    guards = journal.claim(
        owner, limit=limit, ttl_ms=kwargs.pop("ttl_ms", 30_000), now_ms=kwargs.pop("now_ms", NOW), **kwargs
    )
    runs = [guard.run_id for guard in guards]
    for guard in guards:
        guard.release()
    return runs


def test_the_journal_declares_and_implements_the_run_index_and_wake_ups(index: PostgresJournal) -> None:
    """run_index, run_wakeups and append_wakeups are declared, and the journal passes both features' checks."""
    capabilities: JournalCapabilities = index.capabilities
    assert capabilities.run_index and capabilities.run_wakeups and capabilities.append_wakeups
    assert RUN_INDEX.of(index) is index and RUN_WAKEUPS.of(index) is index


def test_a_lower_sequence_never_replaces_a_stored_entry(index: PostgresJournal) -> None:
    """index_put keeps the entry of the highest sequence; an equal sequence replaces (a repair)."""
    run = IDS.new_id()
    index.index_put([entry(run, IndexStatus.WAITING, NOW + 5, sequence=5)])
    index.index_put([entry(run, IndexStatus.NEW, NOW, sequence=3)])
    assert index.index_get(run) == entry(run, IndexStatus.WAITING, NOW + 5, sequence=5)
    index.index_put([entry(run, IndexStatus.TERMINAL, None, sequence=5)])
    assert index.index_get(run) == entry(run, IndexStatus.TERMINAL, None, sequence=5)


def test_a_batch_with_repeats_of_one_run_ends_as_one_by_one_puts_would(index: PostgresJournal) -> None:
    """One put naming a run twice stores the later entry of the higher sequence, with any wake kept."""
    run = IDS.new_id()
    index.index_put(
        [
            entry(run, IndexStatus.WAITING, None, sequence=4, wake=True),
            entry(run, IndexStatus.WAITING, NOW + 9, sequence=6),
            entry(run, IndexStatus.NEW, NOW, sequence=2),
        ]
    )
    assert index.index_get(run) == entry(run, IndexStatus.WAITING, NOW + 9, sequence=6, wake=True)


def test_a_stored_wake_is_kept_until_a_claim_takes_the_run(index: PostgresJournal) -> None:
    """A wake survives later puts without one; a claim clears it; waking a missing or ended run says False."""
    run, ended = IDS.new_id(), IDS.new_id()
    index.index_put(
        [entry(run, IndexStatus.WAITING, None, sequence=2), entry(ended, IndexStatus.TERMINAL, None)]
    )
    assert claimed(index) == []
    assert index.index_wake(run) is True
    index.index_put([entry(run, IndexStatus.WAITING, None, sequence=3)])
    stored = index.index_get(run)
    assert stored is not None and stored.wake and stored.sequence == 3
    assert claimed(index) == [run]
    stored = index.index_get(run)
    assert stored is not None and not stored.wake
    assert claimed(index) == []  # waiting with no wake time and no wake: not claimable again
    assert index.index_wake(ended) is False
    assert index.index_wake(IDS.new_id()) is False


def test_only_claimable_root_runs_are_claimed_in_claim_order(index: PostgresJournal) -> None:
    """new/running, due or woken waiting runs, by priority then ready_at (none last) then run id; never children."""
    ids = sorted(IDS.new_id() for _ in range(9))
    parent = ids[8]
    index.index_put(
        [
            entry(ids[0], IndexStatus.RUNNING, NOW - 10),
            entry(ids[1], IndexStatus.NEW, NOW - 20),
            entry(ids[2], IndexStatus.WAITING, NOW - 30),  # due
            entry(ids[3], IndexStatus.WAITING, NOW + 1),  # not yet
            entry(ids[4], IndexStatus.WAITING, None, wake=True),  # woken, no wake time: last
            entry(ids[5], IndexStatus.TERMINAL, None),
            entry(ids[6], IndexStatus.NEW, NOW - 10, parent=parent),  # a child: its parent drives it
            entry(ids[7], IndexStatus.NEW, NOW + 50, priority=5),  # higher priority first
            entry(parent, IndexStatus.RUNNING, NOW - 10),  # same ready_at as ids[0]: run id decides
        ]
    )
    assert claimed(index) == [ids[7], ids[2], ids[1], ids[0], parent, ids[4]]
    # The first claim answered ids[4]'s wake; at NOW + 1 ids[3] is due.
    assert claimed(index, now_ms=NOW + 1) == [ids[7], ids[2], ids[1], ids[0], parent, ids[3]]


def test_claims_merge_runnable_due_and_woken_runs_in_one_claim_order(index_url: str) -> None:
    """The claim searches runnable, due and woken runs apart: merged, any limit takes the reference order's head.

    A seeded mix of every kind (runnable, due, woken with a later, an earlier or no wake time, timers to
    come, parked, children, ended; three priorities; some held by a live lease): each claim of ``limit``
    takes the first ``limit`` of the claimable, unleased runs by priority, wake time (none last), run id.
    """
    rng = random.Random(7)
    kinds = (
        "runnable",
        "due",
        "woken later",
        "woken due",
        "woken never",
        "later",
        "parked",
        "child",
        "ended",
    )
    entries = []
    for _ in range(90):
        run, kind = IDS.new_id(), rng.choice(kinds)
        ready = NOW + rng.choice((-1, 1)) * rng.randrange(1, 1000)
        fields: dict[str, Any] = {"priority": rng.choice((0, 0, 1, 5))}
        if kind == "runnable":
            made = entry(run, rng.choice((IndexStatus.NEW, IndexStatus.RUNNING)), NOW - rng.randrange(1000))
        elif kind in ("due", "woken due"):
            made = entry(run, IndexStatus.WAITING, NOW - rng.randrange(1000), wake=kind == "woken due")
        elif kind in ("later", "woken later"):
            made = entry(run, IndexStatus.WAITING, NOW + rng.randrange(1, 1000), wake=kind == "woken later")
        elif kind in ("parked", "woken never"):
            made = entry(run, IndexStatus.WAITING, None, wake=kind == "woken never")
        elif kind == "child":
            made = entry(run, IndexStatus.RUNNING, ready, parent=IDS.new_id())
        else:
            made = entry(run, IndexStatus.TERMINAL, None)
        entries.append(msgspec.structs.replace(made, **fields))
    with PostgresJournal(index_url) as journal, PostgresLeaseStore(index_url) as leases:
        journal.index_put(entries)
        held = {e.run_id for e in rng.sample(entries, 15)}
        guards = [leases.acquire(run, "other", 60_000) for run in held]
        expected = [
            e.run_id
            for e in sorted(
                entries,
                key=lambda e: (-e.priority, e.ready_at_ms is None, e.ready_at_ms or 0, e.run_id),
            )
            if claimable_now(e, NOW) and e.run_id not in held
        ]
        assert len(expected) > 20
        for limit in (1, 2, 7, 20, 100):
            journal.index_put(entries)  # the stored wakes the last claim answered, set again
            assert claimed(journal, limit=limit) == expected[:limit]
        for guard in guards:
            guard.release()


def test_a_claim_takes_at_most_limit_runs_and_only_from_the_named_queues(index: PostgresJournal) -> None:
    """limit caps a claim; queues restricts it; None means every queue."""
    runs = {queue: [IDS.new_id() for _ in range(3)] for queue in ("default", "mail", "bulk")}
    index.index_put([entry(run, queue=queue) for queue, ids in runs.items() for run in ids])
    assert sorted(claimed(index, queues=["mail"])) == sorted(runs["mail"])
    assert sorted(claimed(index, queues=("mail", "bulk"))) == sorted(runs["mail"] + runs["bulk"])
    assert len(claimed(index, limit=4)) == 4
    assert len(claimed(index)) == 9


def test_invalid_arguments_are_refused_before_anything_is_read(index: PostgresJournal) -> None:
    """Bad limits, queues, owners, ttls, clocks and entries raise InvalidRecord; a bad run id InvalidIdentifier."""
    run = IDS.new_id()
    bad_claims: list[dict[str, Any]] = [
        {"limit": 0},
        {"limit": True},
        {"limit": 10_001},
        {"queues": "default"},
        {"queues": []},
        {"queues": ["Not A Queue"]},
        {"ttl_ms": 0},
        {"now_ms": True},
        {"owner": ""},
    ]
    for bad in bad_claims:
        arguments: dict[str, Any] = {"owner": "w1", "limit": 1, "ttl_ms": 1_000, "now_ms": NOW, **bad}
        owner = arguments.pop("owner")
        with pytest.raises(InvalidRecord):
            index.claim(owner, **arguments)
    with pytest.raises(InvalidRecord):
        index.next_wake(now_ms=NOW, queues=[])
    for entries in (["not an entry"], [entry(run, queue="Bad Queue")], [entry(run, priority=1 << 63)], "x"):
        with pytest.raises(InvalidRecord):
            index.index_put(entries)  # type: ignore[arg-type]
    with pytest.raises(InvalidIdentifier):
        index.index_put([entry("not-a-run")])
    with pytest.raises(InvalidIdentifier):
        index.index_get("not-a-run")
    with pytest.raises(InvalidIdentifier):
        index.index_wake("not-a-run")
    assert index.index_get(run) is None


def test_next_wake_is_the_earliest_future_wake_of_a_waiting_root_run(index: PostgresJournal) -> None:
    """Children, runnable and past wake times do not count; the queue filter applies."""
    parent = IDS.new_id()
    index.index_put(
        [
            entry(IDS.new_id(), IndexStatus.WAITING, NOW + 300),
            entry(IDS.new_id(), IndexStatus.WAITING, NOW + 200, queue="mail"),
            entry(IDS.new_id(), IndexStatus.WAITING, NOW + 100, parent=parent),
            entry(IDS.new_id(), IndexStatus.WAITING, NOW - 100),
            entry(IDS.new_id(), IndexStatus.NEW, NOW + 50),
        ]
    )
    assert index.next_wake(now_ms=NOW) == NOW + 200
    assert index.next_wake(now_ms=NOW, queues=["default"]) == NOW + 300
    assert index.next_wake(now_ms=NOW + 300) is None


def test_an_indexed_append_writes_its_entry_in_the_same_transaction(
    index: PostgresJournal, index_url: str
) -> None:
    """Every indexed batch carries its entry in its own statement: asked for first, stored only if appended.

    Asking for the entry changes nothing (the runtime reads it off the decision's draft), so it is asked
    for before the statement is sent, also for a batch the statement then refuses, which stores none.
    """
    run = IDS.new_id()
    asked: list[int] = []

    def make(sequence: int) -> Any:
        def produce() -> IndexEntry:
            asked.append(sequence)
            return entry(run, IndexStatus.RUNNING, NOW, sequence=sequence)

        return produce

    index.append_indexed(run, 1, batch(run, 1), None, make(3))
    assert asked == [3] and index.index_get(run) == entry(run, IndexStatus.RUNNING, NOW, sequence=3)
    with pytest.raises(Exception, match="expected next sequence 1"):
        index.append_indexed(run, 1, batch(run, 1), None, make(99))
    assert asked == [3, 99] and index.index_get(run) == entry(run, IndexStatus.RUNNING, NOW, sequence=3)
    leases = PostgresLeaseStore(index_url)
    try:
        guard = leases.acquire(run, "w1", 30_000)
        with pytest.raises(FencingRejected):
            index.append_indexed(run, 4, batch(run, 4), guard.fencing_token - 1, make(98))
        assert asked == [3, 99, 98] and index.index_get(run) == entry(
            run, IndexStatus.RUNNING, NOW, sequence=3
        )
        index.append_indexed(run, 4, batch(run, 4), guard.fencing_token, make(6))
        guard.release()
    finally:
        leases.close()
    assert asked == [3, 99, 98, 6]
    assert index.index_get(run) == entry(run, IndexStatus.RUNNING, NOW, sequence=6)
    assert [r.sequence for r in index.read(run)] == list(range(1, 7))


def test_a_claim_takes_runs_whose_lease_expired_or_was_released_never_a_live_one(index_url: str) -> None:
    """A live lease keeps a run out of claims; once expired it is claimed with the next fencing token."""
    with PostgresJournal(index_url) as journal, PostgresLeaseStore(index_url) as leases:
        live, expiring, released = (IDS.new_id() for _ in range(3))
        journal.index_put([entry(run) for run in (live, expiring, released)])
        held = leases.acquire(live, "dead", 60_000)
        short = leases.acquire(expiring, "dead", 400)
        leases.acquire(released, "gone", 60_000).release()
        assert claimed(journal) == [released]
        time.sleep(0.5)
        guards = journal.claim("w2", limit=10, ttl_ms=30_000, now_ms=NOW)
        by_run = {guard.run_id: guard for guard in guards}
        assert set(by_run) == {expiring, released}
        assert by_run[expiring].fencing_token == short.fencing_token + 1
        assert leases.current_fence(expiring) == by_run[expiring].fencing_token
        with pytest.raises(LeaseLost):
            short.renew()
        for guard in guards:
            guard.release()
        held.release()


def test_claimed_guards_renew_release_and_fence_like_acquired_ones(index_url: str) -> None:
    """A claimed guard renews and releases; after it expires and another claims, its appends are refused."""
    with PostgresJournal(index_url) as journal:
        run = IDS.new_id()
        journal.append_indexed(
            run, 1, batch(run, 1), None, lambda: entry(run, IndexStatus.RUNNING, NOW, sequence=3)
        )
        (first,) = journal.claim("w1", limit=5, ttl_ms=300, now_ms=NOW)
        assert first.run_id == run and first.owner == "w1" and first.ttl_ms == 300
        first.renew(60_000)
        assert journal.claim("w2", limit=5, ttl_ms=300, now_ms=NOW) == []
        first.renew(50)
        time.sleep(0.1)
        (second,) = journal.claim("w2", limit=5, ttl_ms=30_000, now_ms=NOW)
        assert second.fencing_token == first.fencing_token + 1
        with pytest.raises(LeaseLost):
            first.renew()
        with pytest.raises(FencingRejected):
            journal.append_indexed(run, 4, batch(run, 4), first.fencing_token, lambda: entry(run, sequence=6))
        journal.append_indexed(
            run,
            4,
            batch(run, 4),
            second.fencing_token,
            lambda: entry(run, IndexStatus.RUNNING, NOW, sequence=6),
        )
        first.release()  # a stale guard's release leaves the new grant alone
        assert journal.claim("w3", limit=5, ttl_ms=300, now_ms=NOW) == []
        second.release()
        (third,) = journal.claim("w3", limit=5, ttl_ms=300, now_ms=NOW)
        assert third.fencing_token == second.fencing_token + 1
        third.release()


def test_closing_the_journal_releases_the_leases_its_claims_hold(index_url: str) -> None:
    """Guards handed out by claims belong to the journal: closing it releases them, so others claim at once."""
    run = IDS.new_id()
    with PostgresJournal(index_url) as journal:
        journal.index_put([entry(run)])
        assert len(journal.claim("w1", limit=1, ttl_ms=60_000, now_ms=NOW)) == 1
    with PostgresJournal(index_url) as journal:
        assert claimed(journal, "w2") == [run]


def _readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


def test_listeners_are_told_when_a_run_becomes_claimable_now(index_url: str) -> None:
    """notify_wakeups, a leaseless append of a runnable run and a wake reach every listener; a parked run does not."""
    with PostgresJournal(index_url) as journal, PostgresJournal(index_url) as other:
        listeners = [journal.listen_wakeups(), other.listen_wakeups()]
        try:
            for listener in listeners:
                assert not _readable(listener.fileno(), 0.05)
            other.notify_wakeups()
            for listener in listeners:
                assert _readable(listener.fileno(), 5)
                listener.drain()
                assert not _readable(listener.fileno(), 0.05)
            run = IDS.new_id()
            other.append_indexed(
                run, 1, batch(run, 1), None, lambda: entry(run, IndexStatus.WAITING, None, sequence=3)
            )
            assert not _readable(listeners[0].fileno(), 0.2)  # parked on a signal: nothing to claim
            other.index_wake(run)
            assert _readable(listeners[0].fileno(), 5)
            listeners[0].drain()
            fresh = IDS.new_id()
            other.append_indexed(fresh, 1, batch(fresh, 1), None, lambda: entry(fresh, sequence=3))
            assert _readable(listeners[0].fileno(), 5)
            listeners[0].drain()
        finally:
            for listener in listeners:
                listener.close()


def test_a_listener_replaces_a_lost_connection_in_drain(index_url: str, server: str) -> None:
    """A listening connection terminated by the server is readable, and drain listens again on a new one."""
    with PostgresJournal(index_url) as journal:
        listener = journal.listen_wakeups()
        try:
            with psycopg.connect(server, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                    "AND query ILIKE 'LISTEN%%' AND query LIKE %s",
                    (f"%{journal.schema}%",),
                )
            assert _readable(listener.fileno(), 5)
            listener.drain()  # reconnects
            journal.notify_wakeups()
            assert _readable(listener.fileno(), 5)
            listener.drain()
        finally:
            listener.close()


def test_a_store_at_migration_1_is_upgraded_in_place_and_keeps_working(index_url: str) -> None:
    """Opening a schema created by migration 1 adds the run index; its runs read back, with no entry yet."""
    with PostgresJournal(index_url) as journal:
        schema = journal.schema
    settings_url = index_url.split("?", maxsplit=1)[0]
    with psycopg.connect(settings_url, autocommit=True) as admin:
        admin.execute(psycopg.sql.SQL("DROP SCHEMA {} CASCADE").format(psycopg.sql.Identifier(schema)))
        admin.execute(psycopg.sql.SQL("CREATE SCHEMA {}").format(psycopg.sql.Identifier(schema)))
        admin.execute(
            psycopg.sql.SQL(
                "CREATE TABLE {}.mayfly_migrations (version integer PRIMARY KEY, description text NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(psycopg.sql.Identifier(schema))
        )
        _, description, statements = MIGRATIONS[0]
        for template in statements:
            admin.execute(psycopg.sql.SQL(template).format(schema=psycopg.sql.Identifier(schema)))
        admin.execute(
            psycopg.sql.SQL("INSERT INTO {}.mayfly_migrations (version, description) VALUES (1, %s)").format(
                psycopg.sql.Identifier(schema)
            ),
            (description,),
        )
        old = IDS.new_id()
        admin.execute(
            psycopg.sql.SQL("INSERT INTO {}.runs (run_id, next_sequence) VALUES (%s, 1)").format(
                psycopg.sql.Identifier(schema)
            ),
            (old,),
        )
    with PostgresJournal(index_url) as journal:
        journal.append(old, 1, batch(old, 1))
        assert [r.sequence for r in journal.read(old)] == [1, 2, 3]
        assert journal.index_get(old) is None  # `mayfly index rebuild` writes it from the history
        journal.index_put([entry(old, IndexStatus.RUNNING, NOW, sequence=3)])
        assert claimed(journal) == [old]
        with psycopg.connect(settings_url, autocommit=True) as admin:
            assert applied_version(admin, schema) == MIGRATIONS[-1][0]


def test_an_indexed_batch_and_its_entry_land_together(index_url: str) -> None:
    """The entry is asked for before anything of the batch is written; then batch and entry commit as one."""
    run = IDS.new_id()
    asked: list[int] = []
    with PostgresJournal(index_url) as journal, PostgresJournal(index_url) as other:

        def entry_first() -> IndexEntry:
            asked.append(1)
            assert other.next_sequence(run) == 2, "records were written before the entry was asked for"
            assert other.index_get(run) == entry(run, sequence=1)
            return entry(run, IndexStatus.RUNNING, NOW, sequence=3)

        journal.append_indexed(run, 1, batch(run, 1, 1), None, lambda: entry(run, sequence=1))
        journal.append_indexed(run, 2, batch(run, 2), None, entry_first)
        assert asked == [1]
        assert [r.sequence for r in other.read(run)] == [1, 2, 3, 4]
        assert other.index_get(run) == entry(run, IndexStatus.RUNNING, NOW, sequence=3)


def test_a_claim_cut_off_mid_statement_grants_nothing(index_url: str, server: str) -> None:
    """A claim whose backend is killed after it wrote some grants, before the statement ended, leaves no lease."""
    runs = sorted(IDS.new_id() for _ in range(5))
    outcome: list[BaseException | list[Any]] = []
    with PostgresJournal(index_url) as journal, psycopg.connect(server) as blocker:
        journal.index_put([entry(run, IndexStatus.WAITING, None, wake=True) for run in runs])
        schema = psycopg.sql.Identifier(journal.schema)
        # An uncommitted row for the last run: the claim's fence upsert (in mayfly_claim) waits on it.
        blocker.execute(
            psycopg.sql.SQL("INSERT INTO {}.runs (run_id) VALUES (%s)").format(schema), (runs[-1],)
        )

        def claim() -> None:
            try:
                outcome.append(journal.claim("w1", limit=10, ttl_ms=60_000, now_ms=NOW))
            except BaseException as exc:  # reported to the test thread
                outcome.append(exc)

        thread = threading.Thread(target=claim)
        thread.start()
        with psycopg.connect(server, autocommit=True) as admin:
            deadline = time.monotonic() + 10
            while True:
                waiting = admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                    (f"%{journal.schema}%mayfly_claim%",),
                ).fetchall()
                if waiting:
                    break
                assert time.monotonic() < deadline, "the claim never blocked on the uncommitted row"
                time.sleep(0.02)
            admin.execute("SELECT pg_terminate_backend(%s)", (waiting[0][0],))
        thread.join(timeout=30)
        blocker.rollback()
        assert len(outcome) == 1 and isinstance(outcome[0], JournalUnavailable)
        count = psycopg.sql.SQL("SELECT count(*) FROM {}.leases").format(schema)
        with psycopg.connect(server, autocommit=True) as admin:
            assert admin.execute(count).fetchone() == (0,)
        assert all(stored is not None and stored.wake for stored in map(journal.index_get, runs))
        guards = journal.claim("w2", limit=10, ttl_ms=60_000, now_ms=NOW)
        assert [(g.run_id, g.fencing_token) for g in guards] == [(run, 1) for run in runs]
        for guard in guards:
            guard.release()


def test_a_claim_on_a_lost_connection_raises_journal_unavailable_and_the_next_one_reconnects(
    index_url: str, server: str
) -> None:
    """A claim whose pooled connection the server dropped fails with JournalUnavailable; the next claim works."""
    run = IDS.new_id()
    with PostgresJournal(index_url) as journal:
        journal.index_put([entry(run)])
        assert journal.index_get(run) == entry(run)  # a pooled connection the claim will reuse
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                "AND query LIKE %s",
                (f"%{journal.schema}%",),
            )
        time.sleep(0.2)
        with pytest.raises(JournalUnavailable, match="claiming runs for w1"):
            journal.claim("w1", limit=1, ttl_ms=60_000, now_ms=NOW)
        assert claimed(journal) == [run]


def test_an_indexed_append_reusing_an_event_id_is_refused_and_stores_no_entry(
    index: PostgresJournal,
) -> None:
    """An event id already in the run is a ConflictingRecord; its entry is not stored, the connection is reused."""
    run = IDS.new_id()
    first = batch(run, 1)
    index.append_indexed(run, 1, first, None, lambda: entry(run, sequence=3))
    reused = [
        JournalRecord.seal(
            run_id=run,
            sequence=4,
            event_id=first[0].event_id,
            event_type="Probe",
            schema_version=1,
            payload=b"{}",
        )
    ]
    asked: list[int] = []

    def make() -> IndexEntry:
        asked.append(1)
        return entry(run, sequence=4)

    with pytest.raises(ConflictingRecord):
        index.append_indexed(run, 4, reused, None, make)
    assert asked == [1] and index.next_sequence(run) == 4 and index.index_get(run) == entry(run, sequence=3)
    index.append_indexed(run, 4, batch(run, 4), None, lambda: entry(run, sequence=6))
    assert index.index_get(run) == entry(run, sequence=6)


def test_a_claim_while_a_stale_owner_prepares_its_append_takes_the_run_and_fences_the_append_out(
    index_url: str,
) -> None:
    """An owner whose lease expired loses the run to a claim made while it prepared its append: it is fenced out."""
    run = IDS.new_id()
    with PostgresJournal(index_url) as journal, PostgresLeaseStore(index_url) as leases:
        journal.append_indexed(
            run, 1, batch(run, 1), None, lambda: entry(run, IndexStatus.RUNNING, NOW, sequence=3)
        )
        stale = leases.acquire(run, "slow", 50)
        time.sleep(0.1)  # expired: claimable, though its owner is still appending
        during: list[Any] = []

        def claim_meanwhile() -> IndexEntry:
            thread = threading.Thread(
                target=lambda: during.append(journal.claim("w2", limit=5, ttl_ms=60_000, now_ms=NOW))
            )
            thread.start()
            thread.join(timeout=30)
            assert not thread.is_alive(), "the claim waited on the stale owner"
            return entry(run, IndexStatus.RUNNING, NOW, sequence=6)

        with pytest.raises(FencingRejected):
            journal.append_indexed(run, 4, batch(run, 4), stale.fencing_token, claim_meanwhile)
        ((guard,),) = during
        assert guard.fencing_token == stale.fencing_token + 1
        assert journal.next_sequence(run) == 4 and journal.index_get(run) is not None
        journal.append_indexed(
            run,
            4,
            batch(run, 4),
            guard.fencing_token,
            lambda: entry(run, IndexStatus.RUNNING, NOW, sequence=6),
        )
        guard.release()
