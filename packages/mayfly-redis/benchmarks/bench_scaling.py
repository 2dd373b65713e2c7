"""Benchmark: 1, 2 and 4 ``mayfly worker`` processes sharing one durable Redis server, and where the limit is.

Usage: python bench_scaling.py [--url URL] [--runs 1000] [--nodes 10] [--shape chain|fan]
[--workers 1,2,4] [--concurrency 32] [--quick]

Without ``--url`` a private ``redis-server --appendonly yes --appendfsync
always --save ""`` is started on a free loopback port in a temporary
directory (``redis-server`` must be on PATH). Every key lives under a fresh
prefix.

For each worker count K, ``--runs`` runs of ``--nodes`` cooperative no-op
nodes (a chain, or a fan-out under one root) are submitted to a queue of
their own with ``WorkflowRuntime.start`` (not timed), then K real
``mayfly worker --json`` processes serving that queue drive them all. The
phase is timed from the first ``claimed`` event any worker prints to the last
``ended``: runs/s, nodes/s and the ratio to one worker. The server's own work
over the phase is the delta of ``INFO``: ``total_commands_processed``, the
``EVALSHA`` calls and the microseconds the server spent in them
(``commandstats``), the five busiest commands, and the AOF bytes written
(``aof_current_size``; ``rewrite`` if the AOF was rewritten during the phase;
Redis 7.0 counts no fsyncs: with ``appendfsync always`` it fsyncs once per
event loop turn that wrote, before replying).

The raw floor, measured in the same run on the same server: an ``RPUSH`` of
300 bytes per round trip (each one written and fsynced to the AOF before the
reply), from one connection and from four at once (four clients' writes share
an fsync). Numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from mayfly import Node, WorkflowSpec
from mayfly.runtime import WorkflowRuntime
from mayfly_redis.testing import RedisServer

HANDLERS = """
from mayfly import HandlerRegistry, Succeeded

registry = HandlerRegistry()
registry.register("noop", 1, lambda req: Succeeded(), cooperative=True)
"""


def url_with(server: str, **options: object) -> str:
    """``server`` with Mayfly options appended."""
    return server + ("&" if "?" in server else "?") + "&".join(f"{k}={v}" for k, v in options.items())


def spec(shape: str, nodes: int) -> WorkflowSpec:
    """``nodes`` no-op nodes: a chain (each after the last) or a root and its ``nodes - 1`` children."""
    if shape == "chain":
        graph = tuple(
            Node(f"n{i}", handler="noop@1", depends_on=(f"n{i - 1}",) if i else ()) for i in range(nodes)
        )
    else:
        children = (Node(f"n{i}", handler="noop@1", depends_on=("n0",)) for i in range(1, nodes))
        graph = (Node("n0", handler="noop@1"), *children)
    return WorkflowSpec(workflow_id=f"bench.scaling.{shape}", version=1, nodes=graph)


def host_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of every core of this host so far, from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [float(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def process_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` used so far, from /proc/PID/stat."""
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def drive(
    url: str, queue: str, *, workers: int, concurrency: int, runs: int, handlers: Path
) -> tuple[float, float, float]:
    """Start ``workers`` ``mayfly worker`` processes on ``queue`` and wait until ``runs`` runs ended.

    Returns the seconds from the first claim to the last end, and over that
    time the CPU seconds the worker processes used and the share of the
    host's cores busy.
    """
    command = [sys.executable, "-m", "mayfly", "--journal", url, "worker", "--json"]
    command += ["--handlers", str(handlers), "--queue", queue, "--concurrency", str(concurrency)]
    command += ["--poll-interval", "100", "--grace", "5"]
    processes = [
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(workers)
    ]
    chooser = selectors.DefaultSelector()
    buffers: dict[int, bytes] = {}
    for process in processes:
        assert process.stderr is not None
        os.set_blocking(process.stderr.fileno(), False)
        chooser.register(process.stderr, selectors.EVENT_READ, process)
        buffers[process.stderr.fileno()] = b""
    first: float | None = None
    cpu_at, used_at = (0.0, 0.0), 0.0
    pids = [process.pid for process in processes]
    ended = 0
    deadline = time.monotonic() + max(120.0, runs * 0.5)
    try:
        while ended < runs:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {ended} of {runs} runs ended before the deadline")
            for key, _ in chooser.select(timeout=1.0):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    code = key.data.wait()
                    raise RuntimeError(f"a worker exited with {code} after {ended} of {runs} runs")
                now = time.perf_counter()
                lines = (buffers[key.fd] + chunk).split(b"\n")
                buffers[key.fd] = lines.pop()
                for line in lines:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        print(f"  worker: {line.decode(errors='replace')}", file=sys.stderr)
                        continue
                    if event.get("event") == "claimed" and first is None:
                        first, cpu_at, used_at = now, host_cpu(), process_cpu(pids)
                    elif event.get("event") == "ended":
                        ended += 1
                    elif event.get("event") in ("error", "lost", "refused"):
                        print(f"  worker event: {event}", file=sys.stderr)
        finished, cpu_end, used = time.perf_counter(), host_cpu(), process_cpu(pids) - used_at
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        chooser.close()
    assert first is not None
    busy = (cpu_end[0] - cpu_at[0]) / max(1.0, cpu_end[1] - cpu_at[1])
    return finished - first, used, busy


