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
    as a plugin. No OpenTelemetry exporter ships: its SDK is not an admitted
    runtime dependency.
"""

from __future__ import annotations

import enum
import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import ClassVar, Final, Literal, Protocol, final

import msgspec

from mayfly.hookspecs import PLUGIN_API, hookimpl
from mayfly.journal import JournalRecord
from mayfly.model.errors import InvalidRecord, PluginError
from mayfly.model.events import (
    ChildStarted,
    EdgeActivated,
    FailureCause,
    NodeOutcomeCommitted,
    NodeStarted,
    RetryReleased,
    RetryScheduled,
)
from mayfly.model.outcomes import NodeOutcomeKind, RetryableFailure
from mayfly.model.state import NodeStatus, RunState, RunStatus
from mayfly.recovery import RecoveredRun
from mayfly.reducer import Upcaster, decode_event, reduce

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
    "causal_key",
    "compute_metrics",
    "project_pal",
    "publish_metrics",
    "recovery_fact",
    "set_metrics_publisher",
]

PAL_SCHEMA_VERSION: Final = 1
"""Version of :class:`PalFact` and its JSON form."""

METRICS_SCHEMA_VERSION: Final = 1
"""Version of :class:`MetricsSnapshot` and its JSON form."""


# -- the causal key ---------------------------------------------------------------------


def causal_key(run_id: str, node_id: str | None = None, attempt_id: str | None = None) -> str:
    """The deterministic key joining run, node and attempt scope across handler spans and PAL.

    ``sha256(run_id + "\\x1f" + node_id + "\\x1f" + attempt_id)`` over UTF-8, a
    missing scope written as the empty string, as the first 32 lowercase hex
    digits. The separator (0x1F) cannot occur in a run, node or attempt id.
    """
    scope = "\x1f".join((run_id, node_id or "", attempt_id or ""))
    return hashlib.sha256(scope.encode("utf-8")).hexdigest()[:32]


# -- closed dimensions ------------------------------------------------------------------


class FailureClass(enum.Enum):
    """Why a node ended Failed: the handler's own permanent failure or a recorded failure cause.

    ``other`` stands for a failure cause this code does not know yet, so an
    unknown cause still yields a closed label instead of free text.
    """

    PERMANENT_FAILURE = "permanent_failure"
    RETRIES_EXHAUSTED = "retries_exhausted"
    NOT_RETRYABLE = "not_retryable"
    NO_CORRECTION_EDGE = "no_correction_edge"
    NODE_BUDGET_EXHAUSTED = "node_budget_exhausted"
    CORRECTION_UNRESOLVED = "correction_unresolved"
    OTHER = "other"

    @classmethod
    def of(cls, cause: FailureCause | None, last_outcome: NodeOutcomeKind | None) -> FailureClass:
        """The class of a failed node from its recorded cause (if any) and its last outcome kind."""
        if cause is not None:
            return _FAILURE_BY_CAUSE.get(cause.value, cls.OTHER)
        if last_outcome is NodeOutcomeKind.PERMANENT_FAILURE:
            return cls.PERMANENT_FAILURE
        return cls.OTHER


_FAILURE_BY_CAUSE: Final[Mapping[str, FailureClass]] = {c.value: c for c in FailureClass}


class RecoveryMode(enum.Enum):
    """The recovery operations of ADR-0032 "Restart recovery"."""

    INSPECT = "inspect"
    REPLAY = "replay"
    RESUME = "resume"


LATENCY_BUCKET_BOUNDS_MS: Final = (10, 100, 1_000, 10_000, 60_000, 600_000, 3_600_000)
"""Inclusive upper bounds of the latency buckets, in (virtual) milliseconds; above the last is ``gt_1h``."""


class LatencyBucket(enum.Enum):
    """A fixed latency bucket: each holds durations up to and including its bound."""

    LE_10MS = "le_10ms"
    LE_100MS = "le_100ms"
    LE_1S = "le_1s"
    LE_10S = "le_10s"
    LE_1MIN = "le_1min"
    LE_10MIN = "le_10min"
    LE_1H = "le_1h"
    GT_1H = "gt_1h"

    @property
    def upper_bound_ms(self) -> int | None:
        """The bucket's inclusive upper bound in milliseconds (``None`` for ``gt_1h``)."""
        index = list(LatencyBucket).index(self)
        return LATENCY_BUCKET_BOUNDS_MS[index] if index < len(LATENCY_BUCKET_BOUNDS_MS) else None

    @classmethod
    def of(cls, duration_ms: int) -> LatencyBucket:
        """The bucket holding ``duration_ms`` (a negative duration is refused with ValueError)."""
        if duration_ms < 0:
            raise ValueError(f"latency must be >= 0 ms, got {duration_ms}")
        buckets = list(cls)
        for bucket, bound in zip(buckets, LATENCY_BUCKET_BOUNDS_MS, strict=False):
            if duration_ms <= bound:
                return bucket
        return cls.GT_1H


