"""Specification hashing benchmark: the canonical content hash beside a hash of msgspec's bare encoding.

Run: ``python packages/mayfly/benchmarks/bench_spec.py`` (or ``nox -s bench``).
Every run creation and every resume hashes the pinned spec, so its cost
matters for big graphs. Prints, per spec shape, the time of a SHA-256 over
msgspec's sorted encoding as the spec holds it (what ``content_hash`` was
before it was canonical), of ``content_hash()`` (canonical: every field that
JSON-equals its default left out, whatever object holds it), their ratio, and
beside them the typed decode and ``validate`` of the same spec for scale.
Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable

from mayfly.model.json import content_hash
from mayfly.model.spec import ExponentialBackoff, Node, RetryPolicy, RunBudgets, WorkflowSpec
from mayfly.reducer import validate

ONE_ATTEMPT = RetryPolicy(max_attempts=1)
BIG = RunBudgets(max_attempts=10_000_000, max_transitions=10_000_000)


def fan(width: int, *, shared: bool) -> WorkflowSpec:
    """root -> width parallel nodes (a small input each) -> sink; one shared or a fresh RetryPolicy each."""
    middle = tuple(
        Node(
            f"m{i}",
            handler="work@1",
            depends_on=("root",),
            input={"shard": i},
            retry=ONE_ATTEMPT if shared else RetryPolicy(max_attempts=1),
        )
        for i in range(width)
    )
    sink = Node("sink", handler="work@1", depends_on=tuple(n.id for n in middle), retry=ONE_ATTEMPT)
    return WorkflowSpec("bench.fan", 1, nodes=(Node("root", handler="work@1"), *middle, sink), budgets=BIG)


def spelled_out(width: int) -> WorkflowSpec:
    """Every node spells out its defaults in objects of its own: the walk must replace every one."""
    nodes = tuple(
        Node(
            f"n{i}",
            handler="work@1",
            policy=json.loads('"all_succeeded"'),
            retry=RetryPolicy(max_attempts=int("3"), backoff=ExponentialBackoff(int("1000"))),
        )
        for i in range(width)
    )
    return WorkflowSpec("bench.spelled", 1, nodes=nodes, budgets=BIG)


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 100k-node specs")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sizes = [10_000] if args.quick else [10_000, 100_000]
    shapes: list[tuple[str, WorkflowSpec]] = []
    for n in sizes:
        label = f"{n // 1000}k"
        shared = fan(n, shared=True)
        shapes += [
            (f"fan {label} shared", shared),
            (f"fan {label} fresh", fan(n, shared=False)),
            (f"fan {label} decoded", WorkflowSpec.from_json(shared.to_json())),
            (f"spelled {label}", spelled_out(n)),
        ]
    print("spec hashing: canonical content_hash() vs SHA-256 of msgspec's bare sorted encoding (ms)")
    print(
        f"{'shape':<18} {'nodes':>7} {'bare':>8} {'canonical':>10} {'ratio':>6} {'decode':>8} {'validate':>9}"
    )
    for name, spec in shapes:
        data = spec.to_json()
        repeat = args.repeat if len(spec.nodes) < 50_000 else max(1, args.repeat // 2)
        bare = best_of(repeat, lambda: content_hash(spec))  # noqa: B023  # called within the iteration
        canonical = best_of(repeat, spec.content_hash)
        decode = best_of(repeat, lambda: WorkflowSpec.from_json(data))  # noqa: B023
        checked = best_of(1, lambda: validate(spec))  # noqa: B023
        print(
            f"{name:<18} {len(spec.nodes):>7} {bare * 1e3:>8.1f} {canonical * 1e3:>10.1f} "
            f"{canonical / bare:>6.2f} {decode * 1e3:>8.1f} {checked * 1e3:>9.1f}"
        )
    print("ratio = canonical / bare; decode = WorkflowSpec.from_json; validate runs once per run creation.")


if __name__ == "__main__":
    main()
