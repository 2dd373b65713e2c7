"""Benchmark: claiming orphaned runs from the PostgreSQL run index, and what the index costs an append.

Usage: python bench_claims.py [SERVER_URL] [--runs N] [--batch B] [--parked P]

SERVER_URL defaults to ``MAYFLY_TEST_POSTGRES_URL`` or
``postgresql://postgres@127.0.0.1:5432/test``. Everything runs in a fresh
schema that is dropped at the end.

1. ``N`` (default 10,000) orphaned runs: runnable index entries whose leases
   a dead worker held and which expired, plus ``P`` (default 10,000) runs
   parked on a signal and ``P`` waiting on a timer an hour away (which a claim
   must step over). One worker claims them ``B`` (default 500) per claim:
   runs/s over the whole drain, the slowest claim, and round trips per claim.
2. Round trips of one ``append`` and one ``append_indexed`` (the entry is
   written in the append's transaction: BEGIN + append, then entry + COMMIT,
   pipelined), and the appends/s of each, one caller.
3. The cost of an idle claim (nothing claimable) over the parked runs.

Round trips are counted from libpq's protocol trace of the journal's
connections: each turn from messages the client sent to messages the server
answered is one round trip (a pipeline sends several statements, and a Sync
or a flush request, before it reads). Numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql

from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord
from mayfly.runindex import IndexEntry, IndexStatus
from mayfly_postgres import PostgresJournal

IDS = Uuid7IdSource()


class RoundTrips:
    """Counts round trips on the journal's pooled connections from libpq's protocol trace."""

    def __init__(self, journal: PostgresJournal) -> None:
        self._journal = journal
        self._path = f"/tmp/mayfly-bench-trace-{os.getpid()}"
        self._file: Any = None

    def __enter__(self) -> RoundTrips:
        self._file = open(self._path, "w")  # closed in __exit__
        for connection in list(self._journal._store.pool._all):
            connection.pgconn.trace(self._file.fileno())
        return self

    def __exit__(self, *exc: object) -> None:
        for connection in list(self._journal._store.pool._all):
            connection.pgconn.untrace()
        self._file.close()

    def count(self) -> int:
        """Turns from frontend to backend messages so far: the times the client waited for the server."""
        turns, last = 0, ""
        with open(self._path) as trace:
            for line in trace:
                fields = line.split("\t")
                if len(fields) < 2:
                    continue
                turns += last == "F" and fields[1] == "B"
                last = fields[1]
        return turns


def traced(journal: PostgresJournal, operation: Any, times: int) -> float:
    """Round trips per call of ``operation`` (called ``times`` times on warm connections)."""
    operation()  # a warm, pooled connection (the trace is set on pooled connections only)
    with RoundTrips(journal) as trips:
        for _ in range(times):
            operation()
    return trips.count() / times


def url_with(server: str, **options: object) -> str:
    """``server`` with Mayfly options appended."""
    return server + ("&" if "?" in server else "?") + "&".join(f"{k}={v}" for k, v in options.items())


def records(run: str, first: int) -> list[JournalRecord]:
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
        for sequence in range(first, first + 3)
    ]


def seed(journal: PostgresJournal, server: str, orphans: int, parked: int) -> None:
    """Orphaned runs (entries + expired leases of a dead worker) and parked runs, in bulk."""
    now = int(time.time() * 1000)
    runs = [IDS.new_id() for _ in range(orphans)]
    for start in range(0, orphans, 2000):
        journal.index_put(
            [
                IndexEntry(run_id=run, status=IndexStatus.RUNNING, ready_at_ms=now - 60_000 + i, sequence=9)
                for i, run in enumerate(runs[start : start + 2000])
            ]
        )
    waiting = [
        IndexEntry(run_id=IDS.new_id(), status=IndexStatus.WAITING, ready_at_ms=ready, sequence=9)
        for ready in [None] * parked + [now + 3_600_000] * parked
    ]
    for start in range(0, len(waiting), 2000):
        journal.index_put(waiting[start : start + 2000])
    schema = sql.Identifier(journal.schema)
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(
            sql.SQL(
                "INSERT INTO {}.leases (run_id, owner, token, grant_id, expires_at) "
                "SELECT r, 'dead-worker', 1, gen_random_uuid(), now() - interval '1 minute' "
                "FROM unnest(%s::uuid[]) AS r"
            ).format(schema),
            (runs,),
        )
        admin.execute(
            sql.SQL("INSERT INTO {}.runs (run_id, fence) SELECT r, 1 FROM unnest(%s::uuid[]) AS r").format(
                schema
            ),
            (runs,),
        )
        admin.execute(sql.SQL("ANALYZE {}.run_index").format(schema))
        admin.execute(sql.SQL("ANALYZE {}.leases").format(schema))


def drain(journal: PostgresJournal, size: int, expected: int) -> None:
    """Claim until nothing is left; print the rates."""
    took: list[float] = []
    claimed = 0
    started = time.perf_counter()
    while True:
        at = time.perf_counter()
        guards = journal.claim("bench-worker", limit=size, ttl_ms=600_000, now_ms=int(time.time() * 1000))
        took.append(time.perf_counter() - at)
        claimed += len(guards)
        if len(guards) < size:
            break
    elapsed = time.perf_counter() - started
    median = statistics.median(took) * 1000
    print(
        f"claims: {claimed} of {expected} orphaned runs in {len(took)} claims of up to {size}: "
        f"{claimed / elapsed:,.0f} runs/s (target >= 1,000); per claim median {median:.1f} ms, "
        f"slowest {max(took) * 1000:.1f} ms"
    )

    def idle() -> None:
        journal.claim("bench-worker", limit=size, ttl_ms=600_000, now_ms=int(time.time() * 1000))

    at = time.perf_counter()
    for _ in range(20):
        idle()
    idle_ms = (time.perf_counter() - at) / 20 * 1000
    trips = traced(journal, idle, 20)
    print(
        f"idle claim (nothing claimable; the leased and parked runs stepped over): {idle_ms:.2f} ms, "
        f"{trips:g} round trip(s)"
    )


def appends(journal: PostgresJournal, seconds: float, size: int) -> None:
    """Round trips and rates of plain and indexed appends (one caller, 3-record batches), and of a claim."""
    for label, indexed in (("append", False), ("append_indexed", True)):
        run, state = IDS.new_id(), [1]

        def append(run: str = run, state: list[int] = state, indexed: bool = indexed) -> None:
            first = state[0]
            last = first + 2
            batch = records(run, first)
            if indexed:
                journal.append_indexed(
                    run,
                    first,
                    batch,
                    None,
                    lambda: IndexEntry(
                        run_id=run, status=IndexStatus.WAITING, ready_at_ms=None, sequence=last
                    ),
                )
            else:
                journal.append(run, first, batch)
            state[0] = last + 1

        count = 0
        deadline = time.perf_counter() + seconds
        started = time.perf_counter()
        while time.perf_counter() < deadline:
            append()
            count += 1
        rate = count / (time.perf_counter() - started)
        print(f"{label}: {rate:,.0f} appends/s, {traced(journal, append, 50):g} round trip(s) per append")
    fresh = [IDS.new_id() for _ in range(size * 3)]
    journal.index_put(
        [IndexEntry(run_id=run, status=IndexStatus.NEW, ready_at_ms=0, sequence=1) for run in fresh]
    )

    def claim() -> None:
        journal.claim("bench-worker", limit=size, ttl_ms=600_000, now_ms=int(time.time() * 1000))

    print(f"claim of {size} runs: {traced(journal, claim, 2):g} round trip(s)")


def main() -> None:
    """Parse the arguments, seed a fresh schema, measure, drop it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = os.environ.get("MAYFLY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("server", nargs="?", default=default)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--parked", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    schema = f"mayfly_pgbench_claims_{uuid.uuid4().hex[:8]}"
    url = url_with(args.server, schema=schema)
    try:
        with PostgresJournal(url) as journal:
            seed(journal, args.server, args.runs, args.parked)
            drain(journal, args.batch, args.runs)
            appends(journal, args.seconds, args.batch)
    finally:
        with psycopg.connect(args.server, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


if __name__ == "__main__":
    main()
