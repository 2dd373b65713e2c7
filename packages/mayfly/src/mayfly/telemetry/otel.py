"""OpenTelemetry spans of runs, attempts, journal commits and recoveries (the ``[otel]`` extra).

Install ``mayfly-runtime[otel]`` (``opentelemetry-api`` only) and instrument a
runtime, or a worker's runtime::

    from mayfly.telemetry.otel import instrument
    instrument(runtime)            # or instrument(worker.runtime)

:class:`SpanObserver` is a commit observer (the runtime's ``observer=``) that
also watches recoveries. It turns what the runtime already reports, each
acknowledged commit and each run it recovers, into spans through the
OpenTelemetry API. Spans are exported by whatever SDK the application sets
up (``opentelemetry.trace.set_tracer_provider``); with none, every call
returns at its first check, and a runtime that is not instrumented has no
observer at all.

Spans (names, attributes: ``docs/telemetry.md``):

- ``mayfly.run``: a run from its epoch (creation) to its result, emitted by
  the process that commits the result.
- ``mayfly.attempt``: one attempt from its dispatch commit to its outcome
  commit; one this process took over in a recovery starts at the recovery,
  one it only saw end starts at its outcome (``mayfly.attempt.since``).
- ``mayfly.commit``: one acknowledged commit: which events, up to which sequence.
- ``mayfly.recovery``: a run recovered (resumed) by this process, with its
  recovery plan's effect kinds.

Attributes are ids (run, node, attempt, workflow) and closed values only
(states, outcome classes, event and effect kinds, counts); no input, output,
reason, evidence, signal token or decision is ever read. Determinism: every
span of a run is in the trace whose id is the run's causal key
(:func:`~mayfly.telemetry.causal_key`, 128 bits), as the child of a remote
parent whose span id is the key's last 64 bits; a span of an attempt also
links to the attempt's own causal-key context. Any process that touches a run,
the one that created it, the worker that resumed it after a crash, writes
into the same trace without propagating anything.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final, Protocol, final

try:
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
    from opentelemetry.util.types import AttributeValue
except ImportError as missing:  # pragma: no cover - exercised in a subprocess without the API
    raise ModuleNotFoundError(
        f"mayfly.telemetry.otel needs the OpenTelemetry API ({missing}); "
        'install the extra: pip install "mayfly-runtime[otel]"'
    ) from None

from mayfly.model.errors import HubNotRunning
from mayfly.model.events import (
    ChildStarted,
    Event,
    NodeOutcomeCommitted,
    NodeStarted,
    RunCompleted,
)
from mayfly.model.outcomes import NodeOutcomeKind
from mayfly.model.state import RunState, RunStatus
from mayfly.recovery import ReconcileAttempt, ReconcileChild, RecoveryEffect
from mayfly.runtime import WorkflowRuntime
from mayfly.runtime._context import Observer
from mayfly.substrate import offload
from mayfly.telemetry.metrics import RecoveryMode
from mayfly.telemetry.pal import causal_key

__all__ = ["INSTRUMENTATION_NAME", "OffloadSpanExporter", "SpanObserver", "instrument", "scope_context"]

INSTRUMENTATION_NAME: Final = "mayfly"
"""The instrumentation scope name of Mayfly's tracer."""

_MAX_OPEN: Final = 100_000
_LOOKUP_INTERVAL_S: Final = 1.0
_FAILED_OUTCOMES: Final = frozenset({NodeOutcomeKind.PERMANENT_FAILURE, NodeOutcomeKind.RETRYABLE_FAILURE})


def scope_context(run_id: str, node_id: str | None = None, attempt_id: str | None = None) -> SpanContext:
    """The deterministic span context of a causal scope: trace id of the run's key, span id of the scope's.

    The trace id is the 128 bits of ``causal_key(run_id)``; the span id the
    last 64 bits of ``causal_key(run_id, node_id, attempt_id)``. It is remote
    and sampled, so an SDK's parent-based sampler records its children.
    """
    trace_id = int(causal_key(run_id), 16) or 1
    span_id = int(causal_key(run_id, node_id, attempt_id)[16:], 16) or 1
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))


