"""Contract clauses of the run index (feature ``run_index``, :mod:`mayfly.runindex`), through its public SPI.

A journal that declares ``run_index`` keeps one :class:`~mayfly.runindex.IndexEntry`
per run, written in the same atomic step as the append that changes it, and
workers claim runs from it. These clauses check what a worker relies on:

* ``runindex.entry.*`` / ``runindex.put.*`` / ``runindex.wake.*``: what
  ``append_indexed``, ``index_put`` and ``index_wake`` store;
* ``runindex.claim.*``: what is claimable (children never, a queue filter,
  wake-time and priority order, leases), and that ``claim`` hands a run to
  exactly one of K processes racing for it;
* ``runindex.wakeups.*``: listeners are woken by ``notify_wakeups`` and, where
  declared (``append_wakeups``), by the append that creates a claimable run;
* ``runindex.crash.no-lost-wakeup``: a writer SIGKILLed between an append and
  its index write leaves every run at least as claimable as its history says;
* ``runindex.rebuild.*``: :func:`mayfly.recovery.rebuild_run_index` derives
  every entry from the journal and repairs a stale one.

Histories are real runs (:class:`~mayfly_contract.support.ScriptedRun`), and
the truth an entry is judged against is :func:`mayfly.runindex.index_entry`
of the state :func:`mayfly.recovery.replay_run` rebuilds from the journal.
Every test claims only from queues of its own, so the store need not be
empty; every lease a test is granted is released before it ends.
"""

from __future__ import annotations

import json
import random
import select
import time
import uuid
from collections.abc import Iterator, Sequence

import msgspec
import pytest

from mayfly.journal import RUN_PURGE, WorkflowJournal
from mayfly.lease import MAX_LEASE_TTL_MS, RecoveryLeaseGuard, RecoveryLeaseStore
from mayfly.model.errors import CorruptionError, FencingRejected, InvalidRecord, LeaseHeld, LeaseLost
from mayfly.recovery import rebuild_run_index, replay_run
from mayfly.runindex import (
    MAX_CLAIM,
    RUN_INDEX,
    RUN_WAKEUPS,
    IndexEntry,
    IndexStatus,
    RunIndexJournal,
    index_entry,
    more_claimable,
)
from mayfly_contract.support import RETRY_DELAY_MS, Child, Records, ScriptedRun

pytestmark = pytest.mark.capability("run_index")

CLAIMANTS = 4
RACED_RUNS = 100
CRASH_ROUNDS = 12
CRASH_RUNS = 5
TTL_MS = 60_000
# Steps of a ScriptedRun's history (the number of commits made).
CREATED, STARTED, RETRY_WAIT, RELEASED, SIGNAL_WAIT, SIGNALLED, FINISHED = 1, 2, 4, 5, 7, 8, 9


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _fresh_queue() -> str:
    return f"contract-{uuid.uuid4().hex[:16]}"


@pytest.fixture
def index(mayfly_journal: WorkflowJournal) -> RunIndexJournal:
    """The journal under test through its ``run_index`` feature (the module skips when it is absent)."""
    served = RUN_INDEX.of(mayfly_journal)
    assert served is not None, "run_index is declared, so RUN_INDEX.of must serve the journal"
    return served


@pytest.fixture
def queue() -> str:
    """A queue name no other test (or session) uses: claims from it see only this test's runs."""
    return _fresh_queue()


@pytest.fixture
def granted() -> Iterator[list[RecoveryLeaseGuard]]:
    """Collects the leases a test is granted and releases them when it ends."""
    guards: list[RecoveryLeaseGuard] = []
    yield guards
    for guard in guards:
        guard.release()


def _unstarted(entry: IndexEntry | None) -> IndexEntry | None:
    """``entry`` without the start a queue_control backend's claim records on it (not history-derived)."""
    return None if entry is None else msgspec.structs.replace(entry, started_ms=None)


def _truth(journal: WorkflowJournal, run_id: str) -> IndexEntry:
    """The entry the run's history gives it: index_entry of its replayed state."""
    return index_entry(replay_run(journal, run_id).state)


