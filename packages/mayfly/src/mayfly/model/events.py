"""Durable facts: the versioned, tagged-union events of a run's history.

Event type meaning is immutable once released (ADR-0032 "Version and
compatibility policy", rule 5). Each type has its own schema version, carried
by the journal record envelope beside the payload; :data:`EVENT_SCHEMA_VERSIONS`
lists the version this code writes, and the reducer's upcasters lift older
payloads to it. An unknown type or version fails closed.

The JSON payload of an event is an object tagged by ``"type"`` with the event's
class name, e.g. ``{"type":"NodeReady","node_id":"plan","cause":"initial"}``.
"""

from __future__ import annotations

import enum
from typing import Literal, TypeAlias

import msgspec

from mayfly.model.json import JsonValue
from mayfly.model.outcomes import NodeOutcome, NodeOutcomeKind
from mayfly.model.signals import SignalRejection
from mayfly.model.spec import WorkflowSpec

__all__ = [
    "EVENT_SCHEMA_VERSIONS",
    "EVENT_TYPES",
    "AttemptDeadlineExpired",
    "BaseEvent",
    "BudgetExhausted",
    "BudgetKind",
    "CancellationRequested",
    "CancellationTarget",
    "ChildCompleted",
    "ChildStarted",
    "EdgeActivated",
    "Event",
    "FailureCause",
    "LastOutcome",
    "NodeFailed",
    "NodeOutcomeCommitted",
    "NodeReady",
    "NodeStarted",
    "ParentLink",
    "RetryReleased",
    "RetryScheduled",
    "RunCompleted",
    "RunCreated",
    "RunResult",
    "SignalAccepted",
    "SignalExpired",
    "SignalRejected",
    "SignalWaitOpened",
    "VirtualTimeAdvanced",
    "event_type",
]


RunResult: TypeAlias = Literal["succeeded", "failed", "blocked", "cancelled"]
"""A run's terminal result."""


class BaseEvent(
    msgspec.Struct,
    frozen=True,
    forbid_unknown_fields=True,
    omit_defaults=True,
    tag_field="type",
    tag=True,
    kw_only=True,
    gc=False,
):
    """What every event answers: the node and the attempt it is about (``None`` when it has none).

    Run-level facts (``RunCreated``, ``VirtualTimeAdvanced``, ``RunCompleted``
    ...) name neither. An event type that concerns a node or an attempt
    records it as a field of the same name, which takes the place of these
    defaults; ``EdgeActivated`` names a ``source`` and a ``target`` instead.
    """

    # gc=False: events are acyclic immutable data, so the cycle collector need not
    # track them; replaying a long history otherwise spends its time in GC passes.

    @property
    def node_id(self) -> str | None:
        """The node this event is about, if it is about one."""
        return None

    @property
    def attempt_id(self) -> str | None:
        """The attempt this event is about, if it is about one."""
        return None


