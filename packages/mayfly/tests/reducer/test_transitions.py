"""Conditional transitions: predicates, exclusive groups, activation fingerprints and correction loops."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mayfly.model.commands import CancelRun, CompleteAttempt
from mayfly.model.errors import CorruptionError, SpecDecodeError
from mayfly.model.events import (
    BudgetExhausted,
    BudgetKind,
    EdgeActivated,
    Event,
    FailureCause,
    NodeFailed,
    NodeOutcomeCommitted,
    NodeReady,
    NodeStarted,
    RunCompleted,
)
from mayfly.model.outcomes import (
    Blocked,
    ChangesRequested,
    NodeOutcome,
    NodeOutcomeKind,
    PermanentFailure,
    RetryableFailure,
    Skipped,
    Succeeded,
)
from mayfly.model.spec import (
    Edge,
    EdgePredicate,
    ImmediateBackoff,
    Node,
    OnAnyOutcome,
    OnField,
    OnOutcome,
    RetryPolicy,
    RunBudgets,
    WorkflowSpec,
)
from mayfly.model.state import NodeStatus, RunState, RunStateRecord, RunStatus
from mayfly.reducer import decide, reduce, validate
from mayfly.reducer.transitions import first_overlaps, matches, overlap_reason, scalar_equals
from mayfly.testing import ReducerHarness

GOLDEN = Path(__file__).resolve().parent.parent / "fixtures" / "golden"
CR = NodeOutcomeKind.CHANGES_REQUESTED
OK = NodeOutcomeKind.SUCCEEDED
NO_RETRY = RetryPolicy(max_attempts=1)


def node(node_id: str, *deps: str, **kw: object) -> Node:
    return Node(node_id, handler=f"{node_id}@1", depends_on=deps, **kw)  # type: ignore[arg-type]


def workflow(*nodes: Node, edges: tuple[Edge, ...] = (), **kw: object) -> WorkflowSpec:
    return WorkflowSpec("test", 1, nodes, edges=edges, **kw)  # type: ignore[arg-type]


def review_loop(**budgets: int) -> WorkflowSpec:
    """plan -> implement -> review <-> implement (on ChangesRequested) -> qa."""
    return workflow(
        node("plan"),
        node("implement", "plan"),
        node("review"),
        node("qa", "review"),
        edges=(
            Edge("implement", "review", when=OnOutcome(OK)),
            Edge("review", "implement", when=OnOutcome(CR)),
        ),
        initial=("plan",),
        budgets=RunBudgets(**budgets),
    )


def brief(events: list[Event]) -> list[str]:
    """A compact, exact rendering of an event sequence for table assertions."""
    out = []
    for e in events:
        if isinstance(e, NodeReady):
            out.append(f"ready {e.node_id} ({e.cause})")
        elif isinstance(e, NodeStarted):
            out.append(f"start {e.node_id} #{e.attempt}")
        elif isinstance(e, NodeOutcomeCommitted):
            out.append(f"outcome {e.node_id} {e.outcome.kind.value}")
        elif isinstance(e, EdgeActivated):
            out.append(f"edge {e.edge} {e.source}->{e.target} @{e.source_sequence}")
        elif isinstance(e, NodeFailed):
            out.append(f"failed {e.node_id} {e.cause.value}")
        elif isinstance(e, BudgetExhausted):
            out.append(f"exhausted {e.kind.value} {e.limit}")
        elif isinstance(e, RunCompleted):
            out.append(f"run {e.result}")
        else:
            out.append(type(e).__name__)
    return out


def run(spec: WorkflowSpec, script: dict[str, list[NodeOutcome]]) -> ReducerHarness:
    harness = ReducerHarness(spec)
    harness.run_script(script)
    assert harness.replayed().to_record() == harness.state.to_record()
    return harness


# -- predicates -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("predicate", "outcome", "expected"),
    [
        (OnAnyOutcome(), Succeeded(), True),
        (OnAnyOutcome(), PermanentFailure(reason="x"), True),
        (OnOutcome(CR), ChangesRequested(reason="x"), True),
        (OnOutcome(CR), Succeeded(), False),
        (OnOutcome(NodeOutcomeKind.BLOCKED), Blocked(reason="x"), True),
        (OnField("verdict", "ok"), Succeeded(output={"verdict": "ok"}), True),
        (OnField("verdict", "ok"), Succeeded(output={"verdict": "nok"}), False),
        (OnField("verdict", "ok"), Succeeded(output={"other": "ok"}), False),
        (OnField("verdict", "ok"), Succeeded(output=["verdict", "ok"]), False),
        (OnField("verdict", "ok"), Succeeded(), False),
        (OnField("verdict", "ok"), ChangesRequested(reason="ok"), False),
        (OnField("n", 1), Succeeded(output={"n": 1}), True),
        (OnField("n", 1), Succeeded(output={"n": 1.0}), False),
        (OnField("n", 1), Succeeded(output={"n": True}), False),
        (OnField("n", 1), Succeeded(output={"n": "1"}), False),
        (OnField("b", True), Succeeded(output={"b": 1}), False),
        (OnField("b", True), Succeeded(output={"b": True}), True),
        (OnField("b", False), Succeeded(output={"b": 0}), False),
        (OnField("z", None), Succeeded(output={"z": None}), True),
        (OnField("z", None), Succeeded(output={}), False),
        (OnField("z", None), Succeeded(output={"z": 0}), False),
        (OnField("nested", "x"), Succeeded(output={"nested": {"nested": "x"}}), False),
    ],
)
def test_predicate_matching_table(predicate: EdgePredicate, outcome: NodeOutcome, expected: bool) -> None:
    """Predicates compare JSON type and value, match fields only on Succeeded objects, never floats."""
    assert matches(predicate, outcome) is expected


def test_field_equality_survives_a_json_round_trip() -> None:
    """A value decoded from stored JSON compares exactly like the live one (1.0 stays a float)."""
    decoded = msgspec.json.decode(b'{"a": 1, "b": 1.0, "c": true}')
    assert scalar_equals(decoded["a"], 1)
    assert not scalar_equals(decoded["b"], 1)
    assert not scalar_equals(decoded["c"], 1)


@pytest.mark.parametrize(
    ("a", "b", "overlaps"),
    [
        (OnAnyOutcome(), OnOutcome(CR), True),
        (OnAnyOutcome(), OnField("v", "ok"), True),
        (OnOutcome(CR), OnOutcome(CR), True),
        (OnOutcome(CR), OnOutcome(OK), False),
        (OnField("v", "ok"), OnOutcome(OK), True),
        (OnField("v", "ok"), OnOutcome(CR), False),
        (OnOutcome(NodeOutcomeKind.PERMANENT_FAILURE), OnField("v", "ok"), False),
        (OnField("v", "ok"), OnField("v", "nok"), False),
        (OnField("v", "ok"), OnField("v", "ok"), True),
        (OnField("v", 1), OnField("v", True), False),
        (OnField("v", 1), OnField("v", "1"), False),
        (OnField("v", None), OnField("v", False), False),
        (OnField("v", "ok"), OnField("w", "ok"), True),
    ],
)
def test_disjointness_rules_table(a: EdgePredicate, b: EdgePredicate, overlaps: bool) -> None:
    """The exclusive-group proof rules: any overlaps all, same kind overlaps, fields need one field."""
    assert (overlap_reason(a, b) is not None) is overlaps
    assert (overlap_reason(b, a) is not None) is overlaps


_PREDICATES = st.one_of(
    st.just(OnAnyOutcome()),
    st.builds(OnOutcome, st.sampled_from(list(NodeOutcomeKind))),
    st.builds(
        OnField, st.sampled_from(["a", "b", "c"]), st.sampled_from(["x", "y", 0, 1, True, False, None])
    ),
)


@given(st.lists(_PREDICATES, max_size=12))
def test_linear_overlap_search_equals_the_pairwise_check(predicates: list[EdgePredicate]) -> None:
    """For each predicate, the linear search finds exactly the earliest overlapping partner of all pairs."""
    brute = []
    for k in range(len(predicates)):
        partners = [j for j in range(k) if overlap_reason(predicates[j], predicates[k]) is not None]
        if partners:
            brute.append((partners[0], k))
    assert first_overlaps(predicates) == brute


# -- validation -----------------------------------------------------------------


def _classify(*edges: Edge, outputs: tuple[str, ...] = ()) -> WorkflowSpec:
    return workflow(node("classify", outputs=outputs), node("fast"), node("slow"), edges=edges)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            _classify(
                Edge("classify", "fast", OnField("size", "small"), exclusive="route"),
                Edge("classify", "slow", OnField("size", "large"), exclusive="route"),
            ),
            [],
        ),
        (
            _classify(
                Edge("classify", "fast", OnField("size", "small"), exclusive="route"),
                Edge("classify", "slow", OnField("size", "small"), exclusive="route"),
            ),
            [
                "edges[1]: overlaps edges[0] in exclusive group 'route': "
                "edges[0] (classify -> fast on field 'size' == 'small') and "
                "edges[1] (classify -> slow on field 'size' == 'small') "
                "can both match because both match field 'size' == 'small'"
            ],
        ),
        (
            _classify(
                Edge("classify", "fast", OnField("size", "small"), exclusive="route"),
                Edge("classify", "slow", OnField("speed", "low"), exclusive="route"),
            ),
            [
                "edges[1]: overlaps edges[0] in exclusive group 'route': "
                "edges[0] (classify -> fast on field 'size' == 'small') and "
                "edges[1] (classify -> slow on field 'speed' == 'low') can both match because "
                "they constrain different fields ('size', 'speed'), which one succeeded output "
                "can satisfy together"
            ],
        ),
        (
            _classify(
                Edge("classify", "fast", OnField("size", "small"), exclusive="route"),
                Edge("classify", "slow", OnOutcome(OK), exclusive="route"),
            ),
            [
                "edges[1]: overlaps edges[0] in exclusive group 'route': "
                "edges[0] (classify -> fast on field 'size' == 'small') and "
                "edges[1] (classify -> slow on outcome succeeded) can both match because "
                "a succeeded output with field 'size' == 'small' matches both"
            ],
        ),
        (
            _classify(
                Edge("classify", "fast", OnField("size", "small"), exclusive="route"),
                Edge("classify", "slow", OnOutcome(CR), exclusive="route"),
            ),
            [],
        ),
        (
            _classify(
                Edge("classify", "fast", OnAnyOutcome(), exclusive="route"),
                Edge("classify", "slow", OnOutcome(CR), exclusive="route"),
            ),
            [
                "edges[1]: overlaps edges[0] in exclusive group 'route': "
                "edges[0] (classify -> fast on any outcome) and "
                "edges[1] (classify -> slow on outcome changes_requested) can both match because "
                "'any' matches every outcome"
            ],
        ),
        (
            _classify(
                Edge("classify", "fast", OnOutcome(CR), exclusive="route"),
                Edge("classify", "slow", OnOutcome(CR), exclusive="route"),
            ),
            [
                "edges[1]: overlaps edges[0] in exclusive group 'route': "
                "edges[0] (classify -> fast on outcome changes_requested) and "
                "edges[1] (classify -> slow on outcome changes_requested) can both match because "
                "both match outcome changes_requested"
            ],
        ),
        (
            # Parallel (ungrouped) edges may overlap: all matching ones fire.
            _classify(Edge("classify", "fast", OnAnyOutcome()), Edge("classify", "slow", OnAnyOutcome())),
            [],
        ),
        (
            _classify(
                Edge("classify", "fast", OnOutcome(OK), exclusive="g"),
                Edge("fast", "slow", OnOutcome(CR), exclusive="g"),
            ),
            [
                "edges[1].exclusive: exclusive group 'g' mixes sources 'classify' (edges[0]) and "
                "'fast'; a group belongs to one source"
            ],
        ),
        (
            _classify(Edge("classify", "nope"), Edge("ghost", "slow")),
            ["edges[0].target: unknown node 'nope'", "edges[1].source: unknown node 'ghost'"],
        ),
        (
            _classify(Edge("classify", "fast", OnField("verdict", "ok")), outputs=("size",)),
            ["edges[0].when.field: node 'classify' does not declare output 'verdict' (declared: size)"],
        ),
        (
            _classify(Edge("classify", "fast", OnField("", "ok"))),
            ["edges[0].when.field: invalid field name ''"],
        ),
    ],
)
def test_edge_validation_table(spec: WorkflowSpec, expected: list[str]) -> None:
    """Edges name known nodes; exclusive groups share a source and are provably disjoint, else both are named."""
    assert [str(issue) for issue in validate(spec)] == expected


def test_float_predicate_values_are_rejected() -> None:
    """A predicate cannot name a float: the spec is malformed, at the predicate's path."""
    spec = _classify(Edge("classify", "fast", OnField("n", 1.5)))  # type: ignore[arg-type]
    issues = [str(issue) for issue in validate(spec)]
    assert len(issues) == 1
    assert issues[0].startswith("malformed specification:")
    assert "$.edges[0].when.equals" in issues[0]


