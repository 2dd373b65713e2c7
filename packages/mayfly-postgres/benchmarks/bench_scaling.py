"""Benchmark: 1, 2 and 4 ``mayfly worker`` processes sharing one PostgreSQL database, and where the limit is.

Usage: python bench_scaling.py [SERVER_URL] [--runs 1000] [--nodes 10] [--shape chain|fan]
[--workers 1,2,4] [--concurrency 32] [--own-database] [--quick]

SERVER_URL defaults to ``MAYFLY_TEST_POSTGRES_URL`` or
``postgresql://postgres@127.0.0.1:5432/test``. Everything runs in a fresh
schema that is dropped at the end; with ``--own-database`` the schema is in a scratch
database created for the run and dropped after it, so no other client's commits reach the
counter.

For each worker count K, ``--runs`` runs of ``--nodes`` cooperative no-op
nodes (a chain, or a fan-out under one root) are submitted to a queue of
their own with ``WorkflowRuntime.start`` (not timed), then K real
``mayfly worker --json`` processes serving that queue drive them all. The
phase is timed from the first ``claimed`` event any worker prints to the last
``ended``: runs/s, nodes/s and the ratio to one worker. The server's own
commits over the phase are the delta of ``pg_stat_database.xact_commit`` of
the database (the whole database: the background rate of other clients,
measured just before, is printed beside it).

The raw floor, measured in the same run on the same server: one-row
``INSERT`` commits into a logged table, from one connection and from four at
once (what group commit gives). Numbers are printed, never asserted.
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
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from mayfly import Node, WorkflowSpec
from mayfly.runtime import WorkflowRuntime

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


def commits(server: str) -> int:
    """``xact_commit`` of the database, as the statistics collector has it now (fresh snapshot)."""
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def settled_commits(server: str) -> int:
    """``commits`` after backends have flushed their pending statistics (at most once a second)."""
    time.sleep(1.2)
    return commits(server)


def background_rate(server: str, seconds: float) -> float:
    """Commits/s other clients of the database make while this benchmark does nothing (and 2 reads)."""
    before = settled_commits(server)
    time.sleep(seconds)
    after = settled_commits(server)
    return max(0, after - before - 2) / (seconds + 1.2)


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


def insert_floor(server: str, connections: int, seconds: float) -> float:
    """One-row INSERT commits/s into a logged scratch table from ``connections`` connections at once."""
    table = sql.Identifier(f"mayfly_bench_floor_{uuid.uuid4().hex[:8]}")
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE TABLE {} (n int)").format(table))
        try:
            counts = [0] * connections
            start = threading.Barrier(connections + 1)
            stop = time.perf_counter() + seconds + 10  # replaced once every connection is ready

            def loop(slot: int) -> None:
                with psycopg.connect(server, autocommit=True) as conn:
                    statement = sql.SQL("INSERT INTO {} VALUES (%s)").format(table)
                    start.wait()
                    while time.perf_counter() < stop:
                        conn.execute(statement, (slot,))
                        counts[slot] += 1

            # Threads only in this measuring script: psycopg waits on the server outside the GIL.
            threads = [threading.Thread(target=loop, args=(slot,)) for slot in range(connections)]
            for thread in threads:
                thread.start()
            stop = time.perf_counter() + 3600
            start.wait()
            began = time.perf_counter()
            stop = began + seconds
            for thread in threads:
                thread.join()
            return sum(counts) / (time.perf_counter() - began)
        finally:
            admin.execute(sql.SQL("DROP TABLE {}").format(table))


def main() -> None:
    """Parse the arguments, run each phase in a fresh schema, print the table and the floor, drop it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = os.environ.get("MAYFLY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("server", nargs="?", default=default)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--shape", choices=("chain", "fan"), default="chain")
    parser.add_argument("--workers", default="1,2,4", help="worker process counts, comma-separated")
    parser.add_argument("--concurrency", type=int, default=32, help="runs each worker drives at once")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each floor measurement")
    parser.add_argument(
        "--own-database",
        action="store_true",
        help="run in a scratch database (a commit counter no other client touches), dropped after",
    )
    parser.add_argument("--quick", action="store_true", help="100 runs x 5 nodes, 1 and 2 workers")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.nodes, args.workers, args.seconds = 100, 5, "1,2", 0.5
    counts = [int(part) for part in args.workers.split(",")]
    admin_server, database = args.server, None
    if args.own_database:
        database = f"mayfly_bench_scaling_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(admin_server, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        args.server = urlunsplit(urlsplit(admin_server)._replace(path=f"/{database}"))
    schema = f"mayfly_pgbench_scaling_{uuid.uuid4().hex[:8]}"
    url = url_with(args.server, schema=schema)
    scratch = Path(tempfile.mkdtemp(prefix="mayfly-bench-scaling-"))
    handlers = scratch / "bench_scaling_handlers.py"
    handlers.write_text(HANDLERS)
    workflow = spec(args.shape, args.nodes)
    print(f"server: {args.server} (schema {schema})")
    print(
        f"{args.runs} runs x {args.nodes} cooperative no-op nodes ({args.shape}), "
        f"{args.concurrency} runs at once per worker process, poll interval 100 ms"
    )
    try:
        WorkflowRuntime(url).journal.close()  # create and migrate the schema before anything is measured
        one = insert_floor(args.server, 1, args.seconds)
        four = insert_floor(args.server, 4, args.seconds)
        print(f"raw floor: one-row INSERT commits, 1 connection:  {one:9,.0f} commits/s")
        print(f"raw floor: one-row INSERT commits, 4 connections: {four:9,.0f} commits/s")
        background = background_rate(args.server, 1.0)
        print(f"background commits/s of other clients of the database: {background:,.0f}")
        print(
            f"{'workers':>7} {'seconds':>8} {'runs/s':>8} {'nodes/s':>9} {'scaling':>8} "
            f"{'db commits':>10} {'commits/s':>9} {'of floor(4)':>11} {'commits/node':>12} "
            f"{'worker CPU':>10} {'host busy':>9} {'load':>5}"
        )
        base = None
        for count in counts:
            queue = f"bench-w{count}"
            submitter = WorkflowRuntime(url)
            for _ in range(args.runs):
                submitter.start(workflow, queue=queue)
            # Closed, so its connections report their last commits now, not during the phase.
            submitter.journal.close()
            before = settled_commits(args.server)
            seconds, used, busy = drive(
                url, queue, workers=count, concurrency=args.concurrency, runs=args.runs, handlers=handlers
            )
            made = settled_commits(args.server) - before
            rate = args.runs / seconds
            base = base or rate
            print(
                f"{count:>7} {seconds:>8.2f} {rate:>8,.0f} {rate * args.nodes:>9,.0f} {rate / base:>7.2f}x "
                f"{made:>10,} {made / seconds:>9,.0f} {made / seconds / four:>10.0%} "
                f"{made / (args.runs * args.nodes):>12.2f} {used / seconds:>6.2f} cpu {busy:>9.0%} "
                f"{os.getloadavg()[0]:>5.1f}"
            )
        print(
            "(db commits: the whole phase, worker start and stop included, over the timed seconds; "
            "of floor(4): that rate against the 4-connection INSERT floor; worker CPU: cores the worker "
            f"processes used over the timed part; host busy: share of this host's {os.cpu_count()} cores; "
            "load: its 1-minute load average after the phase)"
        )
    finally:
        with psycopg.connect(args.server, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        if database is not None:
            with psycopg.connect(admin_server, autocommit=True) as admin:
                admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(database)))


if __name__ == "__main__":
    main()
