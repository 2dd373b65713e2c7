"""Release and propagation rules, line by line from ADR-0032 "Typed outcomes and dependency policies"."""

from __future__ import annotations

import pytest
from conftest import node, workflow

from mayfly.model.outcomes import (
    Blocked,
    Cancelled,
    NodeOutcome,
    PermanentFailure,
    RetryableFailure,
    Skipped,
    Succeeded,
)
from mayfly.model.spec import DependencyPolicy, RetryPolicy
from mayfly.model.state import NodeStatus, RunStatus
from mayfly.testing import ReducerHarness

OK = Succeeded()
FAIL = PermanentFailure(reason="broken")
BLOCK = Blocked(reason="no credentials")
CANCEL = Cancelled(reason="handler observed cancellation")
SKIP = Skipped(reason="nothing to do")
P, R, C, B, S, X = (
    NodeStatus.PENDING,
    NodeStatus.READY,
    NodeStatus.CANCELLED,
    NodeStatus.BLOCKED,
    NodeStatus.SKIPPED,
    NodeStatus.FAILED,
)


def two_prereqs(policy: DependencyPolicy) -> ReducerHarness:
    run = ReducerHarness(workflow(node("p1"), node("p2"), node("d", "p1", "p2", policy=policy)))
    run.start("p1", "p2")
    return run


# (policy, outcome of p1, outcome of p2, d after p1 completes, d after p2 completes)
TABLE: list[tuple[DependencyPolicy, NodeOutcome, NodeOutcome, NodeStatus, NodeStatus]] = [
    # "all_succeeded releases a node only after every direct prerequisite succeeds."
    ("all_succeeded", OK, OK, P, R),
    # "Once every prerequisite is terminal and that condition is impossible, a cancelled
    # prerequisite propagates cancellation, a blocked prerequisite propagates blocking,
    # and other non-success combinations skip the dependent." — never before all are terminal.
    ("all_succeeded", FAIL, OK, P, S),
    ("all_succeeded", OK, FAIL, P, S),
    ("all_succeeded", CANCEL, OK, P, C),
    ("all_succeeded", BLOCK, OK, P, B),
    ("all_succeeded", SKIP, OK, P, S),
    ("all_succeeded", SKIP, SKIP, P, S),
    # Propagation precedence (ARCHITECTURE section 11): blocked > cancelled > skipped.
    ("all_succeeded", CANCEL, BLOCK, P, B),
    ("all_succeeded", BLOCK, CANCEL, P, B),
    ("all_succeeded", CANCEL, FAIL, P, C),
    # "all_completed releases after every direct prerequisite has any terminal outcome."
    ("all_completed", OK, OK, P, R),
    ("all_completed", FAIL, BLOCK, P, R),
    ("all_completed", CANCEL, SKIP, P, R),
    # "any_succeeded releases immediately after its first successful prerequisite"
    ("any_succeeded", OK, FAIL, R, R),
    ("any_succeeded", FAIL, OK, P, R),
    # "if every prerequisite finishes without success, the same cancel/block/skip propagation applies."
    ("any_succeeded", FAIL, FAIL, P, S),
    ("any_succeeded", FAIL, CANCEL, P, C),
    ("any_succeeded", BLOCK, CANCEL, P, B),
]


@pytest.mark.parametrize(("policy", "first", "second", "after_first", "after_second"), TABLE)
def test_dependency_policy_table(
    policy: DependencyPolicy,
    first: NodeOutcome,
    second: NodeOutcome,
    after_first: NodeStatus,
    after_second: NodeStatus,
) -> None:
    """The dependent's status after each prerequisite outcome follows the ADR sentence."""
    run = two_prereqs(policy)
    run.complete("p1", first)
    d = run.state.node_by_id("d")
    assert d is not None and d.status is after_first
    run.complete("p2", second)
    d = run.state.node_by_id("d")
    assert d is not None and d.status is after_second
    assert run.replayed().to_record() == run.state.to_record()


def test_retryable_failure_that_exhausts_retries_counts_as_non_success() -> None:
    """A prerequisite failed by an explicit termination fact skips its all_succeeded dependent."""
    run = ReducerHarness(workflow(node("p", retry=RetryPolicy(max_attempts=1)), node("d", "p")))
    run.start("p")
    run.complete("p", RetryableFailure(reason="flaky"))
    assert run.types()[-4:] == ["NodeOutcomeCommitted", "NodeFailed", "NodeOutcomeCommitted", "RunCompleted"]
    assert run.state.node_by_id("d").status is NodeStatus.SKIPPED  # type: ignore[union-attr]
    assert run.state.status is RunStatus.FAILED


def test_merely_reaching_a_terminal_state_does_not_imply_success() -> None:
    """A failed prerequisite never releases an all_succeeded dependent."""
    run = ReducerHarness(workflow(node("p"), node("d", "p")))
    run.start("p")
    run.complete("p", FAIL)
    assert run.state.node_by_id("d").status is NodeStatus.SKIPPED  # type: ignore[union-attr]
    assert run.state.ready_nodes() == []


def test_propagation_cascades_down_a_long_chain() -> None:
    """A failure at the head of a 5,000-node chain skips every later node, without recursion limits."""
    nodes = [node("n0")] + [node(f"n{i}", f"n{i - 1}") for i in range(1, 5000)]
    run = ReducerHarness(workflow(*nodes))
    run.start("n0")
    run.complete("n0", FAIL)
    assert run.state.status is RunStatus.FAILED
    assert all(n.status is NodeStatus.SKIPPED for n in run.state.nodes[1:])


def test_independent_branches_continue_after_another_fails() -> None:
    """Branch b keeps running and can succeed after branch a failed; the run waits for it."""
    run = ReducerHarness(workflow(node("a"), node("b"), node("a2", "a"), node("b2", "b")))
    run.start("a", "b")
    run.complete("a", FAIL)
    assert run.state.status is RunStatus.RUNNING
    run.complete("b", OK)
    assert run.state.ready_nodes() == ["b2"]
    run.start("b2")
    run.complete("b2", OK)
    assert run.state.node_by_id("b2").status is NodeStatus.SUCCEEDED  # type: ignore[union-attr]
    assert run.state.status is RunStatus.FAILED


# (outcomes of three independent nodes, run result)
RESULTS = [
    ((OK, OK, OK), RunStatus.SUCCEEDED),
    ((OK, SKIP, OK), RunStatus.SUCCEEDED),  # "only success and explicit skip outcomes succeeds"
    ((FAIL, BLOCK, CANCEL), RunStatus.FAILED),  # permanent failure takes precedence over blocked
    ((BLOCK, CANCEL, OK), RunStatus.BLOCKED),  # blocked takes precedence over cancelled
    ((CANCEL, OK, SKIP), RunStatus.CANCELLED),
    ((SKIP, SKIP, SKIP), RunStatus.SUCCEEDED),
]


@pytest.mark.parametrize(("outcomes", "result"), RESULTS)
def test_run_result_precedence(outcomes: tuple[NodeOutcome, ...], result: RunStatus) -> None:
    """The terminal result is derived only when every node is terminal, by precedence."""
    run = ReducerHarness(workflow(node("a"), node("b"), node("c")))
    run.start("a", "b", "c")
    for node_id, outcome in zip("ab", outcomes[:2], strict=True):
        run.complete(node_id, outcome)
        assert run.state.status is RunStatus.RUNNING
    run.complete("c", outcomes[2])
    assert run.state.status is result
    assert run.types()[-1] == "RunCompleted"
