"""The serializable specification: JSON round trips and a stable content hash."""

from __future__ import annotations

import json

import msgspec
import pytest

from mayfly.model.errors import InvalidIdentifier, SpecDecodeError, SpecValidationError
from mayfly.model.json import content_hash
from mayfly.model.outcomes import NodeOutcomeKind
from mayfly.model.spec import (
    ChildCall,
    ChildDefinition,
    Edge,
    ExponentialBackoff,
    Node,
    OnAnyOutcome,
    RetryPolicy,
    RunBudgets,
    WorkflowSpec,
    parse_handler_ref,
)

SPEC = WorkflowSpec(
    workflow_id="acme.review",
    version=3,
    nodes=(
        Node("plan", handler="plan@1", input={"b": 2, "a": 1}),
        Node("review", handler="review@2", depends_on=("plan",), retry=RetryPolicy(max_attempts=5)),
    ),
)


def test_json_round_trip_is_lossless() -> None:
    """A spec decoded from its own JSON equals the original."""
    assert WorkflowSpec.from_json(SPEC.to_json()) == SPEC


def test_content_hash_is_independent_of_key_order() -> None:
    """Input objects with the same members in another order hash identically."""
    other = msgspec.structs.replace(
        SPEC, nodes=(msgspec.structs.replace(SPEC.nodes[0], input={"a": 1, "b": 2}), SPEC.nodes[1])
    )
    assert other.content_hash() == SPEC.content_hash()


def test_content_hash_is_pinned() -> None:
    """The canonical bytes and hash of a fixed spec never change across runs, machines or releases."""
    assert SPEC.to_json() == (
        b'{"budgets":{},"catalog":[],"edges":[],"initial":null,"jitter_seed":"",'
        b'"nodes":[{"handler":"plan@1","id":"plan","input":{"a":1,"b":2}},'
        b'{"depends_on":["plan"],"handler":"review@2","id":"review","retry":{"max_attempts":5}}],'
        b'"schema_version":1,"version":3,"workflow_id":"acme.review"}'
    )
    assert SPEC.content_hash() == ("sha256:adb22596c24b5fad64df2d62ed8f1184ea902d79d46c4837ebad6b091e77ac24")


def test_unknown_fields_are_rejected_with_their_path() -> None:
    """A misspelled field fails decoding with a typed error that names where it is."""
    data = b'{"workflow_id":"w","version":1,"nodes":[{"id":"a","handler":"a@1","dependson":[]}]}'
    with pytest.raises(SpecDecodeError, match=r"at \$\.nodes\[0\]: .*dependson") as caught:
        WorkflowSpec.from_json(data)
    assert (caught.value.path, caught.value.problem) == (
        "$.nodes[0]",
        "Object contains unknown field `dependson`",
    )


def test_defaults_match_the_adr() -> None:
    """Default budgets are 10,000 attempts and 100,000 transitions; retries 3, exponential 1s..60s."""
    assert SPEC.budgets.max_attempts == 10_000
    assert SPEC.budgets.max_transitions == 100_000
    assert SPEC.budgets.max_elapsed_ms is None
    policy = RetryPolicy()
    assert policy.max_attempts == 3
    assert policy.backoff == ExponentialBackoff(initial_ms=1000, multiplier=2, maximum_ms=60000)
    assert policy.jitter_max_ms == 0
    assert SPEC.nodes[0].policy == "all_succeeded"


@pytest.mark.parametrize("value", ["review@1", "acme.review-v2@12"])
def test_handler_references_parse(value: str) -> None:
    """``name@version`` parses into a name and a positive version."""
    ref = parse_handler_ref(value)
    assert str(ref) == value


@pytest.mark.parametrize("value", ["review", "review@0", "review@01", "Review@1", "@1", "r@x"])
def test_malformed_handler_references_are_rejected(value: str) -> None:
    """Missing or zero versions and bad names are rejected showing the value."""
    with pytest.raises(InvalidIdentifier, match="handler reference"):
        parse_handler_ref(value)


def _spec(*nodes: Node, **fields: object) -> WorkflowSpec:
    return WorkflowSpec("acme.review", 1, nodes=nodes, **fields)  # type: ignore[arg-type]


RETRYABLE = NodeOutcomeKind.RETRYABLE_FAILURE
SPELLED_DEFAULTS = {
    "policy from JSON": _spec(Node("a", handler="a@1", policy=json.loads('"all_succeeded"'))),
    "empty list": _spec(Node("a", handler="a@1", depends_on=[], outputs=[], artifacts=[])),  # type: ignore[arg-type]
    "fresh retry policy": _spec(Node("a", handler="a@1", retry=RetryPolicy())),
    "every retry field": _spec(
        Node(
            "a",
            handler="a@1",
            retry=RetryPolicy(
                max_attempts=int("3"),
                retry_on=[RETRYABLE],  # type: ignore[arg-type]
                backoff=ExponentialBackoff(int("1000"), int("2"), int("60000")),
                jitter_max_ms=int("0"),
            ),
        )
    ),
    "enum as its value": _spec(Node("a", handler="a@1", retry=RetryPolicy(retry_on=("retryable_failure",)))),  # type: ignore[arg-type]
    "budgets": _spec(Node("a", handler="a@1"), budgets=RunBudgets(int("10000"), int("100000"))),
    "edge predicate": _spec(
        Node("a", handler="a@1"), Node("b", handler="b@1"), edges=(Edge("a", "b", OnAnyOutcome()),)
    ),
    "child call and catalog": _spec(
        Node("a", child=ChildCall("acme.child", 1, "propagate", inputs=[], outputs=[])),  # type: ignore[arg-type]
        catalog=(
            ChildDefinition("acme.child", 1, (Node("c", handler="c@1"),), edges=[], budgets=RunBudgets()),
        ),  # type: ignore[arg-type]
    ),
}
LEFT_OUT = {
    "policy from JSON": _spec(Node("a", handler="a@1")),
    "empty list": _spec(Node("a", handler="a@1")),
    "fresh retry policy": _spec(Node("a", handler="a@1")),
    "every retry field": _spec(Node("a", handler="a@1")),
    "enum as its value": _spec(Node("a", handler="a@1")),
    "budgets": _spec(Node("a", handler="a@1")),
    "edge predicate": _spec(Node("a", handler="a@1"), Node("b", handler="b@1"), edges=(Edge("a", "b"),)),
    "child call and catalog": _spec(
        Node("a", child=ChildCall("acme.child", 1, "propagate")),
        catalog=(ChildDefinition("acme.child", 1, (Node("c", handler="c@1"),)),),
    ),
}


