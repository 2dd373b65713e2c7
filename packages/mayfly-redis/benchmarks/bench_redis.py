"""Redis journal appends per second beside a raw redis-py Lua compare-and-append, and engine throughput.

Run: ``python packages/mayfly-redis/benchmarks/bench_redis.py [--appends N] [--repeat R] [--nodes N]``.

Starts two private ``redis-server`` processes on loopback (``redis-server`` must
be on PATH): one with AOF ``appendfsync always`` (``durability=aof``) and one
without persistence (``durability=memory``, where the fsync no longer hides the
client's CPU cost). On each, measured in the same run and interleaved so drift
hits every series alike:

1. ``RedisJournal.append`` of 3-record batches (records sealed before timing),
   from a plain thread and from a task of the greenlet hub (sockets parked on
   the hub);
2. the raw baseline: a stock ``redis.Redis`` client calling a minimal Lua
   compare-and-append (``LLEN`` check, ``RPUSH``) by SHA with exactly the list
   elements the journal stores. Target: journal >= 0.7 x raw. Beside it, the
   journal's own APPEND script (fence, dedup, replay, index) sent through the
   same stock client, which splits the gap into server-side and client-side cost;
3. end-to-end no-op nodes/s of a ``--nodes`` chain through
   ``mayfly.WorkflowRuntime(journal, registry, leases=...)`` with cooperative
   no-op handlers, beside the journal's own commit rate.

Prints figures and ratios; it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import redis

from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord
from mayfly.model.outcomes import Succeeded
from mayfly.model.spec import Node, RetryPolicy, RunBudgets, WorkflowSpec
from mayfly.runtime import HandlerRegistry, HandlerRequest, WorkflowRuntime
from mayfly.substrate import Hub
from mayfly_redis import RedisJournal, RedisLeaseStore, _scripts
from mayfly_redis._journal import encode_element
from mayfly_redis.testing import RedisServer

BATCH = 3
PAYLOAD = b'{"output":"' + b"x" * 200 + b'"}'
RAW_SCRIPT = """
if redis.call('LLEN', KEYS[1]) + 1 ~= tonumber(ARGV[1]) then return 0 end
redis.call('RPUSH', KEYS[1], ARGV[2], ARGV[3], ARGV[4])
return 1
"""
ONE = RetryPolicy(max_attempts=1)
BIG = RunBudgets(max_attempts=10_000_000, max_transitions=10_000_000)


def batches(run_id: str, count: int) -> list[list[JournalRecord]]:
    """``count`` sealed batches of ``BATCH`` records for consecutive sequences."""
    ids = Uuid7IdSource()
    return [
        [
            JournalRecord.seal(
                run_id=run_id,
                sequence=first + offset,
                event_id=ids.new_id(),
                event_type="NodeOutcomeCommitted",
                schema_version=1,
                payload=PAYLOAD,
            )
            for offset in range(BATCH)
        ]
        for first in range(1, count * BATCH + 1, BATCH)
    ]


def journal_rate(url: str, count: int, *, on_hub: bool) -> float:
    """Appends/s of the Redis journal, from a thread or from a hub task."""
    run_id = Uuid7IdSource().new_id()
    work = batches(run_id, count)
    with RedisJournal(url) as journal:
        journal.append(run_id, 1, work[0])  # connects and loads the script outside the timing

        def measure() -> float:
            started = time.perf_counter()
            for batch in work[1:]:
                journal.append(run_id, batch[0].sequence, batch)
            return (count - 1) / (time.perf_counter() - started)

        return Hub().run(measure) if on_hub else measure()


def raw_rate(port: int, count: int) -> float:
    """Appends/s of a stock redis-py client running a minimal Lua CAS-append of the same elements."""
    run_id = Uuid7IdSource().new_id()
    work = [[encode_element(record) for record in batch] for batch in batches(run_id, count)]
    client = redis.Redis(host="127.0.0.1", port=port)
    key = f"raw:{{{run_id}}}:records"
    sha = client.script_load(RAW_SCRIPT)
    client.evalsha(sha, 1, key, 1, *work[0])
    started = time.perf_counter()
    for index, elements in enumerate(work[1:], start=1):
        assert client.evalsha(sha, 1, key, index * BATCH + 1, *elements) == 1
    elapsed = time.perf_counter() - started
    client.close()
    return (count - 1) / elapsed


def script_rate(port: int, count: int) -> float:
    """Appends/s of the journal's own APPEND script sent through a stock redis-py client.

    Same server work as ``RedisJournal.append``, none of its client work
    (validation, hub sockets, reply mapping): the gap to the journal is the
    client's cost, the gap to the raw baseline the contract's server-side checks.
    """
    run_id = Uuid7IdSource().new_id()
    work = batches(run_id, count)
    client = redis.Redis(host="127.0.0.1", port=port)
    keys = [f"s:{{{run_id}}}:records", f"s:{{{run_id}}}:ids", f"s:{{{run_id}}}:fence", "s:runs"]
    sha = client.script_load(_scripts.APPEND)
    started = time.perf_counter()
    for batch in work:
        args: list[str | bytes | int] = ["", str(batch[0].sequence), len(batch), run_id]
        args += [encode_element(record) for record in batch]
        assert client.evalsha(sha, len(keys), *keys, *args)[0] == b"ok"
    elapsed = time.perf_counter() - started
    client.close()
    return count / elapsed


def noop(request: HandlerRequest) -> Succeeded:
    """A cooperative handler that does nothing."""
    return Succeeded()


def chain(nodes: int) -> WorkflowSpec:
    """A chain of ``nodes`` no-op nodes, each depending on the previous one."""
    spec = [Node("n0", handler="noop@1", retry=ONE)]
    spec += [Node(f"n{i}", handler="noop@1", depends_on=(f"n{i - 1}",), retry=ONE) for i in range(1, nodes)]
    return WorkflowSpec(workflow_id="bench.redis.chain", version=1, nodes=tuple(spec), budgets=BIG)


def engine_rate(url: str, nodes: int) -> tuple[float, int]:
    """No-op nodes/s of a chain through WorkflowRuntime on the Redis journal and leases; commits made."""
    registry = HandlerRegistry()
    registry.register("noop", 1, noop, cooperative=True)
    commits = 0

    def count(state: object, events: tuple[object, ...]) -> None:
        nonlocal commits
        commits += 1

    with RedisJournal(url) as journal, RedisLeaseStore(url) as leases:
        runtime = WorkflowRuntime(journal, registry, leases=leases, snapshot_every=10**9, observer=count)
        started = time.perf_counter()
        result = runtime.execute(chain(nodes))
        elapsed = time.perf_counter() - started
    assert result.succeeded
    return nodes / elapsed, commits


def main() -> None:
    """Measure on both servers, print figures and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=2000, help="appends per measurement")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions; the median is reported")
    parser.add_argument("--nodes", type=int, default=100, help="chain length for the engine measurement")
    args = parser.parse_args()
    with RedisServer() as aof, RedisServer(appendfsync=None) as memory:
        servers = {"aof (appendfsync always)": aof, "memory (no persistence)": memory}
        for label, server in servers.items():
            measures: dict[str, Callable[[], float]] = {
                "raw redis-py Lua CAS-append": partial(raw_rate, server.port, args.appends),
                "APPEND script, stock redis-py": partial(script_rate, server.port, args.appends),
                "RedisJournal.append (thread)": partial(journal_rate, server.url, args.appends, on_hub=False),
                "RedisJournal.append (hub task)": partial(
                    journal_rate, server.url, args.appends, on_hub=True
                ),
            }
            samples: dict[str, list[float]] = {name: [] for name in measures}
            for _ in range(args.repeat):
                for name, measure in measures.items():
                    samples[name].append(measure())
            results = {name: statistics.median(values) for name, values in samples.items()}
            raw = results["raw redis-py Lua CAS-append"]
            shape = f"{BATCH}-record batches, median of {args.repeat} x {args.appends} appends"
            print(f"server: {label}; {shape}")
            for name, rate in results.items():
                print(f"  {name:32s} {rate:10,.0f} appends/s  ratio to raw {rate / raw:.2f}")
            nodes_per_s, commits = engine_rate(server.url, args.nodes)
            commit_rate = results["RedisJournal.append (hub task)"]
            efficiency = nodes_per_s / (commit_rate / (commits / args.nodes))
            print(
                f"  engine: {args.nodes}-node no-op chain {nodes_per_s:,.0f} nodes/s, {commits} commits, "
                f"efficiency {efficiency:.2f} (1.00 = the journal's own append rate)"
            )
    print("target: RedisJournal.append >= 0.7 x raw")


if __name__ == "__main__":
    main()