def _run(
    journal: WorkflowJournal,
    records: Records,
    queue: str,
    step: int,
    *,
    indexed: bool = True,
    epoch_ms: int | None = None,
    delay_ms: int = 0,
    parent: str | None = None,
) -> ScriptedRun:
    """A fresh run of ``queue`` moved ``step`` commits into its history."""
    epoch = _now_ms() if epoch_ms is None else epoch_ms
    run = ScriptedRun(records.new_id(), queue=queue, epoch_ms=epoch, delay_ms=delay_ms, parent=parent)
    run.advance_to(step, journal, indexed=indexed)
    return run


def _claim(
    index: RunIndexJournal,
    granted: list[RecoveryLeaseGuard],
    queues: Sequence[str] | None,
    *,
    now_ms: int | None = None,
    limit: int = 50,
    ttl_ms: int = MAX_LEASE_TTL_MS,
) -> list[str]:
    """Claim, keep the guards for release, and return the claimed run ids in the order given.

    The leases last a day by default: claims at ``now_ms`` hours ahead stay live for the rest of
    the test whether the backend judges lease expiry by ``now_ms`` or by its own clock.
    """
    guards = index.claim(
        "contract-claimer",
        limit=limit,
        ttl_ms=ttl_ms,
        now_ms=_now_ms() if now_ms is None else now_ms,
        queues=queues,
    )
    granted.extend(guards)
    assert all(guard.owner == "contract-claimer" and guard.fencing_token >= 1 for guard in guards)
    return [guard.run_id for guard in guards]


def _finish(
    journal: WorkflowJournal, index: RunIndexJournal, runs: Sequence[ScriptedRun], queues: Sequence[str]
) -> None:
    """Claim the runs and drive them to their end under the leases: nothing of the test stays claimable."""
    for guard in index.claim(
        "contract-cleanup", limit=MAX_CLAIM, ttl_ms=TTL_MS, now_ms=_now_ms(), queues=queues
    ):
        with guard:
            for run in runs:
                if run.run_id == guard.run_id:
                    while not run.done:
                        run.advance(journal, fence=guard.fencing_token)


# -- the feature -----------------------------------------------------------------------------------


@pytest.mark.clause("runindex.declared-implemented")
def test_run_index_is_served_by_its_protocol(mayfly_journal: WorkflowJournal) -> None:
    """A journal declaring run_index implements RunIndexJournal; run_wakeups, if declared, RunWakeups."""
    assert isinstance(RUN_INDEX.of(mayfly_journal), RunIndexJournal)
    assert (RUN_WAKEUPS.of(mayfly_journal) is not None) == mayfly_journal.capabilities.run_wakeups


# -- entries ---------------------------------------------------------------------------------------


@pytest.mark.clause("runindex.entry.append-indexed")
def test_append_indexed_stores_the_entry_of_every_batch(
    mayfly_journal: WorkflowJournal,
    index: RunIndexJournal,
    records: Records,
    queue: str,
    granted: list[RecoveryLeaseGuard],
) -> None:
    """After every append_indexed the entry is index_entry of the replayed state; a new run is claimable."""
    run = ScriptedRun(records.new_id(), queue=queue, epoch_ms=_now_ms(), delay_ms=250)
    assert index.index_get(run.run_id) is None
    fence: int | None = None
    seen = []
    while not run.done:
        state = run.advance(mayfly_journal, fence=fence)
        stored = index.index_get(run.run_id)
        assert stored is not None, f"after step {run.step}"
        assert _unstarted(stored) == index_entry(state) == _truth(mayfly_journal, run.run_id), (
            f"after step {run.step}"
        )
        seen.append(stored.status)
        if run.step == CREATED:
            assert stored.status is IndexStatus.NEW and stored.queue == queue
            assert _claim(index, granted, [queue]) == [run.run_id]
            # The rest of the history is written under the claim, as a worker would.
            fence = granted[-1].fencing_token if mayfly_journal.capabilities.fencing else None
    assert set(seen) == set(IndexStatus), "the history visits every status"
    assert _claim(index, granted, [queue]) == [], "a finished run is never claimed"


