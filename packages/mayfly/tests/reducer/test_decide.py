"""decide: commands answered with events or typed rejections; committed-once outcomes."""

from __future__ import annotations

import pytest
from conftest import node, workflow

from mayfly.model.commands import (
    AdvanceTime,
    AttemptStart,
    CancelRun,
    CompleteAttempt,
    CreateRun,
    Rejection,
    RejectionCode,
    StartNodes,
)
from mayfly.model.errors import CommandRejected
from mayfly.model.events import NodeReady, NodeStarted, RunCreated
from mayfly.model.outcomes import Cancelled, PermanentFailure, Succeeded
from mayfly.model.state import NodeStatus
from mayfly.reducer import decide, reduce
from mayfly.testing import ReducerHarness

RUN = "00000000-0000-7000-8000-0000000000aa"


def code(result: object) -> RejectionCode:
    assert isinstance(result, Rejection), result
    return result.code


def test_create_run_pins_spec_hash_and_readies_initial_nodes() -> None:
    """RunCreated pins the spec and its content hash; each initial node becomes Ready."""
    spec = workflow(node("a"), node("b"), node("c", "a", "b"))
    events = decide(None, CreateRun(run_id=RUN, spec=spec, input={"ticket": 42}))
    assert events == [
        RunCreated(run_id=RUN, spec=spec, spec_hash=spec.content_hash(), input={"ticket": 42}),
        NodeReady(node_id="a", cause="initial"),
        NodeReady(node_id="b", cause="initial"),
    ]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (CreateRun(run_id="nope", spec=workflow(node("a"))), RejectionCode.INVALID_INPUT),
        (CreateRun(run_id=RUN, spec=workflow(node("a", "zz"))), RejectionCode.INVALID_SPEC),
        (CreateRun(run_id=RUN, spec=workflow(node("a")), input="x" * 70_000), RejectionCode.INVALID_INPUT),
        (CreateRun(run_id=RUN, spec=workflow(node("a")), epoch_ms=-1), RejectionCode.INVALID_INPUT),
        (StartNodes(()), RejectionCode.RUN_NOT_FOUND),
        (AdvanceTime(5), RejectionCode.RUN_NOT_FOUND),
    ],
)
def test_rejections_before_the_run_exists(command: CreateRun, expected: RejectionCode) -> None:
    """Bad creation input and commands for a missing run are typed rejections."""
    assert code(decide(None, command)) is expected


def test_create_run_records_the_epoch_it_is_given_and_the_state_keeps_it() -> None:
    """The runtime's wall-clock epoch goes into RunCreated as given; decide itself reads no clock."""
    spec = workflow(node("a"))
    created = decide(None, CreateRun(run_id=RUN, spec=spec, epoch_ms=1_767_225_600_000))
    assert isinstance(created, list) and isinstance(created[0], RunCreated)
    assert created[0].epoch_ms == 1_767_225_600_000
    state = reduce(None, created[0], 1)
    assert state.epoch_ms == 1_767_225_600_000 and state.to_record().epoch_ms == 1_767_225_600_000
    assert ReducerHarness(spec).state.epoch_ms is None  # created without one: counts only driven time


def test_create_run_twice_is_rejected() -> None:
    """A second CreateRun for an existing run is rejected; nothing is written."""
    run = ReducerHarness(workflow(node("a")))
    before = len(run.history)
    assert (
        code(run.try_execute(CreateRun(run_id=run.run_id, spec=workflow(node("a")))))
        is RejectionCode.RUN_EXISTS
    )
    assert len(run.history) == before


def test_all_ready_attempts_are_started_in_one_batch() -> None:
    """Independent ready nodes are durably started together, each with its own attempt id."""
    run = ReducerHarness(workflow(node("a"), node("b")))
    attempts = run.start("a", "b")
    assert run.history[-2:] == [
        NodeStarted(node_id="a", attempt_id=attempts["a"], attempt=1, at=0),
        NodeStarted(node_id="b", attempt_id=attempts["b"], attempt=1, at=0),
    ]


@pytest.mark.parametrize(
    ("starts", "expected"),
    [
        ((("zz", "00000000-0000-7000-8000-0000000000f1"),), RejectionCode.UNKNOWN_NODE),
        ((("b", "00000000-0000-7000-8000-0000000000f1"),), RejectionCode.NODE_NOT_READY),
        ((("a", "not-a-uuid"),), RejectionCode.INVALID_INPUT),
        (
            (("a", "00000000-0000-7000-8000-0000000000f1"), ("a", "00000000-0000-7000-8000-0000000000f2")),
            RejectionCode.DUPLICATE_START,
        ),
    ],
)
def test_invalid_starts_reject_the_whole_batch(
    starts: tuple[tuple[str, str], ...], expected: RejectionCode
) -> None:
    """A batch with any invalid start is rejected whole and changes nothing."""
    run = ReducerHarness(workflow(node("a"), node("b", "a")))
    before = run.state.to_record()
    command = StartNodes(tuple(AttemptStart(n, a) for n, a in starts))
    assert code(run.try_execute(command)) is expected
    assert run.state.to_record() == before


def test_an_attempt_identity_is_consumed_only_once() -> None:
    """An attempt id used once in a run can never start another attempt."""
    run = ReducerHarness(workflow(node("a"), node("b", "a")))
    used = run.start("a")["a"]
    run.complete("a", Succeeded())
    assert code(run.try_execute(StartNodes((AttemptStart("b", used),)))) is RejectionCode.ATTEMPT_ID_USED


