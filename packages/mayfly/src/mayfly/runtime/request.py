"""What a handler receives: cloned durable input, dependency outcomes and attempt metadata.

A request carries no mutable workflow state and no journal (ADR-0032 Story
1.9): a handler can only read its inputs, observe cancellation through a
read-only handle, and return an outcome.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, final

import msgspec

from mayfly.model.json import JsonValue
from mayfly.model.outcomes import NodeOutcome, NodeOutcomeKind, Succeeded
from mayfly.model.signals import AcceptedSignal
from mayfly.substrate import CancellationHandle

__all__ = ["DependencyResult", "HandlerRequest", "clone_json"]


def clone_json(value: JsonValue) -> JsonValue:
    """A deep copy of a JSON value, so a handler can never alias durable state."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return msgspec.json.decode(msgspec.json.encode(value))


@final
class DependencyResult(msgspec.Struct, frozen=True):
    """The committed outcome of an upstream node: its kind and, when it succeeded, its output."""

    node_id: str
    kind: NodeOutcomeKind
    output: JsonValue = None
    reason: str = ""

    @property
    def succeeded(self) -> bool:
        """Whether the prerequisite succeeded."""
        return self.kind is NodeOutcomeKind.SUCCEEDED

    @classmethod
    def of(cls, node_id: str, outcome: NodeOutcome) -> DependencyResult:
        """Summarize ``outcome`` (output cloned, reason kept) for a dependent's request."""
        if isinstance(outcome, Succeeded):
            return cls(node_id, outcome.kind, clone_json(outcome.output))
        return cls(node_id, outcome.kind, None, outcome.reason)


@final
class HandlerRequest:
    """Everything one handler invocation may see.

    ``attempt`` is one-based within the node's current activation and
    ``node_attempts`` counts every attempt of the node, correction loops included;
    ``attempt_id`` and ``idempotency_key`` are identical on every
    re-invocation of the same attempt during recovery, so a handler with
    external effects can deduplicate them. ``deadline`` is the absolute
    virtual time (ms since the run epoch) at which the attempt times out.
    """

    __slots__ = (
        "attempt",
        "attempt_id",
        "cancellation",
        "deadline",
        "dependencies",
        "handler",
        "idempotency_key",
        "input",
        "node_attempts",
        "node_id",
        "run_id",
        "run_input",
        "signal",
    )

    def __init__(
        self,
        *,
        run_id: str,
        node_id: str,
        handler: str,
        attempt: int,
        attempt_id: str,
        idempotency_key: str,
        deadline: int | None,
        input: JsonValue,
        run_input: JsonValue,
        dependencies: Mapping[str, DependencyResult],
        cancellation: CancellationHandle,
        signal: AcceptedSignal | None = None,
        node_attempts: int = 1,
    ) -> None:
        self.run_id = run_id
        self.node_id = node_id
        self.handler = handler
        self.attempt = attempt
        self.attempt_id = attempt_id
        self.idempotency_key = idempotency_key
        self.deadline = deadline
        self.input = input
        self.run_input = run_input
        self.dependencies: Mapping[str, DependencyResult] = MappingProxyType(dict(dependencies))
        self.cancellation = cancellation
        self.signal = signal
        self.node_attempts = node_attempts
        """Attempts of this node so far across all activations, this one included."""
        """The accepted signal when this invocation resumes an attempt after its wait."""

    @property
    def cancelled(self) -> bool:
        """Whether cancellation of this attempt was requested (cooperative: check it and return)."""
        return self.cancellation.is_cancelled

    def output_of(self, node_id: str) -> Any:
        """The output of a succeeded prerequisite (``KeyError`` if it is not a succeeded prerequisite)."""
        result = self.dependencies[node_id]
        if not result.succeeded:
            raise KeyError(f"prerequisite {node_id!r} did not succeed ({result.kind.value})")
        return result.output

    def __repr__(self) -> str:
        return (
            f"HandlerRequest(run_id={self.run_id!r}, node_id={self.node_id!r}, "
            f"attempt={self.attempt}, attempt_id={self.attempt_id!r})"
        )
