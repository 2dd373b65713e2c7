"""Reducer benchmark: decode + reduce throughput beside msgspec's bare decode of the same bytes.

Run: ``python packages/mayfly/benchmarks/bench_reducer.py`` (or ``nox -s bench``).
Prints, per history shape, events/s for bare typed decode and for decode +
reduce, their ratio, the cost per event relative to the 1k-node run, and the
derived state's memory per node. Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections.abc import Callable

import msgspec

from mayfly.model.events import Event
from mayfly.model.outcomes import Succeeded
from mayfly.model.spec import Node, RetryPolicy, RunBudgets, WorkflowSpec
from mayfly.reducer import decode_event, encode_event, reduce
from mayfly.testing import ReducerHarness

ONE_ATTEMPT = RetryPolicy(max_attempts=1)
BIG = RunBudgets(max_attempts=10_000_000, max_transitions=10_000_000)


def fan_out_in(width: int) -> WorkflowSpec:
    """root -> width parallel nodes -> sink (all_succeeded)."""
    middle = tuple(
        Node(f"m{i}", handler="work@1", depends_on=("root",), retry=ONE_ATTEMPT) for i in range(width)
    )
    sink = Node("sink", handler="work@1", depends_on=tuple(n.id for n in middle), retry=ONE_ATTEMPT)
    root = Node("root", handler="work@1", retry=ONE_ATTEMPT)
    return WorkflowSpec(workflow_id="bench.fan", version=1, nodes=(root, *middle, sink), budgets=BIG)


def chain(length: int) -> WorkflowSpec:
    """n0 -> n1 -> ... -> n(length-1)."""
    nodes = [Node("n0", handler="work@1", retry=ONE_ATTEMPT)]
    nodes += [
        Node(f"n{i}", handler="work@1", depends_on=(f"n{i - 1}",), retry=ONE_ATTEMPT)
        for i in range(1, length)
    ]
    return WorkflowSpec(workflow_id="bench.chain", version=1, nodes=tuple(nodes), budgets=BIG)


def history(spec: WorkflowSpec) -> list[Event]:
    """Drive the spec to success with every ready node started in one batch."""
    run = ReducerHarness(spec)
    done = Succeeded()
    while not run.state.status.is_terminal:
        started = run.start(*run.state.ready_nodes())
        for node_id, attempt_id in started.items():
            run.complete(node_id, done, attempt_id)
    return run.history


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(name: str, spec: WorkflowSpec, repeat: int) -> dict[str, float]:
    events = history(spec)
    records = [encode_event(e) for e in events]
    envelopes = [(r.event_type, r.schema_version, r.payload) for r in records]
    payloads = [r.payload for r in records]
    bare = msgspec.json.Decoder(Event)

    def bare_decode() -> None:
        decode = bare.decode
        for payload in payloads:
            decode(payload)

    def decode_and_reduce() -> None:
        state = None
        for seq, (event_type, version, payload) in enumerate(envelopes, 1):
            state = reduce(state, decode_event(event_type, version, payload), seq)

    t_bare = best_of(repeat, bare_decode)
    t_full = best_of(repeat, decode_and_reduce)
    gc.collect()
    tracemalloc.start()
    state = None
    for seq, event in enumerate(events, 1):
        state = reduce(state, event, seq)
    memory, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    n = len(events)
    return {
        "nodes": len(spec.nodes),
        "events": n,
        "bytes": sum(map(len, payloads)),
        "bare_eps": n / t_bare,
        "full_eps": n / t_full,
        "ratio": t_bare / t_full,
        "us_per_event": t_full / n * 1e6,
        "bytes_per_node": memory / len(spec.nodes),
    } | {"name": name}  # type: ignore[dict-item]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 100k-node run")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    shapes: list[tuple[str, WorkflowSpec]] = [
        ("fan 1k", fan_out_in(1_000)),
        ("fan 10k", fan_out_in(10_000)),
        ("chain 10k", chain(10_000)),
    ]
    if not args.quick:
        shapes.append(("fan 100k", fan_out_in(100_000)))
    print("reducer: decode+reduce vs msgspec bare typed decode of the same payload bytes")
    print(
        f"{'shape':<10} {'nodes':>7} {'events':>8} {'MB':>6} {'bare ev/s':>11} {'full ev/s':>11} "
        f"{'ratio':>6} {'us/ev':>6} {'vs 1k':>6} {'B/node':>7}"
    )
    base = None
    for name, spec in shapes:
        row = measure(name, spec, args.repeat if len(spec.nodes) < 50_000 else 1)
        base = base or row["us_per_event"]
        print(
            f"{name:<10} {row['nodes']:>7.0f} {row['events']:>8.0f} {row['bytes'] / 1e6:>6.1f} "
            f"{row['bare_eps']:>11,.0f} {row['full_eps']:>11,.0f} {row['ratio']:>6.2f} "
            f"{row['us_per_event']:>6.2f} {row['us_per_event'] / base:>6.2f} {row['bytes_per_node']:>7,.0f}"
        )
    print("ratio = bare decode time / (decode + reduce) time (target >= 0.5);")
    print("vs 1k = cost per event relative to the 1k fan (target <= 1.5); B/node = derived state memory.")


if __name__ == "__main__":
    main()