@pytest.mark.clause("runindex.put.never-lower-sequence")
def test_index_put_never_replaces_an_entry_with_a_lower_sequence(
    mayfly_journal: WorkflowJournal, index: RunIndexJournal, records: Records, queue: str
) -> None:
    """index_put of an entry with a lower sequence changes nothing; the same or a higher one replaces it."""
    run = _run(mayfly_journal, records, queue, RETRY_WAIT)
    stored = index.index_get(run.run_id)
    assert stored is not None and stored.status is IndexStatus.WAITING
    older = msgspec.structs.replace(stored, status=IndexStatus.RUNNING, sequence=stored.sequence - 1)
    index.index_put([older])
    assert index.index_get(run.run_id) == stored
    same = msgspec.structs.replace(stored, priority=3)
    index.index_put([same])
    assert index.index_get(run.run_id) == same
    newer = msgspec.structs.replace(
        stored, status=IndexStatus.TERMINAL, ready_at_ms=None, sequence=stored.sequence + 1
    )
    index.index_put([newer])
    assert index.index_get(run.run_id) == newer
    index.index_put([])  # nothing to store is not an error


@pytest.mark.clause("runindex.put.keeps-wake")
def test_a_stored_wake_is_kept_until_a_claim(
    mayfly_journal: WorkflowJournal,
    index: RunIndexJournal,
    records: Records,
    queue: str,
    granted: list[RecoveryLeaseGuard],
) -> None:
    """A wake survives index_put and append_indexed of entries without one; only a claim clears it."""
    run = _run(mayfly_journal, records, queue, SIGNAL_WAIT)
    assert _claim(index, granted, [queue]) == [], "a run waiting for a signal is not claimable"
    assert index.index_wake(run.run_id) is True
    woken = index.index_get(run.run_id)
    assert woken is not None and woken.wake and woken.status is IndexStatus.WAITING
    index.index_put([msgspec.structs.replace(woken, wake=False)])
    stored = index.index_get(run.run_id)
    assert stored is not None and stored.wake, "index_put kept the stored wake"
    run.advance(mayfly_journal)  # the signal is accepted: an append_indexed with wake=False
    stored = index.index_get(run.run_id)
    assert stored is not None and stored.wake and stored.status is IndexStatus.RUNNING
    assert _claim(index, granted, [queue]) == [run.run_id]
    stored = index.index_get(run.run_id)
    assert stored is not None and not stored.wake, "the claim cleared the wake"


@pytest.mark.clause("runindex.wake.unknown-or-terminal")
def test_index_wake_of_an_unknown_or_finished_run_is_false(
    mayfly_journal: WorkflowJournal,
    index: RunIndexJournal,
    records: Records,
    queue: str,
    granted: list[RecoveryLeaseGuard],
) -> None:
    """index_wake returns False (and wakes nothing) for a run with no entry or a terminal one."""
    unknown = records.new_id()
    assert index.index_get(unknown) is None
    assert index.index_wake(unknown) is False
    assert index.index_get(unknown) is None
    run = _run(mayfly_journal, records, queue, FINISHED)
    assert index.index_wake(run.run_id) is False
    assert _unstarted(index.index_get(run.run_id)) == _truth(mayfly_journal, run.run_id)
    assert _claim(index, granted, [queue]) == []


# -- what is claimable -------------------------------------------------------------------------------


@pytest.mark.clause("runindex.claim.children-never")
def test_child_runs_are_never_claimed(
    mayfly_journal: WorkflowJournal,
    index: RunIndexJournal,
    records: Records,
    queue: str,
    granted: list[RecoveryLeaseGuard],
) -> None:
    """Entries with a parent are never claimed and never give next_wake a time; their parent is claimed."""
    parent = _run(mayfly_journal, records, queue, STARTED)
    runnable = _run(mayfly_journal, records, queue, CREATED, parent=parent.run_id)
    waiting = _run(mayfly_journal, records, queue, RETRY_WAIT, parent=parent.run_id)
    for child in (runnable, waiting):
        stored = index.index_get(child.run_id)
        assert stored is not None and stored.parent == parent.run_id
    assert index.index_wake(waiting.run_id) is True
    assert index.next_wake(now_ms=_now_ms(), queues=[queue]) is None
    far = _now_ms() + 10 * RETRY_DELAY_MS
    assert _claim(index, granted, [queue], now_ms=far) == [parent.run_id]


