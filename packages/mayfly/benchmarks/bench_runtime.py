"""End-to-end runtime throughput and recovery cost on the local journal.

Run: ``python packages/mayfly/benchmarks/bench_runtime.py [--nodes 1000] [--events 100000]``.

Prints, measured in one run:

1. no-op nodes/s for a chain and a fan-out of ``--nodes`` cooperative no-op
   handlers on the local journal in ``fsync`` and ``write`` modes, beside the
   journal's raw append rate for batches of the same shape measured in the
   same directory; ``efficiency = nodes/s / (raw commits/s / commits per node)``
   says how close the engine gets to the journal's own limit;
2. resuming a run of ``--events`` events from a snapshot versus a full replay
   (target: snapshot resume <= 5 % of full replay). The run is a chain whose
   nodes each fail retryably ``RETRIES`` times before succeeding, so 100k
   events fit a specification under the 1 MiB record limit (a plain chain of
   33k nodes would need a 2.8 MB ``RunCreated``).

Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from mayfly.commit import commit_command
from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.commands import AttemptStart, CompleteAttempt, CreateRun, StartNodes
from mayfly.model.outcomes import RetryableFailure, Succeeded
from mayfly.model.spec import ImmediateBackoff, Node, RetryPolicy, RunBudgets, WorkflowSpec
from mayfly.recovery import inspect_run, replay_run
from mayfly.runtime import HandlerRegistry, HandlerRequest, WorkflowRuntime
from mayfly.snapshot import make_snapshot

ONE = RetryPolicy(max_attempts=1)
BIG = RunBudgets(max_attempts=10_000_000, max_transitions=10_000_000)
RETRIES = 4
# Per node: RETRIES x (NodeStarted, NodeOutcomeCommitted, RetryScheduled, RetryReleased),
# then NodeStarted, NodeOutcomeCommitted and the next node's NodeReady.
EVENTS_PER_NODE = 4 * RETRIES + 3


def chain(n: int) -> WorkflowSpec:
    nodes = [Node("n0", handler="noop@1", retry=ONE)]
    nodes += [Node(f"n{i}", handler="noop@1", depends_on=(f"n{i - 1}",), retry=ONE) for i in range(1, n)]
    return WorkflowSpec(workflow_id="bench.chain", version=1, nodes=tuple(nodes), budgets=BIG)


def retrying_chain(n: int) -> WorkflowSpec:
    retry = RetryPolicy(max_attempts=RETRIES + 1, backoff=ImmediateBackoff())
    nodes = [Node("n0", handler="noop@1", retry=retry)]
    nodes += [Node(f"n{i}", handler="noop@1", depends_on=(f"n{i - 1}",), retry=retry) for i in range(1, n)]
    return WorkflowSpec(workflow_id="bench.retrying", version=1, nodes=tuple(nodes), budgets=BIG)


def fan(n: int) -> WorkflowSpec:
    nodes = tuple(Node(f"n{i}", handler="noop@1", retry=ONE) for i in range(n))
    return WorkflowSpec(workflow_id="bench.fan", version=1, nodes=nodes, budgets=BIG)


def noop(req: HandlerRequest) -> Succeeded:
    return Succeeded()


def raw_commit_rate(root: Path, durability: str, commits: int) -> float:
    """Appends/s of 2-record batches straight to the journal (no decide, no reduce, no hub)."""
    journal = LocalWorkflowJournal(f"file://{root}/raw-{durability}?durability={durability}")
    ids = Uuid7IdSource()
    run_id = ids.new_id()
    payload = (
        b'{"type":"NodeStarted","node_id":"n1","attempt_id":"'
        + ids.new_id().encode()
        + b'","attempt":1,"at":0}'
    )
    batches = [
        [
            JournalRecord.seal(
                run_id=run_id,
                sequence=2 * i + k + 1,
                event_id=ids.new_id(),
                event_type="NodeStarted",
                schema_version=1,
                payload=payload,
            )
            for k in range(2)
        ]
        for i in range(commits)
    ]
    start = time.perf_counter()
    for i, batch in enumerate(batches):
        journal.append(run_id, 2 * i + 1, batch)
    return commits / (time.perf_counter() - start)


def engine(root: Path, durability: str, spec: WorkflowSpec) -> tuple[float, int]:
    """Nodes/s through WorkflowRuntime.execute, and the number of journal commits it made."""
    url = f"file://{root}/engine-{durability}-{spec.workflow_id}?durability={durability}"
    registry = HandlerRegistry()
    registry.register("noop", 1, noop, cooperative=True)
    journal = LocalWorkflowJournal(url)
    commits = 0

    def count(state: object, events: tuple[object, ...]) -> None:
        nonlocal commits
        commits += 1

    runtime = WorkflowRuntime(
        journal, registry, leases=LocalLeaseStore(url), snapshot_every=10**9, observer=count
    )
    start = time.perf_counter()
    result = runtime.execute(spec)
    elapsed = time.perf_counter() - start
    assert result.succeeded
    return len(spec.nodes) / elapsed, commits


def recovery(root: Path, events: int) -> tuple[int, float, float]:
    """Build a run of about ``events`` events, snapshot it, and time snapshot resume vs full replay."""
    url = f"file://{root}/recovery?durability=write"
    journal = LocalWorkflowJournal(url)
    ids = Uuid7IdSource()
    nodes = max(events // EVENTS_PER_NODE, 1)
    run_id = ids.new_id()
    spec = retrying_chain(nodes)
    state = commit_command(journal, None, CreateRun(run_id=run_id, spec=spec), ids=ids).state
    last = None
    while not state.status.is_terminal:
        (node_id,) = state.ready_nodes()
        attempt = ids.new_id()
        commit_command(journal, state, StartNodes((AttemptStart(node_id, attempt),)), ids=ids)
        node = state.node_by_id(node_id)
        assert node is not None
        outcome = Succeeded() if node.attempt > RETRIES else RetryableFailure(reason="bench")
        last = commit_command(journal, state, CompleteAttempt(node_id, attempt, outcome), ids=ids)
    assert last is not None
    journal.write_snapshot(run_id, make_snapshot(state, last.records[-1]))
    fresh = LocalWorkflowJournal(url)
    start = time.perf_counter()
    snap = inspect_run(fresh, run_id)
    t_snapshot = time.perf_counter() - start
    assert snap.source == "snapshot"
    fresh = LocalWorkflowJournal(url)
    start = time.perf_counter()
    full = replay_run(fresh, run_id)
    t_full = time.perf_counter() - start
    assert full.state.to_record() == snap.state.to_record()
    return state.sequence, t_snapshot, t_full


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--dir", help="directory for the journals (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        print(f"runtime: {args.nodes} cooperative no-op nodes on the local journal")
        print(
            f"{'mode':<6} {'shape':<6} {'nodes/s':>9} {'commits':>8} {'raw commits/s':>14} {'efficiency':>10}"
        )
        for durability in ("fsync", "write"):
            raw = raw_commit_rate(root, durability, 300 if durability == "fsync" else 3000)
            for shape, spec in (("chain", chain(args.nodes)), ("fan", fan(args.nodes))):
                rate, commits = engine(root, durability, spec)
                efficiency = rate / (raw / (commits / args.nodes))
                print(
                    f"{durability:<6} {shape:<6} {rate:>9,.0f} {commits:>8} {raw:>14,.0f} {efficiency:>10.2f}"
                )
        print("efficiency = nodes/s / (raw commits/s / commits per node); 1.00 = the journal's own limit")
        count, t_snap, t_full = recovery(root, args.events)
        print(
            f"recovery of a {count:,}-event run: snapshot + tail {t_snap * 1000:.1f} ms, "
            f"full replay {t_full * 1000:.1f} ms, ratio {t_snap / t_full:.3f} (target <= 0.05)"
        )


if __name__ == "__main__":
    main()
