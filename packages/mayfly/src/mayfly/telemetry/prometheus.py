"""The Prometheus text exposition (format 0.0.4) of Mayfly's closed-type metrics.

:func:`render` reads a journal and returns the whole exposition: runs by
state, nodes by run and node state, Failed nodes by failure class, committed
attempt outcomes by class, attempt latency and run duration as histograms,
and, where the journal keeps a run index, runs by index status and how many
are due now. :func:`render_worker` renders a :class:`~mayfly.telemetry.WorkerMetrics`
(``worker.metrics()``): claims, lease losses and the worker's other events,
counted in that worker's process. :func:`render_snapshot` renders any
:class:`~mayfly.telemetry.MetricsSnapshot`, so an application that counts
recoveries with a :class:`~mayfly.telemetry.MetricsCollector` can expose them too.

Every label value is the value of a closed enum; no run, node, attempt,
workflow or handler id, and no queue name, ever becomes a label. The text is
written here (the format is small and specified); ``prometheus_client`` is
used only by the tests, as the parser. Each metric is documented in
``docs/telemetry.md``.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from mayfly.commit import keeps_run_index
from mayfly.journal import JournalRecord, WorkflowJournal
from mayfly.model.errors import CompatibilityError, CorruptionError, JournalError, JournalUnavailable
from mayfly.model.outcomes import NodeOutcomeKind
from mayfly.model.state import NodeStatus, RunStatus
from mayfly.plugins import PluginManager, plugin_manager
from mayfly.recovery import inspect_run
from mayfly.runindex import IndexStatus
from mayfly.telemetry.metrics import (
    LATENCY_BUCKET_BOUNDS_MS,
    FailureClass,
    LatencyBucket,
    Metric,
    MetricsCollector,
    MetricsSnapshot,
    RecoveryMode,
    WorkerEvent,
    WorkerMetrics,
)

__all__ = ["CONTENT_TYPE", "render", "render_snapshot", "render_worker"]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
"""The HTTP ``Content-Type`` of the text exposition format 0.0.4."""

_PAGE: Final = 1_000

# Histogram bucket bounds in seconds (Prometheus' base unit), the closed LatencyBucket bounds.
_LE: Final = tuple(_bound / 1000 for _bound in LATENCY_BUCKET_BOUNDS_MS)


def render(
    journal: WorkflowJournal,
    *,
    plugins: PluginManager | None = None,
    now_ms: int | None = None,
) -> bytes:
    """The whole exposition of ``journal``: every run read once (snapshot and tail) plus its records.

    ``plugins`` supplies the event upcasters that read each history (default:
    the process's entry-point manager). ``now_ms`` (wall Unix ms, default the
    system clock) decides which index entries are due. A run whose history
    cannot be read is counted in ``mayfly_runs_unreadable`` rather than failing
    the scrape; a journal that cannot be reached at all raises
    :class:`~mayfly.errors.JournalUnavailable`, so the scrape fails honestly.
    """
    upcasters = (plugin_manager() if plugins is None else plugins).event_upcasters()
    collector = MetricsCollector()
    unreadable = 0
    run_ids = list(_run_ids(journal))
    for run_id in run_ids:
        try:
            state = inspect_run(journal, run_id, upcasters=upcasters).state
            records: Sequence[JournalRecord] = journal.read(run_id)
            collector.add_run(state, records, upcasters=upcasters)
        except JournalUnavailable:
            raise
        except (JournalError, CorruptionError, CompatibilityError):
            unreadable += 1
    out = _Writer()
    _snapshot_families(out, collector.snapshot(), with_recoveries=False)
    out.family("mayfly_runs_unreadable", "gauge", "Runs whose history could not be read (`mayfly inspect`).")
    out.sample("mayfly_runs_unreadable", {}, unreadable)
    if keeps_run_index(journal):
        now = int(time.time() * 1000) if now_ms is None else now_ms
        by_status = dict.fromkeys(IndexStatus, 0)
        due = 0
        for run_id in run_ids:
            entry = journal.index_get(run_id)
            if entry is None:
                continue
            by_status[entry.status] += 1
            if entry.status is not IndexStatus.TERMINAL and (
                entry.wake or (entry.ready_at_ms is not None and entry.ready_at_ms <= now)
            ):
                due += 1
        out.family("mayfly_index_runs", "gauge", "Runs in the run index, by what they need from a worker.")
        for status, count in by_status.items():
            out.sample("mayfly_index_runs", {"index_status": status.value}, count)
        out.family(
            "mayfly_index_runs_due",
            "gauge",
            "Unended runs the index says are due now (ready, woken or past their wake time), held or not.",
        )
        out.sample("mayfly_index_runs_due", {}, due)
    return out.text()


def render_snapshot(snapshot: MetricsSnapshot) -> bytes:
    """The exposition of one :class:`~mayfly.telemetry.MetricsSnapshot`, recoveries included."""
    out = _Writer()
    _snapshot_families(out, snapshot, with_recoveries=True)
    return out.text()


def render_worker(metrics: WorkerMetrics) -> bytes:
    """The exposition of one worker's in-process counters (``worker.metrics()``)."""
    out = _Writer()
    out.family("mayfly_worker_claims", "counter", "Runs this worker claimed from the run index.")
    out.sample("mayfly_worker_claims_total", {}, metrics.events.get(WorkerEvent.CLAIMED, 0))
    out.family(
        "mayfly_worker_lease_losses",
        "counter",
        "Runs this worker let go because its lease was lost or its fencing token was refused.",
    )
    out.sample("mayfly_worker_lease_losses_total", {}, metrics.events.get(WorkerEvent.LOST, 0))
    out.family("mayfly_worker_events", "counter", "Events of this worker's log, by event.")
    for event in WorkerEvent:
        out.sample("mayfly_worker_events_total", {"event": event.value}, metrics.events.get(event, 0))
    out.family("mayfly_worker_active_runs", "gauge", "Runs this worker is driving now.")
    out.sample("mayfly_worker_active_runs", {}, metrics.active)
    out.family("mayfly_worker_concurrency", "gauge", "How many runs this worker drives at most at once.")
    out.sample("mayfly_worker_concurrency", {}, metrics.concurrency)
    return out.text()