def test_float_predicate_values_cannot_be_decoded() -> None:
    """The JSON form of a spec with a float predicate value fails to decode, naming the predicate's path."""
    raw = (
        _classify(Edge("classify", "fast", OnField("n", 1))).to_json().replace(b'"equals":1', b'"equals":1.0')
    )
    with pytest.raises(SpecDecodeError, match=r"edges\[0\]\.when\.equals"):
        WorkflowSpec.from_json(raw)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            workflow(
                node("implement"),
                node("review"),
                edges=(
                    Edge("implement", "review", OnOutcome(OK)),
                    Edge("review", "implement", OnOutcome(CR)),
                ),
            ),
            [
                "initial: the graph has a conditional cycle through: implement, review; "
                "declare the initial nodes explicitly"
            ],
        ),
        (
            workflow(
                node("implement"),
                node("review"),
                edges=(
                    Edge("implement", "review", OnOutcome(OK)),
                    Edge("review", "implement", OnOutcome(CR)),
                ),
                initial=("implement",),
            ),
            [],
        ),
        (
            # A self-loop is a conditional cycle too.
            workflow(node("review"), edges=(Edge("review", "review", OnOutcome(CR)),)),
            [
                "initial: the graph has a conditional cycle through: review; "
                "declare the initial nodes explicitly"
            ],
        ),
        (
            # A dependency plus an edge back is a conditional cycle.
            workflow(node("a"), node("b", "a"), edges=(Edge("b", "a", OnOutcome(CR)),), initial=("a",)),
            [],
        ),
        (
            workflow(node("a", "b"), node("b", "a"), edges=(Edge("a", "b"),), initial=("a",)),
            ["nodes: dependency cycle among unconditional depends_on edges through: a, b"],
        ),
        (
            # Edge targets are not initial by default; an acyclic graph needs no declaration.
            workflow(node("a"), node("b"), edges=(Edge("a", "b"),)),
            [],
        ),
        (
            workflow(node("a"), node("b"), node("c"), edges=(Edge("a", "b"),), initial=("a",)),
            ["nodes[c]: can never become ready: not in initial, no depends_on and no incoming edge"],
        ),
    ],
)
def test_cycle_and_initial_validation_table(spec: WorkflowSpec, expected: list[str]) -> None:
    """Dependencies stay acyclic; a conditional cycle is allowed only with declared initial nodes."""
    assert [str(issue) for issue in validate(spec)] == expected