@pytest.mark.clause("runindex.claim.queues")
def test_claims_take_only_the_queues_asked_for(
    mayfly_journal: WorkflowJournal,
    index: RunIndexJournal,
    records: Records,
    granted: list[RecoveryLeaseGuard],
) -> None:
    """queues=[q] claims only runs of q; None claims from every queue; the entry keeps the run's queue."""
    first, second, unused = _fresh_queue(), _fresh_queue(), _fresh_queue()
    # Created "long ago", so that with queues=None they come before any runnable run of the store.
    runs = [
        _run(mayfly_journal, records, name, CREATED, epoch_ms=1_000 + offset)
        for offset, name in enumerate((first, first, second))
    ]
    try:
        assert [e.queue for e in (index.index_get(r.run_id) for r in runs) if e] == [first, first, second]
        assert _claim(index, granted, [first]) == [runs[0].run_id, runs[1].run_id]
        assert _claim(index, granted, [second, unused]) == [runs[2].run_id]
        assert _claim(index, granted, [unused]) == []
        for guard in granted:
            guard.release()
        granted.clear()
        everywhere = _claim(index, granted, None, limit=len(runs))
        assert everywhere == [run.run_id for run in runs]
        for guard in granted:
            guard.release()
        granted.clear()
    finally:
        _finish(mayfly_journal, index, runs, [first, second])


@pytest.mark.clause("runindex.claim.inputs")
def test_bad_claim_arguments_raise_invalid_record(index: RunIndexJournal, queue: str) -> None:
    """claim and next_wake check limit and queues (mayfly.runindex.check_claim) and raise InvalidRecord."""
    now = _now_ms()
    for limit in (0, -1, MAX_CLAIM + 1, True, "5", 2.0, None):
        with pytest.raises(InvalidRecord):
            index.claim("contract-claimer", limit=limit, ttl_ms=TTL_MS, now_ms=now)  # type: ignore[arg-type]
    for queues in ("default", b"default", [], ["Not A Queue"], [5], ["ok", ""], 7):
        with pytest.raises(InvalidRecord):
            index.claim("contract-claimer", limit=1, ttl_ms=TTL_MS, now_ms=now, queues=queues)  # type: ignore[arg-type]
        with pytest.raises(InvalidRecord):
            index.next_wake(now_ms=now, queues=queues)  # type: ignore[arg-type]
    assert index.claim("contract-claimer", limit=MAX_CLAIM, ttl_ms=TTL_MS, now_ms=now, queues=(queue,)) == []


# -- wake-time order -----------------------------------------------------------------------------------


@pytest.mark.clause("runindex.claim.wake-time")
def test_waiting_runs_are_claimed_once_due_in_wake_order(
    mayfly_journal: WorkflowJournal,
    index: RunIndexJournal,
    records: Records,
    queue: str,
    granted: list[RecoveryLeaseGuard],
) -> None:
    """A run waiting until T is not claimable before T, is at T; due runs are claimed in ready_at order."""
    epoch = _now_ms()
    later, earliest, middle = (
        _run(mayfly_journal, records, queue, RETRY_WAIT, epoch_ms=epoch, delay_ms=delay)
        for delay in (300, 100, 200)
    )
    signal = _run(mayfly_journal, records, queue, SIGNAL_WAIT, epoch_ms=epoch)
    wake = {run.run_id: run.retry_at for run in (later, earliest, middle)}
    for run_id, at in wake.items():
        stored = index.index_get(run_id)
        assert stored is not None and (stored.status, stored.ready_at_ms) == (IndexStatus.WAITING, at)
    assert _claim(index, granted, [queue], now_ms=epoch + 1_000) == []
    assert _claim(index, granted, [queue], now_ms=wake[earliest.run_id] - 1) == []
    assert _claim(index, granted, [queue], now_ms=wake[earliest.run_id]) == [earliest.run_id]
    due = _claim(index, granted, [queue], now_ms=wake[later.run_id] + 10 * RETRY_DELAY_MS)
    assert due == [middle.run_id, later.run_id], "due runs in wake order; the signal wait has no time"
    assert signal.run_id not in due


@pytest.mark.clause("runindex.next-wake")
def test_next_wake_is_the_earliest_future_wake(
    mayfly_journal: WorkflowJournal, index: RunIndexJournal, records: Records, queue: str
) -> None:
    """next_wake is the earliest ready_at after now of a waiting root run in the queues; None if none."""
    assert index.next_wake(now_ms=_now_ms(), queues=[queue]) is None
    epoch = _now_ms()
    _run(mayfly_journal, records, queue, STARTED, epoch_ms=epoch)  # runnable: not a wake
    _run(mayfly_journal, records, queue, SIGNAL_WAIT, epoch_ms=epoch)  # waits with no time
    assert index.next_wake(now_ms=epoch, queues=[queue]) is None
    times = sorted(
        run.retry_at
        for run in (
            _run(mayfly_journal, records, queue, RETRY_WAIT, epoch_ms=epoch, delay_ms=d) for d in (500, 20)
        )
    )
    assert index.next_wake(now_ms=epoch, queues=[queue]) == times[0]
    assert index.next_wake(now_ms=times[0], queues=[queue]) == times[1], "strictly after now"
    assert index.next_wake(now_ms=times[1], queues=[queue]) is None
    assert index.next_wake(now_ms=epoch, queues=[_fresh_queue()]) is None
    found = index.next_wake(now_ms=epoch)
    assert found is not None and found <= times[0], "every queue: at least as early as this one's"


