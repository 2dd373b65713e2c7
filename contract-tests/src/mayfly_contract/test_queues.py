"""Contract clauses of queue flow control (feature ``queue_control``, :mod:`mayfly.queues`).

A journal that declares ``queue_control`` stores :class:`~mayfly.queues.QueueSettings`
durably and enforces them inside ``claim`` for every claimant, atomically with
the selection, and refuses a second live run of a deduplication id:

* ``queues.settings.*``: set, get, list, replace and remove settings; bad input
  changes nothing;
* ``queues.concurrency.*``: a queue's global limit counts the runs leased in it
  (a held lease counts until it is released or expires), also against several
  processes racing; a worker's own limit counts what it says it holds;
* ``queues.rate``: first claims (starts) are recorded on the entry and limited
  per window; a run claimed again is no new start;
* ``queues.dedup.*``: a dedup id is held by one live run of a queue, and freed
  when that run ends.

Every test uses queues of its own and releases what it is granted.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

from mayfly.errors import DuplicateRun
from mayfly.journal import WorkflowJournal
from mayfly.lease import RecoveryLeaseGuard
from mayfly.model.errors import InvalidRecord
from mayfly.queues import QUEUE_CONTROL, QueueControl, QueueSettings, QueueUsage
from mayfly.runindex import RUN_INDEX, RunIndexJournal, index_entry
from mayfly_contract.support import Child, Records, ScriptedRun

pytestmark = [pytest.mark.capability("run_index"), pytest.mark.capability("queue_control")]

TTL_MS = 60_000
CREATED, STARTED, FINISHED = 1, 2, 9


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture
def control(mayfly_journal: WorkflowJournal) -> QueueControl:
    """The journal under test through its ``queue_control`` feature."""
    served = QUEUE_CONTROL.of(mayfly_journal)
    assert served is not None, "queue_control is declared, so QUEUE_CONTROL.of must serve the journal"
    return served


@pytest.fixture
def index(mayfly_journal: WorkflowJournal) -> RunIndexJournal:
    """The journal under test through its ``run_index`` feature."""
    served = RUN_INDEX.of(mayfly_journal)
    assert served is not None
    return served


@pytest.fixture
def queue(control: QueueControl) -> Iterator[str]:
    """A queue of this test alone; its settings are removed when the test ends."""
    name = f"contract-q-{uuid.uuid4().hex[:12]}"
    yield name
    control.queue_remove(name)


@pytest.fixture
def granted() -> Iterator[list[RecoveryLeaseGuard]]:
    """The leases a test is granted, released when it ends."""
    guards: list[RecoveryLeaseGuard] = []
    yield guards
    for guard in guards:
        guard.release()


def _runs(
    journal: WorkflowJournal, records: Records, queue: str, count: int, step: int = CREATED
) -> list[str]:
    runs = []
    epoch = _now_ms()
    for n in range(count):
        run = ScriptedRun(records.new_id(), queue=queue, epoch_ms=epoch + n)
        run.advance_to(step, journal)
        runs.append(run.run_id)
    return runs


def _claim(
    index: RunIndexJournal,
    granted: list[RecoveryLeaseGuard],
    queues: Sequence[str],
    *,
    limit: int = 50,
    now_ms: int | None = None,
    held: dict[str, int] | None = None,
) -> list[str]:
    claim = index.claim  # queue_control backends take held= as well
    arguments: dict[str, object] = {} if held is None else {"held": held}
    guards = claim(
        "contract-queues",
        limit=limit,
        ttl_ms=TTL_MS,
        now_ms=_now_ms() if now_ms is None else now_ms,
        queues=queues,
        **arguments,
    )
    granted.extend(guards)
    return [guard.run_id for guard in guards]


@dataclass
class Case:
    """What a clause works with: the journal and its features, ids, its own queue, its grants."""

    journal: WorkflowJournal
    control: QueueControl
    index: RunIndexJournal
    records: Records
    queue: str
    granted: list[RecoveryLeaseGuard]

    def unpack(
        self,
    ) -> tuple[WorkflowJournal, QueueControl, RunIndexJournal, Records, str, list[RecoveryLeaseGuard]]:
        """The fields, in order."""
        return self.journal, self.control, self.index, self.records, self.queue, self.granted


@pytest.fixture
def case(  # noqa: PLR0917 - pytest passes fixtures by name
    mayfly_journal: WorkflowJournal,
    control: QueueControl,
    index: RunIndexJournal,
    records: Records,
    queue: str,
    granted: list[RecoveryLeaseGuard],
) -> Case:
    """The clause's journal, features, queue and grants in one."""
    return Case(mayfly_journal, control, index, records, queue, granted)


