"""The fast rules of the replay loop against the general rules they shortcut (differential)."""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mayfly.model.commands import (
    AdvanceTime,
    AttemptStart,
    CancelRun,
    Command,
    CompleteAttempt,
    CompleteChild,
    StartNodes,
)
from mayfly.model.errors import CorruptionError
from mayfly.model.events import (
    Event,
    NodeOutcomeCommitted,
    NodeReady,
    NodeStarted,
    RunCompleted,
    RunCreated,
    RunResult,
)
from mayfly.model.outcomes import (
    Blocked,
    Cancelled,
    ChangesRequested,
    NodeOutcome,
    NodeOutcomeKind,
    PermanentFailure,
    RetryableFailure,
    Skipped,
    Succeeded,
)
from mayfly.model.spec import (
    ChildCall,
    ChildDefinition,
    Edge,
    EdgePredicate,
    FixedBackoff,
    Node,
    OnAnyOutcome,
    OnOutcome,
    RetryPolicy,
    RunBudgets,
    WorkflowSpec,
)
from mayfly.model.state import NodeDetail, RunState
from mayfly.reducer import encode_event, reduce, reduce_encoded, validate
from mayfly.reducer._apply import apply_event
from mayfly.testing import ReducerHarness

HOT = (NodeReady, NodeStarted, NodeOutcomeCommitted)
RESULTS: tuple[RunResult, ...] = ("succeeded", "failed", "cancelled")
WHENS: tuple[EdgePredicate, ...] = (OnAnyOutcome(), OnOutcome(NodeOutcomeKind.CHANGES_REQUESTED))
LEAF = ChildDefinition("leaf", 1, (Node("w", handler="w@1"),))

