"""Child workflows: catalog validation, ChildStarted/ChildCompleted, call modes and nested runs."""

from __future__ import annotations

import msgspec
import pytest

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
from mayfly.model.errors import CorruptionError
from mayfly.model.events import (
    CancellationRequested,
    ChildCompleted,
    ChildStarted,
    Event,
    NodeOutcomeCommitted,
    NodeStarted,
    ParentLink,
    RunCreated,
    RunResult,
)
from mayfly.model.ids import DeterministicIdSource
from mayfly.model.json import JsonValue
from mayfly.model.outcomes import (
    Blocked,
    Cancelled,
    NodeOutcomeKind,
    PermanentFailure,
    Succeeded,
)
from mayfly.model.spec import (
    ChildCall,
    ChildDefinition,
    Edge,
    FixedBackoff,
    Node,
    OnOutcome,
    RetryPolicy,
    RunBudgets,
    WorkflowSpec,
)
from mayfly.model.state import NodeStatus, RunState, RunStatus
from mayfly.reducer import decide, reduce, replay, validate
from mayfly.reducer.children import (
    child_completion,
    child_create_run,
    child_outcome,
    child_output,
    nesting_depth,
)

IDS = DeterministicIdSource(namespace=7)

LINT = ChildDefinition(
    workflow_id="acme.lint",
    version=2,
    nodes=(
        Node("scan", handler="scan@1", outputs=("warnings", "secret")),
        Node("report", handler="report@1", depends_on=("scan",), outputs=("warnings", "summary")),
    ),
    inputs=("repo", "ref"),
    outputs=("warnings", "summary"),
    budgets=RunBudgets(max_attempts=7),
)


def parent_spec(
    mode: str = "require_success",
    retry: RetryPolicy | None = None,
    **node_kw: object,
) -> WorkflowSpec:
    """CI: checkout, then lint as a call of the acme.lint@2 catalog workflow."""
    lint = Node(
        "lint",
        child=ChildCall("acme.lint", 2, mode, inputs=("repo", "ref"), outputs=("warnings",)),  # type: ignore[arg-type]
        depends_on=("checkout",),
        retry=retry or RetryPolicy(max_attempts=1),
        **node_kw,  # type: ignore[arg-type]
    )
    return WorkflowSpec(
        "acme.ci",
        1,
        (Node("checkout", handler="checkout@1"), lint),
        catalog=(LINT,),
        jitter_seed="seed",
    )


class Run:
    """A minimal decide/reduce driver for a run created by an explicit CreateRun (so it may have a parent)."""

    def __init__(self, create: CreateRun) -> None:
        self.history: list[Event] = []
        self.state_: RunState | None = None
        self.execute(create)

    @property
    def state(self) -> RunState:
        assert self.state_ is not None
        return self.state_

    def try_execute(self, command: Command) -> list[Event] | Rejection:
        decision = decide(self.state_, command)
        if isinstance(decision, Rejection):
            return decision
        for event in decision:
            self.state_ = reduce(self.state_, event, len(self.history) + 1)
            self.history.append(event)
        return decision

    def execute(self, command: Command) -> list[Event]:
        decision = self.try_execute(command)
        assert not isinstance(decision, Rejection), decision
        return decision

    def start(self, node_id: str, *, child: bool = False) -> AttemptStart:
        start = AttemptStart(node_id, IDS.new_id(), IDS.new_id() if child else None)
        self.execute(StartNodes((start,)))
        return start


def new_run(spec: WorkflowSpec, input: JsonValue = None) -> Run:
    return Run(CreateRun(run_id=IDS.new_id(), spec=spec, input=input))


def started_child(mode: str = "require_success", **kw: object) -> tuple[Run, AttemptStart]:
    run = Run(
        CreateRun(
            run_id=IDS.new_id(),
            spec=parent_spec(mode, **kw),  # type: ignore[arg-type]
            input={"repo": "acme/app", "ref": "main", "token": "secret"},
        )
    )
    run.start("checkout")
    run.execute(CompleteAttempt("checkout", run.state.node_by_id("checkout").attempt_id, Succeeded()))  # type: ignore[arg-type, union-attr]
    return run, run.start("lint", child=True)


