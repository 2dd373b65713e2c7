"""Benchmark: what a claim and a wake-up cost as the PostgreSQL run index grows to 10k, 100k and 1M rows.

Usage: python bench_index_capacity.py [SERVER_URL] [--sizes 10000,100000,1000000] [--claimable 0.01]
[--repeat 20] [--explain] [--quick]

SERVER_URL defaults to ``MAYFLY_TEST_POSTGRES_URL`` or
``postgresql://postgres@127.0.0.1:5432/test``. Everything runs in a fresh
schema that is dropped at the end.

The index is filled through the backend's own ``index_put`` (batches of
5,000 entries, one statement each; the fill rate is printed) up to each size,
shaped like a real store: ``--claimable`` (default 1%) runnable root runs
nobody holds, 30% ended, 20% waiting on a timer an hour or more away, the
rest parked on a signal with no wake time. At each size:

- claim: ``claim(limit=1 | 10 | 100)`` with enough claimable runs, median ms
  per claim over ``--repeat`` claims, claims/s at that median and runs/s;
  the leases are released (not timed) so the next claim has the same work;
- idle claim: a claim of 100 when every claimable run is leased (what an idle
  worker's poll costs), and ``next_wake`` (what it asks before sleeping);
- wake-up: ``index_wake`` of a run parked on a signal (ms per call), and the
  time from calling it to an idle ``LISTEN`` connection (``listen_wakeups``)
  becoming readable with the ``NOTIFY``.

``--explain`` also prints the server's plans (``auto_explain`` of the claim
function's statements, ANALYZE) of a claim of 100 at the largest size, with the claimable runs free and leased
(printed before that size's row). Numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from mayfly.identity import Uuid7IdSource
from mayfly.runindex import IndexEntry, IndexStatus
from mayfly_postgres import PostgresJournal

IDS = Uuid7IdSource()
BATCH = 5000


def url_with(server: str, **options: object) -> str:
    """``server`` with Mayfly options appended."""
    return server + ("&" if "?" in server else "?") + "&".join(f"{k}={v}" for k, v in options.items())


def entries(count: int, claimable: float, now: int, parked: list[str]) -> list[IndexEntry]:
    """``count`` entries in the real-store mix; the parked runs' ids are appended to ``parked``."""
    out = []
    runnable = round(count * claimable)
    for i in range(count):
        run = IDS.new_id()
        if i < runnable:
            entry = IndexEntry(run_id=run, status=IndexStatus.RUNNING, ready_at_ms=now - 60_000, sequence=9)
        elif i % 10 < 3:
            entry = IndexEntry(run_id=run, status=IndexStatus.TERMINAL, ready_at_ms=None, sequence=40)
        elif i % 10 < 5:
            entry = IndexEntry(
                run_id=run, status=IndexStatus.WAITING, ready_at_ms=now + 3_600_000 + i, sequence=12
            )
        else:
            entry = IndexEntry(run_id=run, status=IndexStatus.WAITING, ready_at_ms=None, sequence=12)
            parked.append(run)
        out.append(entry)
    return out


def fill(journal: PostgresJournal, count: int, claimable: float, parked: list[str]) -> float:
    """Put ``count`` more entries through ``index_put``; entries/s."""
    now = int(time.time() * 1000)
    started = time.perf_counter()
    for first in range(0, count, BATCH):
        journal.index_put(entries(min(BATCH, count - first), claimable, now, parked))
    return count / (time.perf_counter() - started)


def timed(operation: Callable[[], Any], repeat: int) -> float:
    """Median seconds of ``operation`` over ``repeat`` calls."""
    took = []
    for _ in range(repeat):
        at = time.perf_counter()
        operation()
        took.append(time.perf_counter() - at)
    return statistics.median(took)


def claims(journal: PostgresJournal, limit: int, repeat: int) -> tuple[float, int]:
    """Median seconds of a claim of ``limit`` (its leases released after each, untimed); runs it got."""
    took, got = [], 0
    for _ in range(repeat):
        at = time.perf_counter()
        guards = journal.claim("bench", limit=limit, ttl_ms=600_000, now_ms=int(time.time() * 1000))
        took.append(time.perf_counter() - at)
        got = len(guards)
        for guard in guards:
            guard.release()
    return statistics.median(took), got


def hold_all(journal: PostgresJournal) -> list[Any]:
    """Lease every claimable run (so a claim finds nothing); the guards, to release afterwards."""
    held: list[Any] = []
    while True:
        got = journal.claim("bench-holder", limit=10_000, ttl_ms=600_000, now_ms=int(time.time() * 1000))
        held += got
        if len(got) < 10_000:
            return held


def wakeups(journal: PostgresJournal, parked: list[str], repeat: int) -> tuple[float, float]:
    """Median seconds of ``index_wake`` and of wake -> the idle listener readable with its NOTIFY."""
    listener = journal.listen_wakeups()
    calls, notified = [], []
    try:
        for _ in range(repeat):
            run = parked.pop()
            listener.drain()
            at = time.perf_counter()
            if not journal.index_wake(run):
                raise RuntimeError(f"run {run} was not woken")
            calls.append(time.perf_counter() - at)
            readable, _, _ = select.select([listener.fileno()], [], [], 5.0)
            if not readable:
                raise RuntimeError("the listener was not told of the wake within 5 s")
            notified.append(time.perf_counter() - at)
            listener.drain()
            time.sleep(0.01)  # idle again
    finally:
        listener.close()
    # The woken runs are claimable now: claim them out of the way so the next size claims the same mix.
    journal.claim("bench-woken", limit=repeat, ttl_ms=86_400_000, now_ms=int(time.time() * 1000))
    return statistics.median(calls), statistics.median(notified)


