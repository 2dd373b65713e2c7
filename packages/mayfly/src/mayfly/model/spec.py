"""The serializable workflow specification (ADR-0032 "Serializable workflow specification").

A run pins one immutable :class:`WorkflowSpec`. Nodes name handlers by stable
name and contract version (``"review@1"``); code is never serialized. The JSON
form carries an explicit ``schema_version`` and the pinned run records the
spec's content hash (SHA-256 of its canonical JSON).

These structs only *hold* a specification; :func:`mayfly.reducer.validate`
checks it and reports every problem at once.
"""

from __future__ import annotations

import re
from typing import Literal, TypeAlias

import msgspec

from mayfly.model.errors import InvalidIdentifier, SpecDecodeError, one_line
from mayfly.model.json import JsonValue, canonical_json, content_hash
from mayfly.model.limits import MAX_HANDLER_NAME, MAX_JSON_DEPTH
from mayfly.model.outcomes import ArtifactRef, NodeOutcomeKind

__all__ = [
    "SPEC_SCHEMA_VERSION",
    "SUPPORTED_SPEC_SCHEMA_VERSIONS",
    "Backoff",
    "ChildCall",
    "ChildDefinition",
    "DependencyPolicy",
    "Edge",
    "EdgePredicate",
    "ExponentialBackoff",
    "FixedBackoff",
    "HandlerRef",
    "ImmediateBackoff",
    "Node",
    "OnAnyOutcome",
    "OnField",
    "OnOutcome",
    "RetryPolicy",
    "RunBudgets",
    "WorkflowSpec",
    "parse_handler_ref",
]

SPEC_SCHEMA_VERSION = 1
"""The specification schema version this code writes."""

SUPPORTED_SPEC_SCHEMA_VERSIONS = frozenset({1})
"""Specification schema versions this code reads; anything else fails validation."""

DependencyPolicy: TypeAlias = Literal["all_succeeded", "all_completed", "any_succeeded"]
"""When a node with ``depends_on`` is released; ``all_succeeded`` is the safe default."""

_HANDLER_NAME = re.compile(r"[a-z][a-z0-9_.-]*")


class HandlerRef(msgspec.Struct, frozen=True):
    """A handler's stable name and contract version, written ``name@version``."""

    name: str
    version: int

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"


def parse_handler_ref(value: str) -> HandlerRef:
    """Parse ``name@version`` (name ``[a-z][a-z0-9_.-]*``, version a positive integer)."""
    name, sep, version = value.rpartition("@")
    if (
        not sep
        or len(name) > MAX_HANDLER_NAME
        or _HANDLER_NAME.fullmatch(name) is None
        or not version.isdigit()
        or version.startswith("0")
    ):
        raise InvalidIdentifier("handler reference", value, "expected name@version, e.g. 'review@1'")
    return HandlerRef(name, int(version))


class ImmediateBackoff(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="immediate"):
    """Retry at the virtual time the retryable outcome was committed."""


class FixedBackoff(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="fixed"):
    """Retry ``delay_ms`` after the retryable outcome was committed."""

    delay_ms: int


class ExponentialBackoff(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="exponential"):
    """Delay ``min(initial_ms * multiplier ** (next_attempt - 2), maximum_ms)``."""

    initial_ms: int = 1_000
    multiplier: int = 2
    maximum_ms: int = 60_000


Backoff: TypeAlias = ImmediateBackoff | FixedBackoff | ExponentialBackoff
"""A backoff schedule; JSON objects tagged by ``"type"``."""


class RetryPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """How many attempts one activation of a node may make, and when the next one starts.

    The safe default permits three attempts and retries only
    ``retryable_failure``; ``permanent_failure`` is retried only when named
    here, and ``changes_requested`` never is (it belongs to correction edges).
    """

    max_attempts: int = 3
    retry_on: tuple[NodeOutcomeKind, ...] = (NodeOutcomeKind.RETRYABLE_FAILURE,)
    backoff: Backoff = ExponentialBackoff()
    jitter_max_ms: int = 0
    attempt_deadline_ms: int | None = None