def server_stats(client: redis.Redis) -> dict[str, float]:
    """The counters a phase is read from: commands, EVALSHA calls and their server time, AOF bytes."""
    stats: dict[str, Any] = client.info("stats")
    commands: dict[str, Any] = client.info("commandstats")
    persistence: dict[str, Any] = client.info("persistence")
    evalsha = commands.get("cmdstat_evalsha", {})
    calls = {f"calls:{name[8:]}": float(value["calls"]) for name, value in commands.items()}
    return calls | {
        "commands": float(stats["total_commands_processed"]),
        "evalsha": float(evalsha.get("calls", 0)),
        "evalsha_usec": float(evalsha.get("usec", 0)),
        "aof_bytes": float(persistence.get("aof_current_size", 0)),
        "aof_rewrites": float(persistence.get("aof_rewrites", 0)),
    }


def append_floor(url: str, connections: int, seconds: float) -> float:
    """``RPUSH`` round trips/s (300 bytes each, fsynced to the AOF) from ``connections`` clients at once."""
    key = f"mayfly-bench-floor-{uuid.uuid4().hex[:8]}"
    counts = [0] * connections
    start = threading.Barrier(connections + 1)
    stop = [time.perf_counter() + 3600]
    payload = b"x" * 300

    def loop(slot: int) -> None:
        client = redis.Redis.from_url(url)
        client.ping()
        start.wait()
        while time.perf_counter() < stop[0]:
            client.rpush(key, payload)
            counts[slot] += 1
        client.close()

    # Threads only in this measuring script: redis-py waits on the socket outside the GIL.
    threads = [threading.Thread(target=loop, args=(slot,)) for slot in range(connections)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    stop[0] = began + seconds
    for thread in threads:
        thread.join()
    rate = sum(counts) / (time.perf_counter() - began)
    redis.Redis.from_url(url).delete(key)
    return rate


def main() -> None:
    """Parse the arguments, run each phase under a fresh prefix, print the table and the floor."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a redis:// journal URL of a durable server (default: a private one)")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--shape", choices=("chain", "fan"), default="chain")
    parser.add_argument("--workers", default="1,2,4", help="worker process counts, comma-separated")
    parser.add_argument("--concurrency", type=int, default=32, help="runs each worker drives at once")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each floor measurement")
    parser.add_argument("--quick", action="store_true", help="100 runs x 5 nodes, 1 and 2 workers")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.nodes, args.workers, args.seconds = 100, 5, "1,2", 0.5
    counts = [int(part) for part in args.workers.split(",")]
    server = None if args.url else RedisServer()
    scratch = Path(tempfile.mkdtemp(prefix="mayfly-bench-scaling-"))
    handlers = scratch / "bench_scaling_handlers.py"
    handlers.write_text(HANDLERS)
    workflow = spec(args.shape, args.nodes)
    try:
        base_url = args.url or server.url  # type: ignore[union-attr]
        plain = base_url.split("?", 1)[0]
        url = url_with(base_url, prefix=f"bench.scaling.{uuid.uuid4().hex[:8]}")
        client = redis.Redis.from_url(plain)
        config = client.config_get("append*")
        durability = f"appendonly {config.get('appendonly')}, appendfsync {config.get('appendfsync')}"
        print(f"server: {plain} ({durability})")
        print(
            f"{args.runs} runs x {args.nodes} cooperative no-op nodes ({args.shape}), "
            f"{args.concurrency} runs at once per worker process, poll interval 100 ms"
        )
        one = append_floor(plain, 1, args.seconds)
        four = append_floor(plain, 4, args.seconds)
        print(f"raw floor: RPUSH 300 B, AOF fsync always, 1 connection:  {one:9,.0f} appends/s")
        print(f"raw floor: RPUSH 300 B, AOF fsync always, 4 connections: {four:9,.0f} appends/s")
        runtime = WorkflowRuntime(url)
        print(
            f"{'workers':>7} {'seconds':>8} {'runs/s':>8} {'nodes/s':>9} {'scaling':>8} {'commands/s':>10} "
            f"{'evalsha/s':>9} {'of floor(4)':>11} {'evalsha/node':>12} {'server busy':>11} {'AOF KB/s':>9} "
            f"{'worker CPU':>10} {'host busy':>9} {'load':>5}"
        )
        base = None
        for count in counts:
            queue = f"bench-w{count}"
            for _ in range(args.runs):
                runtime.start(workflow, queue=queue)
            before = server_stats(client)
            seconds, used, busy = drive(
                url, queue, workers=count, concurrency=args.concurrency, runs=args.runs, handlers=handlers
            )
            after = server_stats(client)
            delta = {name: after[name] - before.get(name, 0.0) for name in after}
            rate = args.runs / seconds
            base = base or rate
            evalsha = delta["evalsha"] / seconds
            # A rewrite (auto-aof-rewrite) during the phase shrinks the file: its growth says nothing then.
            aof = "rewrite" if delta["aof_rewrites"] else f"{delta['aof_bytes'] / 1024 / seconds:,.0f}"
            print(
                f"{count:>7} {seconds:>8.2f} {rate:>8,.0f} {rate * args.nodes:>9,.0f} {rate / base:>7.2f}x "
                f"{delta['commands'] / seconds:>10,.0f} {evalsha:>9,.0f} {evalsha / four:>10.0%} "
                f"{delta['evalsha'] / (args.runs * args.nodes):>12.2f} "
                f"{delta['evalsha_usec'] / 1e6 / seconds:>10.0%} {aof:>9}"
                f" {used / seconds:>6.2f} cpu {busy:>9.0%} {os.getloadavg()[0]:>5.1f}"
            )
            top = sorted(
                ((delta[name], name[6:]) for name in delta if name.startswith("calls:")), reverse=True
            )[:5]
            print(
                "        busiest commands: "
                + ", ".join(f"{name} {calls / seconds:,.0f}/s" for calls, name in top)
            )
        runtime.journal.close()
        print(
            "(deltas over the whole phase, worker start and stop included, per timed second; of floor(4): "
            "EVALSHA/s against the 4-connection RPUSH floor; server busy: share of the phase the server "
            "spent running scripts; worker CPU: cores the worker processes used over the timed part; "
            f"host busy: share of this host's {os.cpu_count()} cores; "
            "load: its 1-minute load average after the phase)"
        )
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
