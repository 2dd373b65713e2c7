"""OpenTelemetry spans through the SDK's in-memory exporter, for real runs on the file journal.

The SDK (opentelemetry-sdk) is a test dependency only; Mayfly's ``[otel]``
extra is the API. Each test uses a private TracerProvider, so no global SDK is
set in the test process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from mayfly import (
    FixedBackoff,
    HandlerRegistry,
    HandlerRequest,
    Node,
    RetryableFailure,
    RetryPolicy,
    RunStatus,
    Succeeded,
    WorkflowSpec,
)
from mayfly.model.events import NodeStarted
from mayfly.model.state import RunState
from mayfly.reducer import decode_event
from mayfly.runtime import WorkflowRuntime
from mayfly.telemetry import causal_key
from mayfly.telemetry.otel import OffloadSpanExporter, SpanObserver, instrument, scope_context
from mayfly.worker import Worker

CANARY = "canary-5d1e-never-in-a-span"

SPEC = WorkflowSpec(
    workflow_id="otel.flow",
    version=1,
    nodes=(
        Node("flaky", handler="flaky@1", retry=RetryPolicy(max_attempts=3, backoff=FixedBackoff(delay_ms=1))),
        Node("after", handler="after@1", depends_on=("flaky",)),
    ),
)


def registry() -> HandlerRegistry:
    handlers = HandlerRegistry()
    seen: dict[str, int] = {}

    @handlers.handler("flaky")
    def flaky(request: HandlerRequest) -> Succeeded | RetryableFailure:
        seen[request.run_id] = seen.get(request.run_id, 0) + 1
        if seen[request.run_id] == 1:
            return RetryableFailure(reason=CANARY)
        return Succeeded(output={"echo": CANARY})

    @handlers.handler("after")
    def after(request: HandlerRequest) -> Succeeded:
        return Succeeded(output=CANARY)

    return handlers


@pytest.fixture
def exporter() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield memory, provider
    provider.shutdown()


def everything_said(span: ReadableSpan) -> str:
    """Every string a span carries: name, attributes, link attributes, status and events."""
    parts = [span.name, repr(dict(span.attributes or {})), repr(span.status.description)]
    parts += [repr(dict(link.attributes or {})) for link in span.links]
    parts += [repr((event.name, dict(event.attributes or {}))) for event in span.events]
    return " ".join(parts)


def attempt_ids(runtime: WorkflowRuntime, run_id: str) -> list[tuple[str, str]]:
    out = []
    for record in runtime.journal.read(run_id):
        event = decode_event(record.event_type, record.schema_version, record.payload)
        if isinstance(event, NodeStarted):
            out.append((event.node_id, event.attempt_id))
    return out


def test_a_run_writes_run_attempt_and_commit_spans_in_its_causal_trace(
    tmp_path: Path, exporter: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    """One run: a run span, one span per attempt, one per commit, all in the run's causal-key trace."""
    memory, provider = exporter
    commits: list[int] = []

    def counting(state: RunState, events: tuple[object, ...]) -> None:
        commits.append(len(events))

    runtime = WorkflowRuntime(f"file://{tmp_path}/journal", registry(), observer=counting)
    observer = instrument(runtime, provider.get_tracer("mayfly"))
    assert runtime.observer is observer and instrument(runtime) is observer
    result = runtime.execute(SPEC, {"secret": CANARY})
    assert result.status is RunStatus.SUCCEEDED
    run_id = result.run_id
    spans = memory.get_finished_spans()
    names = [s.name for s in spans]
    assert names.count("mayfly.run") == 1
    assert names.count("mayfly.attempt") == 3  # flaky twice, after once
    assert names.count("mayfly.commit") == len(commits)  # the chained observer saw the same commits
    assert "mayfly.recovery" not in names

    trace_id = int(causal_key(run_id), 16)
    run_scope = scope_context(run_id)
    for span in spans:
        assert span.context is not None and span.parent is not None
        assert span.context.trace_id == trace_id
        assert span.parent.span_id == run_scope.span_id and span.parent.is_remote
        assert CANARY not in everything_said(span)
        assert span.attributes is not None and span.attributes["mayfly.run_id"] == run_id

    attempts = [s for s in spans if s.name == "mayfly.attempt"]
    recorded = attempt_ids(runtime, run_id)
    assert [(s.attributes["mayfly.node_id"], s.attributes["mayfly.attempt_id"]) for s in attempts] == recorded  # type: ignore[index]
    for span, (node, attempt) in zip(attempts, recorded, strict=True):
        assert [link.context.span_id for link in span.links] == [scope_context(run_id, node, attempt).span_id]
        assert span.attributes["mayfly.causal_key"] == causal_key(run_id, node, attempt)  # type: ignore[index]
        assert span.attributes["mayfly.attempt.since"] == "dispatch"  # type: ignore[index]
        assert span.start_time is not None and span.end_time is not None
        assert span.start_time <= span.end_time
    assert [s.attributes["mayfly.outcome_class"] for s in attempts] == [  # type: ignore[index]
        "retryable_failure",
        "succeeded",
        "succeeded",
    ]
    assert attempts[0].status.status_code is StatusCode.ERROR
    assert attempts[1].status.status_code is StatusCode.UNSET

    commit_spans = [s for s in spans if s.name == "mayfly.commit"]
    sequences = [int(s.attributes["mayfly.sequence"]) for s in commit_spans]  # type: ignore[arg-type,index]
    assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
    records = runtime.journal.read(run_id)
    assert sequences[-1] == records[-1].sequence
    assert sum(s.attributes["mayfly.events"] for s in commit_spans) == len(records)  # type: ignore[index,misc]

    (run_span,) = (s for s in spans if s.name == "mayfly.run")
    state = runtime.inspect(run_id).state
    assert state.epoch_ms is not None and run_span.start_time == state.epoch_ms * 1_000_000
    assert run_span.attributes["mayfly.run_state"] == "succeeded"  # type: ignore[index]
    assert run_span.attributes["mayfly.workflow_id"] == "otel.flow"  # type: ignore[index]


