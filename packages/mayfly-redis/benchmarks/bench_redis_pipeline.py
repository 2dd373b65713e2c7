"""Pipelined appends: many runs on one worker appending at once, with ``pipeline=on`` and ``pipeline=off``.

Run: ``python packages/mayfly-redis/benchmarks/bench_redis_pipeline.py [--runs 100] [--nodes 10]
[--chain 100] [--repeat 3] [--cluster]``.

Starts a private ``redis-server`` with AOF ``appendfsync always`` (``--cluster``:
a private three-primary Cluster of such servers) and measures, in the same
run and interleaved so drift hits every series alike:

1. the raw floor: ``RPUSH`` of 300 bytes per round trip, each written and
   fsynced before its reply, from one connection, from ``--runs`` connections
   at once (their writes share an fsync) and ``--runs`` commands per round trip
   on one connection (a stock redis-py pipeline): what pipelining can approach;
2. the serial chain: one run of ``--chain`` no-op nodes through
   ``WorkflowRuntime.execute`` (each commit waits for the previous one, so
   pipelining cannot help it);
3. the concurrent load: ``--runs`` runs of ``--nodes`` cooperative no-op nodes
   submitted (not timed), then one :class:`mayfly.worker.Worker` with
   concurrency ``--runs`` drives them all; timed from the start of the worker
   to the last run ended. With ``pipeline=on`` the appends that are waiting at
   the same time share a round trip (the script replies per flush are printed).

Prints nodes/s, the ratios (concurrent to serial, on to off) and the floor; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
import uuid
from typing import Any

import redis

from mayfly.model.outcomes import Succeeded
from mayfly.model.spec import Node, RetryPolicy, RunBudgets, WorkflowSpec
from mayfly.runtime import HandlerRegistry, HandlerRequest, WorkflowRuntime
from mayfly.worker import Worker
from mayfly_redis import RedisJournal, RedisLeaseStore
from mayfly_redis.testing import RedisClusterNodes, RedisServer

ONE = RetryPolicy(max_attempts=1)
BIG = RunBudgets(max_attempts=10_000_000, max_transitions=10_000_000)
ELEMENT = b"x" * 300


def noop(request: HandlerRequest) -> Succeeded:
    """A cooperative handler that does nothing."""
    return Succeeded()


def registry() -> HandlerRegistry:
    handlers = HandlerRegistry()
    handlers.register("noop", 1, noop, cooperative=True)
    return handlers


def chain(nodes: int, name: str) -> WorkflowSpec:
    """A chain of ``nodes`` no-op nodes, each depending on the previous one."""
    spec = [Node("n0", handler="noop@1", retry=ONE)]
    spec += [Node(f"n{i}", handler="noop@1", depends_on=(f"n{i - 1}",), retry=ONE) for i in range(1, nodes)]
    return WorkflowSpec(workflow_id=f"bench.pipeline.{name}", version=1, nodes=tuple(spec), budgets=BIG)


def _client(port: int, cluster: bool) -> Any:
    if cluster:
        return redis.RedisCluster(host="127.0.0.1", port=port)
    return redis.Redis(host="127.0.0.1", port=port)


def floor_serial(port: int, cluster: bool, seconds: float) -> float:
    """RPUSH/s from one connection, one command per round trip."""
    client = _client(port, cluster)
    key = f"floor:{uuid.uuid4().hex}"
    count, deadline = 0, time.perf_counter() + seconds
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        client.rpush(key, ELEMENT)
        count += 1
    elapsed = time.perf_counter() - started
    client.delete(key)
    client.close()
    return count / elapsed


def floor_connections(port: int, cluster: bool, connections: int, seconds: float) -> float:
    """RPUSH/s from ``connections`` threads at once, each its own connection (and key)."""
    counts = [0] * connections
    barrier = threading.Barrier(connections + 1)

    def push(index: int) -> None:
        client = _client(port, cluster)
        key = f"floor:{uuid.uuid4().hex}"
        client.ping()
        barrier.wait()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            client.rpush(key, ELEMENT)
            counts[index] += 1
        client.delete(key)
        client.close()

    threads = [threading.Thread(target=push, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - started)


def floor_pipelined(port: int, cluster: bool, depth: int, seconds: float) -> float:
    """RPUSH/s from one connection, ``depth`` commands (to ``depth`` keys) per round trip."""
    client = _client(port, cluster)
    keys = [f"floor:{{{i}}}:{uuid.uuid4().hex}" for i in range(depth)]
    count, deadline = 0, time.perf_counter() + seconds
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.rpush(key, ELEMENT)
        pipe.execute()
        count += depth
    elapsed = time.perf_counter() - started
    client.delete(*keys) if not cluster else [client.delete(key) for key in keys]
    client.close()
    return count / elapsed


def serial_chain(url: str, nodes: int) -> float:
    """Nodes/s of one ``nodes``-node chain through WorkflowRuntime.execute."""
    with RedisJournal(url) as journal, RedisLeaseStore(url) as leases:
        runtime = WorkflowRuntime(journal, registry(), leases=leases, snapshot_every=10**9)
        started = time.perf_counter()
        result = runtime.execute(chain(nodes, "serial"))
        elapsed = time.perf_counter() - started
    assert result.succeeded
    return nodes / elapsed


def concurrent_runs(url: str, runs: int, nodes: int) -> tuple[float, float]:
    """Nodes/s of ``runs`` runs x ``nodes`` nodes driven by one worker of concurrency ``runs``.

    Also the mean commands per round trip of the worker's pipelines (1.0 with ``pipeline=off``).
    """
    with RedisJournal(url) as journal, RedisLeaseStore(url) as leases:
        submitter = WorkflowRuntime(journal, leases=leases)
        handles = [submitter.start(chain(nodes, "concurrent")) for _ in range(runs)]
        ended: list[str] = []

        def log(event: dict[str, Any]) -> None:
            if event["event"] == "ended":
                ended.append(event["run_id"])

    with RedisJournal(url) as journal, RedisLeaseStore(url) as leases:
        worker = Worker(
            journal,
            registry(),
            leases=leases,
            concurrency=runs,
            poll_interval_ms=20,
            log=log,
            snapshot_every=10**9,
        )
        started = time.perf_counter()
        worker.run(until=lambda: len(ended) >= runs)
        elapsed = time.perf_counter() - started
        pipelines = journal._store._pipelines
        flushes = sum(p.flushes for p in pipelines)
        commands = sum(p.commands for p in pipelines)
    assert sorted(ended) == sorted(h.run_id for h in handles)
    return runs * nodes / elapsed, (commands / flushes if flushes else 1.0)


def main() -> None:
    """Measure, print figures and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="concurrent runs on the worker")
    parser.add_argument("--nodes", type=int, default=10, help="no-op nodes per concurrent run")
    parser.add_argument("--chain", type=int, default=100, help="nodes of the serial chain")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions; the median is reported")
    parser.add_argument("--floor-seconds", type=float, default=1.0, help="duration of each floor measurement")
    parser.add_argument(
        "--cluster", action="store_true", help="a private 3-primary Cluster instead of one server"
    )
    args = parser.parse_args()
    deployment = RedisClusterNodes() if args.cluster else RedisServer()
    with deployment:
        port = deployment.nodes[0].port if isinstance(deployment, RedisClusterNodes) else deployment.port
        base = deployment.url

        def url(pipeline: str) -> str:
            return f"{base}?prefix=bench.{uuid.uuid4().hex[:8]}&pipeline={pipeline}"

        series: dict[str, list[float]] = {
            name: []
            for name in (
                "floor RPUSH, 1 connection",
                f"floor RPUSH, {args.runs} connections",
                f"floor RPUSH, {args.runs} per round trip",
                "serial chain, pipeline=off",
                "serial chain, pipeline=on",
                "concurrent, pipeline=off",
                "concurrent, pipeline=on",
            )
        }
        per_flush: list[float] = []
        for mode in ("off", "on"):  # warm-up: connections, script loads, imports
            serial_chain(url(mode), 5)
            concurrent_runs(url(mode), 4, 2)
        for _ in range(args.repeat):
            secs = args.floor_seconds
            series["floor RPUSH, 1 connection"].append(floor_serial(port, args.cluster, secs))
            series[f"floor RPUSH, {args.runs} connections"].append(
                floor_connections(port, args.cluster, args.runs, secs)
            )
            series[f"floor RPUSH, {args.runs} per round trip"].append(
                floor_pipelined(port, args.cluster, args.runs, secs)
            )
            for mode in ("off", "on"):
                series[f"serial chain, pipeline={mode}"].append(serial_chain(url(mode), args.chain))
                rate, depth = concurrent_runs(url(mode), args.runs, args.nodes)
                series[f"concurrent, pipeline={mode}"].append(rate)
                if mode == "on":
                    per_flush.append(depth)
        result = {name: statistics.median(values) for name, values in series.items()}
    kind = "3-primary Cluster" if args.cluster else "standalone server"
    print(
        f"redis {kind}, AOF appendfsync always; median of {args.repeat}; load {os.getloadavg()[0]:.2f} "
        f"(1-min average at the end)"
    )
    for name, value in result.items():
        unit = "RPUSH/s" if name.startswith("floor") else "nodes/s"
        print(f"  {name:40s} {value:10,.0f} {unit}")
    serial = result["serial chain, pipeline=on"]
    on, off = result["concurrent, pipeline=on"], result["concurrent, pipeline=off"]
    shape = f"{args.runs} runs x {args.nodes} nodes"
    print(f"  concurrent {shape} / serial {args.chain}-node chain (pipeline=on): {on / serial:.2f}")
    print(f"  concurrent {shape}, pipeline=on / pipeline=off: {on / off:.2f}")
    depth = statistics.median(per_flush)
    print(f"  scripts per round trip with pipeline=on (mean over the worker's flushes): {depth:.1f}")
    print(
        f"  floor ratio: {args.runs} RPUSH per round trip / 1 connection "
        f"{result[f'floor RPUSH, {args.runs} per round trip'] / result['floor RPUSH, 1 connection']:.1f}"
    )


if __name__ == "__main__":
    main()