@final
class SpanObserver:
    """A commit observer that writes OpenTelemetry spans (see the module docstring).

    ``tracer`` defaults to the global provider's tracer named
    :data:`INSTRUMENTATION_NAME`. While no SDK provider is set it is looked up
    again at most once a second, so an SDK configured after instrumenting is
    picked up within a second (set it up first to miss nothing). ``chain`` is an
    observer called first with every commit (the one it replaces, usually).
    It keeps the dispatch (or takeover) time of attempts in flight, at most
    100,000 (the oldest is forgotten first: its span then starts at its outcome).
    """

    def __init__(self, tracer: trace.Tracer | None = None, *, chain: Observer | None = None) -> None:
        self._tracer = tracer
        self.chain = chain
        self._next_lookup = float("-inf")  # when to ask the API for the global provider again
        # attempt id -> (wall ns, "dispatch" or "recovery"): when this process began to watch it
        self._dispatched: dict[str, tuple[int, str]] = {}

    def _active_tracer(self) -> trace.Tracer | None:
        tracer = self._tracer
        if tracer is not None:
            return tracer
        # Asking the API for the global provider reads os.environ (microseconds): without an SDK,
        # ask at most once a second, and compute nothing in between.
        now = time.monotonic()
        if now < self._next_lookup:
            return None
        self._next_lookup = now + _LOOKUP_INTERVAL_S
        provider = trace.get_tracer_provider()
        if isinstance(provider, trace.ProxyTracerProvider):
            return None  # no SDK: nothing would be recorded, so nothing is computed
        self._tracer = tracer = provider.get_tracer(INSTRUMENTATION_NAME)
        return tracer

    def __call__(self, state: RunState, events: tuple[Event, ...]) -> None:
        """Observe one acknowledged commit: its commit span, and the attempt and run spans it ends."""
        if self.chain is not None:
            self.chain(state, events)
        tracer = self._active_tracer()
        if tracer is None:
            return
        now = time.time_ns()
        run_id = state.run_id
        run_parent = trace.set_span_in_context(trace.NonRecordingSpan(scope_context(run_id)))
        scopes: dict[tuple[str, str], None] = {}
        for event in events:
            if isinstance(event, NodeStarted | ChildStarted):
                self._remember(event.attempt_id, now, "dispatch")
                scopes[(event.node_id, event.attempt_id)] = None
            elif isinstance(event, NodeOutcomeCommitted) and event.attempt_id is not None:
                scopes[(event.node_id, event.attempt_id)] = None
                self._attempt_span(tracer, state, event, now, run_parent)
        attributes: dict[str, AttributeValue] = {
            "mayfly.run_id": run_id,
            "mayfly.causal_key": causal_key(run_id),
            "mayfly.sequence": state.sequence,
            "mayfly.events": len(events),
            "mayfly.event_types": tuple(type(e).__name__ for e in events),
            "mayfly.run_state": state.status.value,
        }
        links = [
            Link(
                scope_context(run_id, node, attempt), {"mayfly.causal_key": causal_key(run_id, node, attempt)}
            )
            for node, attempt in scopes
        ]
        span = tracer.start_span(
            "mayfly.commit",
            context=run_parent,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=links,
            start_time=now,
        )
        span.end(end_time=now)
        if any(isinstance(e, RunCompleted) for e in events):
            self._run_span(tracer, state, now, run_parent)

    def on_recovery(self, state: RunState, effects: tuple[RecoveryEffect, ...]) -> None:
        """Observe a run this process recovered (resumed under its lease), before its plan runs."""
        tracer = self._active_tracer()
        if tracer is None:
            return
        now = time.time_ns()
        run_id = state.run_id
        attributes: dict[str, AttributeValue] = {
            "mayfly.run_id": run_id,
            "mayfly.causal_key": causal_key(run_id),
            "mayfly.recovery_mode": RecoveryMode.RESUME.value,
            "mayfly.run_state": state.status.value,
            "mayfly.sequence": state.sequence,
            "mayfly.recovery.effects": len(effects),
            "mayfly.recovery.effect_types": tuple(type(e).__name__ for e in effects),
        }
        for effect in effects:
            if isinstance(effect, ReconcileAttempt | ReconcileChild):
                # Its dispatch was another process's; from here on this one owns it.
                self._remember(effect.attempt_id, now, "recovery")
        parent = trace.set_span_in_context(trace.NonRecordingSpan(scope_context(run_id)))
        span = tracer.start_span(
            "mayfly.recovery",
            context=parent,
            attributes=attributes,
            links=_parent_links(state),
            start_time=now,
        )
        span.end(end_time=now)

    def _remember(self, attempt_id: str, now: int, since: str) -> None:
        dispatched = self._dispatched
        if len(dispatched) >= _MAX_OPEN:
            del dispatched[next(iter(dispatched))]
        dispatched[attempt_id] = (now, since)

    def _attempt_span(
        self,
        tracer: trace.Tracer,
        state: RunState,
        event: NodeOutcomeCommitted,
        now: int,
        parent: Context,
    ) -> None:
        attempt_id = event.attempt_id
        assert attempt_id is not None
        watched = self._dispatched.pop(attempt_id, None)
        key = causal_key(state.run_id, event.node_id, attempt_id)
        kind = event.outcome.kind
        attributes: dict[str, AttributeValue] = {
            "mayfly.run_id": state.run_id,
            "mayfly.node_id": event.node_id,
            "mayfly.attempt_id": attempt_id,
            "mayfly.causal_key": key,
            "mayfly.outcome_class": kind.value,
            "mayfly.attempt.since": "outcome" if watched is None else watched[1],
        }
        node = state.node_by_id(event.node_id)
        if node is not None:
            attributes["mayfly.node_state"] = node.status.value
            if node.attempt_id == attempt_id:
                attributes["mayfly.attempt"] = node.attempt
        span = tracer.start_span(
            "mayfly.attempt",
            context=parent,
            attributes=attributes,
            links=[Link(scope_context(state.run_id, event.node_id, attempt_id), {"mayfly.causal_key": key})],
            start_time=now if watched is None else watched[0],
        )
        if kind in _FAILED_OUTCOMES:
            span.set_status(Status(StatusCode.ERROR))  # no description: a reason is payload
        span.end(end_time=now)

    def _run_span(self, tracer: trace.Tracer, state: RunState, now: int, parent: Context) -> None:
        epoch = state.epoch_ms
        start = now if epoch is None else min(epoch * 1_000_000, now)
        attributes: dict[str, AttributeValue] = {
            "mayfly.run_id": state.run_id,
            "mayfly.causal_key": causal_key(state.run_id),
            "mayfly.workflow_id": state.spec.workflow_id,
            "mayfly.workflow_version": state.spec.version,
            "mayfly.run_state": state.status.value,
            "mayfly.sequence": state.sequence,
            "mayfly.nodes": len(state.nodes),
        }
        span = tracer.start_span(
            "mayfly.run",
            context=parent,
            attributes=attributes,
            links=_parent_links(state),
            start_time=start,
        )
        if state.status is RunStatus.FAILED:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=now)


