"""What one /metrics scrape costs: render(journal) against reading every run's records (the floor).

Run: ``python packages/mayfly/tests/telemetry/bench_prometheus_render.py [RUNS] [DIR]``. Builds RUNS
three-node runs on a file journal under DIR (default a new temporary directory), then prints the time
of one render, the time of reading every record of every run once, and their ratio. Nothing is asserted.
"""

from __future__ import annotations

import sys
import tempfile
import time

from mayfly import HandlerRegistry, HandlerRequest, Node, Succeeded, WorkflowSpec
from mayfly.runtime import WorkflowRuntime
from mayfly.telemetry.prometheus import render

SPEC = WorkflowSpec(
    workflow_id="bench.metrics",
    version=1,
    nodes=(
        Node("a", handler="step@1"),
        Node("b", handler="step@1", depends_on=("a",)),
        Node("c", handler="step@1"),
    ),
)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    directory = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="mayfly-metrics-")
    handlers = HandlerRegistry()

    @handlers.handler("step")
    def step(request: HandlerRequest) -> Succeeded:
        return Succeeded(output={"node": request.node_id})

    runtime = WorkflowRuntime(f"file://{directory}/journal", handlers)
    for _ in range(runs):
        runtime.execute(SPEC, None)
    journal = runtime.journal
    run_ids = journal.list_runs(limit=runs + 1)
    render(journal)  # warm up
    started = time.perf_counter()
    records = sum(len(journal.read(run_id)) for run_id in run_ids)
    floor = time.perf_counter() - started
    started = time.perf_counter()
    body = render(journal)
    took = time.perf_counter() - started
    print(f"{len(run_ids)} runs, {records} records, file journal in {directory}")
    print(f"read every record once (floor): {floor * 1000:8.1f} ms")
    print(
        f"render(journal):                {took * 1000:8.1f} ms  ratio {took / floor:.2f}  ({len(body)} bytes)"
    )
    print(f"per run: {took / len(run_ids) * 1e6:.0f} us")


if __name__ == "__main__":
    main()