# -- validation -----------------------------------------------------------------


def chain(levels: int) -> WorkflowSpec:
    """A root that nests ``levels`` child levels: root -> c1 -> ... -> c<levels>."""
    catalog = []
    for i in range(1, levels + 1):
        if i < levels:
            body: tuple[Node, ...] = (Node("call", child=ChildCall(f"c{i + 1}", 1, "propagate")),)
        else:
            body = (Node("work", handler="work@1"),)
        catalog.append(ChildDefinition(f"c{i}", 1, body))
    return WorkflowSpec(
        "root", 1, (Node("call", child=ChildCall("c1", 1, "propagate")),), catalog=tuple(catalog)
    )


def test_eight_child_levels_are_accepted() -> None:
    """Nesting of exactly eight child levels below the root validates."""
    assert validate(chain(8)) == []
    assert nesting_depth(chain(8)) == 8


def test_nine_child_levels_are_rejected() -> None:
    """A ninth child level is rejected before any run exists, naming the chain and the limit."""
    assert [str(i) for i in validate(chain(9))] == [
        "catalog: child workflows nest 9 levels "
        "(root@1 -> c1@1 -> c2@1 -> c3@1 -> c4@1 -> c5@1 -> c6@1 -> c7@1 -> c8@1 -> c9@1), "
        "over the limit of 8"
    ]


def _calls(workflow_id: str) -> tuple[Node, ...]:
    return (Node("call", child=ChildCall(workflow_id, 1, "require_success")),)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            # A -> B -> A, with A (the root) also in the catalog.
            WorkflowSpec(
                "a",
                1,
                _calls("b"),
                catalog=(ChildDefinition("a", 1, _calls("b")), ChildDefinition("b", 1, _calls("a"))),
            ),
            ["catalog: recursive child workflows are not allowed: a@1 -> b@1 -> a@1"],
        ),
        (
            # Recursion among catalog entries the root does not even call is rejected too.
            WorkflowSpec(
                "root",
                1,
                (Node("work", handler="work@1"),),
                catalog=(ChildDefinition("b", 1, _calls("c")), ChildDefinition("c", 1, _calls("b"))),
            ),
            ["catalog: recursive child workflows are not allowed: b@1 -> c@1 -> b@1"],
        ),
        (
            WorkflowSpec("a", 1, _calls("a"), catalog=(ChildDefinition("a", 1, _calls("a")),)),
            ["catalog: recursive child workflows are not allowed: a@1 -> a@1"],
        ),
        (
            # The root is not implicitly callable: without a catalog entry, A -> B -> A is an unknown reference.
            WorkflowSpec("a", 1, _calls("b"), catalog=(ChildDefinition("b", 1, _calls("a")),)),
            ["catalog[b@1].nodes[call].child: calls a@1, which is not in the catalog (known: b@1)"],
        ),
        (
            WorkflowSpec("a", 1, _calls("zzz")),
            ["nodes[call].child: calls zzz@1, which is not in the catalog (known: none)"],
        ),
        (
            WorkflowSpec(
                "a",
                1,
                (Node("x", handler="x@1", child=ChildCall("b", 1, "propagate")),),
                catalog=(ChildDefinition("b", 1, (Node("w", handler="w@1"),)),),
            ),
            ["nodes[x]: a node has a handler or a child call, not both"],
        ),
        (
            WorkflowSpec(
                "a",
                1,
                _calls("b"),
                catalog=(
                    ChildDefinition("b", 1, (Node("w", handler="w@1"),)),
                    ChildDefinition("b", 1, (Node("w", handler="w@2"),)),
                ),
            ),
            ["catalog[1]: duplicate catalog entry b@1; versions are immutable"],
        ),
        (
            WorkflowSpec(
                "a",
                1,
                _calls("b"),
                catalog=(
                    ChildDefinition("a", 1, (Node("other", handler="o@1"),)),
                    ChildDefinition("b", 1, (Node("w", handler="BAD"),)),
                ),
            ),
            [
                "catalog[a@1]: has this workflow's own id and version but a different definition",
                "catalog[b@1].nodes[w].handler: invalid handler reference 'BAD': "
                "expected name@version, e.g. 'review@1'",
            ],
        ),
    ],
)
def test_catalog_validation_table(spec: WorkflowSpec, expected: list[str]) -> None:
    """References resolve only in the closed catalog; recursion and malformed entries are rejected."""
    assert [str(i) for i in validate(spec)] == expected