def _parent_links(state: RunState) -> tuple[Link, ...]:
    """A child run's spans link to the parent attempt that called it."""
    link = state.parent
    if link is None:
        return ()
    key = causal_key(link.run_id, link.node_id, link.attempt_id)
    return (Link(scope_context(link.run_id, link.node_id, link.attempt_id), {"mayfly.causal_key": key}),)


def instrument(runtime: WorkflowRuntime, tracer: trace.Tracer | None = None) -> SpanObserver:
    """Make ``runtime`` (or ``worker.runtime``) write spans; its current observer is kept, called first.

    Returns the :class:`SpanObserver`, now ``runtime.observer``. Calling it
    again on an instrumented runtime returns the observer already there.
    """
    current = runtime.observer
    if isinstance(current, SpanObserver):
        return current
    observer = SpanObserver(tracer, chain=current)
    runtime.observer = observer
    return observer


class _SpanExporter(Protocol):
    def export(self, spans: Sequence[Any]) -> Any: ...

    def shutdown(self) -> None: ...

    def force_flush(self, timeout_millis: int = 30_000) -> bool: ...


@final
class OffloadSpanExporter:
    """An SDK span exporter whose blocking ``export`` runs on the hub's offload thread.

    Network exporters (OTLP over HTTP) block on a socket and sleep between
    retries; called from a hub task, that would stop every run of the hub.
    Wrapped in this, an export parks only the task that ended the span while
    ``mayfly.substrate.offload`` runs it; outside a hub it runs inline. Use it
    under the SDK's ``SimpleSpanProcessor`` (``BatchSpanProcessor`` starts a
    thread of its own, which a Mayfly process does not run). ``timeout_s``
    bounds the task's wait (``OffloadTimeout``, which the span processor logs).
    """

    def __init__(self, exporter: _SpanExporter, *, timeout_s: float = 30.0) -> None:
        self.exporter = exporter
        self.timeout_s = timeout_s

    def export(self, spans: Sequence[Any]) -> Any:
        """Export ``spans`` through the wrapped exporter, off the hub when one runs."""
        try:
            return offload(self.exporter.export, spans, timeout=self.timeout_s)
        except HubNotRunning:
            return self.exporter.export(spans)

    def shutdown(self) -> None:
        """Shut the wrapped exporter down."""
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Flush the wrapped exporter."""
        return self.exporter.force_flush(timeout_millis)