def test_review_loop_example_validates() -> None:
    """The review-loop example is a valid specification."""
    assert validate(review_loop()) == []


# -- firing ---------------------------------------------------------------------


def test_default_initial_set_excludes_edge_targets() -> None:
    """Without ``initial``, nodes with no depends_on and no incoming edge start the run."""
    harness = ReducerHarness(workflow(node("a"), node("b"), edges=(Edge("a", "b"),)))
    assert harness.state.ready_nodes() == ["a"]


def test_parallel_edges_fan_out_in_specification_order() -> None:
    """Every matching ungrouped edge fires, in spec order, each consuming one transition."""
    spec = workflow(
        node("a"),
        node("x"),
        node("y"),
        node("z"),
        edges=(Edge("a", "y"), Edge("a", "x", OnOutcome(OK)), Edge("a", "z", OnOutcome(CR))),
    )
    harness = ReducerHarness(spec)
    harness.start("a")
    before = harness.state.transitions_used
    events = harness.complete("a", Succeeded())
    assert brief(events) == ["outcome a succeeded", "edge 0 a->y @4", "edge 1 a->x @4", "outcome z skipped"]
    assert harness.state.transitions_used == before + 2
    harness.run_script({"x": [Succeeded()], "y": [Succeeded()]})
    assert harness.state.node_by_id("z").status is NodeStatus.SKIPPED  # type: ignore[union-attr]
    assert harness.state.status is RunStatus.SUCCEEDED


