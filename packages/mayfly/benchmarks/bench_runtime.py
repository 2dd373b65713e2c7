"""End-to-end runtime cost and recovery cost on the local (file) journal.

Run: ``python packages/mayfly/benchmarks/bench_runtime.py [--nodes 1000] [--events 100000] [--dir D]``.

Prints, measured in one run (CPU is ``time.process_time`` of this process,
the figure that does not depend on other load on a shared machine):

1. the disk's floor: ``fdatasync`` calls/s on a small file in the journal's
   directory (it varies from about 300/s to 14,000/s between runs on the
   development machine, so it is printed beside every figure);
2. per durability mode (``fsync``, ``write``), the journal's raw append rate
   for 2-record batches (no decide, no reduce, no hub) in commits/s and CPU
   us/commit -- the floor -- then, for a chain and a fan-out of ``--nodes``
   cooperative no-op handlers through ``WorkflowRuntime.execute``: nodes/s,
   commits, ``efficiency = nodes/s / (raw commits/s / commits per node)``
   (1.00 = the journal's own limit) and the engine's CPU us/node (target on
   ``write``: <= 150);
3. cost growth, live: CPU per event of a retrying chain of about 1k events
   and of about ``--events`` events on ``write`` (target <= 1.2x);
4. resuming a run of ``--events`` events from a snapshot versus a full replay,
   CPU (target: snapshot resume <= 0.03 of full replay). The run is a chain
   whose nodes each fail retryably ``RETRIES`` times before succeeding, so
   100k events fit a specification under the 1 MiB record limit (a plain
   chain of 33k nodes would need a 2.8 MB ``RunCreated``).

Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
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


def retrying_chain(n: int, handler: str = "noop@1") -> WorkflowSpec:
    retry = RetryPolicy(max_attempts=RETRIES + 1, backoff=ImmediateBackoff())
    nodes = [Node("n0", handler=handler, retry=retry)]
    nodes += [Node(f"n{i}", handler=handler, depends_on=(f"n{i - 1}",), retry=retry) for i in range(1, n)]
    return WorkflowSpec(workflow_id="bench.retrying", version=1, nodes=tuple(nodes), budgets=BIG)


def fan(n: int) -> WorkflowSpec:
    nodes = tuple(Node(f"n{i}", handler="noop@1", retry=ONE) for i in range(n))
    return WorkflowSpec(workflow_id="bench.fan", version=1, nodes=nodes, budgets=BIG)


def noop(req: HandlerRequest) -> Succeeded:
    return Succeeded()


def flaky(req: HandlerRequest) -> Succeeded | RetryableFailure:
    """Fails retryably ``RETRIES`` times, then succeeds (the retrying chain's handler)."""
    return Succeeded() if req.attempt > RETRIES else RetryableFailure(reason="bench")


def fdatasync_rate(root: Path, calls: int = 300) -> float:
    """``fdatasync`` calls/s after a 64-byte append each, in ``root`` (the disk's flush floor)."""
    path = root / "fdatasync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        start = time.perf_counter()
        for _ in range(calls):
            os.write(fd, b"x" * 64)
            os.fdatasync(fd)
        return calls / (time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()


def raw_commit_rate(root: Path, durability: str, commits: int) -> tuple[float, float]:
    """Appends/s and CPU us per append of 2-record batches straight to the journal (no decide, no reduce)."""
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
    start, cpu = time.perf_counter(), time.process_time()
    for i, batch in enumerate(batches):
        journal.append(run_id, 2 * i + 1, batch)
    cpu = time.process_time() - cpu
    return commits / (time.perf_counter() - start), cpu / commits * 1e6


def engine(root: Path, durability: str, spec: WorkflowSpec) -> tuple[float, int, float, int]:
    """Nodes/s through WorkflowRuntime.execute, its journal commits, CPU us/node and events."""
    url = f"file://{root}/engine-{durability}-{spec.workflow_id}-{len(spec.nodes)}?durability={durability}"
    registry = HandlerRegistry()
    registry.register("noop", 1, noop, cooperative=True)
    registry.register("flaky", 1, flaky, cooperative=True)
    journal = LocalWorkflowJournal(url)
    commits = events = 0

    def count(state: object, batch: tuple[object, ...]) -> None:
        nonlocal commits, events
        commits += 1
        events += len(batch)

    runtime = WorkflowRuntime(
        journal, registry, leases=LocalLeaseStore(url), snapshot_every=10**9, observer=count
    )
    start, cpu = time.perf_counter(), time.process_time()
    result = runtime.execute(spec)
    cpu = time.process_time() - cpu
    elapsed = time.perf_counter() - start
    assert result.succeeded
    return len(spec.nodes) / elapsed, commits, cpu / len(spec.nodes) * 1e6, events


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
    start = time.process_time()
    snap = inspect_run(fresh, run_id)
    t_snapshot = time.process_time() - start
    assert snap.source == "snapshot"
    fresh = LocalWorkflowJournal(url)
    start = time.process_time()
    full = replay_run(fresh, run_id)
    t_full = time.process_time() - start
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
        load = os.getloadavg()[0]
        print(f"runtime: {args.nodes} cooperative no-op nodes on the local journal (load {load:.1f})")
        print(f"floor: fdatasync {fdatasync_rate(root):,.0f}/s in {root}")
        print(
            f"{'mode':<6} {'shape':<6} {'nodes/s':>9} {'commits':>8} {'raw commits/s':>14} "
            f"{'raw CPU us':>10} {'efficiency':>10} {'CPU us/node':>11}"
        )
        for durability in ("fsync", "write"):
            raw, raw_cpu = raw_commit_rate(root, durability, 300 if durability == "fsync" else 3000)
            for shape, spec in (("chain", chain(args.nodes)), ("fan", fan(args.nodes))):
                rate, commits, cpu, _ = engine(root, durability, spec)
                efficiency = rate / (raw / (commits / args.nodes))
                print(
                    f"{durability:<6} {shape:<6} {rate:>9,.0f} {commits:>8} {raw:>14,.0f} "
                    f"{raw_cpu:>10.0f} {efficiency:>10.2f} {cpu:>11.0f}"
                )
        print("efficiency = nodes/s / (raw commits/s / commits per node); 1.00 = the journal's own limit;")
        print("raw CPU us = CPU per raw append (the floor); CPU us/node target on write: <= 150")
        growth = []
        for target in (1_000, args.events):
            nodes = max(target // EVENTS_PER_NODE, 1)
            _, _, cpu, events = engine(root, "write", retrying_chain(nodes, "flaky@1"))
            growth.append((events, cpu * nodes / events))
        (small, per_small), (large, per_large) = growth
        print(
            f"live cost growth (write, retrying chain): {per_small:.1f} CPU us/event at {small:,} events, "
            f"{per_large:.1f} at {large:,}, ratio {per_large / per_small:.2f} (target <= 1.2)"
        )
        count, t_snap, t_full = recovery(root, args.events)
        print(
            f"recovery of a {count:,}-event run (CPU): snapshot + tail {t_snap * 1000:.1f} ms, "
            f"full replay {t_full * 1000:.1f} ms, ratio {t_snap / t_full:.3f} (target <= 0.03)"
        )


if __name__ == "__main__":
    main()
