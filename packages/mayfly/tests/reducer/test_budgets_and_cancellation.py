"""Run and node budgets, and structured cancellation (ADR-0032 Story 1.5 and "Structured cancellation")."""

from __future__ import annotations

from conftest import node, workflow

from mayfly.model.commands import CancelRun, RejectionCode
from mayfly.model.events import (
    BudgetExhausted,
    BudgetKind,
    CancellationRequested,
    CancellationTarget,
    FailureCause,
    LastOutcome,
    NodeFailed,
    NodeOutcomeCommitted,
    RunCompleted,
)
from mayfly.model.outcomes import Cancelled, NodeOutcomeKind, RetryableFailure, Succeeded
from mayfly.model.spec import FixedBackoff, ImmediateBackoff, RetryPolicy, RunBudgets
from mayfly.model.state import NodeStatus, RunStatus
from mayfly.testing import ReducerHarness

IMMEDIATE = RetryPolicy(max_attempts=100, backoff=ImmediateBackoff())


def test_initial_readiness_consumes_transitions() -> None:
    """Every Pending -> Ready counts, including the initial set."""
    run = ReducerHarness(workflow(node("a"), node("b"), node("c", "a", "b")))
    assert run.state.transitions_used == 2


def test_transition_exhaustion_fails_the_run_with_the_adr_facts() -> None:
    """Over the transition limit: cancel open nodes, record the exhaustion (limit + 1), fail the run."""
    spec = workflow(node("a"), node("b", "a"), budgets=RunBudgets(max_transitions=1))
    run = ReducerHarness(spec)
    attempt = run.start("a")["a"]
    events = run.complete("a", Succeeded())
    assert events == [
        NodeOutcomeCommitted(node_id="a", outcome=Succeeded(), attempt_id=attempt, at=0),
        NodeOutcomeCommitted(
            node_id="b", outcome=Cancelled(reason="run budget exhausted (run_transitions)"), at=0
        ),
        BudgetExhausted(
            kind=BudgetKind.RUN_TRANSITIONS,
            limit=1,
            observed=2,
            last_outcome=LastOutcome("a", NodeOutcomeKind.SUCCEEDED, attempt),
        ),
        RunCompleted(result="failed", at=0),
    ]
    assert run.state.status is RunStatus.FAILED
    assert run.try_execute(CancelRun("ops", "x")).code is RejectionCode.RUN_TERMINAL  # type: ignore[union-attr]


def test_run_attempt_exhaustion_cancels_active_attempts() -> None:
    """Exceeding the run's attempt budget cancels the running attempts and fails the run."""
    spec = workflow(node("a"), node("b"), node("c"), budgets=RunBudgets(max_attempts=2))
    run = ReducerHarness(spec)
    attempts = run.start("a", "b", "c")
    assert run.types()[-7:] == [
        "NodeStarted",
        "NodeStarted",
        "NodeOutcomeCommitted",
        "NodeOutcomeCommitted",
        "NodeOutcomeCommitted",
        "BudgetExhausted",
        "RunCompleted",
    ]
    exhausted = [e for e in run.history if isinstance(e, BudgetExhausted)]
    assert exhausted == [BudgetExhausted(kind=BudgetKind.RUN_ATTEMPTS, limit=2, observed=3)]
    cancelled = {e.node_id: e.attempt_id for e in run.history if isinstance(e, NodeOutcomeCommitted)}
    assert cancelled == {"a": attempts["a"], "b": attempts["b"], "c": None}
    assert run.state.status is RunStatus.FAILED
    assert all(n.status is NodeStatus.CANCELLED for n in run.state.nodes)


def test_a_retry_loop_that_never_converges_ends_in_a_recorded_exhaustion() -> None:
    """A node that always fails retryably under a generous policy stops at the run's attempt budget."""
    spec = workflow(node("a", retry=IMMEDIATE), budgets=RunBudgets(max_attempts=5))
    run = ReducerHarness(spec)
    for _ in range(5):
        run.start("a")
        run.complete("a", RetryableFailure(reason="never"))
    run.start("a")
    assert run.state.status is RunStatus.FAILED
    (fact,) = [e for e in run.history if isinstance(e, BudgetExhausted)]
    assert (fact.kind, fact.limit, fact.observed) == (BudgetKind.RUN_ATTEMPTS, 5, 6)
    assert fact.last_outcome is not None and fact.last_outcome.kind is NodeOutcomeKind.RETRYABLE_FAILURE