def test_exact_redelivery_of_a_committed_outcome_is_idempotent() -> None:
    """Repeating the committed outcome is acknowledged with no new events."""
    run = ReducerHarness(workflow(node("a"), node("b")))
    attempt = run.start("a", "b")["a"]
    run.complete("a", Succeeded(output={"k": 1}))
    before = len(run.history)
    assert run.execute(CompleteAttempt("a", attempt, Succeeded(output={"k": 1}))) == []
    assert len(run.history) == before


def test_a_conflicting_second_outcome_is_rejected_as_corruption() -> None:
    """A different outcome for an attempt with a committed outcome is rejected."""
    run = ReducerHarness(workflow(node("a"), node("b")))
    attempt = run.start("a", "b")["a"]
    run.complete("a", Succeeded(output={"k": 1}))
    result = run.try_execute(CompleteAttempt("a", attempt, Succeeded(output={"k": 2})))
    assert code(result) is RejectionCode.CONFLICTING_OUTCOME
    assert "corruption" in str(result)


def test_a_result_for_an_unknown_or_foreign_attempt_is_rejected() -> None:
    """Results are accepted only for the exact attempt of the exact node."""
    run = ReducerHarness(workflow(node("a"), node("b")))
    attempts = run.start("a", "b")
    stranger = "00000000-0000-7000-8000-00000000dead"
    assert (
        code(run.try_execute(CompleteAttempt("a", stranger, Succeeded()))) is RejectionCode.ATTEMPT_NOT_ACTIVE
    )
    assert (
        code(run.try_execute(CompleteAttempt("a", attempts["b"], Succeeded())))
        is RejectionCode.ATTEMPT_NOT_ACTIVE
    )


def test_a_late_result_for_a_cancelled_attempt_is_rejected() -> None:
    """After cancellation closed an attempt, the handler's late success is rejected, not committed."""
    run = ReducerHarness(workflow(node("a")))
    attempt = run.start("a")["a"]
    run.cancel("operator asked")
    result = run.try_execute(CompleteAttempt("a", attempt, Succeeded()))
    assert code(result) is RejectionCode.ATTEMPT_NOT_ACTIVE
    assert run.state.node_by_id("a").last_outcome == Cancelled(reason="run cancelled")  # type: ignore[union-attr]


def test_a_successful_attempt_is_never_dispatched_again() -> None:
    """Once a node succeeded it is not Ready, so StartNodes for it is rejected."""
    run = ReducerHarness(workflow(node("a"), node("b")))
    run.start("a", "b")
    run.complete("a", Succeeded())
    result = run.try_execute(StartNodes((AttemptStart("a", run.ids.new_id()),)))
    assert code(result) is RejectionCode.NODE_NOT_READY


@pytest.mark.parametrize(
    "command",
    [
        StartNodes(()),
        AdvanceTime(10),
        CancelRun("ops", "again"),
        CompleteAttempt("a", "00000000-0000-7000-8000-00000000beef", Succeeded()),
    ],
)
def test_a_terminal_run_rejects_every_mutating_command(command: object) -> None:
    """After RunCompleted every mutating command is rejected and nothing is appended."""
    run = ReducerHarness(workflow(node("a")))
    run.start("a")
    run.complete("a", PermanentFailure(reason="x"))
    before = len(run.history)
    result = run.try_execute(command)  # type: ignore[arg-type]
    assert isinstance(result, Rejection)
    assert result.code in (RejectionCode.RUN_TERMINAL, RejectionCode.ATTEMPT_NOT_ACTIVE)
    assert len(run.history) == before


def test_decide_never_mutates_the_state() -> None:
    """Deciding (even a large cascade) leaves the given state untouched until reduced."""
    run = ReducerHarness(workflow(node("a"), *(node(f"d{i}", "a") for i in range(50))))
    attempt = run.start("a")["a"]
    before = run.state.to_record()
    events = decide(run.state, CompleteAttempt("a", attempt, Succeeded()))
    assert isinstance(events, list) and len(events) == 51
    assert run.state.to_record() == before


def test_harness_raises_typed_error_on_rejection() -> None:
    """A rejected command raised through the harness carries the typed rejection."""
    run = ReducerHarness(workflow(node("a")))
    with pytest.raises(CommandRejected) as info:
        run.execute(AdvanceTime(-1))
    assert isinstance(info.value.rejection, Rejection)
    assert info.value.rejection.code is RejectionCode.TIME_WENT_BACKWARDS


def test_handler_returned_cancelled_is_a_node_outcome_not_a_run_cancellation() -> None:
    """A handler returning Cancelled cancels its node only; the run goes on and ends cancelled."""
    run = ReducerHarness(workflow(node("a"), node("b")))
    run.start("a", "b")
    run.complete("a", Cancelled(reason="saw the cancellation handle"))
    assert run.state.cancellation is None
    assert run.state.node_by_id("b").status is NodeStatus.RUNNING  # type: ignore[union-attr]


def test_non_finite_run_input_is_rejected() -> None:
    """A run input holding NaN is a typed rejection; nothing is created."""
    result = decide(None, CreateRun(run_id=RUN, spec=workflow(node("a")), input={"x": float("nan")}))
    assert code(result) is RejectionCode.INVALID_INPUT
    assert "non-finite" in str(result)