def test_mapped_fields_must_be_declared() -> None:
    """A call copies only fields the child declares, and its outputs must be the node's declared outputs."""
    spec = WorkflowSpec(
        "a",
        1,
        (
            Node(
                "lint",
                child=ChildCall(
                    "acme.lint", 2, "propagate", inputs=("repo", "password"), outputs=("secret", "summary")
                ),
                outputs=("warnings",),
            ),
        ),
        catalog=(
            LINT,
            ChildDefinition(
                "acme.bad", 1, (Node("w", handler="w@1"),), outputs=("ghost",), inputs=("x", "x")
            ),
        ),
    )
    assert [str(i) for i in validate(spec)] == [
        "nodes[lint].child.inputs[1]: acme.lint@2 does not declare input 'password'",
        "nodes[lint].child.outputs[0]: acme.lint@2 does not declare output 'secret'",
        "nodes[lint].child.outputs[1]: node 'lint' does not declare output 'summary' in its own outputs",
        "catalog[acme.bad@1].inputs[1]: duplicate input name 'x'",
        "catalog[acme.bad@1].outputs[0]: output 'ghost' is not declared in the outputs of any node",
    ]


def test_the_parent_spec_validates() -> None:
    """The CI example with a lint child call is valid."""
    assert validate(parent_spec()) == []


# -- starting a child -----------------------------------------------------------


def test_child_start_records_one_parent_attempt_and_the_mapped_input() -> None:
    """StartNodes on a child-call node emits ChildStarted with only the declared input fields."""
    run, start = started_child(input={"ref": "pinned", "extra": 1})
    event = run.history[-1]
    assert event == ChildStarted(
        node_id="lint",
        attempt_id=start.attempt_id,
        attempt=1,
        child_run_id=start.child_run_id,  # type: ignore[arg-type]
        workflow_id="acme.lint",
        version=2,
        input={"repo": "acme/app", "ref": "pinned"},  # node input overlays the run input
        at=0,
    )
    lint = run.state.node_by_id("lint")
    assert lint is not None and lint.status is NodeStatus.RUNNING
    assert (lint.total_attempts, run.state.attempts_used) == (1, 2)
    assert run.state.child_attempt(start.child_run_id) == start.attempt_id  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("child_run_id", "code"),
    [
        (None, RejectionCode.INVALID_INPUT),
        ("not-a-uuid", RejectionCode.INVALID_INPUT),
    ],
)
def test_a_child_start_needs_a_fresh_child_run_id(child_run_id: str | None, code: RejectionCode) -> None:
    """Child run ids come from the runtime's IdSource; a missing or malformed one is rejected."""
    fresh = new_run(parent_spec())
    fresh.start("checkout")
    fresh.execute(CompleteAttempt("checkout", fresh.state.node_by_id("checkout").attempt_id, Succeeded()))  # type: ignore[arg-type, union-attr]
    decision = decide(fresh.state, StartNodes((AttemptStart("lint", IDS.new_id(), child_run_id),)))
    assert isinstance(decision, Rejection) and decision.code is code


def test_a_child_run_id_is_never_reused() -> None:
    """A retry must start a new child run; reusing the previous child run id is rejected."""
    retry = RetryPolicy(
        max_attempts=2, retry_on=(NodeOutcomeKind.PERMANENT_FAILURE,), backoff=FixedBackoff(0)
    )
    run, start = started_child(retry=retry)
    run.execute(CompleteChild("lint", start.attempt_id, start.child_run_id, "failed"))  # type: ignore[arg-type]
    assert run.state.node_by_id("lint").status is NodeStatus.READY  # type: ignore[union-attr]
    reused = decide(run.state, StartNodes((AttemptStart("lint", IDS.new_id(), start.child_run_id),)))
    assert isinstance(reused, Rejection) and reused.code is RejectionCode.ATTEMPT_ID_USED
    again = run.start("lint", child=True)
    assert again.child_run_id != start.child_run_id
    event = run.history[-1]
    assert isinstance(event, ChildStarted) and event.attempt == 2


