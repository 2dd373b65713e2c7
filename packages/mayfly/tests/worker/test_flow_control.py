"""Queue flow control through a real worker, checked from the journal (the facts), not from the worker's log.

In one process on the in-memory backend (it declares ``queue_control``); the
same rules hold across processes on the stores whose contract clauses
certify ``queues.concurrency.processes``.
"""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any

import msgspec
import pytest

from mayfly import HandlerRegistry, HandlerRequest, Node, Succeeded, WorkflowSpec
from mayfly.errors import CompatibilityError, DuplicateRun, InvalidRecord
from mayfly.model.events import NodeOutcomeCommitted
from mayfly.queues import QUEUE_CONTROL, QueueSettings
from mayfly.reducer import decode_event
from mayfly.runindex import RUN_INDEX
from mayfly.runtime import WorkflowRuntime
from mayfly.substrate import sleep
from mayfly.testing import MemoryStore
from mayfly.worker import Worker

STEP_S = 0.05


def registry() -> HandlerRegistry:
    handlers = HandlerRegistry()

    @handlers.handler("nap", cooperative=True)
    def nap(request: HandlerRequest) -> Succeeded:
        started = time.time_ns() // 1_000_000
        sleep(STEP_S)
        return Succeeded(output={"node": request.node_id, "from": started, "to": time.time_ns() // 1_000_000})

    return handlers


SPEC = WorkflowSpec(
    workflow_id="flow.nap",
    version=1,
    nodes=(Node("a", handler="nap@1"), Node("b", handler="nap@1", depends_on=("a",))),
)


def serve(url: str, runs: list[str], runtime: WorkflowRuntime, **options: Any) -> None:
    """One worker until every run ended (or 30 s)."""
    deadline = time.monotonic() + 30
    worker = Worker(url, registry(), poll_interval_ms=20, log=lambda record: None, **options)
    worker.run(
        until=lambda: (
            time.monotonic() > deadline or all(runtime.handle(r).status() == "succeeded" for r in runs)
        )
    )
    assert all(runtime.handle(r).status() == "succeeded" for r in runs)


def spans(runtime: WorkflowRuntime, runs: list[str]) -> list[tuple[int, int]]:
    """Each run's time in its handlers, from its journal: the wall times its committed outputs recorded.

    A run's handlers run only under its lease, so runs whose spans overlap were
    leased (in progress) at the same time.
    """
    result = []
    for run in runs:
        history = [decode_event(r.event_type, r.schema_version, r.payload) for r in runtime.journal.read(run)]
        outputs = [e.outcome.output for e in history if isinstance(e, NodeOutcomeCommitted)]
        assert len(outputs) == len(SPEC.nodes), f"run {run}: one committed outcome per node"
        result.append((min(o["from"] for o in outputs), max(o["to"] for o in outputs)))  # type: ignore[index]
    return result


def most_at_once(intervals: list[tuple[int, int]]) -> int:
    """The largest number of intervals open at one instant (an end sorts before a start at the same ms)."""
    points = sorted(itertools.chain(((s, 1) for s, _ in intervals), ((e, -1) for _, e in intervals)))
    running = peak = 0
    for _, step in points:
        running += step
        peak = max(peak, running)
    return peak


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore(f"flow-{uuid.uuid4().hex[:8]}")


def test_a_queue_with_concurrency_two_never_has_three_runs_in_progress(store: MemoryStore) -> None:
    """Eight runs, a worker that could take all eight: the journal shows at most two in progress at once."""
    runtime = WorkflowRuntime(store.url, registry())
    QUEUE_CONTROL.of(runtime.journal).queue_set(QueueSettings(name="narrow", concurrency=2))  # type: ignore[union-attr]
    runs = [runtime.start(SPEC, queue="narrow").run_id for _ in range(8)]
    serve(store.url, runs, runtime, concurrency=8)
    intervals = spans(runtime, runs)
    assert most_at_once(intervals) == 2, intervals


def test_a_worker_concurrency_caps_one_worker(store: MemoryStore) -> None:
    """worker_concurrency 1: the one worker drives the queue's runs one at a time (other queues are not held)."""
    runtime = WorkflowRuntime(store.url, registry())
    QUEUE_CONTROL.of(runtime.journal).queue_set(QueueSettings(name="solo", worker_concurrency=1))  # type: ignore[union-attr]
    runs = [runtime.start(SPEC, queue="solo").run_id for _ in range(4)]
    free = [runtime.start(SPEC, queue="free").run_id for _ in range(4)]
    serve(store.url, runs + free, runtime, concurrency=8)
    assert most_at_once(spans(runtime, runs)) == 1
    assert most_at_once(spans(runtime, free)) > 1


def test_higher_priorities_are_claimed_first_on_a_priority_queue(store: MemoryStore) -> None:
    """Submitted low first, driven high first, one at a time; FIFO queues refuse a priority."""
    runtime = WorkflowRuntime(store.url, registry())
    control = QUEUE_CONTROL.of(runtime.journal)
    assert control is not None
    control.queue_set(QueueSettings(name="ranked", priority=True, concurrency=1))
    low = [runtime.start(SPEC, queue="ranked", priority=1).run_id for _ in range(2)]
    high = [runtime.start(SPEC, queue="ranked", priority=5).run_id for _ in range(2)]
    with pytest.raises(InvalidRecord, match="does not enable priorities"):
        runtime.start(SPEC, queue="fifo", priority=3)
    serve(store.url, low + high, runtime, concurrency=4)
    order = sorted(low + high, key=lambda run: spans(runtime, [run])[0][0])
    assert set(order[:2]) == set(high)
    assert set(order[2:]) == set(low)


def test_the_rate_limit_spaces_starts_by_its_window(store: MemoryStore) -> None:
    """Rate 2 per 400 ms over 6 runs: the recorded starts never put 3 in one window."""
    runtime = WorkflowRuntime(store.url, registry())
    control = QUEUE_CONTROL.of(runtime.journal)
    assert control is not None
    control.queue_set(QueueSettings(name="paced", rate_limit=2, rate_period_ms=400))
    runs = [runtime.start(SPEC, queue="paced").run_id for _ in range(6)]
    serve(store.url, runs, runtime, concurrency=6)
    index = RUN_INDEX.of(runtime.journal)
    assert index is not None
    starts = sorted(index.index_get(run).started_ms for run in runs)  # type: ignore[union-attr,type-var]
    assert all(later - earlier >= 400 for earlier, later in zip(starts, starts[2:], strict=False)), starts
    # Each run's first attempt came after its recorded start: the journal agrees with the index.
    for run, (first_attempt, _) in zip(runs, spans(runtime, runs), strict=True):
        entry = index.index_get(run)
        assert entry is not None and entry.started_ms is not None and entry.started_ms <= first_attempt + 1


def test_a_dedup_id_allows_one_live_run(store: MemoryStore) -> None:
    """A second submission with a live run's dedup id is refused, names the live run, and creates nothing."""
    runtime = WorkflowRuntime(store.url, registry())
    first = runtime.start(SPEC, queue="orders", dedup_id="order-17")
    with pytest.raises(DuplicateRun) as refused:
        runtime.start(SPEC, queue="orders", dedup_id="order-17")
    assert refused.value.live_run_id == first.run_id
    assert f"run {first.run_id}" in str(refused.value)
    serve(store.url, [first.run_id], runtime)
    again = runtime.start(SPEC, queue="orders", dedup_id="order-17")  # the first ended: the id is free
    assert again.run_id != first.run_id


def test_a_journal_without_queue_control_refuses_priorities_and_dedup_ids(store: MemoryStore) -> None:
    """A store that could not honour them says so, rather than storing and ignoring them."""
    journal = store.journal()
    journal._capabilities = msgspec.structs.replace(
        journal.capabilities, queue_control=False
    )  # as if undeclared
    assert QUEUE_CONTROL.of(journal) is None
    runtime = WorkflowRuntime(journal, registry(), leases=store.leases())
    with pytest.raises(CompatibilityError, match="does not declare queue_control"):
        runtime.start(SPEC, dedup_id="x-1")
    with pytest.raises(CompatibilityError, match="does not declare queue_control"):
        runtime.start(SPEC, priority=2)
    assert runtime.journal.list_runs() == []