@pytest.mark.parametrize(
    ("output", "fired", "statuses"),
    [
        ({"size": "small"}, ["fast"], {"fast": NodeStatus.SUCCEEDED, "slow": NodeStatus.SKIPPED}),
        ({"size": "large"}, ["slow"], {"fast": NodeStatus.SKIPPED, "slow": NodeStatus.SUCCEEDED}),
        # The integer group fires only for a JSON integer: not 1.0, not true.
        ({"size": 1}, ["fast"], {"fast": NodeStatus.SUCCEEDED, "slow": NodeStatus.SKIPPED}),
        ({"size": 1.0}, [], {"fast": NodeStatus.SKIPPED, "slow": NodeStatus.SKIPPED}),
        ({"size": True}, [], {"fast": NodeStatus.SKIPPED, "slow": NodeStatus.SKIPPED}),
    ],
)
def test_exclusive_group_selects_one_branch(
    output: dict[str, object], fired: list[str], statuses: dict[str, NodeStatus]
) -> None:
    """In an exclusive group at most one edge fires; unselected branches are skipped and the join runs."""
    spec = workflow(
        node("classify"),
        node("fast"),
        node("slow"),
        node("report", "fast", "slow", policy="all_completed"),
        edges=(
            Edge("classify", "fast", OnField("size", "small"), exclusive="route"),
            Edge("classify", "slow", OnField("size", "large"), exclusive="route"),
            Edge("classify", "fast", OnField("size", 1), exclusive="ints"),
        ),
    )
    harness = run(
        spec,
        {
            "classify": [Succeeded(output=output)],
            "fast": [Succeeded()],
            "slow": [Succeeded()],
            "report": [Succeeded()],
        },
    )
    assert [e.target for e in harness.history if isinstance(e, EdgeActivated)] == fired
    state = harness.state
    assert {n: state.node_by_id(n).status for n in statuses} == statuses  # type: ignore[union-attr]
    for node_id, status in statuses.items():
        if status is NodeStatus.SKIPPED:
            assert state.node_by_id(node_id).last_outcome == Skipped(reason="branch not selected")  # type: ignore[union-attr]
    # all_completed releases the join once every branch is settled.
    assert state.node_by_id("report").status is NodeStatus.SUCCEEDED  # type: ignore[union-attr]
    assert state.status is RunStatus.SUCCEEDED


def test_an_unselected_branch_is_skipped_while_other_work_runs() -> None:
    """A branch whose only sources can never run again is skipped in the batch that settles the choice."""
    spec = workflow(
        node("classify"),
        node("slow_job"),
        node("fast"),
        node("slow"),
        node("join", "fast", "slow", policy="all_completed"),
        edges=(
            Edge("classify", "fast", OnField("size", "small"), exclusive="route"),
            Edge("classify", "slow", OnField("size", "large"), exclusive="route"),
        ),
    )
    harness = ReducerHarness(spec)
    harness.start("classify", "slow_job")
    events = harness.complete("classify", Succeeded(output={"size": "small"}))
    assert brief(events) == ["outcome classify succeeded", "edge 0 classify->fast @6", "outcome slow skipped"]
    assert harness.state.node_by_id("slow_job").status is NodeStatus.RUNNING  # type: ignore[union-attr]
    harness.start("fast")
    events = harness.complete("fast", Succeeded())
    assert brief(events) == ["outcome fast succeeded", "ready join (dependencies)"]