def test_node_attempt_budget_fails_only_that_node() -> None:
    """A node's own attempt budget fails the node (not the run) and records the exhaustion."""
    spec = workflow(node("a", retry=IMMEDIATE, max_attempts=2), node("b"))
    run = ReducerHarness(spec)
    run.start("a", "b")
    run.complete("a", RetryableFailure(reason="1"))
    run.start("a")
    events = run.complete("a", RetryableFailure(reason="2"))
    assert events[1:] == [
        BudgetExhausted(
            kind=BudgetKind.NODE_ATTEMPTS,
            limit=2,
            observed=3,
            node_id="a",
            last_outcome=events[1].last_outcome,  # type: ignore[union-attr]
        ),
        NodeFailed(
            node_id="a", cause=FailureCause.NODE_BUDGET_EXHAUSTED, detail="node attempt budget of 2 exhausted"
        ),
    ]
    assert run.state.status is RunStatus.RUNNING
    run.complete("b", Succeeded())
    assert run.state.status is RunStatus.FAILED


def test_elapsed_budget_is_reached_at_the_limit() -> None:
    """The elapsed budget is exhausted when virtual time reaches it (now >= limit)."""
    spec = workflow(node("a"), budgets=RunBudgets(max_elapsed_ms=1000))
    run = ReducerHarness(spec)
    run.start("a")
    run.advance(999)
    assert run.state.status is RunStatus.RUNNING
    run.advance(1000)
    (fact,) = [e for e in run.history if isinstance(e, BudgetExhausted)]
    assert (fact.kind, fact.limit, fact.observed) == (BudgetKind.RUN_ELAPSED, 1000, 1000)
    assert run.state.status is RunStatus.FAILED


def test_cancellation_records_everything_in_one_atomic_decision() -> None:
    """Cancel with running, retry-pending, ready and pending nodes: request, outcomes, RunCancelled."""
    spec = workflow(
        node("run1"),
        node("retry1", retry=RetryPolicy(backoff=FixedBackoff(delay_ms=1000))),
        node("ready1"),
        node("pending1", "run1"),
        node("done1"),
    )
    run = ReducerHarness(spec)
    attempts = run.start("run1", "retry1", "done1")
    run.complete("retry1", RetryableFailure(reason="later"))
    run.complete("done1", Succeeded())
    run.advance(10)
    events = run.cancel(reason="operator stop", requester="alice")
    assert events[0] == CancellationRequested(
        requester="alice",
        reason="operator stop",
        at=10,
        targets=(CancellationTarget("run1", attempts["run1"]),),
    )
    cancelled = Cancelled(reason="run cancelled")
    assert events[1:] == [
        NodeOutcomeCommitted(node_id="run1", outcome=cancelled, attempt_id=attempts["run1"], at=10),
        NodeOutcomeCommitted(node_id="retry1", outcome=cancelled, at=10),
        NodeOutcomeCommitted(node_id="ready1", outcome=cancelled, at=10),
        NodeOutcomeCommitted(node_id="pending1", outcome=cancelled, at=10),
        RunCompleted(result="cancelled", at=10),
    ]
    assert run.state.status is RunStatus.CANCELLED
    assert list(run.state.pending_retries()) == []
    assert list(run.state.active_attempts()) == []
    assert run.state.node_by_id("done1").status is NodeStatus.SUCCEEDED  # type: ignore[union-attr]


def test_cancellation_never_authorizes_success() -> None:
    """Even when every other node succeeded, a cancelled run's result is cancelled."""
    run = ReducerHarness(workflow(node("a"), node("b")))
    run.start("a", "b")
    run.complete("a", Succeeded())
    run.cancel()
    assert run.state.status is RunStatus.CANCELLED


def test_cancellation_reason_is_bounded() -> None:
    """An over-long reason is a typed rejection and nothing is recorded."""
    run = ReducerHarness(workflow(node("a")))
    result = run.try_execute(CancelRun("ops", "x" * 5000))
    assert result.code is RejectionCode.INVALID_INPUT  # type: ignore[union-attr]
    assert run.state.status is RunStatus.RUNNING
