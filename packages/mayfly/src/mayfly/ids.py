"""Durable identities: typed canonical strings, their grammars and id sources (public API).

Run, attempt, event, signal and artifact ids are canonical lowercase UUIDs;
node and workflow ids and handler names follow a stable ASCII grammar, checked
by the ``parse_*`` functions (a bad one raises
:class:`~mayfly.errors.InvalidIdentifier`). :class:`DeterministicIdSource`
makes every generated id predictable in tests.
"""

from mayfly.model.ids import (
    DEDUP_ID,
    DEDUP_ID_GRAMMAR,
    NODE_ID_GRAMMAR,
    PRIORITY_RANGE,
    QUEUE_NAME,
    QUEUE_NAME_GRAMMAR,
    WORKFLOW_ID_GRAMMAR,
    ArtifactId,
    AttemptId,
    DeterministicIdSource,
    EventId,
    IdSource,
    NodeId,
    RunId,
    SignalId,
    WorkflowId,
    idempotency_key,
    is_node_id,
    is_uuid,
    parse_artifact_id,
    parse_attempt_id,
    parse_event_id,
    parse_node_id,
    parse_run_id,
    parse_signal_id,
    parse_workflow_id,
)

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