class Metric(enum.Enum):
    """The metrics Mayfly publishes; each has a fixed set of dimensions (see :class:`MetricKey`).

    - ``runs`` (run_state): runs observed, by state.
    - ``nodes`` (run_state, node_state): nodes of the observed runs, by state.
    - ``node_failures`` (failure_class): Failed nodes, by class.
    - ``attempt_outcomes`` (outcome_class): committed attempt outcomes, by class.
    - ``attempt_latency`` (outcome_class, latency_bucket): attempts from dispatch
      to committed outcome, in virtual time (needs the journal records).
    - ``run_duration`` (run_state, latency_bucket): terminal runs, creation to result.
    - ``recoveries`` (recovery_mode): recovery operations performed.
    """

    RUNS = "runs"
    NODES = "nodes"
    NODE_FAILURES = "node_failures"
    ATTEMPT_OUTCOMES = "attempt_outcomes"
    ATTEMPT_LATENCY = "attempt_latency"
    RUN_DURATION = "run_duration"
    RECOVERIES = "recoveries"


_DIMENSION_TYPES: Final[Mapping[str, type[enum.Enum]]] = {
    "run_state": RunStatus,
    "node_state": NodeStatus,
    "failure_class": FailureClass,
    "outcome_class": NodeOutcomeKind,
    "recovery_mode": RecoveryMode,
    "latency_bucket": LatencyBucket,
}

_DIMENSIONS: Final[Mapping[Metric, frozenset[str]]] = {
    Metric.RUNS: frozenset({"run_state"}),
    Metric.NODES: frozenset({"run_state", "node_state"}),
    Metric.NODE_FAILURES: frozenset({"failure_class"}),
    Metric.ATTEMPT_OUTCOMES: frozenset({"outcome_class"}),
    Metric.ATTEMPT_LATENCY: frozenset({"outcome_class", "latency_bucket"}),
    Metric.RUN_DURATION: frozenset({"run_state", "latency_bucket"}),
    Metric.RECOVERIES: frozenset({"recovery_mode"}),
}


