"""The Mayfly side of bench_vs_dbos.py: Mayfly on PostgreSQL, in a process of its own.

Usage: python mayfly_side.py JOURNAL_URL --chain 100 --runs 100 --nodes 10 [--chained-runs]

JOURNAL_URL is a ``postgresql://`` journal in its own schema, with the
default ``durability=durable`` (every commit waits for the WAL flush). Handlers
are cooperative no-ops, so each runs on the hub inline, as a DBOS step runs in
its workflow's thread. Measured:

- ``chain``: one run of ``--chain`` nodes, each depending on the one before,
  through ``WorkflowRuntime.execute`` (creating the run included);
- ``fan``: ``--runs`` runs of ``--nodes`` independent nodes, submitted with
  ``WorkflowRuntime.start`` and driven by one ``mayfly.Worker`` of concurrency
  ``--runs`` in this process, as docs/workers.md runs a worker; the time
  counts from the first submission to the last run's end;
- ``fan_chained`` (``--chained-runs``): the same with each run a chain of
  ``--nodes``, the shape of a DBOS workflow of sequential steps.

Prints one JSON line of figures, with the commits per node the observer saw.
This process never imports the comparator (it checks).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from mayfly import HandlerRegistry, Node, Succeeded, WorkflowSpec
from mayfly.runtime import WorkflowRuntime
from mayfly.worker import Worker


def registry() -> HandlerRegistry:
    """One cooperative no-op handler."""
    reg = HandlerRegistry()
    reg.register("noop", 1, lambda req: Succeeded(), cooperative=True)
    return reg


def spec(name: str, nodes: int, *, chained: bool) -> WorkflowSpec:
    """``nodes`` no-op nodes, each depending on the one before when ``chained``, else independent."""
    return WorkflowSpec(
        workflow_id=f"bench.vs-dbos.{name}",
        version=1,
        nodes=tuple(
            Node(f"n{i}", handler="noop@1", depends_on=(f"n{i - 1}",) if chained and i else ())
            for i in range(nodes)
        ),
    )


class Commits:
    """The observer: counts commits (one call per durable append)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, state: Any, batch: Any) -> None:
        self.count += 1


def chain(url: str, length: int) -> tuple[float, float]:
    """Nodes/s of one chain through ``execute``, and its commits per node."""
    commits = Commits()
    runtime = WorkflowRuntime(url, registry(), observer=commits)
    runtime.execute(spec("warm", 2, chained=True))  # warm-up: the schema and the pool, untimed
    commits.count = 0
    started = time.perf_counter()
    result = runtime.execute(spec("chain", length, chained=True))
    elapsed = time.perf_counter() - started
    assert result.status.value == "succeeded", result.status
    return length / elapsed, commits.count / length


def fan(url: str, runs: int, nodes: int, *, chained: bool) -> tuple[float, float, float]:
    """Nodes/s of ``runs`` runs submitted then driven by one worker; submission's share; commits per node."""
    commits = Commits()
    submitter = WorkflowRuntime(url, registry(), observer=commits)
    ended = 0

    def log(event: dict[str, Any]) -> None:
        nonlocal ended
        if event["event"] == "ended":
            ended += 1

    # The worker's defaults but concurrency (poll interval one second: it is woken by the store's
    # notifications and by its own runs ending, not by polling).
    worker = Worker(url, registry(), concurrency=runs, log=log, observer=commits)
    shape = spec("fan-chained" if chained else "fan", nodes, chained=chained)
    started = time.perf_counter()
    handles = [submitter.start(shape) for _ in range(runs)]
    submitted = time.perf_counter()
    worker.run(until=lambda: ended >= runs)
    elapsed = time.perf_counter() - started
    assert all(handle.status() == "succeeded" for handle in handles)
    return runs * nodes / elapsed, (submitted - started) / elapsed, commits.count / (runs * nodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--chain", type=int, default=100)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--chained-runs", action="store_true")
    args = parser.parse_args()
    figures: dict[str, float] = {}
    figures["chain"], figures["chain_commits_per_node"] = chain(args.url, args.chain)
    figures["fan"], figures["fan_submit_share"], figures["fan_commits_per_node"] = fan(
        args.url, args.runs, args.nodes, chained=False
    )
    if args.chained_runs:
        figures["fan_chained"], _, figures["fan_chained_commits_per_node"] = fan(
            args.url, args.runs, args.nodes, chained=True
        )
    assert "dbos" not in sys.modules, "the Mayfly side must never import the comparator"
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