@pytest.mark.clause("runindex.claim.ready-order")
def test_runnable_runs_are_claimed_first_come_first_served(
    mayfly_journal: WorkflowJournal,
    index: RunIndexJournal,
    records: Records,
    queue: str,
    granted: list[RecoveryLeaseGuard],
) -> None:
    """Runnable runs are claimed in ready_at order (when they became runnable), limit at a time."""
    epoch = _now_ms()
    runs = {
        offset: _run(mayfly_journal, records, queue, CREATED, epoch_ms=epoch + offset)
        for offset in (30, 10, 20)
    }
    assert _claim(index, granted, [queue], limit=1) == [runs[10].run_id]
    assert _claim(index, granted, [queue], limit=5) == [runs[20].run_id, runs[30].run_id]


@pytest.mark.clause("runindex.claim.priority")
def test_higher_priority_runs_are_claimed_first(
    mayfly_journal: WorkflowJournal,
    index: RunIndexJournal,
    records: Records,
    queue: str,
    granted: list[RecoveryLeaseGuard],
) -> None:
    """Among claimable runs a higher priority goes first, then ready_at order."""
    epoch = _now_ms()
    runs = [_run(mayfly_journal, records, queue, CREATED, epoch_ms=epoch + offset) for offset in range(4)]
    try:
        for run, priority in zip(runs, (0, 5, 1, 5), strict=True):
            stored = index.index_get(run.run_id)
            assert stored is not None
            index.index_put([msgspec.structs.replace(stored, priority=priority)])
        claimed = _claim(index, granted, [queue], limit=len(runs))
        assert claimed == [runs[1].run_id, runs[3].run_id, runs[2].run_id, runs[0].run_id]
        for guard in granted:
            guard.release()
        granted.clear()
    finally:
        _finish(mayfly_journal, index, runs, [queue])


# -- claims and leases ---------------------------------------------------------------------------------


@pytest.mark.clause("runindex.claim.exactly-once")
@pytest.mark.capability("cross_process")
def test_racing_claimant_processes_claim_each_run_exactly_once(
    *,
    mayfly_journal: WorkflowJournal,
    mayfly_journal_url: str,
    index: RunIndexJournal,
    records: Records,
    queue: str,
    granted: list[RecoveryLeaseGuard],
) -> None:
    """K processes claiming from one set of runs at once: every run is claimed, by exactly one of them."""
    epoch = _now_ms()
    runs = {_run(mayfly_journal, records, queue, CREATED, epoch_ms=epoch).run_id for _ in range(RACED_RUNS)}
    children = [
        Child("claim-race", url=mayfly_journal_url, queue=queue, ttl_ms=TTL_MS, seed=seed)
        for seed in range(CLAIMANTS)
    ]
    try:
        for child in children:
            assert child.readline() == "ready"
        for child in children:
            child.send("go")
        won = [json.loads(child.readline()) for child in children]
        claims = [run_id for pairs in won for run_id, _ in pairs]
        assert len(claims) == len(set(claims)), "a run was handed to two claimants"
        assert set(claims) == runs, f"{len(runs - set(claims))} claimable runs were never claimed"
        assert sum(1 for pairs in won if pairs) >= 2, f"the claimants did not race: {[len(p) for p in won]}"
        assert _claim(index, granted, [queue]) == [], "every run is leased by a live claimant"
        for child in children:
            child.send("release")
            assert child.readline() == "released"
            child.finish()
    finally:
        for child in children:
            child.close()
    tokens = {run_id: token for pairs in won for run_id, token in pairs}
    again = _claim(index, granted, [queue], limit=2 * RACED_RUNS)
    assert set(again) == runs, "released runs are claimable again"
    if mayfly_journal.capabilities.fencing:
        assert all(guard.fencing_token > tokens[guard.run_id] for guard in granted)