settings.register_profile("mayfly", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("mayfly")

OUTCOMES: tuple[NodeOutcome, ...] = (
    Succeeded(),
    Succeeded(output={"v": 1}),
    PermanentFailure(reason="p"),
    RetryableFailure(reason="r"),
    Blocked(reason="b"),
    Cancelled(reason="c"),
    Skipped(reason="s"),
    ChangesRequested(reason="cr"),
)


def dump(state: RunState) -> dict[str, Any]:
    """Everything a state holds, its indexes and counters included (``to_record`` leaves those out)."""

    def plain(value: Any) -> Any:
        # Index order matters (active attempts are kept in start order), so compare items in order.
        return list(value.items()) if isinstance(value, dict) else value

    nodes = []
    for node in state.nodes:
        fields = {name: getattr(node, name) for name in node.__slots__ if name != "detail"}
        fields.update({name: getattr(node, name) for name in NodeDetail.__slots__})
        nodes.append(fields)
    run = {name: plain(getattr(state, name)) for name in state.__slots__ if name != "nodes"}
    return {"run": run, "nodes": nodes}


def out_of_order(sequence: int, after: int) -> CorruptionError:
    return CorruptionError(f"record {sequence} after {after}")


class Record(NamedTuple):
    sequence: int
    event_type: str
    schema_version: int
    payload: bytes


def fast(state: RunState | None, event: Event, sequence: int) -> RunState:
    """The replay loop, which takes the fast rules, on the one record of ``event``."""
    encoded = encode_event(event)
    record = Record(sequence, encoded.event_type, encoded.schema_version, encoded.payload)
    reduced = reduce_encoded(state, [record], out_of_order=out_of_order)
    assert reduced is not None
    return reduced


def apply_both(history: list[Event]) -> tuple[list[Any], list[Any]]:
    """Each step's state (or its CorruptionError's text) through the fast rules and the general ones."""
    steps: tuple[list[Any], list[Any]] = ([], [])
    for rules, out in zip((fast, reduce), steps, strict=True):
        state: RunState | None = None
        for sequence, event in enumerate(history, 1):
            try:
                state = rules(state, event, sequence)
            except CorruptionError as exc:
                out.append(str(exc))
                break
            out.append(dump(state))
    return steps


@st.composite
def specs(draw: st.DrawFn) -> WorkflowSpec:
    """A small DAG with retries, tight budgets and, sometimes, conditional edges."""
    count = draw(st.integers(1, 6))
    nodes = []
    for i in range(count):
        deps = draw(st.sets(st.integers(0, i - 1), max_size=2)) if i else set()
        kinds = draw(
            st.sampled_from(
                [
                    (NodeOutcomeKind.RETRYABLE_FAILURE,),
                    (NodeOutcomeKind.RETRYABLE_FAILURE, NodeOutcomeKind.PERMANENT_FAILURE),
                ]
            )
        )
        retry = RetryPolicy(
            max_attempts=draw(st.integers(1, 3)),
            backoff=FixedBackoff(5),
            retry_on=kinds,
            attempt_deadline_ms=draw(st.sampled_from([None, 7, 100])),
        )
        child = draw(st.integers(0, 4)) == 0
        nodes.append(
            Node(
                f"n{i}",
                handler=None if child else "h@1",
                child=ChildCall("leaf", 1, "propagate") if child else None,
                depends_on=tuple(f"n{d}" for d in sorted(deps)),
                policy=draw(st.sampled_from(["all_succeeded", "all_completed", "any_succeeded"])),
                retry=retry,
            )
        )
    edges = []
    if count > 1 and draw(st.booleans()):
        for _ in range(draw(st.integers(1, 2))):
            source, target = draw(st.integers(1, count - 1)), draw(st.integers(0, count - 1))
            when = draw(st.sampled_from(WHENS))
            edges.append(Edge(f"n{source}", f"n{target}", when))
    budgets = RunBudgets(max_attempts=draw(st.integers(1, 12)), max_transitions=draw(st.integers(1, 20)))
    targets = {edge.target for edge in edges}
    initial = tuple(n.id for n in nodes if not n.depends_on and n.id not in targets) or ("n0",)
    spec = WorkflowSpec(
        "fast", 1, tuple(nodes), edges=tuple(edges), initial=initial, budgets=budgets, catalog=(LEAF,)
    )
    assume(validate(spec) == [])
    return spec


def drive(spec: WorkflowSpec, data: st.DataObject) -> list[Event]:
    """A valid history: random starts, outcomes, time and, rarely, cancellation, until the run ends."""
    run = ReducerHarness(spec)
    for _ in range(60):
        state = run.state
        if state.status.is_terminal:
            break
        command: Command
        ready = state.ready_nodes()
        active = list(state.active_attempts())
        op = data.draw(st.sampled_from(["start", "complete", "advance", "cancel", "complete"]))
        if op == "start" and ready:
            picked = data.draw(st.lists(st.sampled_from(ready), min_size=1, unique=True))
            command = StartNodes(tuple(AttemptStart(n, run.ids.new_id()) for n in picked))
        elif op == "complete" and active:
            attempt_id, i = data.draw(st.sampled_from(active))
            node = state.node(i)
            if node.child_run_id is not None:
                result = data.draw(st.sampled_from(RESULTS))
                command = CompleteChild(node.node_id, attempt_id, node.child_run_id, result)
            else:
                command = CompleteAttempt(node.node_id, attempt_id, data.draw(st.sampled_from(OUTCOMES)))
        elif op == "cancel":
            command = CancelRun(reason="t", requester="t")
        else:
            command = AdvanceTime(state.now + 5)
        run.try_execute(command)
    return run.history


def corrupt(history: list[Event], data: st.DataObject) -> list[Event]:
    """The history with one hot event duplicated, dropped, moved or changed."""
    hot = [k for k, event in enumerate(history) if type(event) in HOT]
    if not hot:
        return history
    created = history[0]
    assert isinstance(created, RunCreated)
    node_ids = st.sampled_from([n.id for n in created.spec.nodes] + ["nx"])
    k = data.draw(st.sampled_from(hot))
    event = history[k]
    how = data.draw(st.sampled_from(["duplicate", "drop", "move", "change"]))
    changed = list(history)
    if how == "duplicate":
        changed.insert(data.draw(st.integers(k, len(history))), event)
    elif how == "drop":
        del changed[k]
    elif how == "move":
        del changed[k]
        changed.insert(data.draw(st.integers(1, len(changed))), event)
    elif isinstance(event, NodeStarted):
        used = [e.attempt_id for e in history if isinstance(e, NodeStarted)]
        field = data.draw(st.sampled_from(["node_id", "attempt", "attempt_id"]))
        value: dict[str, Any] = {
            "node_id": data.draw(node_ids),
            "attempt": event.attempt + 1,
            "attempt_id": data.draw(st.sampled_from(used)),
        }
        changed[k] = msgspec.structs.replace(event, **{field: value[field]})
    elif isinstance(event, NodeOutcomeCommitted):
        field = data.draw(st.sampled_from(["node_id", "attempt_id", "outcome"]))
        replaced: dict[str, Any] = {
            "node_id": data.draw(node_ids),
            "attempt_id": None,
            "outcome": data.draw(st.sampled_from(OUTCOMES)),
        }
        changed[k] = msgspec.structs.replace(event, **{field: replaced[field]})
    elif isinstance(event, NodeReady):
        changed[k] = msgspec.structs.replace(event, node_id=data.draw(node_ids))
    return changed


@given(spec=specs(), data=st.data())
def test_fast_and_general_rules_derive_equal_states_from_valid_histories(
    spec: WorkflowSpec, data: st.DataObject
) -> None:
    """Over generated histories, every step's state through the fast rules equals the general rules'."""
    history = drive(spec, data)
    fast_steps, slow_steps = apply_both(history)
    assert fast_steps == slow_steps
    assert all(isinstance(step, dict) for step in fast_steps)


@given(spec=specs(), data=st.data())
def test_fast_and_general_rules_reject_corrupt_histories_alike(
    spec: WorkflowSpec, data: st.DataObject
) -> None:
    """A history with a hot event duplicated, dropped, moved or changed gets the same error (or state)."""
    history = corrupt(drive(spec, data), data)
    fast_steps, slow_steps = apply_both(history)
    assert fast_steps == slow_steps


def test_plain_nodes_take_only_the_fast_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Readying, starting and finishing nodes without retries, edges or waits never reaches the general rules."""
    spec = WorkflowSpec(
        "fast",
        1,
        (
            Node("a", handler="h@1"),
            Node("b", handler="h@1", depends_on=("a",)),
            Node("c", handler="h@1", depends_on=("a",)),
            Node("d", handler="h@1", depends_on=("b", "c"), policy="all_completed"),
        ),
    )
    run = ReducerHarness(spec)
    run.run_script(
        {"a": [Succeeded()], "b": [Succeeded()], "c": [PermanentFailure(reason="x")], "d": [Skipped()]}
    )
    assert sum(type(e) in HOT for e in run.history) == 12
    general: list[Event] = []

    def record_general(state: RunState, event: Event, sequence: int) -> None:
        general.append(event)
        apply_event(state, event, sequence)

    monkeypatch.setattr(importlib.import_module("mayfly.reducer.reduce"), "apply_event", record_general)
    monkeypatch.setattr(importlib.import_module("mayfly.reducer._fast"), "apply_event", record_general)
    state = None
    for sequence, event in enumerate(run.history, 1):
        state = fast(state, event, sequence)
    assert state is not None and state.to_record() == run.state.to_record()
    assert [type(e) for e in general] == [RunCompleted]  # RunCreated starts the state, before any rule


@pytest.mark.parametrize(
    ("budgets", "extra", "problem"),
    [
        (
            RunBudgets(max_attempts=1, max_transitions=10),
            NodeStarted("b", "00000000-0000-7000-8000-0000000000bb", 1, 0),
            "attempt budget exceeded without an exhaustion fact",
        ),
        (
            RunBudgets(max_attempts=10, max_transitions=2),
            NodeReady("c", "dependencies"),
            "transition budget exceeded without an exhaustion fact",
        ),
    ],
)
def test_a_hot_event_past_a_budget_is_corruption_through_either_rules(
    budgets: RunBudgets, extra: Event, problem: str
) -> None:
    """An attempt or transition beyond its budget, with no exhaustion fact, fails the same way in both."""
    nodes = (Node("a", handler="h@1"), Node("b", handler="h@1"), Node("c", handler="h@1", depends_on=("a",)))
    run = ReducerHarness(WorkflowSpec("fast", 1, nodes, budgets=budgets))
    run.start("a")
    history = [*run.history, extra]
    fast_steps, slow_steps = apply_both(history)
    assert fast_steps == slow_steps
    assert isinstance(fast_steps[-1], str) and fast_steps[-1].endswith(problem), fast_steps[-1]


def test_a_child_call_node_started_as_a_handler_is_corruption_through_either_rules() -> None:
    """NodeStarted on a ready child-call node fails in replay with the general rule's message."""
    nodes = (Node("a", child=ChildCall("leaf", 1, "propagate")),)
    run = ReducerHarness(WorkflowSpec("fast", 1, nodes, catalog=(LEAF,)))
    history = [*run.history, NodeStarted("a", "00000000-0000-7000-8000-0000000000aa", 1, 0)]
    fast_steps, slow_steps = apply_both(history)
    assert fast_steps == slow_steps
    assert isinstance(fast_steps[-1], str) and fast_steps[-1].endswith(
        "node 'a' calls a child workflow; it starts with ChildStarted"
    )
