"""LMDB journal throughput beside raw py-lmdb, replay speed and end-to-end engine speed, in one run.

Run: ``python packages/mayfly-lmdb/benchmarks/bench_lmdb.py [--appends N] [--events 100000]
[--nodes 1000] [--dir DIR]``.

Prints, measured in the same run:

1. appends/s of 3-record batches (~1.5 KB stored per batch) through
   ``LmdbJournal`` in ``sync`` and ``nosync`` mode, beside raw py-lmdb
   ``put`` x3 + ``commit`` of exactly the same value bytes under the same keys,
   in an environment opened with the same durability (target: journal >= 0.7 x
   raw), and beside the "floor": the LMDB operations the contract needs per
   append (head read, event-id claims, record and head puts) with every key
   and value precomputed. The series are interleaved in rounds so machine
   drift hits all alike. Records are sealed before timing (the caller's work).
2. replay: events/s of ``journal.read`` (decode + SHA-256 verify) over a
   ``--events`` run, and of ``mayfly.recovery.replay_run`` (read + reduce) over
   a real workflow run (a no-op chain of at most 8000 nodes, whose spec still
   fits the 1 MiB payload of its RunCreated record).
3. end-to-end no-op nodes/s of a ``--nodes`` chain through
   ``mayfly.WorkflowRuntime`` on the LMDB journal and leases, with cooperative
   no-op handlers, in both modes.

Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import lmdb

from mayfly.commit import commit_command
from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord
from mayfly.model.commands import AttemptStart, CompleteAttempt, CreateRun, StartNodes
from mayfly.model.outcomes import Succeeded
from mayfly.model.spec import Node, RetryPolicy, RunBudgets, WorkflowSpec
from mayfly.recovery import replay_run
from mayfly.runtime import HandlerRegistry, HandlerRequest, WorkflowRuntime
from mayfly_lmdb import LmdbJournal, LmdbLeaseStore, _codec

BATCH = 3
PAYLOAD = b'{"output":"' + b"x" * 400 + b'"}'
ROUNDS = 5
ONE = RetryPolicy(max_attempts=1)
BIG = RunBudgets(max_attempts=10_000_000, max_transitions=10_000_000)


def batches(run_id: str, first: int, count: int, size: int = BATCH) -> list[list[JournalRecord]]:
    """``count`` sealed batches of ``size`` records for consecutive sequences from ``first``."""
    ids = Uuid7IdSource()
    return [
        [
            JournalRecord.seal(
                run_id=run_id,
                sequence=start + offset,
                event_id=ids.new_id(),
                event_type="NodeOutcomeCommitted",
                schema_version=1,
                payload=PAYLOAD,
            )
            for offset in range(size)
        ]
        for start in range(first, first + count * size, size)
    ]


def journal_series(journal: LmdbJournal, run_id: str, work: list[list[JournalRecord]]) -> float:
    """Appends/s of ``work`` through the journal."""
    started = time.perf_counter()
    for batch in work:
        journal.append(run_id, batch[0].sequence, batch)
    return len(work) / (time.perf_counter() - started)


def raw_series(env: lmdb.Environment, db: object, work: list[list[JournalRecord]]) -> float:
    """Appends/s of the same value bytes under the same keys: put x3 + commit, nothing else."""
    prepared = [
        [(_codec.record_key(_codec.run_key(r.run_id), r.sequence), _codec.encode_record(r)) for r in batch]
        for batch in work
    ]
    started = time.perf_counter()
    for batch in prepared:
        txn = env.begin(write=True)
        for key, value in batch:
            txn.put(key, value, db=db)  # type: ignore[arg-type]
        txn.commit()
    return len(prepared) / (time.perf_counter() - started)


def floor_series(env: lmdb.Environment, dbs: tuple[object, ...], work: list[list[JournalRecord]]) -> float:
    """Appends/s of exactly the LMDB operations an append needs, keys and values precomputed.

    Per batch: get the run head, claim each event id (put, no overwrite),
    put each record, put the head, commit. No validation, encoding or
    Python bookkeeping: the store's own floor for the contract's rules.
    """
    records_db, events_db, heads_db = dbs
    prepared = []
    for batch in work:
        run = _codec.run_key(batch[0].run_id)
        prepared.append(
            (
                run,
                [
                    (
                        run + _codec.uuid_bytes(r.event_id),
                        _codec.sequence_bytes(r.sequence),
                        _codec.record_key(run, r.sequence),
                        _codec.encode_record(r),
                    )
                    for r in batch
                ],
                _codec.encode_head(batch[-1].sequence + 1, 0),
            )
        )
    started = time.perf_counter()
    for run, items, head in prepared:
        txn = env.begin(write=True)
        txn.get(run, db=heads_db)  # type: ignore[call-overload]
        for event_key, index, record_key, value in items:
            txn.put(event_key, index, overwrite=False, db=events_db)  # type: ignore[arg-type]
            txn.put(record_key, value, db=records_db)  # type: ignore[arg-type]
        txn.put(run, head, db=heads_db)  # type: ignore[arg-type]
        txn.commit()
    return len(prepared) / (time.perf_counter() - started)


def append_rates(root: Path, mode: str, appends: int) -> tuple[float, float, float, int]:
    """Median journal, store-floor and raw appends/s over interleaved rounds, and bytes per batch."""
    ids = Uuid7IdSource()
    run_id = ids.new_id()
    raw_run = ids.new_id()
    floor_run = ids.new_id()
    per_round = max(appends // ROUNDS, 1)
    journal = LmdbJournal(f"lmdb://{root}/journal-{mode}?durability={mode}")
    env = lmdb.open(str(root / f"raw-{mode}"), map_size=1 << 30, max_dbs=2, sync=mode == "sync")
    db = env.open_db(b"records")
    floor_env = lmdb.open(str(root / f"floor-{mode}"), map_size=1 << 30, max_dbs=4, sync=mode == "sync")
    floor_dbs = tuple(floor_env.open_db(name) for name in (b"records", b"events", b"heads"))
    first = batches(run_id, 1, 1)[0]
    journal.append(run_id, 1, first)  # creates the run outside the timing
    stored = sum(len(_codec.encode_record(r)) for r in first)
    ours: list[float] = []
    floors: list[float] = []
    theirs: list[float] = []
    sequence = BATCH + 1
    other_sequence = 1
    try:
        for _ in range(ROUNDS):
            work = batches(run_id, sequence, per_round)
            sequence += per_round * BATCH
            raw_work = batches(raw_run, other_sequence, per_round)
            floor_work = batches(floor_run, other_sequence, per_round)
            other_sequence += per_round * BATCH
            ours.append(journal_series(journal, run_id, work))
            floors.append(floor_series(floor_env, floor_dbs, floor_work))
            theirs.append(raw_series(env, db, raw_work))
    finally:
        journal.close()
        env.close()
        floor_env.close()
    return statistics.median(ours), statistics.median(floors), statistics.median(theirs), stored


def read_replay(root: Path, events: int) -> tuple[int, float]:
    """Build a run of ``events`` records (batches of 100) and time reading it all back."""
    journal = LmdbJournal(f"lmdb://{root}/replay?durability=nosync")
    run_id = Uuid7IdSource().new_id()
    for batch in batches(run_id, 1, events // 100, size=100):
        journal.append(run_id, batch[0].sequence, batch)
    journal.close()
    reopened = LmdbJournal(f"lmdb://{root}/replay?durability=nosync")
    started = time.perf_counter()
    records = reopened.read(run_id)
    elapsed = time.perf_counter() - started
    reopened.close()
    return len(records), len(records) / elapsed


def chain(n: int) -> WorkflowSpec:
    """A chain of ``n`` no-op nodes, each depending on the previous one."""
    nodes = [Node("n0", handler="noop@1", retry=ONE)]
    nodes += [Node(f"n{i}", handler="noop@1", depends_on=(f"n{i - 1}",), retry=ONE) for i in range(1, n)]
    return WorkflowSpec(workflow_id="bench.chain", version=1, nodes=tuple(nodes), budgets=BIG)


MAX_CHAIN = 8000
"""Longest chain whose RunCreated event (it embeds the spec) fits the 1 MiB record payload limit."""


def workflow_replay(root: Path, events: int) -> tuple[int, float]:
    """Build a real chain run of up to ``events`` events and time replay_run (read + reduce) on it."""
    url = f"lmdb://{root}/workflow?durability=nosync"
    journal = LmdbJournal(url)
    ids = Uuid7IdSource()
    run_id = ids.new_id()
    state = commit_command(
        journal, None, CreateRun(run_id=run_id, spec=chain(min(max(events // 3, 1), MAX_CHAIN))), ids=ids
    ).state
    while not state.status.is_terminal:
        (node_id,) = state.ready_nodes()
        attempt = ids.new_id()
        state = commit_command(journal, state, StartNodes((AttemptStart(node_id, attempt),)), ids=ids).state
        state = commit_command(journal, state, CompleteAttempt(node_id, attempt, Succeeded()), ids=ids).state
    journal.close()
    fresh = LmdbJournal(url)
    started = time.perf_counter()
    replayed = replay_run(fresh, run_id)
    elapsed = time.perf_counter() - started
    fresh.close()
    assert replayed.state.sequence == state.sequence
    return state.sequence, state.sequence / elapsed


def noop(request: HandlerRequest) -> Succeeded:
    """A cooperative handler that does nothing."""
    return Succeeded()


def engine(root: Path, mode: str, nodes: int) -> tuple[float, int]:
    """No-op nodes/s of a chain through WorkflowRuntime on LMDB, and the commits it made."""
    url = f"lmdb://{root}/engine-{mode}?durability={mode}"
    registry = HandlerRegistry()
    registry.register("noop", 1, noop, cooperative=True)
    commits = 0

    def count(state: object, events: tuple[object, ...]) -> None:
        nonlocal commits
        commits += 1

    journal = LmdbJournal(url)
    leases = LmdbLeaseStore(url)
    runtime = WorkflowRuntime(journal, registry, leases=leases, snapshot_every=10**9, observer=count)
    started = time.perf_counter()
    result = runtime.execute(chain(nodes))
    elapsed = time.perf_counter() - started
    assert result.succeeded
    leases.close()
    journal.close()
    return nodes / elapsed, commits


def main() -> None:
    """Measure and print every figure; nothing is asserted about time."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--appends", type=int, default=0, help="appends per mode (default: 500 sync, 10000 nosync)"
    )
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--dir", help="directory for the environments (default: a temporary one)")
    args = parser.parse_args()
    print(f"lmdb {lmdb.__version__} (LMDB {'.'.join(map(str, lmdb.version()))})")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        print(f"appends: batches of {BATCH} records, median of {ROUNDS} interleaved rounds")
        print(
            f"{'mode':<7} {'journal/s':>10} {'floor/s':>9} {'raw lmdb/s':>11} {'ratio':>6} "
            f"{'floor ratio':>12} {'bytes/batch':>12}"
        )
        for mode in ("sync", "nosync"):
            count = args.appends or (500 if mode == "sync" else 10_000)
            ours, floor, theirs, stored = append_rates(root, mode, count)
            print(
                f"{mode:<7} {ours:>10,.0f} {floor:>9,.0f} {theirs:>11,.0f} {ours / theirs:>6.2f} "
                f"{floor / theirs:>12.2f} {stored:>12,}"
            )
        print("ratio = journal appends/s / raw put x3 + commit/s at the same durability (target >= 0.70)")
        print(
            "floor = the LMDB operations the contract needs per append (head get, 3 event-id claims, "
            "3 record puts, head put, commit), precomputed: the best any LMDB journal can do"
        )
        count, rate = read_replay(root, args.events)
        print(f"replay read: {count:,} records read and verified at {rate:,.0f} events/s")
        count, rate = workflow_replay(root, args.events)
        print(f"replay_run: {count:,}-event workflow run read and reduced at {rate:,.0f} events/s")
        for mode in ("sync", "nosync"):
            rate, commits = engine(root, mode, args.nodes)
            print(
                f"engine {mode:<6}: {args.nodes}-node no-op chain at {rate:,.0f} nodes/s "
                f"({commits} commits, {commits / args.nodes:.1f} per node)"
            )


if __name__ == "__main__":
    main()
