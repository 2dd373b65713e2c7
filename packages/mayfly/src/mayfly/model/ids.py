"""Durable identities: typed canonical strings, their grammars and the injectable id source.

Runtime-generated global identities (runs, attempts, events, signals,
artifacts) are UUIDs in canonical lowercase hyphenated form, UUIDv7 by default
so operators can sort them roughly by creation time. No rule depends on that
ordering: the journal sequence is authoritative (ADR-0032 "Public identity
contract"). The UUIDv7 generator reads a clock and randomness, so it lives
outside this pure layer in :mod:`mayfly.identity`; this module holds the
grammar, the :class:`IdSource` protocol and a deterministic source for tests.

Author-defined identities (nodes, workflows, handler names) follow a stable
ASCII grammar because event history and edges reference them by name.
"""

from __future__ import annotations

import hashlib
import re
from typing import NewType, Protocol, final

from mayfly.model.errors import InvalidIdentifier

__all__ = [
    "DEDUP_ID",
    "DEDUP_ID_GRAMMAR",
    "NODE_ID_GRAMMAR",
    "PRIORITY_RANGE",
    "QUEUE_NAME",
    "QUEUE_NAME_GRAMMAR",
    "WORKFLOW_ID_GRAMMAR",
    "ArtifactId",
    "AttemptId",
    "DeterministicIdSource",
    "EventId",
    "IdSource",
    "NodeId",
    "RunId",
    "SignalId",
    "WorkflowId",
    "idempotency_key",
    "is_node_id",
    "is_uuid",
    "parse_artifact_id",
    "parse_attempt_id",
    "parse_event_id",
    "parse_node_id",
    "parse_run_id",
    "parse_signal_id",
    "parse_workflow_id",
]

RunId = NewType("RunId", str)
AttemptId = NewType("AttemptId", str)
EventId = NewType("EventId", str)
SignalId = NewType("SignalId", str)
ArtifactId = NewType("ArtifactId", str)
NodeId = NewType("NodeId", str)
WorkflowId = NewType("WorkflowId", str)

NODE_ID_GRAMMAR = "[a-z][a-z0-9_-]{0,62}"
"""Node ids: a lowercase ASCII letter, then up to 62 lowercase letters, digits, ``_`` or ``-``."""

WORKFLOW_ID_GRAMMAR = f"{NODE_ID_GRAMMAR}(\\.{NODE_ID_GRAMMAR})*"
"""Workflow ids: node-id segments separated by dots for namespaces, e.g. ``acme.code-review``."""

QUEUE_NAME_GRAMMAR = "[a-z0-9][a-z0-9._-]{0,63}"
"""Queue names: a lowercase letter or digit, then up to 63 of those or ``.``, ``_``, ``-``."""

QUEUE_NAME = re.compile(QUEUE_NAME_GRAMMAR)
"""The compiled :data:`QUEUE_NAME_GRAMMAR`."""

DEDUP_ID_GRAMMAR = "[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}"
"""Deduplication ids: a letter or digit, then up to 127 of those or ``. _ : @ / -`` (an order number)."""

DEDUP_ID = re.compile(DEDUP_ID_GRAMMAR)
"""The compiled :data:`DEDUP_ID_GRAMMAR`."""

PRIORITY_RANGE = (-1_000_000, 1_000_000)
"""The inclusive range of run priorities (higher is claimed first on a queue that enables priorities)."""

_NODE_ID = re.compile(NODE_ID_GRAMMAR)
_WORKFLOW_ID = re.compile(WORKFLOW_ID_GRAMMAR)
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_MAX_WORKFLOW_ID = 255


def is_node_id(value: object) -> bool:
    """Whether ``value`` matches the node-id grammar."""
    return isinstance(value, str) and _NODE_ID.fullmatch(value) is not None


def is_uuid(value: object) -> bool:
    """Whether ``value`` is a UUID in canonical lowercase hyphenated form."""
    return isinstance(value, str) and _UUID.fullmatch(value) is not None


