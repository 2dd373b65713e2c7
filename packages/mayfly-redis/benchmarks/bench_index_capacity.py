"""Benchmark: what a claim and a wake-up cost as the Redis run index grows to 10k, 100k and 1M entries.

Usage: python bench_index_capacity.py [--url URL] [--sizes 10000,100000,1000000] [--claimable 0.01]
[--repeat 20] [--quick]

Without ``--url`` a private ``redis-server`` with AOF ``appendfsync always``
is started on loopback (``redis-server`` must be on PATH) and stopped at the
end; with ``--url`` every key lives under a fresh prefix, deleted at the end.

The index is filled through the backend's own ``index_put`` (batches of
5,000 entries, one script each; the fill rate is printed) up to each size,
shaped like a real store: ``--claimable`` (default 1%) runnable root runs
nobody holds, 30% ended, 20% waiting on a timer an hour or more away, the
rest parked on a signal with no wake time. At each size:

- claim: ``claim(limit=1 | 10 | 100)`` with enough claimable runs, median ms
  per claim over ``--repeat`` claims, claims/s at that median and runs/s;
  the leases are released (not timed) so the next claim has the same work;
- idle claim: a claim of 100 when every claimable run is leased (what an idle
  worker's poll costs), and ``next_wake`` (what it asks before sleeping);
- wake-up: ``index_wake`` of a run parked on a signal (ms per call), and the
  time from calling it to an idle subscription (``listen_wakeups``) becoming
  readable with the published wake-up.

Also printed: the server's memory per index entry at each size
(``used_memory`` over the entries put). Numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import select
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from mayfly.identity import Uuid7IdSource
from mayfly.runindex import IndexEntry, IndexStatus
from mayfly_redis import RedisJournal
from mayfly_redis.testing import RedisServer

IDS = Uuid7IdSource()
BATCH = 5000


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


def fill(journal: RedisJournal, count: int, claimable: float, parked: list[str]) -> float:
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


def claims(journal: RedisJournal, limit: int, repeat: int) -> tuple[float, int]:
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


def hold_all(journal: RedisJournal) -> list[Any]:
    """Lease every claimable run (so a claim finds nothing); the guards, to release afterwards."""
    held: list[Any] = []
    while True:
        got = journal.claim("bench-holder", limit=10_000, ttl_ms=600_000, now_ms=int(time.time() * 1000))
        held += got
        if len(got) < 10_000:
            return held


def wakeups(journal: RedisJournal, parked: list[str], repeat: int) -> tuple[float, float]:
    """Median seconds of ``index_wake`` and of wake -> the idle subscriber readable with the wake-up."""
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
                raise RuntimeError("the subscriber was not told of the wake within 5 s")
            notified.append(time.perf_counter() - at)
            listener.drain()
            time.sleep(0.01)  # idle again
    finally:
        listener.close()
    # The woken runs are claimable now: claim them out of the way so the next size claims the same mix.
    journal.claim("bench-woken", limit=repeat, ttl_ms=86_400_000, now_ms=int(time.time() * 1000))
    return statistics.median(calls), statistics.median(notified)


def measure(journal: RedisJournal, parked: list[str], repeat: int) -> str:
    """One table row's measurements (after the size column and the fill rate)."""
    one, _ = claims(journal, 1, repeat)
    ten, _ = claims(journal, 10, repeat)
    hundred, got = claims(journal, 100, repeat)
    held = hold_all(journal)
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
    """Parse the arguments, fill a fresh prefix size by size, measure, print the table, clean up."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a redis:// journal URL of a durable server (default: a private one)")
    parser.add_argument("--sizes", default="10000,100000,1000000", help="index sizes, comma-separated")
    parser.add_argument("--claimable", type=float, default=0.01, help="share of runnable entries")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="sizes 10k and 100k, 5 repeats")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.repeat = "10000,100000", 5
    sizes = sorted(int(size) for size in args.sizes.split(","))
    server = None if args.url else RedisServer()
    base = args.url or server.url  # type: ignore[union-attr]
    prefix = f"bench.capacity.{uuid.uuid4().hex[:8]}"
    url = base + ("&" if "?" in base else "?") + f"prefix={prefix}"
    client = redis.Redis.from_url(base.split("?", 1)[0])
    print(f"server: {base} (prefix {prefix}); {args.claimable:.0%} claimable, repeat {args.repeat}")
    print(
        f"{'rows':>9} {'fill/s':>8} | {'claim 1':>8} {'claim 10':>8} {'claim 100':>9} {'claims/s':>8} "
        f"{'runs/s':>8} | {'idle claim':>10} {'next_wake':>9} | {'index_wake':>10} {'to notify':>9} | "
        f"{'B/entry':>7}"
    )
    parked: list[str] = []
    try:
        memory = float(client.info("memory")["used_memory"])
        with RedisJournal(url) as journal:
            rows = 0
            for size in sizes:
                rate = fill(journal, size - rows, args.claimable, parked)
                rows = size
                used = (float(client.info("memory")["used_memory"]) - memory) / size
                print(f"{size:>9,} {rate:>8,.0f} | {measure(journal, parked, args.repeat)} | {used:>7,.0f}")
        print(
            "(medians; claims/s: claims of 1 per second at that median, one caller; runs/s: runs a claim of "
            "100 leases per second; idle claim: a claim of 100 with every claimable run leased; "
            "to notify: from calling index_wake to the idle subscriber readable)"
        )
    finally:
        if server is not None:
            server.stop()
        else:
            for keys in batched(client.scan_iter(match=f"{prefix}*", count=1000), 1000):
                client.unlink(*keys)


def batched(items: Any, size: int) -> Any:
    """Lists of up to ``size`` of ``items``."""
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


if __name__ == "__main__":
    main()
