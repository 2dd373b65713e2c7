"""Edge predicates: what a conditional edge matches, and when two edges provably cannot both match.

Predicates are data, never code: ``any`` (every outcome), ``outcome`` (one
:class:`~mayfly.model.outcomes.NodeOutcomeKind`) and ``field`` (a top-level
field of a *Succeeded* output equal to a scalar). Nothing here calls a
handler, reads the clock or the environment, so the same outcome always
selects the same edges.

Field equality compares JSON type *and* value: ``1`` never equals ``true``
(booleans are not integers), ``1`` never equals ``1.0`` (a JSON number with a
fraction or exponent is a float, and predicates cannot name floats), ``"1"``
never equals ``1``, and a missing field never equals ``null``. A field
predicate matches only a Succeeded outcome whose output is a JSON object.

Disjointness (exclusive groups) is decided by these rules, which are sound —
an accepted pair can never both match — and deliberately simple:

- ``any`` overlaps every predicate;
- two ``outcome`` predicates overlap when they name the same kind;
- ``field`` and ``outcome: succeeded`` overlap; ``field`` and any other kind are disjoint;
- two ``field`` predicates are disjoint only when they constrain the *same*
  field to *different* scalars (different fields can hold at the same time).
"""

from __future__ import annotations

from collections.abc import Sequence

from mayfly.model.json import JsonValue
from mayfly.model.outcomes import NodeOutcome, NodeOutcomeKind, Succeeded
from mayfly.model.spec import EdgePredicate, OnAnyOutcome, OnField, OnOutcome

# Enum members as module constants: on Python 3.11 ``NodeStatus.READY`` goes through
# EnumType's __getattr__ hook (several times a global load), and these are read on every event.
_KIND_SUCCEEDED = NodeOutcomeKind.SUCCEEDED


__all__ = ["describe_predicate", "first_overlaps", "matches", "overlap_reason", "scalar_equals"]

Scalar = str | int | bool | None


def scalar_equals(value: JsonValue, expected: Scalar) -> bool:
    """Whether JSON ``value`` equals the predicate scalar ``expected``, comparing type and value."""
    if expected is None:
        return value is None
    if isinstance(expected, bool):
        return isinstance(value, bool) and value is expected
    if isinstance(expected, int):
        return isinstance(value, int) and not isinstance(value, bool) and value == expected
    return isinstance(value, str) and value == expected


def matches(predicate: EdgePredicate, outcome: NodeOutcome) -> bool:
    """Whether ``predicate`` selects ``outcome`` (an activation's final committed outcome)."""
    if isinstance(predicate, OnAnyOutcome):
        return True
    if isinstance(predicate, OnOutcome):
        return outcome.kind is predicate.outcome
    if not isinstance(outcome, Succeeded) or not isinstance(outcome.output, dict):
        return False
    output: dict[str, JsonValue] = outcome.output
    return predicate.field in output and scalar_equals(output[predicate.field], predicate.equals)


def describe_predicate(predicate: EdgePredicate) -> str:
    """A short human form of ``predicate`` for error messages: ``any``, ``outcome changes_requested``."""
    if isinstance(predicate, OnAnyOutcome):
        return "any outcome"
    if isinstance(predicate, OnOutcome):
        return f"outcome {predicate.outcome.value}"
    return f"field {predicate.field!r} == {_literal(predicate.equals)}"


def _literal(value: Scalar) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _key(value: Scalar) -> tuple[str, Scalar]:
    # Typed identity, so that 1 and True (equal in Python) stay distinct values.
    if value is None:
        return ("null", None)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    return ("str", value)


def overlap_reason(a: EdgePredicate, b: EdgePredicate) -> str | None:
    """Why one outcome could match both ``a`` and ``b``, or ``None`` when they are provably disjoint."""
    if isinstance(a, OnAnyOutcome) or isinstance(b, OnAnyOutcome):
        return "'any' matches every outcome"
    if isinstance(a, OnOutcome) and isinstance(b, OnOutcome):
        return f"both match outcome {a.outcome.value}" if a.outcome is b.outcome else None
    if isinstance(a, OnField) and isinstance(b, OnField):
        if a.field != b.field:
            return (
                f"they constrain different fields ({a.field!r}, {b.field!r}), "
                "which one succeeded output can satisfy together"
            )
        if _key(a.equals) == _key(b.equals):
            return f"both match field {a.field!r} == {_literal(a.equals)}"
        return None
    field, kind = (a, b) if isinstance(a, OnField) else (b, a)
    assert isinstance(field, OnField) and isinstance(kind, OnOutcome)
    if kind.outcome is _KIND_SUCCEEDED:
        return f"a succeeded output with field {field.field!r} == {_literal(field.equals)} matches both"
    return None


def first_overlaps(predicates: Sequence[EdgePredicate]) -> list[tuple[int, int]]:
    """``(j, k)`` for every ``k`` that overlaps an earlier predicate, ``j`` the earliest such; O(n).

    Equivalent to checking every pair with :func:`overlap_reason` and keeping
    the first partner of each, without the quadratic cost on large groups.
    """
    found: list[tuple[int, int]] = []
    first_any: int | None = None
    first_kind: dict[NodeOutcomeKind, int] = {}
    first_value: dict[tuple[str, tuple[str, Scalar]], int] = {}
    # The first two distinct field names, with the index where each first appears.
    fields: list[tuple[str, int]] = []
    for k, predicate in enumerate(predicates):
        candidates: list[int | None] = [first_any]
        if isinstance(predicate, OnAnyOutcome):
            candidates.append(0 if k else None)
            if first_any is None:
                first_any = k
        elif isinstance(predicate, OnOutcome):
            candidates.append(first_kind.get(predicate.outcome))
            if predicate.outcome is _KIND_SUCCEEDED and fields:
                candidates.append(fields[0][1])
            first_kind.setdefault(predicate.outcome, k)
        else:
            key = (predicate.field, _key(predicate.equals))
            candidates.append(first_kind.get(_KIND_SUCCEEDED))
            candidates.append(first_value.get(key))
            other = [index for name, index in fields if name != predicate.field]
            candidates.append(other[0] if other else None)
            first_value.setdefault(key, k)
            if len(fields) < 2 and all(name != predicate.field for name, _ in fields):
                fields.append((predicate.field, k))
        earlier = [j for j in candidates if j is not None]
        if earlier:
            found.append((min(earlier), k))
    return found