class RunBudgets(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Run-wide ceilings; exhausting one fails the run immediately."""

    max_attempts: int = 10_000
    max_transitions: int = 100_000
    max_elapsed_ms: int | None = None


class OnAnyOutcome(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="any"):
    """Matches every final outcome of the source node's activation; JSON ``{"match": "any"}``."""


class OnOutcome(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="outcome"):
    """Matches one outcome kind; JSON ``{"match": "outcome", "outcome": "changes_requested"}``."""

    outcome: NodeOutcomeKind


class OnField(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="field"):
    """Matches a Succeeded output whose top-level ``field`` equals the scalar ``equals``.

    JSON ``{"match": "field", "field": "verdict", "equals": "ok"}``. Equality
    compares JSON type and value: ``1`` is not ``true`` and not ``1.0``; floats
    cannot be named (a spec holding one fails validation); a missing field is
    not ``null``. Any other outcome kind never matches.
    """

    field: str
    equals: str | int | bool | None


EdgePredicate: TypeAlias = OnAnyOutcome | OnOutcome | OnField
"""Data-only edge conditions; JSON objects tagged by ``"match"``."""


class Edge(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A conditional transition from ``source`` to ``target``.

    Evaluated once on the final committed outcome of each activation of
    ``source``; a match activates ``target`` (consuming one transition). Edges
    sharing an ``exclusive`` group name must share a source and be provably
    disjoint; ungrouped edges fan out in parallel, in specification order.
    Conditional edges may form correction loops (see ``docs/transitions.md``).
    """

    source: str
    target: str
    when: EdgePredicate = OnAnyOutcome()
    exclusive: str | None = None


class ChildCall(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Run a catalog workflow as this node's work.

    ``mode`` decides how a non-success child reads in the parent:
    ``require_success`` fails the parent node, ``propagate`` gives it the
    child's outcome class; a child's failure or cancellation is never the
    parent's success. Only the named top-level fields are copied: ``inputs``
    from the parent node's input (the run input object overlaid with the
    node's own ``input`` object) into the child run's input, ``outputs`` from
    the child run's output into the parent node's Succeeded output. A field
    the source lacks is left out, never invented as ``null``.
    """

    workflow_id: str
    version: int
    mode: Literal["propagate", "require_success"]
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()


class Node(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One unit of work: a handler (``name@version``) or a child workflow call."""

    id: str
    handler: str | None = None
    child: ChildCall | None = None
    input: JsonValue = None
    artifacts: tuple[ArtifactRef, ...] = ()
    depends_on: tuple[str, ...] = ()
    policy: DependencyPolicy = "all_succeeded"
    outputs: tuple[str, ...] = ()
    retry: RetryPolicy = RetryPolicy()
    max_attempts: int | None = None

    @property
    def handler_ref(self) -> HandlerRef | None:
        """The parsed handler reference, or ``None`` for a child-call node."""
        return None if self.handler is None else parse_handler_ref(self.handler)


class ChildDefinition(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A reusable workflow in the root specification's closed catalog.

    ``inputs`` and ``outputs`` declare its interface: the top-level fields a
    call may copy in, and those it may copy out (each must be declared in the
    ``outputs`` of one of its nodes). Its own ``budgets`` bound its own run.
    """

    workflow_id: str
    version: int
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...] = ()
    initial: tuple[str, ...] | None = None
    budgets: RunBudgets = RunBudgets()
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()


class WorkflowSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An immutable, serializable workflow: nodes, edges, budgets and a child catalog.

    Every top-level field, ``schema_version`` included, is always written, so the
    version is explicit in every stored copy; nested structs omit their defaults
    so that adding an optional nested field keeps existing content hashes.

    ``initial`` lists the nodes that start the run; when omitted, every node
    without ``depends_on`` and without an incoming edge starts it. A graph
    with conditional cycles must declare it. ``catalog`` holds the child
    workflows that ``ChildCall`` nodes may run, and nothing else can be
    called. ``jitter_seed`` is pinned into retry jitter.
    """

    workflow_id: str
    version: int
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...] = ()
    initial: tuple[str, ...] | None = None
    budgets: RunBudgets = RunBudgets()
    catalog: tuple[ChildDefinition, ...] = ()
    jitter_seed: str = ""
    schema_version: int = SPEC_SCHEMA_VERSION

    def content_hash(self) -> str:
        """``sha256:<hex>`` over the canonical JSON of this spec; stable across machines."""
        return content_hash(self)

    def to_json(self) -> bytes:
        """The spec as compact JSON (canonical: sorted keys)."""
        return canonical_json(self)

    @classmethod
    def from_json(cls, data: bytes | str) -> WorkflowSpec:
        """Decode a spec from JSON; anything undecodable raises :class:`SpecDecodeError` naming where.

        Unknown fields, wrong types, malformed JSON and nesting too deep to
        decode are all refused with a one-line message such as ``... at
        $.nodes[0].handler: Expected `str`, got `int```.
        """
        try:
            return _SPEC_DECODER.decode(data)
        except msgspec.ValidationError as exc:
            # msgspec ends a located message with " - at `$.nodes[0].handler`".
            problem, located, where = one_line(str(exc)).rpartition(" - at `")
            if not located:
                raise SpecDecodeError("$", where) from None
            raise SpecDecodeError(where.rstrip("`"), problem) from None
        except msgspec.DecodeError as exc:
            raise SpecDecodeError("$", one_line(str(exc))) from None
        except RecursionError:
            raise SpecDecodeError(
                "$", f"nested too deeply to decode (node inputs may nest at most {MAX_JSON_DEPTH} levels)"
            ) from None


_SPEC_DECODER = msgspec.json.Decoder(WorkflowSpec)