def test_without_an_sdk_the_observer_records_nothing_and_still_chains(tmp_path: Path) -> None:
    """No SDK provider is set in this process: the global tracer is a no-op and the observer skips work."""
    seen: list[int] = []
    observer = SpanObserver(chain=lambda state, events: seen.append(state.sequence))
    assert observer._active_tracer() is None
    runtime = WorkflowRuntime(f"file://{tmp_path}/journal", registry(), observer=observer)
    assert runtime.execute(SPEC, None).status is RunStatus.SUCCEEDED
    assert seen and seen == sorted(seen)


CRASHING_DRIVER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from mayfly import HandlerRegistry, Node, Succeeded, WorkflowSpec
    from mayfly.runtime import WorkflowRuntime

    url, marker, run_id = sys.argv[1:4]
    handlers = HandlerRegistry()

    @handlers.handler("first")
    def first(request):
        return Succeeded(output=None)

    @handlers.handler("hang")
    def hang(request):
        Path(marker).write_text("dispatched")
        time.sleep(600)  # killed here, its attempt in flight

    spec = WorkflowSpec(workflow_id="otel.crash", version=1, nodes=(
        Node("first", handler="first@1"), Node("hang", handler="hang@1", depends_on=("first",)),
    ))
    WorkflowRuntime(url, handlers, lease_ttl_ms=300).execute(spec, {"secret": sys.argv[4]}, run_id=run_id)
    """
)


def test_a_run_resumed_after_a_sigkill_writes_a_recovery_span_into_the_same_trace(
    tmp_path: Path, exporter: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    """A process is SIGKILLed mid-attempt; the process that resumes the run adds its spans to the run's trace."""
    memory, provider = exporter
    url = f"file://{tmp_path}/journal"
    marker = tmp_path / "dispatched"
    run_id = "0193a5c4-7b1e-7c3d-9f00-00000000c0de"
    child = subprocess.Popen([sys.executable, "-c", CRASHING_DRIVER, url, str(marker), run_id, CANARY])
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert child.poll() is None, "the driver process ended before dispatching the attempt"
            assert time.monotonic() < deadline, "the driver never dispatched the hanging attempt"
            time.sleep(0.01)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    time.sleep(0.4)  # the dead process's 300 ms lease expires

    handlers = HandlerRegistry()

    @handlers.handler("first")
    def first(request: HandlerRequest) -> Succeeded:
        return Succeeded(output=None)

    @handlers.handler("hang")
    def hang(request: HandlerRequest) -> Succeeded:
        return Succeeded(output=CANARY)

    runtime = WorkflowRuntime(url, handlers)
    instrument(runtime, provider.get_tracer("mayfly"))
    result = runtime.resume(run_id)
    assert result.status is RunStatus.SUCCEEDED
    spans = memory.get_finished_spans()
    names = [s.name for s in spans]
    assert names.count("mayfly.recovery") == 1
    assert names.count("mayfly.run") == 1
    recovery = next(s for s in spans if s.name == "mayfly.recovery")
    assert names.index("mayfly.recovery") == 0  # before anything the recovery plan commits
    assert recovery.attributes is not None
    assert recovery.attributes["mayfly.recovery_mode"] == "resume"
    assert recovery.attributes["mayfly.run_state"] == "running"
    assert "ReconcileAttempt" in recovery.attributes["mayfly.recovery.effect_types"]  # type: ignore[operator]
    trace_id = int(causal_key(run_id), 16)
    for span in spans:
        assert span.context is not None and span.context.trace_id == trace_id
        assert span.parent is not None and span.parent.span_id == scope_context(run_id).span_id
        assert CANARY not in everything_said(span)
    # The attempt in flight when its process was killed is re-invoked under its original ids: its span
    # starts at the recovery that took it over and ends at the outcome committed here.
    hung = [s for s in spans if s.name == "mayfly.attempt" and s.attributes["mayfly.node_id"] == "hang"]  # type: ignore[index]
    recorded = [a for node, a in attempt_ids(runtime, run_id) if node == "hang"]
    assert len(recorded) == 1
    assert [s.attributes["mayfly.attempt_id"] for s in hung] == recorded  # type: ignore[index]
    assert hung[0].attributes["mayfly.attempt.since"] == "recovery"  # type: ignore[index]
    assert hung[0].start_time == recovery.start_time
    assert [link.context.span_id for link in hung[0].links] == [
        scope_context(run_id, "hang", recorded[0]).span_id
    ]
    # The first node's attempt ended in the killed process: no span of it here.
    assert not [s for s in spans if s.name == "mayfly.attempt" and s.attributes["mayfly.node_id"] == "first"]  # type: ignore[index]
    (run_span,) = (s for s in spans if s.name == "mayfly.run")
    state = runtime.inspect(run_id).state
    assert state.epoch_ms is not None and run_span.start_time == state.epoch_ms * 1_000_000


