"""Round trips, statements and commits per node on PostgreSQL, counted on the wire, and the client CPU.

Usage: python bench_round_trips.py [SERVER_URL] [--chain 100] [--runs 100] [--nodes 10] [--quick]

SERVER_URL defaults to ``MAYFLY_TEST_POSTGRES_URL`` or
``postgresql://postgres@127.0.0.1:5432/test``; everything runs in a fresh
schema dropped at the end. The journal connects through ``wirecount.py``, a
loopback proxy that parses the protocol and counts what the client sends
(see its docstring), so these counts do not depend on the machine's load
(except how many appends a group commit carries, which depends on timing).
Measured, each with the client's CPU time (``time.process_time``):

1. the serial chain: one run of ``--chain`` cooperative no-op nodes through
   ``WorkflowRuntime.execute`` (its creation included), per node;
2. ``start``: ``--runs`` runs of ``--nodes`` independent nodes submitted with
   ``WorkflowRuntime.start``, per run;
3. the fan-out: one ``mayfly.Worker`` of concurrency ``--runs`` driving them
   until every run ended, per node and per claimed run.

Beside them, the floor of the same run: a one-row ``INSERT`` in autocommit on
one psycopg connection (one statement, one round trip, one commit), its rate
and its client CPU. Each phase prints its statements by kind. Counts and
timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

from mayfly import HandlerRegistry, Node, Succeeded, WorkflowSpec
from mayfly.runtime import WorkflowRuntime
from mayfly.worker import Worker

HERE = Path(__file__).resolve().parent
DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/test"

# What each statement is, by its text (first match wins).
KINDS: tuple[tuple[str, str], ...] = (
    (r"^WITH locked AS .*INSERT INTO \S+\.\"records\"", "append + entry lock"),
    (r"^WITH bump AS", "append"),
    (r"^WITH put AS .*pg_notify", "index put + notify"),
    (r"^INSERT INTO \S+\.\"run_index\"", "index put"),
    (r"^SELECT pg_notify", "notify"),
    (r"mayfly_claim", "claim"),
    (r"^WITH granted AS \(INSERT INTO \S+\.\"leases\"", "lease grant"),
    (r"^UPDATE \S+\.\"leases\" SET expires_at = clock_timestamp", "lease renew"),
    (r"^UPDATE \S+\.\"leases\" SET expires_at = '-infinity'", "lease release"),
    (r"^SELECT h\.next_sequence", "read records"),
    (r"^WITH heads AS", "read tails"),
    (r"^SELECT schema_version, last_sequence.*\"snapshots\"", "read snapshot"),
    (r"^INSERT INTO \S+\.\"snapshots\"", "write snapshot"),
    (r"^SELECT next_sequence FROM", "next sequence"),
    (r"min\(i\.ready_at\)", "next wake"),
    (r"^SELECT run_id::text, queue, status", "index get"),
    (r"^SELECT next_sequence, fence", "diagnose"),
    (r"^BEGIN", "BEGIN"),
    (r"^COMMIT", "COMMIT"),
)


def kind_of(query: str) -> str:
    """The kind of one statement, or its first words."""
    for pattern, kind in KINDS:
        if re.search(pattern, query, re.DOTALL):
            return kind
    return query[:60]


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


class Proxy:
    """The counting proxy process."""

    def __init__(self, host: str, port: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "wirecount.py"), host, str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        self.port = int(line.split()[1])

    def snap(self) -> dict[str, Any]:
        """The counts since the previous snap (and reset them)."""
        assert self.process.stdin is not None and self.process.stdout is not None
        time.sleep(0.2)  # let the last replies pass through
        self.process.stdin.write("snap\n")
        self.process.stdin.flush()
        counts: dict[str, Any] = json.loads(self.process.stdout.readline())
        return counts

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=10)


def registry() -> HandlerRegistry:
    reg = HandlerRegistry()
    reg.register("noop", 1, lambda req: Succeeded(), cooperative=True)
    return reg


def spec(name: str, nodes: int, *, chained: bool) -> WorkflowSpec:
    return WorkflowSpec(
        workflow_id=f"bench.round-trips.{name}",
        version=1,
        nodes=tuple(
            Node(f"n{i}", handler="noop@1", depends_on=(f"n{i - 1}",) if chained and i else ())
            for i in range(nodes)
        ),
    )


def floor(conninfo: str, table: str, count: int) -> tuple[float, float]:
    """Raw one-row INSERT commits on one connection: commits/s and client CPU us per commit."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        conn.execute(f"INSERT INTO {table} VALUES (0)")
        cpu, wall = time.process_time(), time.perf_counter()
        for n in range(count):
            conn.execute(f"INSERT INTO {table} VALUES (%s)", (n,))
        return count / (time.perf_counter() - wall), (time.process_time() - cpu) / count * 1e6