@pytest.mark.clause("queues.declared-implemented")
def test_queue_control_is_served_by_its_protocol(mayfly_journal: WorkflowJournal) -> None:
    """A journal declaring queue_control implements QueueControl (and declares run_index)."""
    assert isinstance(QUEUE_CONTROL.of(mayfly_journal), QueueControl)
    assert mayfly_journal.capabilities.run_index, "queue limits are enforced in claims: run_index is needed"


@pytest.mark.clause("queues.settings.roundtrip")
def test_settings_are_stored_replaced_listed_and_removed(control: QueueControl, queue: str) -> None:
    """What queue_set stores, queue_get and queue_list return; a second set replaces it; remove forgets it."""
    assert control.queue_get(queue) is None
    first = QueueSettings(name=queue, concurrency=3, worker_concurrency=2, rate_limit=10, rate_period_ms=1000)
    control.queue_set(first)
    assert control.queue_get(queue) == first
    assert first in control.queue_list()
    second = QueueSettings(name=queue, priority=True)
    control.queue_set(second)
    assert control.queue_get(queue) == second
    assert [s for s in control.queue_list() if s.name == queue] == [second]
    names = [s.name for s in control.queue_list()]
    assert names == sorted(names), "queue_list is ordered by name"
    assert control.queue_remove(queue) is True
    assert control.queue_get(queue) is None
    assert control.queue_remove(queue) is False


@pytest.mark.clause("queues.settings.inputs")
def test_bad_settings_and_names_are_refused_and_change_nothing(control: QueueControl, queue: str) -> None:
    """Malformed names and non-settings are refused with InvalidRecord; the stored settings stay."""
    control.queue_set(QueueSettings(name=queue, concurrency=1))
    for bad in ("", "Upper", "a b", "x" * 65, 7):
        with pytest.raises(InvalidRecord):
            control.queue_get(bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidRecord):
            control.queue_remove(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRecord):
        control.queue_set({"name": queue, "concurrency": 9})  # type: ignore[arg-type]
    with pytest.raises(InvalidRecord):
        QueueSettings(name=queue, concurrency=0)
    with pytest.raises(InvalidRecord):
        QueueSettings(name=queue, rate_limit=5)
    assert control.queue_get(queue) == QueueSettings(name=queue, concurrency=1)


@pytest.mark.clause("queues.concurrency.global")
def test_a_queue_never_has_more_runs_leased_than_its_concurrency(
    case: Case,
) -> None:
    """Concurrency 2: claims hand out 2 runs until one is released; without settings nothing is held back."""
    mayfly_journal, control, index, records, queue, granted = case.unpack()
    control.queue_set(QueueSettings(name=queue, concurrency=2))
    runs = _runs(mayfly_journal, records, queue, 5)
    first = _claim(index, granted, [queue])
    assert first == runs[:2], "the limit caps the claim, in claim order"
    assert _claim(index, granted, [queue]) == [], "no more while two are leased"
    assert control.queue_usage(queue, now_ms=_now_ms()) == QueueUsage(in_progress=2, recent_starts=0)
    granted.pop(0).release()
    assert _claim(index, granted, [queue]) == [runs[0]], "a released run frees its slot (and is claimable)"
    assert _claim(index, granted, [queue]) == []
    control.queue_remove(queue)
    assert _claim(index, granted, [queue]) == runs[2:], "without settings the queue is unlimited"