class ParentLink(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where a child run was called from: the parent run, node and attempt, and its nesting depth.

    ``depth`` is 1 for a child of a root run and at most
    :data:`~mayfly.model.limits.MAX_CHILD_DEPTH`.
    """

    run_id: str
    node_id: str
    attempt_id: str
    depth: int


class RunCreated(BaseEvent, frozen=True):
    """A run exists and pins its specification, content hash and input.

    ``parent`` is set only on a child run and links it to the call that started it.
    ``epoch_ms`` is the wall-clock time (Unix milliseconds) at which the run's
    virtual time is 0; a runtime resuming the run advances virtual time to
    the wall time elapsed since then. Runs recorded before the field existed
    have none (an additive optional field: same schema version, and their
    bytes are unchanged); their virtual time counts only driven time.
    ``queue`` is the queue workers claim the run from; ``default`` is left
    out of the stored bytes (additive, like ``epoch_ms``). ``priority`` and
    ``dedup_id`` (see :class:`~mayfly.model.commands.CreateRun`) are additive
    the same way: left out at their defaults.
    """

    run_id: str
    spec: WorkflowSpec
    spec_hash: str
    input: JsonValue = None
    parent: ParentLink | None = None
    epoch_ms: int | None = None
    queue: str = "default"
    priority: int = 0
    dedup_id: str | None = None


class NodeReady(BaseEvent, frozen=True):
    """A node became eligible to start (consumes one transition).

    ``cause`` is ``initial`` for the run's initial set and ``dependencies``
    when its dependency policy released it.
    """

    node_id: str
    cause: Literal["initial", "dependencies"]


class NodeStarted(BaseEvent, frozen=True):
    """An attempt was durably dispatched (consumes one attempt); committed before invocation.

    ``attempt`` is one-based within the node's current activation; ``deadline``
    is the absolute virtual time at which the attempt times out, if any.
    """

    node_id: str
    attempt_id: str
    attempt: int
    at: int
    deadline: int | None = None


class NodeOutcomeCommitted(BaseEvent, frozen=True):
    """A node outcome is committed.

    With ``attempt_id`` it is the one terminal outcome of that attempt; without
    it, it is an outcome the run assigned (propagation, cancellation, budgets).
    """

    node_id: str
    outcome: NodeOutcome
    attempt_id: str | None = None
    at: int = 0


class FailureCause(enum.Enum):
    """Why a node failed although its last outcome was not itself a permanent failure."""

    RETRIES_EXHAUSTED = "retries_exhausted"
    NOT_RETRYABLE = "not_retryable"
    NO_CORRECTION_EDGE = "no_correction_edge"
    NODE_BUDGET_EXHAUSTED = "node_budget_exhausted"
    CORRECTION_UNRESOLVED = "correction_unresolved"
    """ChangesRequested selected a correction, but nothing re-activated the node before the run went idle."""


class NodeFailed(BaseEvent, frozen=True):
    """An explicit termination fact: the node fails, retaining its committed outcome."""

    node_id: str
    cause: FailureCause
    detail: str


class RetryScheduled(BaseEvent, frozen=True):
    """Another attempt will start at ``deadline`` (absolute virtual time; never recomputed)."""

    node_id: str
    next_attempt: int
    delay_ms: int
    deadline: int


class RetryReleased(BaseEvent, frozen=True):
    """The backoff deadline was reached and the node is ready again (consumes one transition)."""

    node_id: str
    next_attempt: int
    at: int


class EdgeActivated(BaseEvent, frozen=True):
    """A conditional edge fired: ``target`` becomes Ready for a new activation (one transition).

    The fingerprint is ``edge`` (the edge's stable position in the
    specification's ``edges``) and ``source_sequence`` (the sequence of the
    NodeOutcomeCommitted that ended the source's activation). One fingerprint
    activates at most once, and only while that outcome is the source's
    latest, so neither replay nor a later correction cycle can reuse it.
    """

    edge: int
    source: str
    target: str
    source_sequence: int


class ChildStarted(BaseEvent, frozen=True):
    """An attempt of a child-call node was durably dispatched as a new child run (one parent attempt).

    Committed before the child run is created; ``input`` is the mapped child
    input, ``attempt`` one-based within the node's activation, ``deadline``
    the attempt's absolute virtual deadline, if any.
    """

    node_id: str
    attempt_id: str
    attempt: int
    child_run_id: str
    workflow_id: str
    version: int
    input: JsonValue = None
    at: int = 0
    deadline: int | None = None


class ChildCompleted(BaseEvent, frozen=True):
    """The child run of an attempt reached its terminal ``result``; the parent's outcome follows.

    ``output`` holds only the call's declared output fields.
    """

    node_id: str
    attempt_id: str
    child_run_id: str
    result: RunResult
    output: JsonValue = None
    at: int = 0


class VirtualTimeAdvanced(BaseEvent, frozen=True):
    """The run's virtual clock moved to ``to`` milliseconds after the run epoch."""

    to: int


class AttemptDeadlineExpired(BaseEvent, frozen=True):
    """An attempt's deadline passed without an outcome; a timeout outcome follows."""

    node_id: str
    attempt_id: str
    deadline: int


class BudgetKind(enum.Enum):
    """Which ceiling was exhausted."""

    RUN_ATTEMPTS = "run_attempts"
    RUN_TRANSITIONS = "run_transitions"
    RUN_ELAPSED = "run_elapsed"
    NODE_ATTEMPTS = "node_attempts"


class LastOutcome(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    """The most recently committed outcome at the time a budget ran out."""

    node_id: str
    kind: NodeOutcomeKind
    attempt_id: str | None = None


class BudgetExhausted(BaseEvent, frozen=True):
    """A budget ran out: its kind, immutable limit, observed usage (limit + 1) and last outcome."""

    kind: BudgetKind
    limit: int
    observed: int
    node_id: str | None = None
    last_outcome: LastOutcome | None = None


class CancellationTarget(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """An active attempt the runtime must cancel once the cancellation is durable.

    ``child_run_id`` is set when the attempt is a child run, which must be cancelled in turn.
    """

    node_id: str
    attempt_id: str
    child_run_id: str | None = None


class CancellationRequested(BaseEvent, frozen=True):
    """One atomic cancellation decision: who, why, when, which policy and which active targets."""

    requester: str
    reason: str
    at: int
    policy: Literal["cascade"] = "cascade"
    targets: tuple[CancellationTarget, ...] = ()


class SignalWaitOpened(BaseEvent, frozen=True):
    """A running attempt now waits durably for signal ``name``; only the token's digest is kept.

    ``deadline`` is the absolute virtual time at which the wait expires (none:
    it may wait forever). The attempt's own deadline is paused meanwhile.
    """

    node_id: str
    attempt_id: str
    name: str
    token_sha256: str
    at: int
    deadline: int | None = None


class SignalAccepted(BaseEvent, frozen=True):
    """A delivered signal matched the wait: the signal id is consumed and the attempt resumes."""

    signal_id: str
    node_id: str
    attempt_id: str
    name: str
    at: int
    decision: JsonValue = None


class SignalRejected(BaseEvent, frozen=True):
    """A delivered signal could not advance the run; its id is consumed all the same."""

    signal_id: str
    node_id: str
    reason: SignalRejection
    at: int


class SignalExpired(BaseEvent, frozen=True):
    """A wait reached its deadline (recorded after the VirtualTimeAdvanced that reached it)."""

    node_id: str
    attempt_id: str
    name: str
    deadline: int


class RunCompleted(BaseEvent, frozen=True):
    """The run reached its terminal result; every later mutating command is rejected."""

    result: RunResult
    at: int


Event: TypeAlias = (
    RunCreated
    | NodeReady
    | NodeStarted
    | NodeOutcomeCommitted
    | NodeFailed
    | RetryScheduled
    | RetryReleased
    | VirtualTimeAdvanced
    | AttemptDeadlineExpired
    | BudgetExhausted
    | CancellationRequested
    | RunCompleted
    | EdgeActivated
    | ChildStarted
    | ChildCompleted
    | SignalWaitOpened
    | SignalAccepted
    | SignalRejected
    | SignalExpired
)
"""Every event type this code reads and writes."""

EVENT_TYPES: dict[str, type[Event]] = {
    cls.__name__: cls
    for cls in (
        RunCreated,
        NodeReady,
        NodeStarted,
        NodeOutcomeCommitted,
        NodeFailed,
        RetryScheduled,
        RetryReleased,
        VirtualTimeAdvanced,
        AttemptDeadlineExpired,
        BudgetExhausted,
        CancellationRequested,
        RunCompleted,
        EdgeActivated,
        ChildStarted,
        ChildCompleted,
        SignalWaitOpened,
        SignalAccepted,
        SignalRejected,
        SignalExpired,
    )
}
"""Event classes by type name (the ``"type"`` tag)."""

EVENT_SCHEMA_VERSIONS: dict[str, int] = dict.fromkeys(EVENT_TYPES, 1)
"""The schema version this code writes for each event type."""


def event_type(event: Event) -> str:
    """The type name of ``event``, as written in the envelope and the ``"type"`` tag."""
    return type(event).__name__