class MetricKey(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A metric and its labels; every label is a closed enum, so no id can become one.

    Construction checks that each label is a member of its dimension's enum
    and that the metric gets exactly its dimensions; anything else (a string,
    an id, a missing or extra label) raises ``TypeError`` or ``ValueError``.
    Decoding JSON with a value outside an enum raises ``msgspec.ValidationError``.
    """

    metric: Metric
    run_state: RunStatus | None = None
    node_state: NodeStatus | None = None
    failure_class: FailureClass | None = None
    outcome_class: NodeOutcomeKind | None = None
    recovery_mode: RecoveryMode | None = None
    latency_bucket: LatencyBucket | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.metric, Metric):
            raise TypeError(f"metric must be a Metric, got {type(self.metric).__name__}")
        required = _DIMENSIONS[self.metric]
        for name, kind in _DIMENSION_TYPES.items():
            value = getattr(self, name)
            if value is None:
                if name in required:
                    raise ValueError(f"metric {self.metric.value} needs a {name} label")
                continue
            # Enum membership only: a str or an id is never a label (ADR-0032: ids cannot become labels).
            if type(value) is not kind:
                raise TypeError(f"label {name} must be a {kind.__name__} member, got {type(value).__name__}")
            if name not in required:
                raise ValueError(f"metric {self.metric.value} has no {name} dimension")

    def labels(self) -> dict[str, str]:
        """The key's labels as ``{dimension: enum value}`` (for exporters)."""
        out: dict[str, str] = {}
        for name in _DIMENSION_TYPES:
            value = getattr(self, name)
            if value is not None:
                out[name] = str(value.value)
        return out

    def sort_key(self) -> tuple[str, ...]:
        """A total order over keys: metric, then every label value (empty when absent)."""
        return (
            self.metric.value,
            *(v.value if (v := getattr(self, n)) is not None else "" for n in _DIMENSION_TYPES),
        )


class Counter(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One series of a snapshot: a key and its value."""

    key: MetricKey
    value: int


@final
class MetricsSnapshot(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An immutable, complete metrics projection: counters sorted by key, each key once.

    ``runs_observed`` is how many runs the projection covers. Build one with
    :class:`MetricsCollector` or :func:`compute_metrics`.
    """

    schema_version: int
    runs_observed: int
    counters: tuple[Counter, ...]

    def __post_init__(self) -> None:
        # Exporters rely on one series per key, in a stable order, with counts that never go negative.
        previous: tuple[str, ...] | None = None
        for counter in self.counters:
            order = counter.key.sort_key()
            if previous is not None and order <= previous:
                raise ValueError(f"metrics snapshot series {order} is duplicated or out of key order")
            if counter.value < 0:
                raise ValueError(f"metrics snapshot series {order} has a negative value {counter.value}")
            previous = order

    def value(self, key: MetricKey) -> int:
        """The value of ``key`` (0 when the projection has no such series)."""
        for counter in self.counters:
            if counter.key == key:
                return counter.value
        return 0

    def series(self, metric: Metric) -> tuple[Counter, ...]:
        """Every counter of ``metric``, in key order."""
        return tuple(c for c in self.counters if c.key.metric is metric)

    def total(self, metric: Metric) -> int:
        """The sum of every counter of ``metric``."""
        return sum(c.value for c in self.counters if c.key.metric is metric)

    def to_json(self) -> bytes:
        """The snapshot as compact JSON."""
        return _ENCODER.encode(self)


_ENCODER = msgspec.json.Encoder()


class MetricsCollector:
    """Accumulates runs and recovery operations into one :class:`MetricsSnapshot`.

    Not thread-safe; use one per projection. :meth:`snapshot` copies, so a
    collector can keep accumulating after publishing.
    """

    def __init__(self) -> None:
        self._counts: dict[MetricKey, int] = {}
        self._runs = 0

    def _add(self, key: MetricKey, amount: int = 1) -> None:
        self._counts[key] = self._counts.get(key, 0) + amount

    def add_run(
        self,
        state: RunState,
        records: Sequence[JournalRecord] | None = None,
        *,
        upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
    ) -> None:
        """Count one run: its state, its nodes' states and failures, its attempt outcomes.

        With the run's ``records`` (from sequence 1, or any contiguous part)
        attempt latencies are counted too: dispatch time to committed outcome.
        """
        self._runs += 1
        run_state = state.status
        self._add(MetricKey(Metric.RUNS, run_state=run_state))
        for node in state.nodes:
            self._add(MetricKey(Metric.NODES, run_state=run_state, node_state=node.status))
            if node.status is NodeStatus.FAILED:
                kind = None if node.last_outcome is None else node.last_outcome.kind
                self._add(MetricKey(Metric.NODE_FAILURES, failure_class=FailureClass.of(node.failure, kind)))
        for attempt in state.to_record().attempts:
            if attempt.outcome is not None:
                self._add(MetricKey(Metric.ATTEMPT_OUTCOMES, outcome_class=attempt.outcome.kind))
        if run_state.is_terminal:
            self._add(
                MetricKey(
                    Metric.RUN_DURATION, run_state=run_state, latency_bucket=LatencyBucket.of(state.now)
                )
            )
        if records:
            started: dict[str, int] = {}
            for record in records:
                if record.run_id != state.run_id:
                    raise InvalidRecord(
                        f"metrics for run {state.run_id} were given a record of run {record.run_id} "
                        f"(sequence {record.sequence}); pass only this run's records"
                    )
                event = decode_event(
                    record.event_type, record.schema_version, record.payload, upcasters=upcasters
                )
                if isinstance(event, NodeStarted | ChildStarted):
                    started[event.attempt_id] = event.at
                elif isinstance(event, NodeOutcomeCommitted) and event.attempt_id is not None:
                    at = started.pop(event.attempt_id, None)
                    if at is not None:
                        self._add(
                            MetricKey(
                                Metric.ATTEMPT_LATENCY,
                                outcome_class=event.outcome.kind,
                                latency_bucket=LatencyBucket.of(max(event.at - at, 0)),
                            )
                        )

    def add_recovery(self, mode: RecoveryMode) -> None:
        """Count one recovery operation."""
        self._add(MetricKey(Metric.RECOVERIES, recovery_mode=mode))

    def snapshot(self) -> MetricsSnapshot:
        """The complete projection so far, as an immutable snapshot."""
        counters = tuple(
            Counter(key, value)
            for key, value in sorted(self._counts.items(), key=lambda kv: kv[0].sort_key())
        )
        return MetricsSnapshot(
            schema_version=METRICS_SCHEMA_VERSION, runs_observed=self._runs, counters=counters
        )


def compute_metrics(
    runs: Iterable[RunState | RecoveredRun],
    records: Mapping[str, Sequence[JournalRecord]] | None = None,
) -> MetricsSnapshot:
    """One snapshot over ``runs``; ``records`` maps a run id to its records for latency counters."""
    collector = MetricsCollector()
    for run in runs:
        state = run.state if isinstance(run, RecoveredRun) else run
        collector.add_run(state, None if records is None else records.get(state.run_id))
    return collector.snapshot()


class MetricsPublisher(Protocol):
    """Anything that hands a snapshot to exporters; :class:`mayfly.plugins.PluginManager` is one."""

    def publish_metrics(self, snapshot: object) -> None:
        """Deliver ``snapshot`` to every exporter."""
        ...


_default_publisher: Callable[[], MetricsPublisher] | None = None


def set_metrics_publisher(
    factory: Callable[[], MetricsPublisher] | None,
) -> Callable[[], MetricsPublisher] | None:
    """Install how :func:`publish_metrics` finds its default publisher; return the previous one.

    ``None`` removes it. The package root installs
    ``mayfly.plugins.plugin_manager``: this module sits beside the plugin
    manager in the layer order and may not import it.
    """
    global _default_publisher  # one process-wide hook, installed by the package root
    previous, _default_publisher = _default_publisher, factory
    return previous


def publish_metrics(snapshot: MetricsSnapshot, publisher: MetricsPublisher | None = None) -> None:
    """Publish one complete snapshot through the ``mayfly_publish_metrics`` hook.

    ``publisher`` defaults to the one installed with :func:`set_metrics_publisher`
    (the process-wide plugin manager); every exporter receives the same snapshot.
    """
    if not isinstance(snapshot, MetricsSnapshot):
        raise TypeError(f"publish_metrics takes a MetricsSnapshot, got {type(snapshot).__name__}")
    if publisher is None:
        if _default_publisher is None:
            raise PluginError(
                "no metrics publisher is installed; `import mayfly` installs the plugin manager, "
                "or pass publisher= explicitly"
            )
        publisher = _default_publisher()
    publisher.publish_metrics(snapshot)


# -- PAL --------------------------------------------------------------------------------


class PalFact(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """One payload-free PAL fact: an acknowledged record, or an explicit recovery operation.

    For a record (``kind="record"``): its ``sequence``, ``event_id`` and
    ``event_type``; the node and attempt it concerns, if any; the outcome
    class of an outcome event; the node status before and after
    (``node_from``/``node_to``) and the run status after; ``at`` is the run's
    virtual time after the event. For a recovery (``kind="recovery"``,
    ``event_type="Recovery"``): ``recovery_mode``, with ``sequence`` and
    ``event_id`` of the last record the recovery read. ``causal_key`` is
    :func:`causal_key` of the fact's scope.
    """

    kind: Literal["record", "recovery"]
    causal_key: str
    run_id: str
    sequence: int
    event_id: str
    event_type: str
    at: int
    run_status: RunStatus
    schema_version: int = PAL_SCHEMA_VERSION
    node_id: str | None = None
    attempt_id: str | None = None
    attempt: int | None = None
    outcome: NodeOutcomeKind | None = None
    timeout: bool = False
    node_from: NodeStatus | None = None
    node_to: NodeStatus | None = None
    recovery_mode: RecoveryMode | None = None


class PalProjector:
    """Projects one run's records to PAL facts, incrementally, in sequence order.

    It keeps a private state, reduced from the records it projects, to report
    status transitions; that state is its own and never written back.
    Start it empty (records from sequence 1) or from a copy of a run's state
    (records from ``state.sequence + 1``). A record out of order, or of
    another run, raises :class:`~mayfly.model.errors.InvalidRecord`.
    """

    def __init__(
        self,
        state: RunState | None = None,
        *,
        upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
    ) -> None:
        # A copy: reduction mutates in place, and the caller's state must stay untouched.
        self._state = None if state is None else RunState.from_record(state.to_record())
        self._upcasters = upcasters

    def project(self, records: Iterable[JournalRecord]) -> list[PalFact]:
        """The facts of ``records``, which continue the run where the projector stands."""
        facts: list[PalFact] = []
        for record in records:
            state = self._state
            expected = 1 if state is None else state.sequence + 1
            if record.sequence != expected or (state is not None and record.run_id != state.run_id):
                where = "a new run" if state is None else f"run {state.run_id}"
                raise InvalidRecord(
                    f"PAL projection of {where} expected sequence {expected}, got run {record.run_id} "
                    f"sequence {record.sequence}; project records in order from the projector's state"
                )
            event = decode_event(
                record.event_type, record.schema_version, record.payload, upcasters=self._upcasters
            )
            node_id = getattr(event, "node_id", None)
            if isinstance(event, EdgeActivated):
                node_id = event.target  # the node the edge activates
            node_id = node_id if isinstance(node_id, str) else None
            attempt_id = getattr(event, "attempt_id", None)
            attempt_id = attempt_id if isinstance(attempt_id, str) else None
            before = None
            node_before = None if state is None or node_id is None else state.node_by_id(node_id)
            if node_before is not None:
                before = node_before.status
            attempt: int | None = None
            if isinstance(event, NodeStarted | ChildStarted):
                attempt = event.attempt
            elif isinstance(event, RetryScheduled | RetryReleased):
                attempt = event.next_attempt
            elif node_before is not None and attempt_id is not None and node_before.attempt_id == attempt_id:
                attempt = node_before.attempt
            self._state = after_state = reduce(state, event, record.sequence)
            node_after = None if node_id is None else after_state.node_by_id(node_id)
            outcome = event.outcome if isinstance(event, NodeOutcomeCommitted) else None
            facts.append(
                PalFact(
                    kind="record",
                    causal_key=causal_key(record.run_id, node_id, attempt_id),
                    run_id=record.run_id,
                    sequence=record.sequence,
                    event_id=record.event_id,
                    event_type=record.event_type,
                    at=after_state.now,
                    run_status=after_state.status,
                    node_id=node_id,
                    attempt_id=attempt_id,
                    attempt=attempt,
                    outcome=None if outcome is None else outcome.kind,
                    timeout=isinstance(outcome, RetryableFailure) and outcome.timeout,
                    node_from=before,
                    node_to=None if node_after is None else node_after.status,
                )
            )
        return facts


def project_pal(
    records: Iterable[JournalRecord], *, upcasters: Mapping[tuple[str, int], Upcaster] | None = None
) -> list[PalFact]:
    """The payload-free PAL facts of one run's records, which start at sequence 1."""
    return PalProjector(upcasters=upcasters).project(records)


def recovery_fact(recovered: RecoveredRun, mode: RecoveryMode) -> PalFact:
    """The PAL fact of an explicit recovery operation on ``recovered`` (scope: the run)."""
    state = recovered.state
    last = recovered.last_record
    return PalFact(
        kind="recovery",
        causal_key=causal_key(state.run_id),
        run_id=state.run_id,
        sequence=last.sequence,
        event_id=last.event_id,
        event_type="Recovery",
        at=state.now,
        run_status=state.status,
        recovery_mode=mode,
    )


# -- structured logging -----------------------------------------------------------------


class _MetricsLine(msgspec.Struct, frozen=True):
    event: str
    snapshot: MetricsSnapshot


class _PalLine(msgspec.Struct, frozen=True):
    event: str
    fact: PalFact


@final
class JsonLogExporter:
    """Writes metrics snapshots and PAL facts as JSON lines through :mod:`logging` (stdlib only).

    Each snapshot is one line on the ``mayfly.metrics`` logger (whole, never
    split), each PAL fact one line on ``mayfly.pal``; the message *is* the
    JSON, so a handler with the format ``%(message)s`` writes JSON lines.
    Register an instance as a plugin to receive every published snapshot::

        mayfly.plugins.plugin_manager().register(JsonLogExporter(), name="jsonlog", distribution="mayfly")
    """

    MAYFLY_PLUGIN_API: ClassVar[int] = PLUGIN_API

    def __init__(
        self,
        metrics_logger: logging.Logger | None = None,
        pal_logger: logging.Logger | None = None,
        *,
        level: int = logging.INFO,
    ) -> None:
        self.metrics_logger = (
            metrics_logger if metrics_logger is not None else logging.getLogger("mayfly.metrics")
        )
        self.pal_logger = pal_logger if pal_logger is not None else logging.getLogger("mayfly.pal")
        self.level = level

    def export_metrics(self, snapshot: MetricsSnapshot) -> None:
        """Log ``snapshot`` as one JSON line ``{"event": "mayfly.metrics", "snapshot": {...}}``."""
        line = _ENCODER.encode(_MetricsLine("mayfly.metrics", snapshot)).decode()
        self.metrics_logger.log(self.level, "%s", line)

    def export_pal(self, facts: Iterable[PalFact]) -> None:
        """Log each fact as one JSON line ``{"event": "mayfly.pal", "fact": {...}}``."""
        for fact in facts:
            self.pal_logger.log(self.level, "%s", _ENCODER.encode(_PalLine("mayfly.pal", fact)).decode())

    @hookimpl
    def mayfly_publish_metrics(self, snapshot: object) -> None:
        """Export a published snapshot (the plugin hook); anything else is ignored."""
        if isinstance(snapshot, MetricsSnapshot):
            self.export_metrics(snapshot)