@pytest.mark.clause("runindex.claim.live-lease")
def test_a_live_lease_keeps_a_run_from_being_claimed(
    *,
    mayfly_journal: WorkflowJournal,
    mayfly_journal_url: str,
    mayfly_leases: RecoveryLeaseStore,
    mayfly_leases_url: str,
    index: RunIndexJournal,
    records: Records,
    queue: str,
    granted: list[RecoveryLeaseGuard],
) -> None:
    """A run leased (by a claim or the lease store) is not claimed; once released it is, with a new token."""
    run = _run(mayfly_journal, records, queue, CREATED)
    if mayfly_leases_url == mayfly_journal_url:
        with mayfly_leases.acquire(run.run_id, "contract-holder", TTL_MS) as held:
            assert _claim(index, granted, [queue]) == []
        first = held.fencing_token
    else:
        first = 0
    assert _claim(index, granted, [queue]) == [run.run_id]
    (guard,) = granted
    assert guard.fencing_token > first
    assert _claim(index, granted, [queue]) == [], "the claim's own lease is live"
    guard.renew()
    guard.renew(TTL_MS)
    assert _claim(index, granted, [queue]) == []
    with pytest.raises(LeaseHeld):
        mayfly_leases.acquire(run.run_id, "contract-holder", TTL_MS)
    guard.release()
    assert _claim(index, granted, [queue]) == [run.run_id]
    assert granted[-1].fencing_token > guard.fencing_token
    with pytest.raises(LeaseLost):
        guard.renew()


@pytest.mark.clause("runindex.claim.fenced")
@pytest.mark.capability("fencing")
def test_an_append_under_a_stale_claim_is_refused(
    mayfly_journal: WorkflowJournal,
    index: RunIndexJournal,
    records: Records,
    queue: str,
    granted: list[RecoveryLeaseGuard],
) -> None:
    """A claim's token fences appends: after the run is claimed again, the old token's append is refused."""
    run = _run(mayfly_journal, records, queue, CREATED)
    assert _claim(index, granted, [queue]) == [run.run_id]
    old = granted[-1]
    run.advance(mayfly_journal, fence=old.fencing_token)
    old.release()
    assert _claim(index, granted, [queue]) == [run.run_id]
    new = granted[-1]
    assert new.fencing_token > old.fencing_token
    before = index.index_get(run.run_id)
    with pytest.raises(FencingRejected):
        run.advance(mayfly_journal, fence=old.fencing_token)
    assert index.index_get(run.run_id) == before, "a refused append stores no entry"
    state = run.advance(mayfly_journal, fence=new.fencing_token)
    assert _unstarted(index.index_get(run.run_id)) == index_entry(state)


@pytest.mark.clause("runindex.claim.expired-lease")
@pytest.mark.capability("lease_expiry")
def test_an_expired_claim_makes_the_run_claimable_again(
    mayfly_journal: WorkflowJournal,
    index: RunIndexJournal,
    records: Records,
    queue: str,
    granted: list[RecoveryLeaseGuard],
) -> None:
    """A claimed run whose lease is not renewed within its ttl is claimed again, and the old lease is lost."""
    run = _run(mayfly_journal, records, queue, CREATED)
    assert _claim(index, granted, [queue], ttl_ms=200) == [run.run_id]
    old = granted[-1]
    time.sleep(0.5)
    assert _claim(index, granted, [queue]) == [run.run_id]
    assert granted[-1].fencing_token > old.fencing_token
    with pytest.raises(LeaseLost):
        old.renew()
    if mayfly_journal.capabilities.fencing:
        with pytest.raises(FencingRejected):
            run.advance(mayfly_journal, fence=old.fencing_token)
        run.advance(mayfly_journal, fence=granted[-1].fencing_token)


# -- wake-ups -----------------------------------------------------------------------------------------------


def _readable(fileno: int, timeout: float) -> bool:
    return bool(select.select([fileno], [], [], timeout)[0])


