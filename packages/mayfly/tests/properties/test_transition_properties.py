"""Properties over random graphs with conditional edges (cycles included) and child calls.

Every run is driven by random interleavings of starts, outcomes, child
results, time and cancellation. The properties: the run never hangs (budgets
end every loop), replay equals live after every command (also through the
JSON codec and the state record), decide is a pure function, every counter the
reducer keeps incrementally equals a direct recount, and no activation
fingerprint is ever used twice.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mayfly.model.commands import (
    AdvanceTime,
    AttemptStart,
    CancelRun,
    Command,
    CompleteAttempt,
    CompleteChild,
    CreateRun,
    Rejection,
    RejectionCode,
    StartNodes,
)
from mayfly.model.events import (
    ChildCompleted,
    ChildStarted,
    EdgeActivated,
    Event,
    FailureCause,
    NodeFailed,
    NodeOutcomeCommitted,
    RunResult,
)
from mayfly.model.ids import DeterministicIdSource
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
    DependencyPolicy,
    Edge,
    EdgePredicate,
    FixedBackoff,
    Node,
    OnAnyOutcome,
    OnField,
    OnOutcome,
    RetryPolicy,
    RunBudgets,
    WorkflowSpec,
)
from mayfly.model.state import NodeDetail, NodeState, NodeStatus, RunState, RunStatus
from mayfly.reducer import decide, decode_event, encode_event, reduce, replay, validate
from mayfly.reducer._draft import Draft
from mayfly.reducer.children import child_completion, child_create_run
from mayfly.reducer.decide import decide_draft

settings.register_profile("mayfly", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("mayfly")

POLICIES: tuple[DependencyPolicy, ...] = ("all_succeeded", "all_completed", "any_succeeded")
KINDS = (
    NodeOutcomeKind.SUCCEEDED,
    NodeOutcomeKind.CHANGES_REQUESTED,
    NodeOutcomeKind.PERMANENT_FAILURE,
    NodeOutcomeKind.RETRYABLE_FAILURE,
    NodeOutcomeKind.BLOCKED,
)
OUTCOMES: tuple[NodeOutcome, ...] = (
    Succeeded(),
    Succeeded(output={"v": "a"}),
    Succeeded(output={"v": "b"}),
    Succeeded(output={"v": 1}),
    Succeeded(output={"v": 1.0}),
    Succeeded(output={"v": True}),
    ChangesRequested(reason="cr"),
    ChangesRequested(reason="cr"),
    PermanentFailure(reason="p"),
    RetryableFailure(reason="r"),
    Blocked(reason="b"),
    Cancelled(reason="c"),
    Skipped(reason="s"),
)
RESULTS: tuple[RunResult, ...] = ("succeeded", "succeeded", "failed", "blocked", "cancelled")
FIELD_VALUES = ("a", "b", 1, True)

LEAF = ChildDefinition("leaf", 1, (Node("w", handler="w@1", outputs=("v",)),), inputs=("v",), outputs=("v",))


def predicates() -> st.SearchStrategy[EdgePredicate]:
    return st.one_of(
        st.just(OnAnyOutcome()),
        st.builds(OnOutcome, st.sampled_from(KINDS)),
        st.builds(OnField, st.just("v"), st.sampled_from(FIELD_VALUES)),
    )


@st.composite
def transition_graphs(draw: st.DrawFn, max_nodes: int = 7) -> WorkflowSpec:
    """Dependencies form a DAG; edges go anywhere (cycles and self-loops included); some are grouped."""
    count = draw(st.integers(2, max_nodes))
    nodes = []
    for i in range(count):
        deps = draw(st.sets(st.integers(0, i - 1), max_size=2)) if i else set()
        child = draw(st.integers(0, 5)) == 0
        retry = RetryPolicy(
            max_attempts=draw(st.integers(1, 2)),
            backoff=FixedBackoff(draw(st.sampled_from([0, 10]))),
            retry_on=(NodeOutcomeKind.RETRYABLE_FAILURE, NodeOutcomeKind.PERMANENT_FAILURE)
            if child and draw(st.booleans())
            else (NodeOutcomeKind.RETRYABLE_FAILURE,),
        )
        common = {
            "depends_on": tuple(f"n{d}" for d in sorted(deps)),
            "policy": draw(st.sampled_from(POLICIES)),
            "retry": retry,
            "max_attempts": draw(st.sampled_from([None, 2, 4])),
        }
        if child:
            mode = draw(st.sampled_from(["propagate", "require_success"]))
            call = ChildCall("leaf", 1, mode, inputs=("v",), outputs=("v",))  # type: ignore[arg-type]
            nodes.append(Node(f"n{i}", child=call, input={"v": i}, **common))  # type: ignore[arg-type]
        else:
            nodes.append(Node(f"n{i}", handler=f"h{i}@1", **common))  # type: ignore[arg-type]
    edges: list[Edge] = []
    for _ in range(draw(st.integers(0, count + 2))):
        source = draw(st.integers(0, count - 1))
        target = draw(st.integers(0, count - 1))
        edges.append(Edge(f"n{source}", f"n{target}", draw(predicates())))
    # An exclusive group: disjoint by construction (distinct values of one field, or distinct kinds).
    if draw(st.booleans()):
        source = f"n{draw(st.integers(0, count - 1))}"
        targets = draw(st.lists(st.integers(0, count - 1), min_size=2, max_size=3))
        if draw(st.booleans()):
            whens: list[EdgePredicate] = [OnField("v", value) for value in FIELD_VALUES[: len(targets)]]
        else:
            whens = [OnOutcome(kind) for kind in KINDS[1 : len(targets) + 1]]
        edges.extend(
            Edge(source, f"n{t}", when, exclusive="g") for t, when in zip(targets, whens, strict=True)
        )
    targets = {e.target for e in edges}
    initial = tuple(n.id for n in nodes if not n.depends_on and n.id not in targets) or ("n0",)
    spec = WorkflowSpec(
        "prop",
        1,
        tuple(nodes),
        edges=tuple(edges),
        initial=initial,
        budgets=RunBudgets(max_attempts=draw(st.integers(6, 40)), max_transitions=draw(st.integers(10, 60))),
        catalog=(LEAF,),
    )
    issues = validate(spec)
    assert issues == [], issues
    return spec


class Driver:
    """Applies commands through decide and reduce, checking every property after each accepted one."""

    def __init__(
        self, spec: WorkflowSpec, create: CreateRun | None = None, ids: DeterministicIdSource | None = None
    ) -> None:
        self.ids = ids or DeterministicIdSource(namespace=3)
        self.history: list[Event] = []
        self.state_: RunState | None = None
        command = create or CreateRun(run_id=self.ids.new_id(), spec=spec)
        assert not isinstance(self.execute(command), Rejection)

    @property
    def state(self) -> RunState:
        assert self.state_ is not None
        return self.state_

    def execute(self, command: Command) -> list[Event] | Rejection:
        if self.state_ is not None:
            # Determinism, and a restored snapshot decides exactly like the live state.
            again = decide(self.state_, command)
            restored = decide(RunState.from_record(self.state_.to_record()), command)
        decision = decide(self.state_, command)
        if self.state_ is not None:
            assert decision == again
            assert decision == restored
        if isinstance(decision, Rejection):
            return decision
        # The engine does not reduce a committed batch: the state takes the draft's results
        # (Draft.settle). On a copy of the state, that must give exactly what reducing gives.
        drafted = decide_draft(replay(self.history) if self.history else None, command)
        assert isinstance(drafted, Draft)
        for fact in decision:
            encoded = encode_event(fact)
            assert decode_event(encoded.event_type, encoded.schema_version, encoded.payload) == fact
            self.state_ = reduce(self.state_, fact, len(self.history) + 1)
            self.history.append(fact)
        check_counters(self.state)
        assert replay(self.history).to_record() == self.state.to_record()
        assert_same_state(drafted.settle(), self.state)
        return decision


def assert_same_state(settled: RunState, reduced: RunState) -> None:
    """Every field of both states equal, their indexes in the same order (orders are observable)."""
    for name in RunState.__slots__:
        mine, theirs = getattr(settled, name), getattr(reduced, name)
        if name == "nodes":
            assert len(mine) == len(theirs)
            for a, b in zip(mine, theirs, strict=True):
                assert_same_fields(a, b, (a.node_id,))
        elif isinstance(mine, dict):
            assert list(mine.items()) == list(theirs.items()), name
        else:
            assert mine == theirs, name


def assert_same_fields(mine: object, theirs: object, where: tuple[str, ...]) -> None:
    """The same slot values, looking inside the state's own slotted parts (a node's detail)."""
    if isinstance(mine, NodeState | NodeDetail) or isinstance(theirs, NodeState | NodeDetail):
        assert type(mine) is type(theirs), where
        for field in NodeState.__slots__ if isinstance(mine, NodeState) else NodeDetail.__slots__:
            assert_same_fields(getattr(mine, field), getattr(theirs, field), (*where, field))
    else:
        assert mine == theirs, where


def check_counters(state: RunState) -> None:
    """Every incrementally kept counter equals a direct recount from the node statuses."""
    nodes = state.nodes
    assert state.open_nodes == sum(not n.status.is_terminal for n in nodes)
    assert state.n_idle == sum(n.status.is_idle for n in nodes)
    assert state.n_failed == sum(n.status is NodeStatus.FAILED for n in nodes)
    assert state.n_blocked == sum(n.status is NodeStatus.BLOCKED for n in nodes)
    assert state.n_cancelled == sum(n.status is NodeStatus.CANCELLED for n in nodes)
    parked = [
        n.index
        for n in nodes
        if n.status is NodeStatus.CHANGES_REQUESTED
        or (n.status is NodeStatus.PENDING and not n.spec.depends_on)
    ]
    assert state.parked_nodes() == parked
    for n in nodes:
        prereqs = [state.node_by_id(d) for d in n.spec.depends_on]
        statuses = [p.status for p in prereqs if p is not None]
        assert n.done_prereqs == sum(s.is_terminal for s in statuses)
        assert n.succeeded_prereqs == statuses.count(NodeStatus.SUCCEEDED)
        assert n.blocked_prereqs == statuses.count(NodeStatus.BLOCKED)
        assert n.cancelled_prereqs == statuses.count(NodeStatus.CANCELLED)
    for n in nodes:
        closed = [
            k
            for k, edge in enumerate(state.spec.edges)
            if edge.target == n.node_id
            and (source := state.node_by_id(edge.source)) is not None
            and source.status.is_terminal
            and not source.in_edges
        ]
        assert n.closed_in == len(closed)
    if state.status.is_terminal:
        assert state.open_nodes == 0


@given(spec=transition_graphs(), data=st.data())
def test_runs_with_edges_and_children_never_hang_and_replay_equals_live(
    spec: WorkflowSpec, data: st.DataObject
) -> None:
    """Random interleavings always end (budgets bound every loop) with exact counters and replay = live."""
    run = Driver(spec)
    for _step in range(400):
        state = run.state
        if state.status.is_terminal:
            break
        ready = state.ready_nodes()
        active = [(state.node(i), attempt_id) for attempt_id, i in state.active_attempts()]
        retries = sorted(deadline for _, deadline in state.pending_retries())
        assert ready or active or retries, "the run hangs: nothing ready, running or scheduled"
        choices = (
            (["start"] if ready else []) + (["complete"] if active else []) + (["advance"] if retries else [])
        )
        choices += ["cancel"] if data.draw(st.integers(0, 40), label="rarely") == 0 else []
        op = data.draw(st.sampled_from(choices), label="op")
        command: Command
        if op == "start":
            chosen = data.draw(st.lists(st.sampled_from(ready), min_size=1, unique=True), label="start")
            starts = []
            for node_id in chosen:
                is_child = state.node_by_id(node_id).spec.child is not None  # type: ignore[union-attr]
                starts.append(AttemptStart(node_id, run.ids.new_id(), run.ids.new_id() if is_child else None))
            command = StartNodes(tuple(starts))
        elif op == "complete":
            node, attempt_id = data.draw(st.sampled_from(active), label="which")
            if node.child_run_id is not None:
                result = data.draw(st.sampled_from(RESULTS), label="child result")
                output = data.draw(
                    st.sampled_from([None, {"v": "a"}, {"v": 1}, {"x": 2}]), label="child output"
                )
                command = CompleteChild(node.node_id, attempt_id, node.child_run_id, result, output)
            else:
                command = CompleteAttempt(node.node_id, attempt_id, data.draw(st.sampled_from(OUTCOMES)))
        elif op == "advance":
            command = AdvanceTime(max(retries[0], state.now))
        else:
            command = CancelRun("prop", "random cancellation")
        decision = run.execute(command)
        assert not isinstance(decision, Rejection), decision
    assert run.state.status.is_terminal, "the run did not end within 400 commands"
    check_fingerprints(run.history)
    check_result(run.state)
    label_coverage(run.history, run.state)


def label_coverage(history: list[Event], state: RunState) -> None:
    """Hypothesis statistics (``--hypothesis-show-statistics``) showing the generator reaches each feature."""
    event(f"result {state.status.value}")
    event(f"exhausted {state.exhausted.kind.value if state.exhausted else None}")
    event(f"edges fired: {any(isinstance(e, EdgeActivated) for e in history)}")
    event(f"child completed: {any(isinstance(e, ChildCompleted) for e in history)}")
    skipped = any(
        isinstance(e, NodeOutcomeCommitted) and e.outcome == Skipped(reason="branch not selected")
        for e in history
    )
    event(f"branch not selected: {skipped}")
    unresolved = any(
        isinstance(e, NodeFailed) and e.cause is FailureCause.CORRECTION_UNRESOLVED for e in history
    )
    event(f"correction unresolved: {unresolved}")
    terminal: set[str] = set()
    reactivated = False
    for e in history:
        if isinstance(e, EdgeActivated) and e.target in terminal:
            reactivated = True
        if isinstance(e, NodeOutcomeCommitted | NodeFailed):
            terminal.add(e.node_id)
    event(f"re-activated a finished node: {reactivated}")


def check_fingerprints(history: list[Event]) -> None:
    """Each (edge, source sequence) activates once and names a committed attempt outcome of its source."""
    seen: set[tuple[int, int]] = set()
    for fact in history:
        if isinstance(fact, EdgeActivated):
            key = (fact.edge, fact.source_sequence)
            assert key not in seen
            seen.add(key)
            source = history[fact.source_sequence - 1]
            assert isinstance(source, NodeOutcomeCommitted)
            assert source.node_id == fact.source and source.attempt_id is not None


def check_result(state: RunState) -> None:
    """The terminal result follows the final node statuses (or the exhaustion / cancellation)."""
    statuses = {n.status for n in state.nodes}
    if state.exhausted is not None:
        expected = RunStatus.FAILED
    elif state.cancellation is not None:
        expected = RunStatus.CANCELLED
    elif NodeStatus.FAILED in statuses:
        expected = RunStatus.FAILED
    elif NodeStatus.BLOCKED in statuses:
        expected = RunStatus.BLOCKED
    elif NodeStatus.CANCELLED in statuses:
        expected = RunStatus.CANCELLED
    else:
        expected = RunStatus.SUCCEEDED
    assert state.status is expected


@given(spec=transition_graphs(max_nodes=5), data=st.data())
def test_the_same_commands_give_the_same_history(spec: WorkflowSpec, data: st.DataObject) -> None:
    """Two runs fed the same commands write identical histories (decide is deterministic end to end)."""
    first = Driver(spec)
    commands: list[Command] = []
    for _step in range(60):
        state = first.state
        if state.status.is_terminal:
            break
        ready = state.ready_nodes()
        active = [(state.node(i), a) for a, i in state.active_attempts()]
        retries = sorted(d for _, d in state.pending_retries())
        command: Command
        if ready:
            node_id = ready[0]
            is_child = state.node_by_id(node_id).spec.child is not None  # type: ignore[union-attr]
            command = StartNodes(
                (AttemptStart(node_id, first.ids.new_id(), first.ids.new_id() if is_child else None),)
            )
        elif active:
            node, attempt_id = active[0]
            if node.child_run_id is not None:
                result = data.draw(st.sampled_from(RESULTS))
                command = CompleteChild(node.node_id, attempt_id, node.child_run_id, result, {"v": "a"})
            else:
                command = CompleteAttempt(node.node_id, attempt_id, data.draw(st.sampled_from(OUTCOMES)))
        else:
            command = AdvanceTime(max(retries[0], state.now))
        commands.append(command)
        first.execute(command)
    second = Driver(spec)
    for command in commands:
        second.execute(command)
    assert second.history == first.history


# -- nested child runs ----------------------------------------------------------


@st.composite
def nested_specs(draw: st.DrawFn) -> WorkflowSpec:
    """root calls mid, mid calls inner (a correction loop); modes and policies are random."""
    inner = ChildDefinition(
        "inner",
        1,
        (Node("a", handler="a@1", outputs=("v",)), Node("b", handler="b@1", outputs=("v",))),
        edges=(
            Edge("a", "b", OnOutcome(NodeOutcomeKind.SUCCEEDED)),
            Edge("b", "a", OnOutcome(NodeOutcomeKind.CHANGES_REQUESTED)),
        ),
        initial=("a",),
        budgets=RunBudgets(max_attempts=draw(st.integers(2, 8))),
        inputs=("v",),
        outputs=("v",),
    )
    mid = ChildDefinition(
        "mid",
        1,
        (
            Node(
                "c",
                child=ChildCall(
                    "inner", 1, draw(st.sampled_from(["propagate", "require_success"])), ("v",), ("v",)
                ),
                input={"v": "mid"},
                outputs=("v",),
            ),
            Node(
                "d", handler="d@1", depends_on=("c",), policy=draw(st.sampled_from(POLICIES)), outputs=("v",)
            ),
        ),
        inputs=("v",),
        outputs=("v",),
    )
    root = WorkflowSpec(
        "root",
        1,
        (
            Node(
                "r",
                child=ChildCall(
                    "mid", 1, draw(st.sampled_from(["propagate", "require_success"])), ("v",), ("v",)
                ),
                # A retried call starts a new child run under a fresh child run id.
                retry=RetryPolicy(
                    max_attempts=draw(st.integers(1, 3)),
                    retry_on=(NodeOutcomeKind.RETRYABLE_FAILURE, NodeOutcomeKind.PERMANENT_FAILURE),
                    backoff=FixedBackoff(draw(st.sampled_from([0, 10]))),
                ),
            ),
            Node("s", handler="s@1"),
        ),
        edges=(Edge("r", "s", draw(predicates())),),
        catalog=(inner, mid),
    )
    assert validate(root) == []
    return root


@given(spec=nested_specs(), data=st.data())
def test_nested_child_runs_end_and_map_back_through_their_calls(
    spec: WorkflowSpec, data: st.DataObject
) -> None:
    """Parent and child runs interleave randomly; all end, and each call maps its child's result by its mode."""
    ids = DeterministicIdSource(namespace=9)
    root = Driver(spec, ids=ids)
    runs: dict[str, Driver] = {root.state.run_id: root}
    reported: set[str] = set()
    for _step in range(600):
        movable = [r for r in runs.values() if not r.state.status.is_terminal and _can_move(r.state)]
        finished = [
            r
            for r in runs.values()
            if r.state.status.is_terminal and r.state.parent and r.state.run_id not in reported
        ]
        if not movable and not finished:
            break
        if finished and (not movable or data.draw(st.booleans(), label="report first?")):
            child = data.draw(st.sampled_from(finished), label="report")
            reported.add(child.state.run_id)
            assert child.state.parent is not None
            parent = runs[child.state.parent.run_id]
            decision = parent.execute(child_completion(child.state, ("v",)))
            if isinstance(decision, Rejection):
                # Only a parent that already closed the attempt (or ended) may refuse its child's result.
                assert decision.code in (RejectionCode.RUN_TERMINAL, RejectionCode.ATTEMPT_NOT_ACTIVE), (
                    decision
                )
            continue
        run = data.draw(st.sampled_from(movable), label="run")
        state = run.state
        ready = state.ready_nodes()
        active = [
            (state.node(i), a) for a, i in state.active_attempts() if state.node(i).child_run_id is None
        ]
        retries = sorted(d for _, d in state.pending_retries())
        command: Command
        if ready:
            node_id = ready[0]
            is_child = state.node_by_id(node_id).spec.child is not None  # type: ignore[union-attr]
            command = StartNodes((AttemptStart(node_id, ids.new_id(), ids.new_id() if is_child else None),))
        elif active:
            node, attempt_id = active[0]
            outcome = data.draw(st.sampled_from(OUTCOMES), label="outcome")
            command = CompleteAttempt(node.node_id, attempt_id, outcome)
        else:
            command = AdvanceTime(max(retries[0], state.now))
        events = run.execute(command)
        assert not isinstance(events, Rejection), events
        for fact in events:
            if isinstance(fact, ChildStarted):
                create = child_create_run(run.state, fact)
                child = Driver(create.spec, create=create, ids=ids)
                assert child.state.depth == run.state.depth + 1 <= 2
                runs[child.state.run_id] = child
    assert all(r.state.status.is_terminal for r in runs.values()), "a run did not end"
    event(f"child runs: {min(len(runs) - 1, 3)}{'+' if len(runs) > 3 else ''}")
    event(f"root result {root.state.status.value}")
    for run in runs.values():
        for fact in run.history:
            if isinstance(fact, ChildCompleted):
                committed = next(
                    e
                    for e in run.history
                    if isinstance(e, NodeOutcomeCommitted) and e.attempt_id == fact.attempt_id
                )
                call = run.state.node_by_id(fact.node_id).spec.child  # type: ignore[union-attr]
                assert call is not None
                assert isinstance(committed.outcome, Succeeded) is (fact.result == "succeeded")
                if fact.result != "succeeded" and call.mode == "require_success":
                    assert isinstance(committed.outcome, PermanentFailure)


def _can_move(state: RunState) -> bool:
    """Whether the run itself can take a step (not only wait for its open child runs)."""
    return bool(
        state.ready_nodes()
        or any(state.node(i).child_run_id is None for _, i in state.active_attempts())
        or any(True for _ in state.pending_retries())
    )