@pytest.mark.clause("queues.concurrency.ended-runs-free-slots")
def test_a_run_that_ended_under_its_lease_frees_its_slot(
    case: Case,
) -> None:
    """A terminal run no longer counts against the limit, even while its lease is still held."""
    mayfly_journal, control, index, records, queue, granted = case.unpack()
    control.queue_set(QueueSettings(name=queue, concurrency=1))
    epoch = _now_ms()
    scripted = [ScriptedRun(records.new_id(), queue=queue, epoch_ms=epoch + n) for n in range(2)]
    for run in scripted:
        run.advance(mayfly_journal)
    assert _claim(index, granted, [queue]) == [scripted[0].run_id]
    fence = granted[0].fencing_token if mayfly_journal.capabilities.fencing else None
    while not scripted[0].done:
        scripted[0].advance(mayfly_journal, fence=fence)
    assert _claim(index, granted, [queue]) == [scripted[1].run_id]


@pytest.mark.clause("queues.concurrency.per-worker")
def test_a_claimant_gets_no_more_than_its_worker_concurrency_less_what_it_holds(
    case: Case,
) -> None:
    """worker_concurrency 2: holding 1 a claimant gets 1 more, holding 2 none; other queues do not count."""
    mayfly_journal, control, index, records, queue, granted = case.unpack()
    control.queue_set(QueueSettings(name=queue, worker_concurrency=2))
    runs = _runs(mayfly_journal, records, queue, 6)
    assert _claim(index, granted, [queue], held={queue: 2}) == []
    assert _claim(index, granted, [queue], held={queue: 1, "elsewhere": 9}) == runs[:1]
    assert _claim(index, granted, [queue], held={}) == runs[1:3]
    assert _claim(index, granted, [queue]) == runs[3:5], "held omitted counts as holding nothing"
    with pytest.raises(InvalidRecord):
        _claim(index, granted, [queue], held={queue: -1})


@pytest.mark.clause("queues.rate")
def test_starts_are_recorded_and_limited_per_window(
    case: Case,
) -> None:
    """Rate 2 per minute: 2 of 4 new runs start; a re-claim is no new start; the next window starts 2 more."""
    mayfly_journal, control, index, records, queue, granted = case.unpack()
    control.queue_set(QueueSettings(name=queue, rate_limit=2, rate_period_ms=60_000))
    runs = _runs(mayfly_journal, records, queue, 4)
    now = _now_ms()
    assert _claim(index, granted, [queue], now_ms=now) == runs[:2]
    for run in runs[:2]:
        entry = index.index_get(run)
        assert entry is not None and entry.started_ms == now, "a first claim records the start"
    assert index.index_get(runs[2]) is not None
    assert index.index_get(runs[2]).started_ms is None  # type: ignore[union-attr]
    assert control.queue_usage(queue, now_ms=now).recent_starts == 2
    assert _claim(index, granted, [queue], now_ms=now + 1) == []
    for guard in granted:
        guard.release()
    granted.clear()
    assert _claim(index, granted, [queue], now_ms=now + 2) == runs[:2], "started runs are claimed again"
    for guard in granted:
        guard.release()
    granted.clear()
    later = now + 60_001
    assert sorted(_claim(index, granted, [queue], now_ms=later)) == sorted(runs)
    entry = index.index_get(runs[0])
    assert entry is not None and entry.started_ms == now, "a start is recorded once"


@pytest.mark.clause("queues.rate.kept-by-writes")
def test_a_recorded_start_survives_later_appends_and_puts(
    case: Case,
) -> None:
    """append_indexed and index_put of entries without started_ms keep the stored one."""
    mayfly_journal, control, index, records, queue, granted = case.unpack()
    control.queue_set(QueueSettings(name=queue, rate_limit=5, rate_period_ms=60_000))
    run = ScriptedRun(records.new_id(), queue=queue, epoch_ms=_now_ms())
    run.advance(mayfly_journal)
    now = _now_ms()
    assert _claim(index, granted, [queue], now_ms=now) == [run.run_id]
    fence = granted[0].fencing_token if mayfly_journal.capabilities.fencing else None
    state = run.advance(mayfly_journal, fence=fence)
    stored = index.index_get(run.run_id)
    assert stored is not None and stored.started_ms == now and stored.sequence == state.sequence
    index.index_put([index_entry(state)])
    stored = index.index_get(run.run_id)
    assert stored is not None and stored.started_ms == now


