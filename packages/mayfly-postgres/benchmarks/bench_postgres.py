"""Benchmark: PostgresJournal appends beside raw psycopg INSERT + COMMIT, and end-to-end nodes/s.

Usage: python bench_postgres.py [SERVER_URL] [--seconds S] [--rounds R]

SERVER_URL defaults to ``MAYFLY_TEST_POSTGRES_URL`` or
``postgresql://postgres@127.0.0.1:5432/test``. Everything runs in a fresh
schema that is dropped at the end. Measured in one run, series interleaved so
drift hits both sides alike, at the same durability (synchronous_commit=on):

1. appends/s of 3-record batches through ``PostgresJournal.append`` beside raw
   psycopg ``INSERT`` of the same rows (``executemany``) + ``COMMIT`` into a
   table with the same columns and keys; ratio journal / raw (target >= 0.6);
2. the same with 4 processes appending at once (aggregate rates);
3. no-op nodes/s through ``WorkflowRuntime`` for a 100-node chain, and for 100
   concurrent 10-node runs on one hub (cooperative no-op handlers).

Numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql

from mayfly import HandlerRegistry, HandlerRequest, Node, Succeeded, WorkflowRuntime, WorkflowSpec
from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord
from mayfly.substrate import Hub, spawn
from mayfly_postgres import PostgresJournal, PostgresLeaseStore

BATCH = 3
PROCESSES = 4
IDS = Uuid7IdSource()


def url_with(server: str, **options: object) -> str:
    """``server`` with Mayfly options appended."""
    return server + ("&" if "?" in server else "?") + "&".join(f"{k}={v}" for k, v in options.items())


def batch(run: str, first: int) -> list[JournalRecord]:
    """A 3-record batch of small JSON events."""
    return [
        JournalRecord.seal(
            run_id=run,
            sequence=sequence,
            event_id=IDS.new_id(),
            event_type="NodeReady",
            schema_version=1,
            payload=b'{"type":"NodeReady","node_id":"n%d","cause":"initial"}' % sequence,
        )
        for sequence in range(first, first + BATCH)
    ]


def create_raw_table(server: str, schema: str) -> None:
    """A table with the records table's columns and keys, for the raw baseline."""
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        connection.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (run_id uuid NOT NULL, sequence bigint NOT NULL, "
                "event_id uuid NOT NULL, event_type text NOT NULL, schema_version bigint NOT NULL, "
                "payload bytea NOT NULL, checksum text NOT NULL, PRIMARY KEY (run_id, sequence), "
                "UNIQUE (run_id, event_id))"
            ).format(sql.Identifier(schema, "raw_records"))
        )


def journal_appends(journal: PostgresJournal, seconds: float) -> float:
    """Batches appended per second for ``seconds`` (a fresh run every 300 batches)."""
    count, run, next_sequence = 0, IDS.new_id(), 1
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    while time.perf_counter() < deadline:
        journal.append(run, next_sequence, batch(run, next_sequence))
        next_sequence += BATCH
        count += 1
        if count % 300 == 0:
            run, next_sequence = IDS.new_id(), 1
    return count / (time.perf_counter() - started)


def raw_appends(connection: psycopg.Connection[Any], schema: str, seconds: float) -> float:
    """Raw INSERT (executemany of the same 3 rows) + COMMIT per second, same durability."""
    insert = sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s, %s)").format(
        sql.Identifier(schema, "raw_records")
    )
    count, run, next_sequence = 0, IDS.new_id(), 1
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    with connection.cursor() as cursor:
        while time.perf_counter() < deadline:
            records = batch(run, next_sequence)
            cursor.executemany(
                insert,
                [
                    (r.run_id, r.sequence, r.event_id, r.event_type, r.schema_version, r.payload, r.checksum)
                    for r in records
                ],
            )
            connection.commit()
            next_sequence += BATCH
            count += 1
            if count % 300 == 0:
                run, next_sequence = IDS.new_id(), 1
    return count / (time.perf_counter() - started)


def raw_connection(server: str) -> psycopg.Connection[Any]:
    """A plain psycopg connection at the journal's durability (synchronous_commit=on)."""
    return psycopg.connect(server, options="-c synchronous_commit=on")


def worker(kind: str, server: str, schema: str, seconds: float, start_at: float) -> None:
    """One of the concurrent processes: wait for the common start, measure, print the rate."""
    if kind == "journal":
        with PostgresJournal(url_with(server, schema=schema)) as journal:
            journal.next_sequence(IDS.new_id())  # connect before the clock starts
            time.sleep(max(0.0, start_at - time.time()))
            rate = journal_appends(journal, seconds)
    else:
        with raw_connection(server) as connection:
            time.sleep(max(0.0, start_at - time.time()))
            rate = raw_appends(connection, schema, seconds)
    print(f"{rate:.3f}", flush=True)


