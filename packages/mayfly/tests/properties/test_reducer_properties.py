"""Properties of the pure reducer over random graphs, outcome scripts and interleavings."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mayfly.model.commands import (
    AdvanceTime,
    AttemptStart,
    CancelRun,
    Command,
    CompleteAttempt,
    Rejection,
    StartNodes,
)
from mayfly.model.outcomes import (
    Blocked,
    Cancelled,
    ChangesRequested,
    NodeOutcome,
    PermanentFailure,
    RetryableFailure,
    Skipped,
    Succeeded,
)
from mayfly.model.spec import DependencyPolicy, FixedBackoff, Node, RetryPolicy, WorkflowSpec
from mayfly.model.state import NodeStatus, RunState, RunStatus
from mayfly.reducer import decide
from mayfly.reducer._draft import Draft
from mayfly.reducer.decide import decide_draft
from mayfly.runindex import IndexEntry, index_entry
from mayfly.testing import ReducerHarness

POLICIES: tuple[DependencyPolicy, ...] = ("all_succeeded", "all_completed", "any_succeeded")
OUTCOMES: tuple[NodeOutcome, ...] = (
    Succeeded(),
    Succeeded(output={"n": 1}),
    PermanentFailure(reason="p"),
    RetryableFailure(reason="r"),
    Blocked(reason="b"),
    Cancelled(reason="c"),
    Skipped(reason="s"),
    ChangesRequested(reason="cr"),
)

settings.register_profile("mayfly", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("mayfly")


@st.composite
def graphs(draw: st.DrawFn, max_nodes: int = 10, retries: bool = False) -> WorkflowSpec:
    """A random DAG: each node depends on up to three earlier nodes, with a random policy."""
    count = draw(st.integers(1, max_nodes))
    nodes = []
    for i in range(count):
        deps = draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()
        retry = (
            RetryPolicy(max_attempts=draw(st.integers(1, 3)), backoff=FixedBackoff(draw(st.integers(0, 50))))
            if retries
            else RetryPolicy(max_attempts=1)
        )
        nodes.append(
            Node(
                f"n{i}",
                handler=f"h{i}@1",
                depends_on=tuple(f"n{d}" for d in sorted(deps)),
                policy=draw(st.sampled_from(POLICIES)),
                retry=retry,
            )
        )
    return WorkflowSpec(workflow_id="prop", version=1, nodes=tuple(nodes))


def oracle(spec: WorkflowSpec, outcome_of: dict[str, NodeOutcome]) -> tuple[dict[str, NodeStatus], RunStatus]:
    """Final node statuses and run result, computed directly from the ADR's rules (no retries)."""
    direct = {
        Succeeded: NodeStatus.SUCCEEDED,
        PermanentFailure: NodeStatus.FAILED,
        RetryableFailure: NodeStatus.FAILED,
        ChangesRequested: NodeStatus.FAILED,
        Blocked: NodeStatus.BLOCKED,
        Cancelled: NodeStatus.CANCELLED,
        Skipped: NodeStatus.SKIPPED,
    }
    final: dict[str, NodeStatus] = {}
    for node in spec.nodes:  # specification order is a topological order here
        prereqs = [final[d] for d in node.depends_on]
        ok = [s is NodeStatus.SUCCEEDED for s in prereqs]
        runs = (
            not prereqs
            or (node.policy == "all_succeeded" and all(ok))
            or node.policy == "all_completed"
            or (node.policy == "any_succeeded" and any(ok))
        )
        if runs:
            final[node.id] = direct[type(outcome_of[node.id])]
        elif NodeStatus.BLOCKED in prereqs:
            final[node.id] = NodeStatus.BLOCKED
        elif NodeStatus.CANCELLED in prereqs:
            final[node.id] = NodeStatus.CANCELLED
        else:
            final[node.id] = NodeStatus.SKIPPED
    values = set(final.values())
    if NodeStatus.FAILED in values:
        result = RunStatus.FAILED
    elif NodeStatus.BLOCKED in values:
        result = RunStatus.BLOCKED
    elif NodeStatus.CANCELLED in values:
        result = RunStatus.CANCELLED
    else:
        result = RunStatus.SUCCEEDED
    return final, result


def assert_no_node_ready_with_unmet_policy(state: RunState) -> None:
    """Check every Ready node's policy against its prerequisites' statuses by direct scan."""
    for node in state.nodes:
        if node.status is not NodeStatus.READY or not node.spec.depends_on:
            continue
        prereqs = [state.node_by_id(d).status for d in node.spec.depends_on]  # type: ignore[union-attr]
        if node.spec.policy == "all_succeeded":
            assert all(s is NodeStatus.SUCCEEDED for s in prereqs), node
        elif node.spec.policy == "all_completed":
            assert all(s.is_terminal for s in prereqs), node
        else:
            assert any(s is NodeStatus.SUCCEEDED for s in prereqs), node


def assert_replay_equals_live(run: ReducerHarness) -> None:
    assert run.replayed().to_record() == run.state.to_record()