def parse_node_id(value: object) -> NodeId:
    """Return ``value`` as a :data:`NodeId`, or raise :class:`InvalidIdentifier` showing it."""
    if not is_node_id(value):
        raise InvalidIdentifier("node id", value, f"expected {NODE_ID_GRAMMAR}")
    return NodeId(value)  # type: ignore[arg-type]  # checked by is_node_id


def parse_workflow_id(value: object) -> WorkflowId:
    """Return ``value`` as a :data:`WorkflowId`, or raise :class:`InvalidIdentifier` showing it."""
    if not isinstance(value, str) or len(value) > _MAX_WORKFLOW_ID or _WORKFLOW_ID.fullmatch(value) is None:
        raise InvalidIdentifier(
            "workflow id",
            value,
            f"expected {WORKFLOW_ID_GRAMMAR}, at most {_MAX_WORKFLOW_ID} chars",
        )
    return WorkflowId(value)


def _parse_uuid(kind: str, value: object) -> str:
    if not is_uuid(value):
        raise InvalidIdentifier(kind, value, "expected a canonical lowercase hyphenated UUID")
    return value  # type: ignore[return-value]  # checked by is_uuid


def parse_run_id(value: object) -> RunId:
    """Return ``value`` as a :data:`RunId` (canonical UUID string) or raise :class:`InvalidIdentifier`."""
    return RunId(_parse_uuid("run id", value))


def parse_attempt_id(value: object) -> AttemptId:
    """Return ``value`` as an :data:`AttemptId` or raise :class:`InvalidIdentifier`."""
    return AttemptId(_parse_uuid("attempt id", value))


def parse_event_id(value: object) -> EventId:
    """Return ``value`` as an :data:`EventId` or raise :class:`InvalidIdentifier`."""
    return EventId(_parse_uuid("event id", value))


def parse_signal_id(value: object) -> SignalId:
    """Return ``value`` as a :data:`SignalId` or raise :class:`InvalidIdentifier`."""
    return SignalId(_parse_uuid("signal id", value))


def parse_artifact_id(value: object) -> ArtifactId:
    """Return ``value`` as an :data:`ArtifactId` or raise :class:`InvalidIdentifier`."""
    return ArtifactId(_parse_uuid("artifact id", value))


class IdSource(Protocol):
    """Where runtime-generated identities come from; injected so tests are deterministic."""

    def new_id(self) -> str:
        """Return a fresh canonical UUID string, never returned before by this source."""
        ...


@final
class DeterministicIdSource:
    """A repeatable :class:`IdSource` for tests: UUIDv7-shaped ids from a namespace and a counter.

    Two sources built with the same ``namespace`` yield the same sequence of
    ids, so a test can predict every run, attempt and event id it will see.
    """

    __slots__ = ("_counter", "_prefix")

    def __init__(self, namespace: int = 0, start: int = 1) -> None:
        if not 0 <= namespace < 1 << 32:
            raise ValueError(f"namespace must fit in 32 bits, got {namespace}")
        self._prefix = f"{namespace:08x}-0000-7000-8000-"
        self._counter = start

    def new_id(self) -> str:
        """Return the next id: ``<namespace>-0000-7000-8000-<counter as 12 hex digits>``."""
        value = self._counter
        if value >= 1 << 48:
            raise OverflowError("deterministic id source exhausted")
        self._counter = value + 1
        return f"{self._prefix}{value:012x}"


def idempotency_key(run_id: str, node_id: str, attempt_id: str) -> str:
    """The deterministic idempotency key of one attempt: the same on every (re-)invocation.

    ``mfk_`` followed by 32 hex digits of SHA-256 over run id, node id and
    attempt id joined by 0x1F. Handlers pass it to external systems so a
    re-invocation after a crash is recognised as the same request.
    """
    digest = hashlib.sha256(f"{run_id}\x1f{node_id}\x1f{attempt_id}".encode()).hexdigest()
    return f"mfk_{digest[:32]}"