@pytest.mark.clause("runindex.wakeups.notified")
@pytest.mark.capability("run_wakeups")
@pytest.mark.capability("cross_process")
def test_a_listener_is_woken_by_another_process(
    mayfly_journal: WorkflowJournal, mayfly_journal_url: str
) -> None:
    """notify_wakeups from another process makes a listener readable; drain consumes it; close is final."""
    wakeups = RUN_WAKEUPS.of(mayfly_journal)
    assert wakeups is not None
    listener = wakeups.listen_wakeups()
    try:
        listener.drain()
        child = Child("notify-wakeups", url=mayfly_journal_url)
        try:
            assert child.readline() == "notified"
            child.finish()
        finally:
            child.close()
        assert _readable(listener.fileno(), 10), "the listener was not woken"
        listener.drain()
        assert not _readable(listener.fileno(), 0.05), "drain left the wake-up pending"
    finally:
        listener.close()
    wakeups.notify_wakeups()  # nobody listening (any more) is not an error


@pytest.mark.clause("runindex.wakeups.on-append")
@pytest.mark.capability("run_wakeups")
@pytest.mark.capability("append_wakeups")
def test_creating_a_claimable_run_wakes_listeners_by_itself(
    mayfly_journal: WorkflowJournal, index: RunIndexJournal, records: Records, queue: str
) -> None:
    """An append_indexed without a fencing token that makes a run claimable now wakes a listener itself."""
    wakeups = RUN_WAKEUPS.of(mayfly_journal)
    assert wakeups is not None
    listener = wakeups.listen_wakeups()
    try:
        listener.drain()
        run = _run(mayfly_journal, records, queue, CREATED)  # no notify_wakeups: the append must tell
        assert _readable(listener.fileno(), 10), "creating a claimable run did not wake the listener"
        listener.drain()
    finally:
        listener.close()
    _finish(mayfly_journal, index, [run], [queue])


# -- crashes -----------------------------------------------------------------------------------------------


@pytest.mark.clause("runindex.crash.no-lost-wakeup")
@pytest.mark.capability("crash_durable")
@pytest.mark.capability("cross_process")
def test_a_writer_killed_between_append_and_index_loses_no_wakeup(
    *,
    mayfly_journal: WorkflowJournal,
    mayfly_journal_url: str,
    index: RunIndexJournal,
    records: Records,
    queue: str,
    granted: list[RecoveryLeaseGuard],
) -> None:
    """After SIGKILLs of a writer mid-history, every entry is at least as claimable as the journal says."""
    chooser = random.Random()
    epoch = _now_ms()
    runs: list[str] = []
    for round_ in range(CRASH_ROUNDS):
        batch = [records.new_id() for _ in range(CRASH_RUNS)]
        runs.extend(batch)
        child = Child(
            "script-until-killed",
            url=mayfly_journal_url,
            queue=queue,
            runs=batch,
            epoch_ms=epoch,
            seed=chooser.randrange(1 << 30),
        )
        try:
            acks = chooser.randrange(2, CRASH_RUNS * ScriptedRun.STEPS)
            assert child.readline().startswith("ack "), f"round {round_}"
            started = time.monotonic()
            for _ in range(acks - 1):
                assert child.readline().startswith("ack "), f"round {round_}"
            # Kill at a uniformly random point of the next append (one append takes about `mean`),
            # so that rounds land between its records and its index write as often as anywhere else.
            mean = (time.monotonic() - started) / (acks - 1)
            time.sleep(chooser.uniform(0, 1.5 * mean))
            child.kill()
        finally:
            child.close()
    claimable_truth: set[str] = set()
    for run_id in runs:
        if mayfly_journal.next_sequence(run_id) == 1:
            continue  # killed before its first append: nothing to find
        truth = _truth(mayfly_journal, run_id)
        stored = index.index_get(run_id)
        assert stored is not None, f"run {run_id} has records but no index entry: it can never be claimed"
        assert (stored.run_id, stored.queue, stored.parent) == (run_id, queue, None)
        assert stored.wake or not more_claimable(truth, stored), (
            f"run {run_id}: stored {stored} is less claimable than its history's {truth}: a lost wake-up"
        )
        if truth.status in (IndexStatus.NEW, IndexStatus.RUNNING) or (
            truth.status is IndexStatus.WAITING and truth.ready_at_ms is not None
        ):
            claimable_truth.add(run_id)
    assert claimable_truth, "the kills left no claimable run to check"
    far = epoch + 100 * RETRY_DELAY_MS
    claimed = set(_claim(index, granted, [queue], now_ms=far, limit=MAX_CLAIM))
    assert claimable_truth <= claimed, f"claimable runs not claimed: {sorted(claimable_truth - claimed)}"