@pytest.mark.parametrize("case", sorted(SPELLED_DEFAULTS))
def test_a_default_held_in_an_object_of_its_own_hashes_like_the_default(case: str) -> None:
    """A field equal to its default is left out of the canonical JSON whatever object holds it."""
    spelled, plain = SPELLED_DEFAULTS[case], LEFT_OUT[case]
    assert spelled.to_json() == plain.to_json()
    assert spelled.content_hash() == plain.content_hash()
    assert WorkflowSpec.from_json(spelled.to_json()).content_hash() == spelled.content_hash()


@pytest.mark.parametrize(
    "retry",
    [RetryPolicy(max_attempts=3.0), RetryPolicy(jitter_max_ms=False), RetryPolicy(max_attempts=True)],  # type: ignore[arg-type]
)
def test_values_equal_in_python_but_not_in_json_hash_differently(retry: RetryPolicy) -> None:
    """3.0 and True are not the JSON of 3 and 0: a float or a bool is never taken for the int default."""
    assert retry == RetryPolicy() or retry.max_attempts == 1  # Python calls them equal (True == 1)
    assert (
        _spec(Node("a", handler="a@1", retry=retry)).content_hash()
        != LEFT_OUT["fresh retry policy"].content_hash()
    )


def test_json_that_spells_out_defaults_hashes_like_json_that_leaves_them_out() -> None:
    """Decoded from JSON, explicit defaults (ints beyond the small-int cache, nested structs) hash as absent."""
    spelled = WorkflowSpec.from_json(
        b'{"workflow_id":"acme.review","version":1,"budgets":{"max_attempts":10000},"nodes":'
        b'[{"id":"a","handler":"a@1","policy":"all_succeeded","retry":{"backoff":{"type":"exponential"}}}]}'
    )
    assert spelled.content_hash() == LEFT_OUT["budgets"].content_hash()


def test_hashes_recorded_before_hashing_was_canonical_still_match() -> None:
    """matches_hash accepts the hash an earlier Mayfly recorded for a spec, and no other spec's."""
    spelled = WorkflowSpec.from_json(
        b'{"workflow_id":"acme.review","version":1,"budgets":{"max_attempts":10000},"nodes":[{"id":"a","handler":"a@1"}]}'
    )
    earlier = content_hash(spelled)  # what content_hash() computed before: the encoding as held
    assert earlier != spelled.content_hash()
    assert spelled.matches_hash(earlier) and spelled.matches_hash(spelled.content_hash())
    assert not SPEC.matches_hash(earlier) and not SPEC.matches_hash(spelled.content_hash())


@pytest.mark.parametrize(
    ("data", "path", "problem"),
    [
        (
            b'{"workflow_id":"w","version":1,"nodes":[{"id":"a","handler":7}]}',
            "$.nodes[0].handler",
            "Expected `str | null`, got `int`",
        ),
        (b'{"workflow_id":"w","version":1,"nodes":[', "$", "Input data was truncated"),
        (b"[]", "$", "Expected `object`, got `array`"),
        (
            b'{"workflow_id":"w","version":1,"nodes":[{"id":"a","input":'
            + b"[" * 2000
            + b"]" * 2000
            + b"}]}",
            "$",
            "nested too deeply to decode (node inputs may nest at most 128 levels)",
        ),
        (
            b'{"workflow_id":"w","version":1,"nodes":[{"id":"a","input":' + b"9" * 5000 + b"}]}",
            "$.nodes[0].input",
            "Integer value out of range",
        ),
        (
            b'{"workflow_id":"w","version":1,"nodes":[{"id":"a","artifacts":[{"artifact_id":"x","byte_length":1,"sha256":"0"}]}]}',
            "$.nodes[0].artifacts[0]",
            "invalid artifact id 'x': expected a canonical UUID",
        ),
    ],
    ids=["wrong-type", "truncated", "not-an-object", "too-deep", "long-integer", "bad-artifact"],
)
def test_undecodable_json_raises_a_located_spec_decode_error(data: bytes, path: str, problem: str) -> None:
    """from_json refuses bad JSON with one typed, one-line error naming where, never a raw msgspec error."""
    with pytest.raises(SpecDecodeError) as caught:
        WorkflowSpec.from_json(data)
    assert (caught.value.path, caught.value.problem) == (path, problem)
    assert str(caught.value) == f"workflow specification JSON is invalid at {path}: {problem}"
    assert isinstance(caught.value, SpecValidationError) and caught.value.issues[0].path == path