def test_a_handler_node_takes_no_child_run_id() -> None:
    """Giving a handler node a child run id is a typed rejection."""
    run = new_run(parent_spec())
    decision = decide(run.state, StartNodes((AttemptStart("checkout", IDS.new_id(), IDS.new_id()),)))
    assert isinstance(decision, Rejection) and decision.code is RejectionCode.INVALID_INPUT


# -- completing a child ---------------------------------------------------------


def test_child_success_copies_only_declared_outputs() -> None:
    """A succeeded child gives the parent Succeeded with the call's declared output fields only."""
    run, start = started_child()
    events = run.execute(
        CompleteChild(
            "lint", start.attempt_id, start.child_run_id, "succeeded", {"warnings": 3, "secret": "x"}
        )  # type: ignore[arg-type]
    )
    assert events[:2] == [
        ChildCompleted(
            node_id="lint",
            attempt_id=start.attempt_id,
            child_run_id=start.child_run_id,  # type: ignore[arg-type]
            result="succeeded",
            output={"warnings": 3},
        ),
        NodeOutcomeCommitted(
            node_id="lint", outcome=Succeeded(output={"warnings": 3}), attempt_id=start.attempt_id
        ),
    ]
    assert run.state.status is RunStatus.SUCCEEDED
    assert replay(run.history).to_record() == run.state.to_record()


@pytest.mark.parametrize(
    ("mode", "result", "outcome_class", "node_status", "run_status"),
    [
        ("require_success", "failed", PermanentFailure, NodeStatus.FAILED, RunStatus.FAILED),
        ("require_success", "blocked", PermanentFailure, NodeStatus.FAILED, RunStatus.FAILED),
        ("require_success", "cancelled", PermanentFailure, NodeStatus.FAILED, RunStatus.FAILED),
        ("propagate", "failed", PermanentFailure, NodeStatus.FAILED, RunStatus.FAILED),
        ("propagate", "blocked", Blocked, NodeStatus.BLOCKED, RunStatus.BLOCKED),
        ("propagate", "cancelled", Cancelled, NodeStatus.CANCELLED, RunStatus.CANCELLED),
    ],
)
def test_child_failure_under_each_call_mode(
    mode: str, result: RunResult, outcome_class: type, node_status: NodeStatus, run_status: RunStatus
) -> None:
    """A non-success child is never parent success: require_success fails it, propagate copies the class."""
    run, start = started_child(mode)
    run.execute(CompleteChild("lint", start.attempt_id, start.child_run_id, result, {"warnings": 0}))  # type: ignore[arg-type]
    lint = run.state.node_by_id("lint")
    assert lint is not None
    assert type(lint.last_outcome) is outcome_class
    assert start.child_run_id in lint.last_outcome.reason  # type: ignore[union-attr, operator]
    assert result in lint.last_outcome.reason  # type: ignore[union-attr, operator]
    assert lint.status is node_status
    assert run.state.status is run_status
    completed = next(e for e in run.history if isinstance(e, ChildCompleted))
    assert completed.output is None


def test_child_outcome_mapping_table() -> None:
    """The mapping function itself: only succeeded maps to Succeeded, whatever the mode."""
    for mode in ("propagate", "require_success"):
        call = ChildCall("w", 1, mode, outputs=("a",))  # type: ignore[arg-type]
        assert child_outcome(call, "c", "succeeded", {"a": 1, "b": 2}) == Succeeded(output={"a": 1})
        assert child_outcome(call, "c", "succeeded", "not an object") == Succeeded(output={})
        for result in ("failed", "blocked", "cancelled"):
            assert not isinstance(child_outcome(call, "c", result, {"a": 1}), Succeeded)  # type: ignore[arg-type]