def test_a_requester_no_edge_can_reach_fails_at_once() -> None:
    """ChangesRequested routed to another node, with no edge back, fails without waiting for quiescence."""
    spec = workflow(node("review"), node("fix"), node("other"), edges=(Edge("review", "fix", OnOutcome(CR)),))
    harness = ReducerHarness(spec)
    harness.start("review", "other")
    events = harness.complete("review", ChangesRequested(reason="x"))
    assert brief(events) == [
        "outcome review changes_requested",
        "edge 0 review->fix @6",
        "failed review correction_unresolved",
    ]


def test_integer_field_predicate_ignores_float_output() -> None:
    """``{"size": 1.0}`` does not select ``size == 1``; the branch is skipped."""
    spec = workflow(node("a"), node("b"), edges=(Edge("a", "b", OnField("size", 1)),))
    harness = run(spec, {"a": [Succeeded(output={"size": 1.0})]})
    assert harness.state.node_by_id("b").status is NodeStatus.SKIPPED  # type: ignore[union-attr]


def test_edges_fire_only_on_the_final_outcome_of_an_activation() -> None:
    """A retried outcome selects nothing; the outcome that ends the activation does."""
    spec = workflow(
        node("a", retry=RetryPolicy(max_attempts=2, backoff=ImmediateBackoff())),
        node("alarm"),
        edges=(Edge("a", "alarm", OnOutcome(NodeOutcomeKind.RETRYABLE_FAILURE)),),
    )
    harness = ReducerHarness(spec)
    harness.start("a")
    first = harness.complete("a", RetryableFailure(reason="flaky"))
    assert not any(isinstance(e, EdgeActivated) for e in first)
    harness.start("a")
    second = harness.complete("a", RetryableFailure(reason="flaky"))
    assert brief(second) == [
        "outcome a retryable_failure",
        "failed a retries_exhausted",
        "edge 0 a->alarm @8",
    ]


def test_changes_requested_without_a_matching_edge_fails_the_node() -> None:
    """ChangesRequested that no edge selects fails the node with the ADR's reason; the run never hangs."""
    spec = workflow(node("a"), node("b"), edges=(Edge("a", "b", OnOutcome(OK)),))
    harness = run(spec, {"a": [ChangesRequested(reason="nope")]})
    failed = [e for e in harness.history if isinstance(e, NodeFailed)]
    assert failed == [
        NodeFailed(
            node_id="a",
            cause=FailureCause.NO_CORRECTION_EDGE,
            detail="changes requested, no correction edge matched",
        )
    ]
    assert harness.state.status is RunStatus.FAILED


def test_propagated_outcomes_fire_no_edges() -> None:
    """A node skipped by propagation never ran; its edges (even ``any``) do not fire."""
    spec = workflow(node("a"), node("b", "a"), node("c"), edges=(Edge("b", "c"),))
    harness = run(spec, {"a": [PermanentFailure(reason="x")]})
    assert not any(isinstance(e, EdgeActivated) for e in harness.history)
    assert harness.state.node_by_id("c").status is NodeStatus.SKIPPED  # type: ignore[union-attr]


# -- correction loops -----------------------------------------------------------


def test_review_loop_reaches_success_with_the_expected_event_sequence() -> None:
    """The review loop converges on review's third attempt with exactly these facts."""
    harness = run(
        review_loop(),
        {
            "plan": [Succeeded()],
            "implement": [Succeeded(output={"diff": n}) for n in range(3)],
            "review": [
                ChangesRequested(reason="tests missing"),
                ChangesRequested(reason="lint"),
                Succeeded(),
            ],
            "qa": [Succeeded()],
        },
    )
    assert brief(harness.history) == [
        "RunCreated",
        "ready plan (initial)",
        "start plan #1",
        "outcome plan succeeded",
        "ready implement (dependencies)",
        "start implement #1",
        "outcome implement succeeded",
        "edge 0 implement->review @7",
        "start review #1",
        "outcome review changes_requested",
        "edge 1 review->implement @10",
        "start implement #1",
        "outcome implement succeeded",
        "edge 0 implement->review @13",
        "start review #1",
        "outcome review changes_requested",
        "edge 1 review->implement @16",
        "start implement #1",
        "outcome implement succeeded",
        "edge 0 implement->review @19",
        "start review #1",
        "outcome review succeeded",
        "ready qa (dependencies)",
        "start qa #1",
        "outcome qa succeeded",
        "run succeeded",
    ]
    state = harness.state
    assert state.status is RunStatus.SUCCEEDED
    review = state.node_by_id("review")
    implement = state.node_by_id("implement")
    assert review is not None and implement is not None
    assert (review.total_attempts, implement.total_attempts) == (3, 3)
    assert implement.last_outcome == Succeeded(output={"diff": 2})
    # Every execution used a fresh attempt id.
    starts = [e.attempt_id for e in harness.history if isinstance(e, NodeStarted)]
    assert len(starts) == len(set(starts)) == 8


