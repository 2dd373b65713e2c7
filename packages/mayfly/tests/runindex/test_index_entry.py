"""The run index entry of a state: which status a run has and when it wakes (mayfly.runindex)."""

from __future__ import annotations

from conftest import node, workflow

from mayfly.model.commands import (
    AdvanceTime,
    AttemptStart,
    Command,
    CompleteAttempt,
    CreateRun,
    OpenSignalWait,
    Rejection,
    StartNodes,
)
from mayfly.model.ids import DeterministicIdSource
from mayfly.model.outcomes import RetryableFailure, Succeeded
from mayfly.model.signals import SignalToken
from mayfly.model.spec import FixedBackoff, RetryPolicy
from mayfly.model.state import RunState
from mayfly.reducer import reduce
from mayfly.reducer._draft import Draft
from mayfly.reducer.decide import decide_draft
from mayfly.runindex import IndexEntry, IndexStatus, index_entry, more_claimable

EPOCH = 1_700_000_000_000
IDS = DeterministicIdSource(14)
SPEC = workflow(
    node("a", retry=RetryPolicy(max_attempts=3, backoff=FixedBackoff(delay_ms=5_000))),
    node("b", "a"),
)


def apply(state: RunState | None, command: Command) -> RunState:
    """Decide and reduce ``command``; the entry read off its draft must be the reduced state's."""
    drafted = decide_draft(state, command)
    assert not isinstance(drafted, Rejection), drafted
    expected = index_entry(drafted) if isinstance(drafted, Draft) else None  # before the base moves
    events = drafted.events if isinstance(drafted, Draft) else drafted
    first = 1 if state is None else state.sequence + 1
    for offset, event in enumerate(events):
        state = reduce(state, event, first + offset)
    assert state is not None
    if expected is not None:
        assert index_entry(state) == expected
    return state


def created(queue: str = "default") -> RunState:
    return apply(None, CreateRun(run_id=IDS.new_id(), spec=SPEC, epoch_ms=EPOCH, queue=queue))


def test_a_new_run_is_new_from_its_epoch_on_its_queue() -> None:
    """A created, never-started run is new, runnable from its epoch, on the queue it was created on."""
    state = created("billing")
    assert index_entry(state) == IndexEntry(
        run_id=state.run_id,
        queue="billing",
        status=IndexStatus.NEW,
        ready_at_ms=EPOCH,
        sequence=state.sequence,
    )


def test_an_attempt_in_flight_is_running() -> None:
    """A started attempt without an outcome needs a driver: running, runnable since the recorded time."""
    state = apply(created(), AdvanceTime(250))
    state = apply(state, StartNodes((AttemptStart("a", IDS.new_id()),)))
    entry = index_entry(state)
    assert (entry.status, entry.ready_at_ms) == (IndexStatus.RUNNING, EPOCH + 250)


def test_a_pending_retry_waits_until_its_release_in_wall_time() -> None:
    """A run whose only work is a retry backoff waits until epoch + the recorded release deadline."""
    state = created()
    attempt = IDS.new_id()
    state = apply(state, StartNodes((AttemptStart("a", attempt),)))
    state = apply(state, AdvanceTime(1_000))
    state = apply(state, CompleteAttempt("a", attempt, RetryableFailure(reason="flaky")))
    entry = index_entry(state)
    assert (entry.status, entry.ready_at_ms) == (IndexStatus.WAITING, EPOCH + 6_000)


def test_a_signal_wait_waits_until_its_deadline_or_forever() -> None:
    """A run parked on a wait wakes at the wait's deadline; without one, only a wake ends the wait."""
    for timeout, expected in ((60_000, EPOCH + 60_000), (None, None)):
        state = created()
        attempt = IDS.new_id()
        state = apply(state, StartNodes((AttemptStart("a", attempt),)))
        digest = SignalToken("a-token-of-sixteen-chars").digest
        state = apply(
            state,
            OpenSignalWait(
                node_id="a", attempt_id=attempt, name="approval", token_sha256=digest, timeout_ms=timeout
            ),
        )
        entry = index_entry(state)
        assert (entry.status, entry.ready_at_ms) == (IndexStatus.WAITING, expected)


def test_a_finished_run_is_terminal() -> None:
    """Once the run has its result the entry is terminal and never wakes."""
    state = created()
    for node_id in ("a", "b"):
        attempt = IDS.new_id()
        state = apply(state, StartNodes((AttemptStart(node_id, attempt),)))
        state = apply(state, CompleteAttempt(node_id, attempt, Succeeded()))
    entry = index_entry(state)
    assert (entry.status, entry.ready_at_ms, entry.sequence) == (IndexStatus.TERMINAL, None, state.sequence)


def test_a_run_parked_on_its_children_waits_until_their_earliest_wake() -> None:
    """A driver detaching a run whose only work is parked children marks it waiting until they wake."""
    state = apply(created(), StartNodes((AttemptStart("a", IDS.new_id()),)))
    assert index_entry(state).status is IndexStatus.RUNNING
    entry = index_entry(state, parked=True, parked_until=EPOCH + 9)
    assert (entry.status, entry.ready_at_ms) == (IndexStatus.WAITING, EPOCH + 9)


def test_more_claimable_orders_runnable_before_waiting_and_earlier_before_later() -> None:
    """The pre-write rule of the file journal: runnable beats waiting, an earlier wake a later one."""

    def entry(status: IndexStatus, at: int | None) -> IndexEntry:
        return IndexEntry(run_id="r", status=status, ready_at_ms=at, sequence=1)

    running, waiting = entry(IndexStatus.RUNNING, 5), entry(IndexStatus.WAITING, 10)
    assert more_claimable(running, waiting) and not more_claimable(waiting, running)
    assert more_claimable(entry(IndexStatus.WAITING, 3), waiting)
    assert not more_claimable(waiting, waiting)  # equally claimable: nothing to write first
    assert not more_claimable(entry(IndexStatus.RUNNING, 9), running)  # a chain moving on
    assert not more_claimable(entry(IndexStatus.WAITING, None), waiting)
    assert more_claimable(waiting, entry(IndexStatus.WAITING, None))
    assert not more_claimable(entry(IndexStatus.TERMINAL, None), waiting)
    assert more_claimable(waiting, None)
