"""What instrumenting costs per node: no observer (the floor), the span observer without an SDK, with one.

Run: ``python packages/mayfly/tests/telemetry/bench_otel_overhead.py [RUNS]``. Prints microseconds per
node for each setup and its ratio to the floor, measured in the same run on the in-memory journal
(so the journal's own cost does not hide the observer's). Nothing is asserted.
"""

from __future__ import annotations

import sys
import time
import uuid

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mayfly import HandlerRegistry, HandlerRequest, Node, Succeeded, WorkflowSpec
from mayfly.runtime import WorkflowRuntime
from mayfly.telemetry.otel import SpanObserver, instrument

NODES = 20
SPEC = WorkflowSpec(
    workflow_id="bench.otel",
    version=1,
    nodes=tuple(
        Node(f"n{i}", handler="step@1", depends_on=(f"n{i - 1}",) if i else ()) for i in range(NODES)
    ),
)


def registry() -> HandlerRegistry:
    handlers = HandlerRegistry()

    @handlers.handler("step")
    def step(request: HandlerRequest) -> Succeeded:
        return Succeeded(output=None)

    return handlers


def per_node_us(runtime: WorkflowRuntime, runs: int) -> float:
    runtime.execute(SPEC, None)  # warm up
    started = time.perf_counter()
    for _ in range(runs):
        runtime.execute(SPEC, None)
    return (time.perf_counter() - started) / (runs * NODES) * 1e6


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    floor_rt = WorkflowRuntime(f"memory://bench-{uuid.uuid4().hex}", registry())
    no_sdk_rt = WorkflowRuntime(f"memory://bench-{uuid.uuid4().hex}", registry(), observer=SpanObserver())
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sdk_rt = WorkflowRuntime(f"memory://bench-{uuid.uuid4().hex}", registry())
    instrument(sdk_rt, provider.get_tracer("mayfly"))
    results: dict[str, list[float]] = {"floor": [], "no_sdk": [], "sdk": []}
    for _ in range(3):  # interleaved rounds, best of three, so load drift hits every setup alike
        results["floor"].append(per_node_us(floor_rt, runs))
        results["no_sdk"].append(per_node_us(no_sdk_rt, runs))
        results["sdk"].append(per_node_us(sdk_rt, runs))
        exporter.clear()
    # The observer alone, without an SDK, against an empty function: what one commit pays.
    state = no_sdk_rt.inspect(no_sdk_rt.journal.list_runs(limit=1)[0]).state
    calls = 200_000
    observer = SpanObserver()

    def nothing(state: object, events: tuple[object, ...]) -> None:
        return None

    timings = {}
    for name, fn in (("empty", nothing), ("observer", observer)):
        started = time.perf_counter()
        for _ in range(calls):
            fn(state, ())
        timings[name] = (time.perf_counter() - started) / calls * 1e9
    floor = min(results["floor"])
    print(f"{NODES}-node chain x {runs} runs, in-memory journal, best of 3 rounds")
    print(f"floor (no observer):            {floor:8.1f} us/node")
    for name, label in (("no_sdk", "span observer, no SDK"), ("sdk", "span observer, SDK in-memory")):
        best = min(results[name])
        print(
            f"{label + ':':31} {best:8.1f} us/node  ratio {best / floor:.3f}  (+{best - floor:.1f} us/node)"
        )
    print(
        f"one observer call without an SDK: {timings['observer']:.0f} ns "
        f"(an empty function: {timings['empty']:.0f} ns, ratio {timings['observer'] / timings['empty']:.1f})"
    )


if __name__ == "__main__":
    main()