def test_a_child_attempt_is_completed_only_by_its_child() -> None:
    """CompleteAttempt cannot close a child attempt, and a foreign child run id is a mismatch."""
    run, start = started_child()
    as_handler = decide(run.state, CompleteAttempt("lint", start.attempt_id, Succeeded()))
    assert isinstance(as_handler, Rejection) and as_handler.code is RejectionCode.CHILD_MISMATCH
    foreign = decide(run.state, CompleteChild("lint", start.attempt_id, IDS.new_id(), "succeeded"))
    assert isinstance(foreign, Rejection) and foreign.code is RejectionCode.CHILD_MISMATCH
    unknown = decide(run.state, CompleteChild("lint", IDS.new_id(), start.child_run_id, "succeeded"))  # type: ignore[arg-type]
    assert isinstance(unknown, Rejection) and unknown.code is RejectionCode.ATTEMPT_NOT_ACTIVE


def test_child_results_are_idempotent_and_conflicts_are_rejected() -> None:
    """Re-delivering the same child result writes nothing; a different one is rejected."""
    run, start = started_child()
    run.execute(CompleteChild("lint", start.attempt_id, start.child_run_id, "succeeded", {"warnings": 1}))  # type: ignore[arg-type]
    same = CompleteChild("lint", start.attempt_id, start.child_run_id, "succeeded", {"warnings": 1, "x": 2})  # type: ignore[arg-type]
    assert decide(run.state, same) == []
    other = decide(run.state, CompleteChild("lint", start.attempt_id, start.child_run_id, "failed"))  # type: ignore[arg-type]
    assert isinstance(other, Rejection) and other.code is RejectionCode.CONFLICTING_OUTCOME


def test_cancellation_names_the_child_run_to_cancel() -> None:
    """A cancellation target for an active child attempt carries its child run id."""
    run, start = started_child()
    run.execute(CancelRun("alice", "superseded"))
    request = next(e for e in run.history if isinstance(e, CancellationRequested))
    assert [(t.node_id, t.attempt_id, t.child_run_id) for t in request.targets] == [
        ("lint", start.attempt_id, start.child_run_id)
    ]
    late = decide(run.state, CompleteChild("lint", start.attempt_id, start.child_run_id, "succeeded"))  # type: ignore[arg-type]
    assert isinstance(late, Rejection) and late.code is RejectionCode.ATTEMPT_NOT_ACTIVE


def test_a_child_attempt_deadline_times_out_the_parent_attempt() -> None:
    """An expired attempt deadline closes the child attempt; the child's late result is rejected."""
    retry = RetryPolicy(max_attempts=1, attempt_deadline_ms=1000)
    run, start = started_child(retry=retry)
    started = run.history[-1]
    assert isinstance(started, ChildStarted) and started.deadline == 1000
    run.execute(AdvanceTime(1000))
    assert run.state.node_by_id("lint").status is NodeStatus.FAILED  # type: ignore[union-attr]
    late = decide(run.state, CompleteChild("lint", start.attempt_id, start.child_run_id, "succeeded"))  # type: ignore[arg-type]
    assert isinstance(late, Rejection) and late.code is RejectionCode.ATTEMPT_NOT_ACTIVE


def test_child_attempts_consume_the_parent_attempt_budget() -> None:
    """A child start counts as one parent attempt: a node attempt budget stops the next child."""
    retry = RetryPolicy(
        max_attempts=5, retry_on=(NodeOutcomeKind.PERMANENT_FAILURE,), backoff=FixedBackoff(0)
    )
    run, start = started_child(retry=retry, max_attempts=1)
    run.execute(CompleteChild("lint", start.attempt_id, start.child_run_id, "failed"))  # type: ignore[arg-type]
    lint = run.state.node_by_id("lint")
    assert lint is not None and lint.status is NodeStatus.FAILED and lint.total_attempts == 1