@pytest.mark.clause("queues.dedup.one-live-run")
def test_a_dedup_id_allows_one_live_run_per_queue(
    case: Case,
) -> None:
    """A second run with a live run's dedup id is refused and writes nothing; allowed once the first ends."""
    mayfly_journal, _, index, records, queue, granted = case.unpack()
    dedup = f"order-{uuid.uuid4().hex[:8]}"
    first = ScriptedRun(records.new_id(), queue=queue, epoch_ms=_now_ms(), dedup_id=dedup)
    first.advance(mayfly_journal)
    second = ScriptedRun(records.new_id(), queue=queue, epoch_ms=_now_ms(), dedup_id=dedup)
    with pytest.raises(DuplicateRun) as refused:
        second.advance(mayfly_journal)
    assert refused.value.live_run_id == first.run_id and refused.value.dedup_id == dedup
    assert mayfly_journal.next_sequence(second.run_id) == 1, "the refused run wrote nothing"
    assert index.index_get(second.run_id) is None
    elsewhere = ScriptedRun(records.new_id(), queue=f"{queue}-b", epoch_ms=_now_ms(), dedup_id=dedup)
    elsewhere.advance(mayfly_journal)  # the same id on another queue is another id
    assert _claim(index, granted, [queue]) == [first.run_id]
    fence = granted[0].fencing_token if mayfly_journal.capabilities.fencing else None
    while not first.done:
        first.advance(mayfly_journal, fence=fence)
    again = ScriptedRun(records.new_id(), queue=queue, epoch_ms=_now_ms(), dedup_id=dedup)
    again.advance(mayfly_journal)
    assert index.index_get(again.run_id) is not None


@pytest.mark.clause("queues.concurrency.processes")
@pytest.mark.capability("cross_process")
def test_processes_racing_claims_never_exceed_the_queue_concurrency(
    mayfly_journal: WorkflowJournal, control: QueueControl, records: Records, queue: str
) -> None:
    """Four processes claim from a queue with concurrency 3, holding all they get, while runs of rising
    priority keep arriving (so the claimants' plans differ): 3 runs are granted in total, never more."""
    control.queue_set(QueueSettings(name=queue, concurrency=3))
    _runs(mayfly_journal, records, queue, 10)
    children = [
        Child("claim-race", url=mayfly_journal.url, queue=queue, ttl_ms=TTL_MS, seed=seed)
        for seed in range(4)
    ]
    arrivals: list[ScriptedRun] = []
    try:
        for child in children:
            assert child.readline() == "ready"
        for child in children:
            child.send("go")
        # Arrivals during the race: each outranks everything before it, so a claimant that planned
        # before an arrival and one that planned after it pick different runs; only the queue's
        # serialisation keeps them from exceeding the limit together.
        epoch = _now_ms()
        for priority in range(1, 21):
            arrivals.append(ScriptedRun(records.new_id(), queue=queue, epoch_ms=epoch, priority=priority))
            arrivals[-1].advance(mayfly_journal)
            time.sleep(0.002)
        held = [json.loads(child.readline()) for child in children]
        for child in children:
            child.send("release")
        for child in children:
            assert child.readline() == "released"
            child.finish()
    finally:
        for child in children:
            child.close()
    claimed = [run for got in held for run, _ in got]
    assert len(claimed) == 3 == len(set(claimed)), f"claims under concurrency 3: {held}"
    # Leave nothing that outranks other clauses' runs claimable: drive the arrivals to their end.
    control.queue_remove(queue)
    index = RUN_INDEX.of(mayfly_journal)
    assert index is not None
    by_id = {run.run_id: run for run in arrivals}
    for guard in index.claim("contract-cleanup", limit=100, ttl_ms=TTL_MS, now_ms=_now_ms(), queues=[queue]):
        with guard:
            run = by_id.get(guard.run_id)
            while run is not None and not run.done:
                run.advance(mayfly_journal, fence=guard.fencing_token)
    assert all(run.done for run in arrivals)