# -- rebuilding -----------------------------------------------------------------------------------------


def _rebuild_all(journal: WorkflowJournal, mine: Sequence[str]) -> None:
    """Rebuild the whole store, which also holds other clauses' probe runs (records that are no workflow
    events): those are named as unreadable after every other run is indexed, never one of ``mine``."""
    try:
        rebuild_run_index(journal)
    except CorruptionError as exc:
        named = [run_id for run_id in mine if run_id in str(exc)]
        assert not named, f"rebuild could not read runs of this clause: {named}: {exc}"


@pytest.mark.clause("runindex.rebuild.from-journal")
def test_rebuild_indexes_runs_appended_without_an_index(
    mayfly_journal: WorkflowJournal, index: RunIndexJournal, records: Records, queue: str
) -> None:
    """Runs written with plain append get index_entry(replayed state) from rebuild_run_index."""
    parent = _run(mayfly_journal, records, queue, STARTED, indexed=False)
    runs = [
        _run(mayfly_journal, records, queue, step, indexed=False, delay_ms=step)
        for step in (CREATED, RETRY_WAIT, RELEASED, SIGNAL_WAIT, FINISHED)
    ]
    child = ScriptedRun(records.new_id(), queue=queue, epoch_ms=_now_ms(), parent=parent.run_id)
    child.advance_to(RETRY_WAIT, mayfly_journal, indexed=False)
    mine = [run.run_id for run in (parent, *runs, child)]
    indexed = rebuild_run_index(mayfly_journal, runs=mine)
    assert indexed == len(mine)
    for run in (parent, *runs, child):
        assert _unstarted(index.index_get(run.run_id)) == _truth(mayfly_journal, run.run_id), (
            f"step {run.step}"
        )
    # The same from the journal's own listing of every run.
    later = _run(mayfly_journal, records, queue, RETRY_WAIT, indexed=False)
    _rebuild_all(mayfly_journal, [*mine, later.run_id])
    for run in (parent, *runs, child, later):
        assert _unstarted(index.index_get(run.run_id)) == _truth(mayfly_journal, run.run_id), (
            f"step {run.step}"
        )


@pytest.mark.clause("runindex.rebuild.repairs")
def test_rebuild_keeps_correct_entries_and_repairs_a_stale_one(
    mayfly_journal: WorkflowJournal, index: RunIndexJournal, records: Records, queue: str
) -> None:
    """A rebuild over an index changes no correct entry (nor a stored wake) and repairs a stale entry."""
    correct = [_run(mayfly_journal, records, queue, step) for step in (CREATED, RETRY_WAIT, FINISHED)]
    woken = _run(mayfly_journal, records, queue, SIGNAL_WAIT)
    assert index.index_wake(woken.run_id) is True
    stale = _run(mayfly_journal, records, queue, STARTED)
    truth = _truth(mayfly_journal, stale.run_id)
    # A stale entry as a lost write would leave it: the run looks finished, so no worker would claim it.
    index.index_put([msgspec.structs.replace(truth, status=IndexStatus.TERMINAL, ready_at_ms=None)])
    before = {run.run_id: index.index_get(run.run_id) for run in (*correct, woken)}
    _rebuild_all(mayfly_journal, [run.run_id for run in (*correct, woken, stale)])
    assert {run.run_id: index.index_get(run.run_id) for run in (*correct, woken)} == before
    assert _unstarted(index.index_get(stale.run_id)) == truth


@pytest.mark.clause("runindex.purge")
def test_a_purged_run_has_no_entry_and_is_never_claimed(
    mayfly_journal: WorkflowJournal,
    index: RunIndexJournal,
    records: Records,
    queue: str,
    granted: list[RecoveryLeaseGuard],
) -> None:
    """Purging a run (the run_purge feature) removes its index entry with its history."""
    purger = RUN_PURGE.of(mayfly_journal)
    if purger is None:
        pytest.skip(f"backend {mayfly_journal.url} declares capability run_purge absent")
    run = _run(mayfly_journal, records, queue, CREATED)
    assert index.index_get(run.run_id) is not None
    assert purger.purge_run(run.run_id)
    assert index.index_get(run.run_id) is None
    assert run.run_id not in _claim(index, granted, [queue], now_ms=_now_ms() + 100 * RETRY_DELAY_MS)