def test_edges_fire_on_a_child_call_outcome() -> None:
    """A child call's mapped outcome selects edges like any other final outcome."""
    spec = WorkflowSpec(
        "acme.ci",
        1,
        (
            Node("lint", child=ChildCall("acme.lint", 2, "propagate", outputs=("warnings",))),
            Node("fix", handler="fix@1"),
        ),
        edges=(Edge("lint", "fix", OnOutcome(NodeOutcomeKind.BLOCKED)),),
        catalog=(LINT,),
    )
    run = new_run(spec)
    start = run.start("lint", child=True)
    run.execute(CompleteChild("lint", start.attempt_id, start.child_run_id, "blocked"))  # type: ignore[arg-type]
    assert run.state.node_by_id("fix").status is NodeStatus.READY  # type: ignore[union-attr]


# -- child runs -----------------------------------------------------------------


def test_child_create_run_builds_the_child_from_the_catalog() -> None:
    """The helper pins the catalog spec, the mapped input and the parent link; decide accepts it."""
    run, start = started_child()
    started = run.history[-1]
    assert isinstance(started, ChildStarted)
    create = child_create_run(run.state, started)
    assert create.run_id == start.child_run_id
    assert (create.spec.workflow_id, create.spec.version) == ("acme.lint", 2)
    assert create.spec.nodes == LINT.nodes and create.spec.budgets == LINT.budgets
    assert create.spec.catalog == run.state.spec.catalog
    assert create.input == {"repo": "acme/app", "ref": "main"}
    assert create.parent == ParentLink(run.state.run_id, "lint", start.attempt_id, 1)
    child = Run(create)
    created = child.history[0]
    assert isinstance(created, RunCreated) and created.parent == create.parent
    assert child.state.depth == 1


def test_a_nested_child_runs_to_completion_and_reports_to_its_parent() -> None:
    """Drive the child run with scripted outcomes; its completion maps back into the parent."""
    run, _ = started_child()
    started = run.history[-1]
    assert isinstance(started, ChildStarted)
    child = Run(child_create_run(run.state, started))
    child.start("scan")
    child.execute(
        CompleteAttempt(
            "scan",
            child.state.node_by_id("scan").attempt_id,
            Succeeded(output={"warnings": 9, "secret": "s"}),
        )  # type: ignore[arg-type, union-attr]
    )
    child.start("report")
    child.execute(
        CompleteAttempt(
            "report",
            child.state.node_by_id("report").attempt_id,
            Succeeded(output={"warnings": 2, "summary": "ok"}),
        )  # type: ignore[arg-type, union-attr]
    )
    assert child.state.status is RunStatus.SUCCEEDED
    assert child_output(child.state, LINT.outputs) == {"warnings": 2, "summary": "ok"}
    completion = child_completion(child.state, LINT.outputs)
    run.execute(completion)
    lint = run.state.node_by_id("lint")
    assert lint is not None and lint.last_outcome == Succeeded(output={"warnings": 2})
    assert run.state.status is RunStatus.SUCCEEDED


def test_child_completion_refuses_a_running_child() -> None:
    """The completion helper needs a terminal child run."""
    run, _ = started_child()
    started = run.history[-1]
    assert isinstance(started, ChildStarted)
    child = Run(child_create_run(run.state, started))
    with pytest.raises(ValueError, match="still running"):
        child_completion(child.state, LINT.outputs)


@pytest.mark.parametrize(("depth", "accepted"), [(1, True), (8, True), (9, False), (0, False)])
def test_child_run_depth_is_bounded_at_creation(depth: int, accepted: bool) -> None:
    """A child run's depth plus its own nesting must stay within eight levels."""
    spec = WorkflowSpec("leaf", 1, (Node("w", handler="w@1"),))
    create = CreateRun(
        run_id=IDS.new_id(), spec=spec, parent=ParentLink(IDS.new_id(), "n", IDS.new_id(), depth)
    )
    decision = decide(None, create)
    assert isinstance(decision, list) is accepted


def test_a_deep_child_cannot_call_deeper() -> None:
    """A child at depth 8 whose spec calls another level is rejected before it exists."""
    spec = chain(1)
    create = CreateRun(run_id=IDS.new_id(), spec=spec, parent=ParentLink(IDS.new_id(), "n", IDS.new_id(), 8))
    decision = decide(None, create)
    assert isinstance(decision, Rejection) and "would nest 9 child levels" in decision.message


