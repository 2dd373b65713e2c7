"""Specification validation reports every problem at once, each with its path."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import pytest
from conftest import node, workflow

from mayfly.model.errors import InvalidJSONValue, LimitExceeded, SpecValidationError, ValidationIssue
from mayfly.model.outcomes import NodeOutcomeKind
from mayfly.model.spec import ExponentialBackoff, Node, RetryPolicy, RunBudgets, WorkflowSpec
from mayfly.reducer import check_input, ensure_valid, validate
from mayfly.reducer.validate import validate_and_hash


def messages(spec: WorkflowSpec) -> list[str]:
    return [str(issue) for issue in validate(spec)]


def test_a_valid_spec_has_no_issues() -> None:
    """A small DAG with defaults validates cleanly."""
    assert validate(workflow(node("plan"), node("impl", "plan"), node("qa", "impl"))) == []


def test_every_problem_is_reported_at_once() -> None:
    """Several independent problems are all listed, in a stable order."""
    spec = workflow(
        node("plan"),
        node("plan"),
        node("review", "plan", "impl", "qa"),
        Node("Bad", handler="x"),
    )
    assert messages(spec) == [
        "nodes[plan].id: duplicate node id 'plan' (also at position 0)",
        "nodes[3].id: invalid node id 'Bad': expected [a-z][a-z0-9_-]{0,62}",
        "nodes[3].handler: invalid handler reference 'x': expected name@version, e.g. 'review@1'",
        "nodes[review].depends_on[1]: unknown node 'impl'",
        "nodes[review].depends_on[2]: unknown node 'qa'",
    ]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            workflow(node("a", "a")),
            "nodes[a].depends_on[0]: a node cannot depend on itself",
        ),
        (
            workflow(node("a"), node("b", "a", "a")),
            "nodes[b].depends_on[1]: duplicate dependency 'a'",
        ),
        (
            workflow(node("a"), node("b", "c"), node("c", "b")),
            "nodes: dependency cycle among unconditional depends_on edges through: b, c",
        ),
        (
            workflow(node("a"), node("b"), initial=("a",)),
            "nodes[b]: can never become ready: not in initial, no depends_on and no incoming edge",
        ),
        (
            workflow(node("a"), initial=("z",)),
            "initial[0]: unknown node 'z'",
        ),
        (
            workflow(node("a"), initial=()),
            "initial: when given, initial must name at least one node",
        ),
        (
            workflow(node("a"), budgets=RunBudgets(max_attempts=0)),
            "budgets.max_attempts: must be >= 1, got 0",
        ),
        (
            workflow(node("a", retry=RetryPolicy(max_attempts=0))),
            "nodes[a].retry.max_attempts: must be >= 1, got 0",
        ),
        (
            workflow(node("a", retry=RetryPolicy(retry_on=(NodeOutcomeKind.CHANGES_REQUESTED,)))),
            "nodes[a].retry.retry_on[0]: changes_requested is never retried; route it with a correction edge",
        ),
        (
            workflow(node("a", retry=RetryPolicy(retry_on=(NodeOutcomeKind.BLOCKED,)))),
            "nodes[a].retry.retry_on[0]: blocked cannot be retried (only retryable_failure, permanent_failure)",
        ),
        (
            workflow(
                node("a", retry=RetryPolicy(backoff=ExponentialBackoff(initial_ms=500, maximum_ms=100)))
            ),
            "nodes[a].retry.backoff.maximum_ms: must be >= initial_ms (500), got 100",
        ),
        (
            workflow(node("a", input="x" * 70_000)),
            "nodes[a].input: inline input (use artifact references) is 70002 bytes, "
            "over the limit of 65536 bytes",
        ),
        (
            workflow(Node("a")),
            "nodes[a].handler: a node needs a handler ('name@version')",
        ),
        (
            WorkflowSpec(workflow_id="w", version=1, nodes=()),
            "nodes: a workflow needs at least one node",
        ),
        (
            WorkflowSpec(workflow_id="W", version=0, nodes=(node("a"),)),
            "workflow_id: invalid workflow id 'W': expected "
            "[a-z][a-z0-9_-]{0,62}(\\.[a-z][a-z0-9_-]{0,62})*, at most 255 chars",
        ),
    ],
)
def test_single_problem_is_located(spec: WorkflowSpec, expected: str) -> None:
    """Each rule reports its problem at the offending path."""
    assert expected in messages(spec)


def test_unknown_schema_version_fails_closed() -> None:
    """A spec written for an unknown schema version is rejected, not interpreted."""
    spec = msgspec.structs.replace(workflow(node("a")), schema_version=2)
    assert messages(spec) == ["schema_version: unknown specification schema version 2 (this Mayfly reads 1)"]


def test_wrong_types_from_python_are_caught() -> None:
    """Structs built in Python skip decoding checks; validation applies them with a path."""
    spec = workflow(Node("a", handler="a@1", policy="sometimes"))  # type: ignore[arg-type]
    (issue,) = validate(spec)
    assert "$.nodes[0].policy" in issue.message


def test_ensure_valid_raises_with_all_issues() -> None:
    """ensure_valid raises SpecValidationError carrying every issue."""
    with pytest.raises(SpecValidationError) as info:
        ensure_valid(workflow(node("a", "x"), node("b", "y")))
    assert info.value.issues == (
        ValidationIssue("nodes[a].depends_on[0]", "unknown node 'x'"),
        ValidationIssue("nodes[b].depends_on[0]", "unknown node 'y'"),
    )
    assert "2 problem(s)" in str(info.value)


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (
            {1: "a"},
            InvalidJSONValue,
            "run input is not JSON: it has the object key 1, and JSON keys are strings",
        ),
        ([10**4300], InvalidJSONValue, "run input holds an integer of more than 4300 digits"),
        (
            {"x": [float("nan")]},
            InvalidJSONValue,
            "run input is not JSON: it contains the non-finite number nan",
        ),
        (object(), InvalidJSONValue, "run input is not JSON-serializable"),
        (_nested(129), LimitExceeded, "run input nesting is 129 levels, over the limit of 128 levels"),
        (_nested(995), LimitExceeded, "run input nesting is 995 levels, over the limit of 128 levels"),
    ],
    ids=["int-key", "long-integer", "nan", "object", "just-too-deep", "recursion-deep"],
)
def test_inputs_that_would_not_read_back_are_refused_with_typed_errors(
    value: object, error: type[Exception], message: str
) -> None:
    """check_input refuses what JSON cannot carry back unchanged, as a typed ValueError naming the problem."""
    with pytest.raises(error, match=re.escape(message)):
        check_input(value, "run input")
    assert issubclass(error, ValueError)


def test_inputs_at_the_limits_are_accepted() -> None:
    """128 levels and 4,300-digit integers are inside the limits."""
    check_input({"deep": _nested(127), "long": -(10**4300 - 1)}, "run input")


@pytest.mark.parametrize(
    ("node", "issue"),
    [
        (
            Node("a", handler="a@1", max_attempts=float("nan")),
            "nodes[a].max_attempts: does not read back unchanged",
        ),  # type: ignore[arg-type]
        (Node("a", handler="a@1", input=_nested(200)), "nodes[a].input: input nesting is 200 levels"),
        (
            Node("a", handler="a@1", input=_nested(995)),
            "malformed specification: nested too deeply to encode as JSON",
        ),
        (Node("a", handler="a@1", input={1: "a"}), "malformed specification:"),
        (Node("a", handler="a@1", input=[10**5000]), "malformed specification:"),
    ],
    ids=["nan-in-a-typed-field", "deep-input", "recursion-deep-input", "int-key", "long-integer"],
)
def test_a_spec_that_would_replay_differently_is_invalid(node: Node, issue: str) -> None:
    """A Python-built spec whose JSON would read back as another spec, or not at all, fails validation."""
    (found,) = messages(workflow(node))
    assert found.startswith(issue)


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_a_spec_is_refused_even_after_its_json_twin_was_accepted(value: float) -> None:
    """A non-finite input is written as null, so its spec has the JSON of a valid one: validating that twin
    first (memoised by its JSON) must not let the non-finite one through, then or later."""
    twin = workflow(Node("a", handler="a@1", input={"x": None}))
    bad = workflow(Node("a", handler="a@1", input={"x": value}))
    assert twin.to_json() == bad.to_json()
    for _ in range(2):
        assert validate(twin) == []
        (found,) = messages(bad)
        assert found.startswith("nodes[a].input: input is not JSON: it contains the non-finite number")


def test_a_spec_validated_again_gets_the_same_answer_and_hash() -> None:
    """The memo of specs validated before answers exactly what a first validation does."""
    spec = workflow(
        Node("a", handler="a@1", input={"n": [1, 2.5, "x"]}), Node("b", handler="b@1", depends_on=("a",))
    )
    first = validate_and_hash(spec)
    again = validate_and_hash(WorkflowSpec.from_json(spec.to_json()))
    assert first == again == ([], spec.content_hash())