def show(title: str, counts: dict[str, Any], per: float, unit: str, *, cpu_s: float, wall_s: float) -> None:
    """One phase: its counts per ``unit`` and its statements by kind."""
    print(
        f"{title}: per {unit}: {counts['round_trips'] / per:.2f} round trips, "
        f"{counts['statements'] / per:.2f} statements, {counts['writing_transactions'] / per:.2f} commits "
        f"({counts['transactions'] / per:.2f} transactions, {counts['syncs'] / per:.2f} syncs); "
        f"client CPU {cpu_s / per * 1e6:.0f} us/{unit}; {per / wall_s:.0f} {unit}s/s"
    )
    kinds: Counter[str] = Counter()
    for query, n in counts["by_sql"].items():
        kinds[kind_of(query)] += n
    print("    " + ", ".join(f"{kind} {n / per:.2f}" for kind, n in kinds.most_common()))
    print(f"    connections opened {counts['connections']}, notifications {counts['notifications']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default=os.environ.get("MAYFLY_TEST_POSTGRES_URL", DEFAULT_SERVER))
    parser.add_argument("--chain", type=int, default=100)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="a 30-node chain and 20 runs")
    parser.add_argument("--json", action="store_true", help="also print every phase's raw counts")
    args = parser.parse_args()
    if args.quick:
        args.chain, args.runs = 30, 20
    server = urlsplit(args.url)
    schema = f"pgperf_rt_{uuid.uuid4().hex[:8]}"
    proxy = Proxy(server.hostname or "127.0.0.1", server.port or 5432)
    user = f"{server.username}@" if server.username else ""
    url = (
        f"postgresql://{user}127.0.0.1:{proxy.port}{server.path}"
        f"?schema={schema}&sslmode=disable&gssencmode=disable"
    )
    conninfo = args.url.split("?")[0]
    print(f"{load()}; schema {schema}")
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
            conn.execute(f'CREATE TABLE "{schema}".floor (n bigint)')
        rate, floor_cpu = floor(conninfo, f'"{schema}".floor', 300 if args.quick else 1000)
        print(
            f"floor: one-row INSERT + COMMIT, one connection: {rate:.0f} commits/s, "
            f"client CPU {floor_cpu:.0f} us"
        )
        runtime = WorkflowRuntime(url, registry())
        runtime.execute(spec("warm", 2, chained=True))
        proxy.snap()

        cpu, wall = time.process_time(), time.perf_counter()
        result = runtime.execute(spec("chain", args.chain, chained=True))
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        assert result.succeeded, result.status
        counts = proxy.snap()
        show(f"chain of {args.chain} through execute", counts, args.chain, "node", cpu_s=cpu, wall_s=wall)
        if args.json:
            print(json.dumps(counts))

        fan = spec("fan", args.nodes, chained=False)
        cpu, wall = time.process_time(), time.perf_counter()
        handles = [runtime.start(fan) for _ in range(args.runs)]
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        counts = proxy.snap()
        show(f"start() of {args.runs} runs", counts, args.runs, "run", cpu_s=cpu, wall_s=wall)
        if args.json:
            print(json.dumps(counts))

        ended = 0

        def log(event: dict[str, Any]) -> None:
            nonlocal ended
            if event["event"] == "ended":
                ended += 1

        worker = Worker(url, registry(), concurrency=args.runs, log=log)
        cpu, wall = time.process_time(), time.perf_counter()
        worker.run(until=lambda: ended >= args.runs)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        counts = proxy.snap()
        assert all(handle.status() == "succeeded" for handle in handles)
        nodes = args.runs * args.nodes
        show(f"worker: {args.runs} runs x {args.nodes} nodes", counts, nodes, "node", cpu_s=cpu, wall_s=wall)
        print(
            f"    per claimed run: {counts['round_trips'] / args.runs:.2f} round trips, "
            f"{counts['statements'] / args.runs:.2f} statements, "
            f"{counts['writing_transactions'] / args.runs:.2f} commits"
        )
        if args.json:
            print(json.dumps(counts))
        proxy.snap()
        runtime.journal.close()
        worker.runtime.journal.close()
        print(load())
    finally:
        proxy.close()
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