@given(spec=graphs(), data=st.data())
def test_terminal_result_matches_the_oracle_for_any_interleaving(
    spec: WorkflowSpec, data: st.DataObject
) -> None:
    """Random DAGs and outcomes, started and completed in random order, end as the oracle says."""
    outcome_of = {n.id: data.draw(st.sampled_from(OUTCOMES), label=f"outcome {n.id}") for n in spec.nodes}
    run = ReducerHarness(spec)
    while not run.state.status.is_terminal:
        ready = run.state.ready_nodes()
        running = [n.node_id for n in run.state.nodes if n.status is NodeStatus.RUNNING]
        assert ready or running, "the run hangs"
        if ready and (not running or data.draw(st.booleans(), label="start?")):
            chosen = data.draw(st.lists(st.sampled_from(ready), min_size=1, unique=True), label="start")
            run.start(*chosen)
        else:
            node_id = data.draw(st.sampled_from(running), label="complete")
            run.complete(node_id, outcome_of[node_id])
        assert_no_node_ready_with_unmet_policy(run.state)
    final, result = oracle(spec, outcome_of)
    assert {n.node_id: n.status for n in run.state.nodes} == final
    assert run.state.status is result
    assert_replay_equals_live(run)


@given(spec=graphs(max_nodes=8, retries=True), data=st.data())
def test_replay_equals_live_and_decisions_are_deterministic(spec: WorkflowSpec, data: st.DataObject) -> None:
    """After every command, replaying history gives the live state, and decide is a pure function."""
    run = ReducerHarness(spec)
    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        if run.state.status.is_terminal:
            break
        ready = run.state.ready_nodes()
        running = [(n.node_id, n.attempt_id) for n in run.state.nodes if n.status is NodeStatus.RUNNING]
        choice = data.draw(st.sampled_from(["start", "complete", "advance", "cancel", "stale"]), label="op")
        command: object
        if choice == "start" and ready:
            chosen = data.draw(st.lists(st.sampled_from(ready), min_size=1, unique=True), label="start")
            run.start(*chosen)
            assert_replay_equals_live(run)
            continue
        if choice == "complete" and running:
            node_id, attempt_id = data.draw(st.sampled_from(running), label="which")
            command = CompleteAttempt(node_id, attempt_id or "", data.draw(st.sampled_from(OUTCOMES)))
        elif choice == "advance":
            command = AdvanceTime(run.state.now + data.draw(st.integers(0, 60), label="dt"))
        elif choice == "cancel" and data.draw(st.integers(0, 9), label="rarely") == 0:
            command = CancelRun("prop", "random cancellation")
        elif choice == "stale" and run.history:
            command = CompleteAttempt("n0", "00000000-0000-7000-8000-00000000ffff", Succeeded())
        else:
            continue
        again = decide(run.replayed(), command)  # type: ignore[arg-type]
        result = run.try_execute(command)  # type: ignore[arg-type]
        assert result == again
        if isinstance(result, Rejection):
            continue
        assert_replay_equals_live(run)
        assert_no_node_ready_with_unmet_policy(run.state)
    assert_replay_equals_live(run)
    assert run.state.open_nodes == sum(not n.status.is_terminal for n in run.state.nodes)


def drafted_entry(run: ReducerHarness, command: Command) -> IndexEntry | None:
    """The index entry read off the draft ``command`` is decided on (``None``: nothing to record)."""
    drafted = decide_draft(run.replayed(), command)
    return index_entry(drafted) if isinstance(drafted, Draft) else None


@given(spec=graphs(max_nodes=8, retries=True), data=st.data())
def test_the_entry_read_off_a_draft_is_the_entry_of_the_state_after_its_batch(
    spec: WorkflowSpec, data: st.DataObject
) -> None:
    """A journal may ask for a run's index entry before appending: the draft's view equals the reduced run."""
    run = ReducerHarness(spec)
    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        if run.state.status.is_terminal:
            break
        ready = run.state.ready_nodes()
        running = [(n.node_id, n.attempt_id) for n in run.state.nodes if n.status is NodeStatus.RUNNING]
        choice = data.draw(st.sampled_from(["start", "complete", "advance", "cancel"]), label="op")
        command: Command
        if choice == "start" and ready:
            chosen = data.draw(st.lists(st.sampled_from(ready), min_size=1, unique=True), label="start")
            command = StartNodes(tuple(AttemptStart(node_id, run.ids.new_id()) for node_id in chosen))
        elif choice == "complete" and running:
            node_id, attempt_id = data.draw(st.sampled_from(running), label="which")
            offered = tuple(run.ids.new_id() for _ in range(data.draw(st.integers(0, 3), label="offered")))
            command = CompleteAttempt(
                node_id, attempt_id or "", data.draw(st.sampled_from(OUTCOMES)), offered
            )
        elif choice == "advance":
            command = AdvanceTime(run.state.now + data.draw(st.integers(0, 60), label="dt"))
        elif choice == "cancel" and data.draw(st.integers(0, 9), label="rarely") == 0:
            command = CancelRun("prop", "random cancellation")
        else:
            continue
        expected = drafted_entry(run, command)
        if isinstance(run.try_execute(command), Rejection) or expected is None:
            continue
        assert index_entry(run.state) == expected