def test_self_correction_converges_on_the_third_attempt() -> None:
    """A ChangesRequested edge back to the same node re-runs it with a new attempt id until it succeeds."""
    spec = workflow(
        node("draft"),
        node("publish", "draft"),
        edges=(Edge("draft", "draft", OnOutcome(CR)),),
        initial=("draft",),
    )
    harness = run(
        spec,
        {
            "draft": [ChangesRequested(reason="1"), ChangesRequested(reason="2"), Succeeded()],
            "publish": [Succeeded()],
        },
    )
    assert [e for e in brief(harness.history) if e.startswith(("edge", "start draft"))] == [
        "start draft #1",
        "edge 0 draft->draft @4",
        "start draft #1",
        "edge 0 draft->draft @7",
        "start draft #1",
    ]
    assert harness.state.status is RunStatus.SUCCEEDED


def test_a_loop_that_never_converges_exhausts_the_node_budget() -> None:
    """A review that always requests changes ends in a recorded node-budget exhaustion, not a hang."""
    spec = workflow(
        node("plan"),
        node("implement", "plan"),
        node("review", max_attempts=3),
        node("qa", "review"),
        edges=review_loop().edges,
        initial=("plan",),
    )
    harness = run(
        spec,
        {
            "plan": [Succeeded()],
            "implement": [Succeeded()] * 4,
            "review": [ChangesRequested(reason="again")] * 3,
        },
    )
    assert brief(harness.history)[-5:] == [
        "edge 0 implement->review @25",
        "exhausted node_attempts 3",
        "failed review node_budget_exhausted",
        "outcome qa skipped",
        "run failed",
    ]
    exhausted = [e for e in harness.history if isinstance(e, BudgetExhausted)]
    assert [(e.kind, e.limit, e.observed, e.node_id) for e in exhausted] == [
        (BudgetKind.NODE_ATTEMPTS, 3, 4, "review")
    ]
    assert harness.state.status is RunStatus.FAILED


def test_a_loop_that_never_converges_exhausts_the_transition_budget() -> None:
    """With no node ceiling, the run's transition budget ends the loop and fails the run."""
    harness = run(
        review_loop(max_transitions=6),
        {
            "plan": [Succeeded()],
            "implement": [Succeeded()] * 10,
            "review": [ChangesRequested(reason="x")] * 10,
        },
    )
    exhausted = [e for e in harness.history if isinstance(e, BudgetExhausted)]
    assert [(e.kind, e.limit, e.observed) for e in exhausted] == [(BudgetKind.RUN_TRANSITIONS, 6, 7)]
    assert exhausted[0].last_outcome is not None
    assert brief(harness.history)[-1] == "run failed"
    # Every conditional activation consumed a transition: 2 readiness + 4 edges.
    assert sum(isinstance(e, EdgeActivated) for e in harness.history) == 4


def test_a_loop_that_never_converges_exhausts_the_attempt_budget() -> None:
    """The run's attempt budget bounds the total executions of a loop."""
    harness = run(
        review_loop(max_attempts=5),
        {
            "plan": [Succeeded()],
            "implement": [Succeeded()] * 10,
            "review": [ChangesRequested(reason="x")] * 10,
        },
    )
    exhausted = [e for e in harness.history if isinstance(e, BudgetExhausted)]
    assert [(e.kind, e.limit, e.observed) for e in exhausted] == [(BudgetKind.RUN_ATTEMPTS, 5, 6)]
    assert harness.state.status is RunStatus.FAILED


def test_retry_policy_counts_within_one_activation() -> None:
    """After a correction re-activates a node, its retry policy starts again at attempt 1."""
    spec = workflow(
        node("implement", retry=RetryPolicy(max_attempts=2, backoff=ImmediateBackoff())),
        node("review"),
        edges=review_loop().edges[:2],
        initial=("implement",),
    )
    flaky = RetryableFailure(reason="flaky")
    harness = run(
        spec,
        {
            "implement": [flaky, Succeeded(), flaky, Succeeded()],
            "review": [ChangesRequested(reason="x"), Succeeded()],
        },
    )
    attempts = [e.attempt for e in harness.history if isinstance(e, NodeStarted) and e.node_id == "implement"]
    assert attempts == [1, 2, 1, 2]
    assert harness.state.node_by_id("implement").total_attempts == 4  # type: ignore[union-attr]
    assert harness.state.status is RunStatus.SUCCEEDED


def test_reactivating_a_failed_node_makes_the_run_follow_its_final_outcome() -> None:
    """A failed node re-activated by an edge leaves the failed count; the run result follows the end."""
    spec = workflow(
        node("fetch", retry=NO_RETRY),
        node("backoff"),
        edges=(
            Edge("fetch", "backoff", OnOutcome(NodeOutcomeKind.RETRYABLE_FAILURE)),
            Edge("backoff", "fetch", OnOutcome(OK)),
        ),
        initial=("fetch",),
    )
    harness = ReducerHarness(spec)
    harness.start("fetch")
    harness.complete("fetch", RetryableFailure(reason="503"))
    assert harness.state.n_failed == 1
    harness.start("backoff")
    harness.complete("backoff", Succeeded())
    state = harness.state
    assert state.node_by_id("fetch").status is NodeStatus.READY  # type: ignore[union-attr]
    assert (state.n_failed, state.open_nodes) == (0, 1)
    harness.start("fetch")
    harness.complete("fetch", Succeeded())
    assert harness.state.status is RunStatus.SUCCEEDED
    assert harness.replayed().to_record() == harness.state.to_record()


