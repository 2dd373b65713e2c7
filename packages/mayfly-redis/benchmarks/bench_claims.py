"""Claims per second from the Redis run index: 10,000 orphaned runs, claimed in batches of 500.

Run: ``python packages/mayfly-redis/benchmarks/bench_claims.py [--journal URL] [--runs 10000] [--batch 500]``.

Without ``--journal`` a private ``redis-server`` with AOF ``appendfsync always``
is started on loopback (``redis-server`` must be on PATH). ``--runs`` runnable
root entries are put in the index (``index_put``, batches of 1,000), claimed
once by an owner with a 200 ms lease that then "dies" (never renews), so every
run is orphaned: its lease expired, its entry says it has work. The timed part
is a new owner claiming them all with ``claim(limit=--batch)``; the first claim
also files every expired lease's run back where claims find it. Prints runs/s
over the whole drain and the first and median batch; it asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from mayfly.runindex import IndexEntry, IndexStatus
from mayfly_redis import RedisJournal
from mayfly_redis.testing import RedisServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--journal", help="a redis:// journal URL (default: a private AOF server)")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    server = None if args.journal else RedisServer()
    try:
        base = args.journal or server.url  # type: ignore[union-attr]
        joiner = "&" if "?" in base else "?"
        url = f"{base}{joiner}prefix=bench.claims.{uuid.uuid4().hex[:8]}"
        with RedisJournal(url) as journal:
            now = int(time.time() * 1000)
            entries = [
                IndexEntry(
                    run_id=str(uuid.uuid4()), status=IndexStatus.RUNNING, ready_at_ms=now - i, sequence=3
                )
                for i in range(args.runs)
            ]
            for first in range(0, len(entries), 1000):
                journal.index_put(entries[first : first + 1000])
            dead = 0
            while dead < args.runs:
                dead += len(journal.claim("dead-owner", limit=min(10_000, args.runs), ttl_ms=200, now_ms=now))
            time.sleep(0.4)  # every lease of the dead owner ran out: the runs are orphaned
            batches: list[float] = []
            claimed = 0
            started = time.perf_counter()
            while True:
                begun = time.perf_counter()
                got = journal.claim("rescuer", limit=args.batch, ttl_ms=600_000, now_ms=now)
                if not got:
                    break
                batches.append(time.perf_counter() - begun)
                claimed += len(got)
            total = time.perf_counter() - started
        print(f"journal: {url}")
        print(
            f"claimed {claimed} orphaned runs in {len(batches)} batches of {args.batch}: "
            f"{claimed / total:,.0f} runs/s overall"
        )
        print(
            f"first batch (files {args.runs} expired leases back first) {batches[0] * 1000:.1f} ms, "
            f"median batch {statistics.median(batches) * 1000:.1f} ms "
            f"({args.batch / statistics.median(batches):,.0f} runs/s)"
        )
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
