"""Operational telemetry: the PAL projection and closed-type metrics (ADR-0032 Story 1.10).

PAL
    :func:`project_pal` turns acknowledged journal records into payload-free
    :class:`PalFact` values: event type, sequence, event id, run, node and
    attempt scope, outcome class, the node and run status transition and the
    run's virtual time. :func:`recovery_fact` adds the explicit recovery
    operations (inspect, replay, resume). PAL is an operational stream: it is
    never fed back into reduction and may be sampled or lost without
    affecting replay. Every fact carries a deterministic causal key
    (:func:`causal_key`) that joins run, node and attempt scope across handler
    spans and PAL.

Metrics
    :class:`MetricsSnapshot` holds counters keyed only by :class:`MetricKey`,
    whose every label is a closed enum: run state (:class:`RunStatus`), node
    state (:class:`NodeStatus`), outcome class (:class:`NodeOutcomeKind`),
    :class:`FailureClass`, :class:`RecoveryMode` and :class:`LatencyBucket`.
    A run, node, attempt, workflow or handler id cannot become a label: the
    key refuses anything that is not the dimension's enum. Snapshots are
    published whole through the ``mayfly_publish_metrics`` hook
    (:func:`publish_metrics`), so exporters never see a partial projection.

Exporters
    :class:`JsonLogExporter` writes metrics snapshots and PAL facts as JSON
    lines through the standard library's :mod:`logging` and can be registered
    as a plugin. :mod:`mayfly.telemetry.prometheus` writes the Prometheus text
    exposition of a journal and of a worker's counters;
    :mod:`mayfly.telemetry.otel` (the ``otel`` extra, the OpenTelemetry API
    only) writes spans of runs, attempts, commits and recoveries, exported by
    the application's own SDK. Neither is imported here: ``import
    mayfly.telemetry`` needs no extra.
"""

from mayfly.telemetry.export import JsonLogExporter
from mayfly.telemetry.metrics import (
    LATENCY_BUCKET_BOUNDS_MS,
    METRICS_SCHEMA_VERSION,
    Counter,
    FailureClass,
    LatencyBucket,
    Metric,
    MetricKey,
    MetricsCollector,
    MetricsPublisher,
    MetricsSnapshot,
    RecoveryMode,
    WorkerEvent,
    WorkerMetrics,
    compute_metrics,
    publish_metrics,
)
from mayfly.telemetry.pal import (
    PAL_SCHEMA_VERSION,
    PalFact,
    PalProjector,
    causal_key,
    project_pal,
    recovery_fact,
)

__all__ = [
    "LATENCY_BUCKET_BOUNDS_MS",
    "METRICS_SCHEMA_VERSION",
    "PAL_SCHEMA_VERSION",
    "Counter",
    "FailureClass",
    "JsonLogExporter",
    "LatencyBucket",
    "Metric",
    "MetricKey",
    "MetricsCollector",
    "MetricsPublisher",
    "MetricsSnapshot",
    "PalFact",
    "PalProjector",
    "RecoveryMode",
    "WorkerEvent",
    "WorkerMetrics",
    "causal_key",
    "compute_metrics",
    "project_pal",
    "publish_metrics",
    "recovery_fact",
]
