"""Identity grammars and the deterministic id source."""

from __future__ import annotations

import pytest

from mayfly.model.errors import InvalidIdentifier
from mayfly.model.ids import (
    DeterministicIdSource,
    is_uuid,
    parse_node_id,
    parse_run_id,
    parse_workflow_id,
)


@pytest.mark.parametrize("value", ["a", "plan", "review-2", "qa_gate", "a" + "b" * 62])
def test_valid_node_ids_are_accepted(value: str) -> None:
    """Node ids matching [a-z][a-z0-9_-]{0,62} parse to themselves."""
    assert parse_node_id(value) == value


@pytest.mark.parametrize("value", ["", "Plan", "1st", "-x", "a" * 64, "a.b", "naïve", "a b", None, 7])
def test_invalid_node_ids_are_rejected_showing_the_value(value: object) -> None:
    """Anything outside the node-id grammar is rejected and the message shows the value."""
    with pytest.raises(InvalidIdentifier) as info:
        parse_node_id(value)
    assert repr(value) in str(info.value)


@pytest.mark.parametrize("value", ["code-review", "acme.code-review", "a.b.c"])
def test_workflow_ids_allow_dotted_namespaces(value: str) -> None:
    """Workflow ids follow the node grammar with dots separating namespaces."""
    assert parse_workflow_id(value) == value


@pytest.mark.parametrize("value", ["", ".a", "a.", "a..b", "A.b", "a" * 256])
def test_invalid_workflow_ids_are_rejected(value: str) -> None:
    """Leading, trailing or doubled dots, capitals and over-long ids are rejected."""
    with pytest.raises(InvalidIdentifier):
        parse_workflow_id(value)


def test_run_ids_must_be_canonical_lowercase_uuids() -> None:
    """Upper-case or unhyphenated UUIDs are not canonical and are rejected."""
    good = "0193a3b2-7c4d-7e5f-8a9b-0c1d2e3f4a5b"
    assert parse_run_id(good) == good
    for bad in (good.upper(), good.replace("-", ""), good + "0"):
        with pytest.raises(InvalidIdentifier):
            parse_run_id(bad)


def test_deterministic_id_source_repeats_across_instances() -> None:
    """Two sources with the same namespace yield the same canonical UUID sequence."""
    a, b = DeterministicIdSource(7), DeterministicIdSource(7)
    first = [a.new_id() for _ in range(3)]
    assert first == [b.new_id() for _ in range(3)]
    assert len(set(first)) == 3
    assert all(is_uuid(value) for value in first)
    assert first[0] == "00000007-0000-7000-8000-000000000001"


def test_deterministic_sources_with_different_namespaces_never_collide() -> None:
    """Different namespaces produce disjoint ids."""
    a, b = DeterministicIdSource(1), DeterministicIdSource(2)
    assert {a.new_id() for _ in range(100)}.isdisjoint({b.new_id() for _ in range(100)})