def test_run_created_with_a_parent_link_has_pinned_bytes() -> None:
    """The optional parent link adds one field to RunCreated; runs without one encode as before."""
    spec = WorkflowSpec("leaf", 1, (Node("w", handler="w@1"),))
    link = ParentLink(
        "0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a5b", "lint", "0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a60", 1
    )
    event = RunCreated(
        run_id="0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a62", spec=spec, spec_hash="sha256:x", parent=link
    )
    encoded = msgspec.json.encode(event)
    assert encoded.endswith(
        b',"parent":{"run_id":"0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a5b","node_id":"lint",'
        b'"attempt_id":"0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a60","depth":1}}'
    )
    assert b"parent" not in msgspec.json.encode(msgspec.structs.replace(event, parent=None))
    assert msgspec.json.decode(encoded, type=RunCreated) == event


def test_child_state_round_trips_through_its_record() -> None:
    """Open child attempts and parent links survive the state record (snapshots)."""
    from mayfly.model.state import RunStateRecord

    run, start = started_child()
    record = msgspec.json.decode(msgspec.json.encode(run.state.to_record()), type=RunStateRecord)
    restored = RunState.from_record(record)
    assert restored.child_attempt(start.child_run_id) == start.attempt_id  # type: ignore[arg-type]
    assert restored.node_by_id("lint").child_run_id == start.child_run_id  # type: ignore[union-attr]
    command = CompleteChild("lint", start.attempt_id, start.child_run_id, "succeeded", {"warnings": 0})  # type: ignore[arg-type]
    assert decide(restored, command) == decide(run.state, command)


def test_a_retryable_child_outcome_follows_the_retry_policy() -> None:
    """A propagated failure with a retry policy naming it starts a new child run after backoff."""
    retry = RetryPolicy(
        max_attempts=2, retry_on=(NodeOutcomeKind.PERMANENT_FAILURE,), backoff=FixedBackoff(50)
    )
    run, start = started_child("propagate", retry=retry)
    run.execute(CompleteChild("lint", start.attempt_id, start.child_run_id, "failed"))  # type: ignore[arg-type]
    assert run.state.node_by_id("lint").status is NodeStatus.RETRY_PENDING  # type: ignore[union-attr]
    run.execute(AdvanceTime(50))
    second = run.start("lint", child=True)
    run.execute(CompleteChild("lint", second.attempt_id, second.child_run_id, "succeeded", {"warnings": 0}))  # type: ignore[arg-type]
    assert run.state.status is RunStatus.SUCCEEDED
    assert replay(run.history).to_record() == run.state.to_record()


def test_forged_child_history_fails_closed() -> None:
    """Replay rejects a reused child run id, a handler start of a child node and a foreign completion."""
    run, start = started_child()
    started = run.history[-1]
    assert isinstance(started, ChildStarted)
    state = replay(run.history)
    foreign = ChildCompleted(
        node_id="lint", attempt_id=start.attempt_id, child_run_id=IDS.new_id(), result="succeeded"
    )
    with pytest.raises(CorruptionError, match="is not the open child of attempt"):
        reduce(state, foreign, state.sequence + 1)
    # A second start of the same node reusing the child run id (after a forged ready) is corruption too.
    retry = RetryPolicy(
        max_attempts=2, retry_on=(NodeOutcomeKind.PERMANENT_FAILURE,), backoff=FixedBackoff(0)
    )
    run, start = started_child(retry=retry)
    run.execute(CompleteChild("lint", start.attempt_id, start.child_run_id, "failed"))  # type: ignore[arg-type]
    state = replay(run.history)
    reused = msgspec.structs.replace(
        started, attempt_id=IDS.new_id(), attempt=2, child_run_id=start.child_run_id
    )
    with pytest.raises(CorruptionError, match="was already used"):
        reduce(state, reused, state.sequence + 1)
    as_handler = NodeStarted(node_id="lint", attempt_id=IDS.new_id(), attempt=2, at=0)
    with pytest.raises(CorruptionError, match="it starts with ChildStarted"):
        reduce(state, as_handler, state.sequence + 1)