def test_the_run_does_not_complete_while_a_correction_is_in_flight() -> None:
    """While implement re-runs, review waits in ChangesRequested and the run stays open."""
    harness = ReducerHarness(review_loop())
    harness.start("plan")
    harness.complete("plan", Succeeded())
    harness.start("implement")
    harness.complete("implement", Succeeded())
    harness.start("review")
    harness.complete("review", ChangesRequested(reason="x"))
    state = harness.state
    assert state.node_by_id("review").status is NodeStatus.CHANGES_REQUESTED  # type: ignore[union-attr]
    assert state.node_by_id("implement").status is NodeStatus.READY  # type: ignore[union-attr]
    assert state.status is RunStatus.RUNNING
    assert (state.open_nodes, state.n_idle) == (3, 2)


def test_a_correction_that_never_returns_fails_the_waiting_node() -> None:
    """If the corrected node ends without re-activating the requester, the requester fails once idle."""
    harness = run(
        review_loop(),
        {
            "plan": [Succeeded()],
            "implement": [Succeeded(), PermanentFailure(reason="cannot fix")],
            "review": [ChangesRequested(reason="x")],
        },
    )
    assert brief(harness.history)[-5:] == [
        "start implement #1",
        "outcome implement permanent_failure",
        "failed review correction_unresolved",
        "outcome qa skipped",
        "run failed",
    ]


def test_an_edge_to_an_active_target_adds_no_activation() -> None:
    """A matching edge whose target is already Ready or Running is coalesced into that activation."""
    spec = workflow(node("a"), node("b"), node("c"), edges=(Edge("a", "c"), Edge("b", "c")))
    harness = ReducerHarness(spec)
    harness.start("a", "b")
    harness.complete("a", Succeeded())
    events = harness.complete("b", Succeeded())
    assert brief(events) == ["outcome b succeeded"]
    harness.run_script({"c": [Succeeded()]})
    assert harness.state.status is RunStatus.SUCCEEDED


def test_dependency_release_governs_the_first_activation() -> None:
    """An edge into a Pending node with depends_on adds nothing; later edges re-activate it even after success."""
    spec = workflow(
        node("a"),
        node("gate"),
        node("b", "gate"),
        edges=(Edge("a", "b"), Edge("b", "b", OnField("again", True))),
        initial=("a", "gate"),
    )
    harness = ReducerHarness(spec)
    harness.start("a")
    assert brief(harness.complete("a", Succeeded())) == ["outcome a succeeded"]
    harness.start("gate")
    assert brief(harness.complete("gate", Succeeded())) == [
        "outcome gate succeeded",
        "ready b (dependencies)",
    ]
    harness.start("b")
    events = harness.complete("b", Succeeded(output={"again": True}))
    assert brief(events) == ["outcome b succeeded", "edge 1 b->b @10"]
    harness.start("b")
    harness.complete("b", Succeeded(output={"again": False}))
    assert harness.state.status is RunStatus.SUCCEEDED


def test_cancellation_cancels_a_node_awaiting_correction() -> None:
    """A ChangesRequested node is open: cancelling the run records it Cancelled."""
    harness = ReducerHarness(review_loop())
    harness.start("plan")
    harness.complete("plan", Succeeded())
    harness.start("implement")
    harness.complete("implement", Succeeded())
    harness.start("review")
    harness.complete("review", ChangesRequested(reason="x"))
    harness.execute(CancelRun("alice", "stop"))
    assert harness.state.node_by_id("review").status is NodeStatus.CANCELLED  # type: ignore[union-attr]
    assert harness.state.status is RunStatus.CANCELLED
    assert harness.replayed().to_record() == harness.state.to_record()


# -- fingerprints ---------------------------------------------------------------


def _looped_once() -> ReducerHarness:
    harness = ReducerHarness(review_loop())
    harness.start("plan")
    harness.complete("plan", Succeeded())
    harness.start("implement")
    harness.complete("implement", Succeeded())
    harness.start("review")
    harness.complete("review", ChangesRequested(reason="x"))
    return harness


def test_a_fingerprint_cannot_be_reused_after_replay() -> None:
    """Replaying history and re-appending a consumed activation is corruption, not a second activation."""
    harness = _looped_once()
    state = harness.replayed()
    used = next(e for e in reversed(harness.history) if isinstance(e, EdgeActivated))
    assert used == EdgeActivated(edge=1, source="review", target="implement", source_sequence=10)
    with pytest.raises(CorruptionError, match=r"fingerprint \(edge 1, source sequence 10\) was already used"):
        reduce(state, used, state.sequence + 1)


def test_a_stale_fingerprint_from_an_earlier_cycle_is_rejected() -> None:
    """An activation naming an older outcome of the source can never fire in a later cycle."""
    harness = _looped_once()
    harness.start("implement")
    harness.complete("implement", Succeeded())  # fires edge 0 again, at source sequence 13
    state = harness.replayed()
    stale = EdgeActivated(edge=0, source="implement", target="review", source_sequence=7)
    with pytest.raises(CorruptionError, match="stale activation"):
        reduce(state, stale, state.sequence + 1)


