"""Group commit across runs (issue 18 §2) on PostgreSQL, against the server's raw commit floor.

Usage: python bench_group_commit.py [SERVER_URL] [--chain 100] [--runs 100] [--nodes 10] [--connections 8]

SERVER_URL defaults to ``MAYFLY_TEST_POSTGRES_URL`` or
``postgresql://postgres@127.0.0.1:5432/test``; everything runs in a fresh
schema dropped at the end. Measured in this one run, beside the load average:

1. the raw floor: one-row ``INSERT`` commits (``synchronous_commit=on``) on
   one connection, and the aggregate over ``--connections`` connections in as
   many processes (the server's own group commit);
2. the serial chain of ``--chain`` no-op nodes and its ratio to the
   one-connection floor (target >= 0.8);
3. ``--runs`` runs of ``--nodes`` nodes on one ``mayfly.Worker`` and the
   ratio to the serial chain (target >= 5x);
4. the journal alone: one run appending, and ``--runs`` runs appending at
   once on one hub (their appends share group transactions); and the serial
   chain with ``durability=write`` (no commit waits for the WAL flush).

Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).parents[2] / "mayfly" / "benchmarks"))

from bench_group_commit import load, report  # the core's group-commit benchmark, the same figures

_CHILD = "--floor-child"


def insert_commits(conninfo: str, table: str, seconds: float) -> int:
    """One-row INSERT commits on one connection for ``seconds``; how many."""
    count = 0
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            conn.execute(f"INSERT INTO {table} VALUES (%s)", (count,))
            count += 1
    return count


def floors(conninfo: str, connections: int, seconds: float = 2.0) -> tuple[float, float]:
    """The one-connection INSERT+COMMIT rate, and the aggregate over ``connections`` processes."""
    table = f"gc_floor_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (n bigint)")
    try:
        one = insert_commits(conninfo, table, seconds) / seconds
        children = [
            subprocess.Popen(
                [sys.executable, __file__, _CHILD, conninfo, table, str(seconds)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(connections)
        ]
        many = sum(int(child.communicate()[0]) for child in children) / seconds
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f"DROP TABLE {table}")
    return one, many


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == _CHILD:
        print(insert_commits(sys.argv[2], sys.argv[3], float(sys.argv[4])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("server", nargs="?", default=os.environ.get("MAYFLY_TEST_POSTGRES_URL"))
    parser.add_argument("--chain", type=int, default=100)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--connections", type=int, default=8)
    args = parser.parse_args()
    conninfo = (args.server or "postgresql://postgres@127.0.0.1:5432/test").split("?", 1)[0]
    schema = f"mayfly_bench_gc_{uuid.uuid4().hex[:8]}"
    url = f"{conninfo}?schema={schema}"
    fast_url = f"{conninfo}?schema={schema}_w&durability=write"

    measured: list[float] = []

    def floor() -> float:
        # report() measures the floor before and after the serial chain; say which this is.
        one, many = floors(conninfo, args.connections)
        when = "before the chain" if not measured else "after the chain"
        measured.append(many)
        print(
            f"  raw floor, {args.connections} connections at once:        {many:9,.0f} commits/s "
            f"(aggregate, {when})"
        )
        return one

    try:
        print(f"  {load()}")
        report("PostgreSQL, durable", url, fast_url, floor, args, alone_url=url)
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            for name in (schema, f"{schema}_w"):
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


if __name__ == "__main__":
    main()
