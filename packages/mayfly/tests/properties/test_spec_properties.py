"""Properties of the specification's content hash: a function of the specification's value alone."""

from __future__ import annotations

import json
import tempfile
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mayfly
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.outcomes import NodeOutcomeKind, Succeeded
from mayfly.model.spec import (
    ChildCall,
    ChildDefinition,
    DependencyPolicy,
    Edge,
    ExponentialBackoff,
    FixedBackoff,
    ImmediateBackoff,
    Node,
    OnAnyOutcome,
    OnField,
    OnOutcome,
    RetryPolicy,
    RunBudgets,
    WorkflowSpec,
)
from mayfly.recovery import inspect_run, replay_run
from mayfly.runtime import HandlerRegistry, WorkflowRuntime
from mayfly.substrate import VirtualClock

settings.register_profile("mayfly", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("mayfly")

POLICIES: tuple[DependencyPolicy, ...] = ("all_succeeded", "all_completed", "any_succeeded")
RETRY_CLASSES = (NodeOutcomeKind.RETRYABLE_FAILURE, NodeOutcomeKind.PERMANENT_FAILURE)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def drawn(draw: st.DrawFn, choices: tuple[tuple[str, st.SearchStrategy[Any]], ...]) -> dict[str, Any]:
    """Keyword arguments: each field either left out (its default) or given a drawn value."""
    return {name: draw(strategy) for name, strategy in choices if draw(st.booleans())}


@st.composite
def retry_policies(draw: st.DrawFn) -> RetryPolicy:
    fields = drawn(
        draw,
        (
            ("max_attempts", st.integers(1, 3)),
            ("retry_on", st.lists(st.sampled_from(RETRY_CLASSES), min_size=1, max_size=2, unique=True)),
            (
                "backoff",
                st.sampled_from(
                    [ImmediateBackoff(), FixedBackoff(5), ExponentialBackoff(), ExponentialBackoff(10)]
                ),
            ),
            ("jitter_max_ms", st.integers(0, 5)),
        ),
    )
    if "retry_on" in fields:
        fields["retry_on"] = tuple(fields["retry_on"])
    return RetryPolicy(**fields)


@st.composite
def budgets(draw: st.DrawFn) -> RunBudgets:
    fields = drawn(
        draw,
        (
            ("max_attempts", st.sampled_from([1_000, 10_000])),
            ("max_transitions", st.sampled_from([10_000, 100_000])),
            ("max_elapsed_ms", st.integers(60_000, 10**9)),
        ),
    )
    return RunBudgets(**fields)


@st.composite
def bodies(
    draw: st.DrawFn, prefix: str, child: ChildDefinition | None
) -> tuple[tuple[Node, ...], tuple[Edge, ...]]:
    """A DAG of nodes (each depends on earlier ones) and forward conditional edges."""
    count = draw(st.integers(1, 4))
    nodes = []
    for i in range(count):
        deps = draw(st.sets(st.integers(0, i - 1), max_size=2)) if i else set()
        fields: dict[str, Any] = {"depends_on": tuple(f"{prefix}{d}" for d in sorted(deps))}
        if child is not None and draw(st.booleans()):
            fields["child"] = ChildCall(
                child.workflow_id, child.version, draw(st.sampled_from(["propagate", "require_success"]))
            )
        else:
            fields["handler"] = "work@1"
        fields |= drawn(
            draw,
            (
                ("policy", st.sampled_from(POLICIES)),
                ("input", json_values),
                ("outputs", st.just(("verdict",))),
                ("retry", retry_policies()),
                ("max_attempts", st.integers(1, 5)),
            ),
        )
        nodes.append(Node(f"{prefix}{i}", **fields))
    edges = []
    for _ in range(draw(st.integers(0, 2))):
        if count < 3:
            break
        source = draw(st.integers(0, count - 2))
        target = draw(st.integers(source + 1, count - 1))
        if nodes[target].depends_on:
            continue  # keep the graph's first activations those of its dependencies
        when = draw(
            st.sampled_from(
                [
                    OnAnyOutcome(),
                    OnOutcome(NodeOutcomeKind.SUCCEEDED),
                    OnField("verdict", "ok"),
                    OnField("verdict", 1),
                ]
            )
        )
        edge: dict[str, Any] = (
            {} if isinstance(when, OnAnyOutcome) and draw(st.booleans()) else {"when": when}
        )
        edges.append(Edge(f"{prefix}{source}", f"{prefix}{target}", **edge))
    return tuple(nodes), tuple(edges)


@st.composite
def specs(draw: st.DrawFn) -> WorkflowSpec:
    """A valid specification exercising every struct, each optional field either left out or drawn."""
    catalog: tuple[ChildDefinition, ...] = ()
    child = None
    if draw(st.booleans()):
        nodes, edges = draw(bodies("c", None))
        child = ChildDefinition("prop.child", 1, nodes=nodes, edges=edges, budgets=draw(budgets()))
        catalog = (child,)
    nodes, edges = draw(bodies("n", child))
    extra: dict[str, Any] = {}
    if draw(st.booleans()):
        extra["jitter_seed"] = draw(st.text(max_size=5))
    return WorkflowSpec(
        "prop.spec", 1, nodes=nodes, edges=edges, budgets=draw(budgets()), catalog=catalog, **extra
    )


def distinct(value: Any) -> Any:
    """An equal copy built from distinct objects: every field spelled out, lists for tuples, fresh ints and strs."""
    if isinstance(value, msgspec.Struct):
        cls = type(value)
        return cls(**{name: distinct(getattr(value, name)) for name in cls.__struct_fields__})
    if isinstance(value, list | tuple):
        return [distinct(item) for item in value]
    if isinstance(value, dict):
        return {distinct(key): distinct(item) for key, item in value.items()}
    if isinstance(value, str):
        return json.loads(json.dumps(value))  # a new str object (beyond the cached one-character ones)
    if type(value) is int:
        return int(str(value))  # a new int object beyond the small-int cache
    return value


@given(specs())
def test_a_spec_hashes_like_its_own_json_round_trip(spec: WorkflowSpec) -> None:
    """The content hash of any spec equals that of the spec decoded from its JSON."""
    assert mayfly.reducer.validate(spec) == []
    again = WorkflowSpec.from_json(spec.to_json())
    assert again.content_hash() == spec.content_hash()
    assert again.to_json() == spec.to_json()


@given(specs())
def test_equal_specs_built_from_distinct_objects_hash_equally(spec: WorkflowSpec) -> None:
    """A copy with every default spelled out in objects of its own has the same JSON and hash."""
    copy = distinct(spec)
    assert copy is not spec
    assert copy.to_json() == spec.to_json()
    assert copy.content_hash() == spec.content_hash()


@settings(max_examples=40)
@given(specs())
def test_every_executed_run_replays(spec: WorkflowSpec) -> None:
    """A run of any spec, however its objects were built, replays, inspects and resumes from its journal."""
    registry = HandlerRegistry()
    registry.register("work", 1, lambda req: Succeeded(output={"verdict": "ok"}))
    with tempfile.TemporaryDirectory(prefix="mayfly-spec-prop-") as root:
        url = f"file://{root}/journal?durability=write"
        with LocalWorkflowJournal(url) as journal, LocalLeaseStore(url) as leases:
            runtime = WorkflowRuntime(journal, registry, leases=leases, clock=VirtualClock)
            result = runtime.execute(distinct(spec))
            assert result.status.is_terminal
            replayed = replay_run(journal, result.run_id)
            assert replayed.state.spec_hash == spec.content_hash()
            assert inspect_run(journal, result.run_id).state.to_record() == replayed.state.to_record()
            assert runtime.resume(result.run_id).status is result.status