def test_an_activation_must_name_the_edge_it_fires() -> None:
    """Edge position, source and target must agree with the pinned specification."""
    harness = _looped_once()
    state = harness.replayed()
    with pytest.raises(CorruptionError, match="edge 1 is 'review' -> 'implement'"):
        reduce(
            state, EdgeActivated(edge=1, source="review", target="qa", source_sequence=10), state.sequence + 1
        )
    with pytest.raises(CorruptionError, match="edge position 9"):
        reduce(
            state, EdgeActivated(edge=9, source="review", target="qa", source_sequence=10), state.sequence + 1
        )


def test_an_activation_needs_a_final_outcome() -> None:
    """An outcome that is being retried cannot activate edges, even in forged history."""
    spec = workflow(node("a"), node("b"), edges=(Edge("a", "b"),))
    harness = ReducerHarness(spec)
    harness.start("a")
    harness.complete("a", RetryableFailure(reason="flaky"))
    state = harness.replayed()
    seq = next(i for i, e in enumerate(harness.history, 1) if isinstance(e, NodeOutcomeCommitted))
    with pytest.raises(CorruptionError, match="stale activation"):
        reduce(state, EdgeActivated(edge=0, source="a", target="b", source_sequence=seq), state.sequence + 1)


def test_decide_never_reuses_a_fingerprint_across_cycles() -> None:
    """Over a converging loop every (edge, source sequence) pair is distinct and increasing per edge."""
    harness = run(
        review_loop(),
        {
            "plan": [Succeeded()],
            "implement": [Succeeded()] * 4,
            "review": [ChangesRequested(reason="x")] * 3 + [Succeeded()],
            "qa": [Succeeded()],
        },
    )
    fired: dict[int, list[int]] = {}
    for e in harness.history:
        if isinstance(e, EdgeActivated):
            fired.setdefault(e.edge, []).append(e.source_sequence)
    for sequences in fired.values():
        assert sequences == sorted(set(sequences))


# -- state bookkeeping ----------------------------------------------------------


def test_snapshot_mid_loop_restores_exact_counters_and_continues_identically() -> None:
    """A state record taken mid-correction rebuilds the same counters and decides the same next facts."""
    harness = _looped_once()
    record = msgspec.json.decode(msgspec.json.encode(harness.state.to_record()), type=RunStateRecord)
    restored = RunState.from_record(record)
    live = harness.state
    for name in ("open_nodes", "n_idle", "n_failed", "n_blocked", "n_cancelled", "transitions_used"):
        assert getattr(restored, name) == getattr(live, name), name
    assert restored.parked_nodes() == live.parked_nodes()
    assert [restored.edge_fired(k) for k in range(2)] == [live.edge_fired(k) for k in range(2)]
    for a, b in zip(restored.nodes, live.nodes, strict=True):
        assert (a.done_prereqs, a.succeeded_prereqs, a.outcome_seq) == (
            b.done_prereqs,
            b.succeeded_prereqs,
            b.outcome_seq,
        )
    command = CompleteAttempt("review", "0" * 8, Succeeded())
    assert decide(restored, command) == decide(live, command)


def test_reactivation_keeps_dependents_counters_exact() -> None:
    """A prerequisite that leaves Succeeded and comes back counts exactly once for its dependents."""
    spec = workflow(
        node("a"),
        node("b", "a", "c"),
        node("c"),
        edges=(Edge("c", "a", OnField("redo", True)),),
        initial=("a", "c"),
    )
    harness = ReducerHarness(spec)
    harness.start("a", "c")
    harness.complete("a", Succeeded())
    b = harness.state.node_by_id("b")
    assert b is not None and (b.done_prereqs, b.succeeded_prereqs) == (1, 1)
    # c's edge re-activates a before c's dependents are settled, so b is not released early.
    harness.complete("c", Succeeded(output={"redo": True}))
    b = harness.state.node_by_id("b")
    assert b is not None and b.status is NodeStatus.PENDING
    assert (b.done_prereqs, b.succeeded_prereqs) == (1, 1)
    harness.start("a")
    harness.complete("a", Succeeded())
    b = harness.state.node_by_id("b")
    assert b is not None and b.status is NodeStatus.READY
    assert (b.done_prereqs, b.succeeded_prereqs) == (2, 2)
    harness.run_script({"b": [Succeeded()]})
    assert harness.state.status is RunStatus.SUCCEEDED
    assert harness.replayed().to_record() == harness.state.to_record()


def test_mid_loop_state_record_matches_its_golden_fixture() -> None:
    """A state taken mid-correction (edge activations, fingerprints, a waiting requester) has pinned bytes."""
    harness = _looped_once()
    data = msgspec.json.encode(harness.state.to_record())
    path = GOLDEN / "state-transitions.v1.json"
    if not path.exists() and os.environ.get("MAYFLY_UPDATE_GOLDEN") == "1":
        path.write_bytes(data + b"\n")
    assert data == path.read_bytes().rstrip(b"\n")
    restored = RunState.from_record(msgspec.json.decode(data, type=RunStateRecord))
    assert restored.to_record() == harness.state.to_record()