def explain(journal: PostgresJournal, server: str, label: str) -> None:
    """Print the plans of a claim of 100 as the server runs it now (rolled back).

    The claim is a PL/pgSQL function, so ``EXPLAIN`` of its call shows one
    Function Scan: its statements' plans come from ``auto_explain`` (nested
    statements, ANALYZE, BUFFERS), sent to this client as LOG messages. The
    claim runs six times first, each rolled back, so the session's cached
    plans are the ones a pooled connection runs (PL/pgSQL may switch to a
    generic plan after five).
    """
    arguments = {
        "queues": None,
        "limit": 100,
        "owner": "bench",
        "ttl": 1000.0,
        "held_names": [],
        "held_counts": [],
    }
    logged: list[str] = []
    with psycopg.connect(server) as conn:
        conn.add_notice_handler(lambda diagnostic: logged.append(diagnostic.message_primary or ""))
        try:
            conn.execute("LOAD 'auto_explain'")
        except psycopg.Error as error:
            conn.rollback()
            print(f"  plan of a claim of 100, {label}: auto_explain not loadable ({error}); no plans")
            return
        for _ in range(6):
            with conn.transaction(force_rollback=True):
                conn.execute(journal._index_sql.claim, {**arguments, "now": int(time.time() * 1000)})
        for setting in (
            "auto_explain.log_min_duration = 0",
            "auto_explain.log_analyze = on",
            "auto_explain.log_buffers = on",
            "auto_explain.log_nested_statements = on",
            "client_min_messages = log",
        ):
            conn.execute(f"SET {setting}")
        logged.clear()
        with conn.transaction(force_rollback=True):
            conn.execute(journal._index_sql.claim, {**arguments, "now": int(time.time() * 1000)})
        conn.rollback()
    print(f"  plans of a claim of 100, {label} (auto_explain, the function's statements then the call):")
    for message in logged:
        # Each message: "duration: ...  plan:", "Query Text: ..." (many lines), then the plan.
        lines = message.splitlines()
        plan = next((n for n, line in enumerate(lines) if "(cost=" in line), len(lines))
        for line in lines[:1] + lines[plan:]:
            print(f"    {line}")


def measure(journal: PostgresJournal, parked: list[str], repeat: int, explained: str | None) -> str:
    """One table row's measurements (after the size column and the fill rate)."""
    one, _ = claims(journal, 1, repeat)
    ten, _ = claims(journal, 10, repeat)
    hundred, got = claims(journal, 100, repeat)
    if explained:
        explain(journal, explained, "every claimable run free")
    held = hold_all(journal)
    if explained:
        explain(journal, explained, "every claimable run leased (an idle claim)")
    idle = timed(
        lambda: journal.claim("bench", limit=100, ttl_ms=600_000, now_ms=int(time.time() * 1000)), repeat
    )
    wake_at = timed(lambda: journal.next_wake(now_ms=int(time.time() * 1000)), repeat)
    for guard in held:
        guard.release()
    wake, notify = wakeups(journal, parked, repeat)
    claim_ms = f"{one * 1e3:>6.2f}ms {ten * 1e3:>6.2f}ms {hundred * 1e3:>7.2f}ms"
    return (
        f"{claim_ms} {1 / one:>8,.0f} {got / hundred:>8,.0f} | {idle * 1e3:>8.2f}ms {wake_at * 1e3:>7.2f}ms"
        f" | {wake * 1e3:>8.2f}ms {notify * 1e3:>7.2f}ms"
    )


def main() -> None:
    """Parse the arguments, fill a fresh schema size by size, measure, print the table, drop it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = os.environ.get("MAYFLY_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("server", nargs="?", default=default)
    parser.add_argument("--sizes", default="10000,100000,1000000", help="index sizes, comma-separated")
    parser.add_argument("--claimable", type=float, default=0.01, help="share of runnable entries")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--explain", action="store_true", help="print the claim's plans at the largest size")
    parser.add_argument("--quick", action="store_true", help="sizes 10k and 100k, 5 repeats")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.repeat = "10000,100000", 5
    sizes = sorted(int(size) for size in args.sizes.split(","))
    schema = f"mayfly_pgbench_capacity_{uuid.uuid4().hex[:8]}"
    url = url_with(args.server, schema=schema)
    print(f"server: {args.server} (schema {schema}); {args.claimable:.0%} claimable, repeat {args.repeat}")
    print(
        f"{'rows':>9} {'fill/s':>8} | {'claim 1':>8} {'claim 10':>8} {'claim 100':>9} {'claims/s':>8} "
        f"{'runs/s':>8} | {'idle claim':>10} {'next_wake':>9} | {'index_wake':>10} {'to NOTIFY':>9}"
    )
    parked: list[str] = []
    try:
        with PostgresJournal(url) as journal:
            rows = 0
            for size in sizes:
                rate = fill(journal, size - rows, args.claimable, parked)
                rows = size
                explained = args.server if args.explain and size == sizes[-1] else None
                with psycopg.connect(args.server, autocommit=True) as admin:
                    admin.execute(sql.SQL("ANALYZE {}.run_index").format(sql.Identifier(schema)))
                print(f"{size:>9,} {rate:>8,.0f} | {measure(journal, parked, args.repeat, explained)}")
        print(
            "(medians; claims/s: claims of 1 per second at that median, one caller; runs/s: runs a claim of "
            "100 leases per second; idle claim: a claim of 100 with every claimable run leased; "
            "to NOTIFY: from calling index_wake to the idle listener readable)"
        )
    finally:
        with psycopg.connect(args.server, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


if __name__ == "__main__":
    main()