class ThreadRecordingExporter(InMemorySpanExporter):
    """The in-memory exporter, noting the thread each export ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.threads.append(threading.get_ident())
        return super().export(spans)


def test_an_offload_exporter_exports_off_the_hub_and_inline_outside_it(tmp_path: Path) -> None:
    """Wrapped in OffloadSpanExporter, exports from hub tasks run on the offload thread, others inline."""
    inner = ThreadRecordingExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OffloadSpanExporter(inner)))  # type: ignore[arg-type]
    try:
        runtime = WorkflowRuntime(f"file://{tmp_path}/journal", registry())
        instrument(runtime, provider.get_tracer("mayfly"))
        runtime.start(SPEC, None)  # committed outside any hub: exported inline, on this thread
        assert inner.threads == [threading.get_ident()]
        assert runtime.execute(SPEC, None).status is RunStatus.SUCCEEDED
        hub_exports = inner.threads[1:]
        assert hub_exports and threading.get_ident() not in hub_exports
        assert len(inner.get_finished_spans()) == len(inner.threads)
    finally:
        provider.shutdown()


def test_without_the_api_the_import_says_which_extra_to_install() -> None:
    """With opentelemetry unimportable, importing the module fails with the install command to run."""
    script = "import sys; sys.modules['opentelemetry'] = None; import mayfly.telemetry.otel"
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert completed.returncode == 1
    last = completed.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError: mayfly.telemetry.otel needs the OpenTelemetry API")
    assert last.endswith('install the extra: pip install "mayfly-runtime[otel]"')
    # The rest of telemetry needs no extra.
    script = "import sys; sys.modules['opentelemetry'] = None; import mayfly.telemetry, mayfly.telemetry.prometheus"
    assert subprocess.run([sys.executable, "-c", script], check=False).returncode == 0


def test_a_worker_that_claims_a_crashed_run_writes_its_recovery_span(
    tmp_path: Path, exporter: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    """A worker's claim is a resume: instrumented, it writes the recovery span and finishes the trace."""
    memory, provider = exporter
    url = f"file://{tmp_path}/journal"
    marker = tmp_path / "dispatched"
    run_id = "0193a5c4-7b1e-7c3d-9f00-00000000beef"
    child = subprocess.Popen([sys.executable, "-c", CRASHING_DRIVER, url, str(marker), run_id, CANARY])
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the attempt was never dispatched"
            time.sleep(0.01)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()

    handlers = HandlerRegistry()

    @handlers.handler("first")
    def first(request: HandlerRequest) -> Succeeded:
        return Succeeded(output=None)

    @handlers.handler("hang")
    def hang(request: HandlerRequest) -> Succeeded:
        return Succeeded(output=CANARY)

    worker = Worker(url, handlers, poll_interval_ms=20, log=lambda record: None)
    instrument(worker.runtime, provider.get_tracer("mayfly"))
    deadline = time.monotonic() + 30
    worker.run(until=lambda: time.monotonic() > deadline or worker.ended == 1)
    assert worker.ended == 1 and worker.runtime.handle(run_id).status() == "succeeded"
    spans = memory.get_finished_spans()
    recoveries = [s for s in spans if s.name == "mayfly.recovery"]
    assert recoveries and recoveries[0].attributes is not None
    assert "ReconcileAttempt" in recoveries[0].attributes["mayfly.recovery.effect_types"]  # type: ignore[operator]
    assert [s.name for s in spans].count("mayfly.run") == 1
    (hung,) = (s for s in spans if s.name == "mayfly.attempt")
    assert hung.attributes is not None and hung.attributes["mayfly.attempt.since"] == "recovery"
    trace_id = int(causal_key(run_id), 16)
    assert {s.context.trace_id for s in spans if s.context is not None} == {trace_id}
    assert all(CANARY not in everything_said(s) for s in spans)