# -- internals ----------------------------------------------------------------------------


def _run_ids(journal: WorkflowJournal) -> Iterator[str]:
    after: str | None = None
    while True:
        page = journal.list_runs(after=after, limit=_PAGE)
        yield from page
        if len(page) < _PAGE:
            return
        after = page[-1]


def _snapshot_families(out: _Writer, snapshot: MetricsSnapshot, *, with_recoveries: bool) -> None:
    counts = {c.key: c.value for c in snapshot.counters}
    by_metric: dict[Metric, dict[tuple[str, ...], int]] = {}
    for key, value in counts.items():
        labels = tuple(sorted(key.labels().items()))
        by_metric.setdefault(key.metric, {})[tuple(f"{k}={v}" for k, v in labels)] = value

    def get(metric: Metric, **labels: enum.Enum) -> int:
        wanted = tuple(f"{k}={v.value}" for k, v in sorted(labels.items()))
        return by_metric.get(metric, {}).get(wanted, 0)

    out.family("mayfly_runs_observed", "gauge", "Runs the projection read.")
    out.sample("mayfly_runs_observed", {}, snapshot.runs_observed)
    out.family("mayfly_runs", "gauge", "Runs, by run state.")
    for run_state in RunStatus:
        out.sample("mayfly_runs", {"run_state": run_state.value}, get(Metric.RUNS, run_state=run_state))
    out.family("mayfly_nodes", "gauge", "Nodes of the runs, by run state and node state.")
    for run_state in RunStatus:
        for node_state in NodeStatus:
            value = get(Metric.NODES, run_state=run_state, node_state=node_state)
            out.sample("mayfly_nodes", {"run_state": run_state.value, "node_state": node_state.value}, value)
    out.family("mayfly_node_failures", "gauge", "Failed nodes of the runs, by failure class.")
    for failure in FailureClass:
        value = get(Metric.NODE_FAILURES, failure_class=failure)
        out.sample("mayfly_node_failures", {"failure_class": failure.value}, value)
    out.family("mayfly_attempt_outcomes", "counter", "Committed attempt outcomes, by outcome class.")
    for kind in NodeOutcomeKind:
        value = get(Metric.ATTEMPT_OUTCOMES, outcome_class=kind)
        out.sample("mayfly_attempt_outcomes_total", {"outcome_class": kind.value}, value)
    _histogram(
        out,
        "mayfly_attempt_latency_seconds",
        "Attempts from dispatch to committed outcome, in run (virtual) time, by outcome class.",
        label="outcome_class",
        members=NodeOutcomeKind,
        count=lambda kind, bucket: get(Metric.ATTEMPT_LATENCY, outcome_class=kind, latency_bucket=bucket),
    )
    _histogram(
        out,
        "mayfly_run_duration_seconds",
        "Ended runs from creation to result, in run (virtual) time, by final run state.",
        label="run_state",
        members=[s for s in RunStatus if s.is_terminal],
        count=lambda state, bucket: get(Metric.RUN_DURATION, run_state=state, latency_bucket=bucket),
    )
    if with_recoveries:
        out.family("mayfly_recoveries", "counter", "Recovery operations performed, by mode.")
        for mode in RecoveryMode:
            value = get(Metric.RECOVERIES, recovery_mode=mode)
            out.sample("mayfly_recoveries_total", {"recovery_mode": mode.value}, value)


def _histogram(
    out: _Writer,
    name: str,
    help_text: str,
    *,
    label: str,
    members: Iterable[enum.Enum],
    count: Callable[[Any, LatencyBucket], int],
) -> None:
    # A cumulative histogram from the closed latency buckets. There is no _sum: the projection keeps
    # bucket counts only, and a sum would have to be made up (docs/telemetry.md says so).
    out.family(name, "histogram", help_text)
    buckets = list(LatencyBucket)
    for member in members:
        running = 0
        for bucket, le in zip(buckets, [*_LE, None], strict=True):
            running += count(member, bucket)
            bound = "+Inf" if le is None else _float(le)
            out.sample(f"{name}_bucket", {label: str(member.value), "le": bound}, running)
        out.sample(f"{name}_count", {label: str(member.value)}, running)


def _float(value: float) -> str:
    return repr(float(value))


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Writer:
    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        if kind == "counter":
            # Format 0.0.4 names a counter's HELP and TYPE by its sample name, the one with _total.
            name = f"{name}_total"
        self._lines.append(f"# HELP {name} {_escape_help(help_text)}")
        self._lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: Mapping[str, str], value: int) -> None:
        if labels:
            body = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
            self._lines.append(f"{name}{{{body}}} {value}")
        else:
            self._lines.append(f"{name} {value}")

    def text(self) -> bytes:
        return ("\n".join(self._lines) + "\n").encode("utf-8")
