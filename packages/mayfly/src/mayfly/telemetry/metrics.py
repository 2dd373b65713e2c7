"""Closed-type metrics: counters whose every label is a closed enum, published whole (ADR-0032 Story 1.10)."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Protocol, final

import msgspec

from mayfly.journal import JournalRecord
from mayfly.model.errors import InvalidRecord
from mayfly.model.events import ChildStarted, FailureCause, NodeOutcomeCommitted, NodeStarted
from mayfly.model.outcomes import NodeOutcomeKind
from mayfly.model.state import NodeStatus, RunState, RunStatus
from mayfly.plugins import plugin_manager
from mayfly.recovery import RecoveredRun
from mayfly.reducer import Upcaster, decode_event

__all__ = [
    "LATENCY_BUCKET_BOUNDS_MS",
    "METRICS_SCHEMA_VERSION",
    "Counter",
    "FailureClass",
    "LatencyBucket",
    "Metric",
    "MetricKey",
    "MetricsCollector",
    "MetricsPublisher",
    "MetricsSnapshot",
    "RecoveryMode",
    "WorkerEvent",
    "WorkerMetrics",
    "compute_metrics",
    "publish_metrics",
]

METRICS_SCHEMA_VERSION: Final = 1
"""Version of :class:`MetricsSnapshot` and its JSON form."""


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
        ``upcasters`` lift older event versions as the records are decoded; left
            out, they are those of the process's plugin manager
            (:func:`mayfly.plugins.plugin_manager`), and ``{}`` means none.
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
            upcasters = plugin_manager().event_upcasters() if upcasters is None else upcasters
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
    *,
    upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
) -> MetricsSnapshot:
    """One snapshot over ``runs``; ``records`` maps a run id to its records for latency counters.

    ``upcasters`` read the records, as in :meth:`MetricsCollector.add_run`.
    """
    collector = MetricsCollector()
    for run in runs:
        state = run.state if isinstance(run, RecoveredRun) else run
        collector.add_run(state, None if records is None else records.get(state.run_id), upcasters=upcasters)
    return collector.snapshot()


class MetricsPublisher(Protocol):
    """Anything that hands a snapshot to exporters; :class:`mayfly.plugins.PluginManager` is one."""

    def publish_metrics(self, snapshot: object) -> None:
        """Deliver ``snapshot`` to every exporter."""
        ...


def publish_metrics(snapshot: MetricsSnapshot, publisher: MetricsPublisher | None = None) -> None:
    """Publish one complete snapshot through the ``mayfly_publish_metrics`` hook.

    ``publisher`` is the plugin context whose exporters receive it, by default
    the process's entry-point manager (:func:`mayfly.plugins.plugin_manager`);
    every exporter receives the same snapshot.
    """
    if not isinstance(snapshot, MetricsSnapshot):
        raise TypeError(f"publish_metrics takes a MetricsSnapshot, got {type(snapshot).__name__}")
    (plugin_manager() if publisher is None else publisher).publish_metrics(snapshot)


# -- a worker's own counters ----------------------------------------------------------------


class WorkerEvent(enum.Enum):
    """The events a :class:`mayfly.Worker` logs; ``other`` stands for one this code does not know yet."""

    CLAIMED = "claimed"
    ENDED = "ended"
    PARKED = "parked"
    REFUSED = "refused"
    LOST = "lost"
    ERROR = "error"
    SCHEDULED = "scheduled"
    STARTED = "started"
    STOPPING = "stopping"
    ABORTING = "aborting"
    STOPPED = "stopped"
    INDEX_INCOMPLETE = "index_incomplete"
    OTHER = "other"

    @classmethod
    def of(cls, name: str) -> WorkerEvent:
        """The member named by a worker log event (``other`` for an unknown one)."""
        return _WORKER_EVENTS.get(name, cls.OTHER)


_WORKER_EVENTS: Final[Mapping[str, WorkerEvent]] = {e.value: e for e in WorkerEvent}


@final
class WorkerMetrics(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A worker's in-process counters: its log events by kind, its active runs and concurrency.

    ``events[WorkerEvent.CLAIMED]`` counts claims, ``events[WorkerEvent.LOST]``
    lease losses (a lost lease or a refused fencing token). They count what this
    worker process did since it was built; nothing is read from the journal.
    """

    events: dict[WorkerEvent, int]
    active: int
    concurrency: int

    def to_json(self) -> bytes:
        """The counters as compact JSON (events keyed by their value)."""
        return _ENCODER.encode(self)