def concurrent(kind: str, server: str, schema: str, seconds: float) -> float:
    """Aggregate batches/s of PROCESSES processes appending at once."""
    start_at = time.time() + 1.5
    children = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                server,
                "--worker",
                kind,
                "--schema",
                schema,
                "--seconds",
                str(seconds),
                "--start-at",
                str(start_at),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    rates = [float(child.communicate(timeout=120)[0].strip()) for child in children]
    return sum(rates)


def chain_spec(nodes: int, name: str) -> WorkflowSpec:
    """A chain of no-op nodes."""
    return WorkflowSpec(
        workflow_id=name,
        version=1,
        nodes=tuple(
            Node(f"n{i}", handler="noop@1", depends_on=(f"n{i - 1}",) if i else ()) for i in range(nodes)
        ),
    )


def runtime_rates(server: str, schema: str) -> tuple[float, float]:
    """No-op nodes/s: one 100-node chain; 100 concurrent 10-node runs on one hub."""
    registry = HandlerRegistry()

    @registry.handler("noop", cooperative=True)
    def noop(request: HandlerRequest) -> Succeeded:
        return Succeeded()

    url = url_with(server, schema=schema, pool_size=16)
    with PostgresJournal(url) as journal, PostgresLeaseStore(url) as leases:
        runtime = WorkflowRuntime(journal, registry, leases=leases)
        runtime.execute(chain_spec(10, "bench.warmup"))
        started = time.perf_counter()
        result = runtime.execute(chain_spec(100, "bench.chain"))
        chain_rate = 100 / (time.perf_counter() - started)
        assert result.succeeded

        small = chain_spec(10, "bench.many")

        def main() -> list[Any]:
            tasks = [spawn(runtime.execute_in_current_task, small) for _ in range(100)]
            return [task.join() for task in tasks]

        started = time.perf_counter()
        results = Hub().run(main)
        many_rate = 100 * 10 / (time.perf_counter() - started)
        assert all(r.succeeded for r in results)
    return chain_rate, many_rate


def main() -> None:
    """Run every measurement and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "server",
        nargs="?",
        default=os.environ.get("MAYFLY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one measurement series")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median reported)")
    parser.add_argument("--worker", choices=("journal", "raw"), help=argparse.SUPPRESS)
    parser.add_argument("--schema", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.server, args.schema, args.seconds, args.start_at)
        return
    schema = f"mayfly_bench_{uuid.uuid4().hex[:8]}"
    try:
        with PostgresJournal(url_with(args.server, schema=schema)) as journal:
            create_raw_table(args.server, schema)
            with raw_connection(args.server) as connection:
                fsync = connection.execute("SHOW fsync").fetchone()
                print(
                    f"server {journal.url.split('?')[0]}, fsync={fsync[0] if fsync else '?'}, "
                    f"synchronous_commit=on on both sides, {args.rounds} interleaved rounds "
                    f"of {args.seconds:g} s"
                )
                single: dict[str, list[float]] = {"journal": [], "raw": []}
                for _ in range(args.rounds):
                    single["journal"].append(journal_appends(journal, args.seconds))
                    single["raw"].append(raw_appends(connection, schema, args.seconds))
        j, r = statistics.median(single["journal"]), statistics.median(single["raw"])
        print(
            f"1 process : journal {j:8.1f} appends/s ({j * BATCH:8.1f} records/s) | raw INSERT+COMMIT "
            f"{r:8.1f} batches/s | ratio {j / r:.2f} (target >= 0.6)"
        )
        multi: dict[str, list[float]] = {"journal": [], "raw": []}
        for _ in range(args.rounds):
            multi["journal"].append(concurrent("journal", args.server, schema, args.seconds))
            multi["raw"].append(concurrent("raw", args.server, schema, args.seconds))
        j, r = statistics.median(multi["journal"]), statistics.median(multi["raw"])
        print(
            f"{PROCESSES} processes: journal {j:8.1f} appends/s ({j * BATCH:8.1f} records/s) | "
            f"raw INSERT+COMMIT {r:8.1f} batches/s | ratio {j / r:.2f}"
        )
        chain_rate, many_rate = runtime_rates(args.server, schema)
        print(
            f"runtime   : 100-node chain {chain_rate:8.1f} nodes/s | 100 concurrent 10-node runs "
            f"{many_rate:8.1f} nodes/s (cooperative no-op handlers)"
        )
    finally:
        with psycopg.connect(args.server, autocommit=True) as connection:
            connection.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


if __name__ == "__main__":
    main()
