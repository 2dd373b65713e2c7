"""The DBOS side of bench_vs_dbos.py: DBOS Transact on PostgreSQL, in a process of its own.

Run by bench_vs_dbos.py, never imported by Mayfly: DBOS is a banned
distribution admitted only as the benchmark comparator of the ``bench_dbos``
nox session (policy/runtime-dependency-policy.toml, ``[[comparator]]``).
``DBOS.launch()`` starts its own event loop, executor and background threads,
which is why this runs apart from the Mayfly side.

Usage: python dbos_side.py SYSTEM_DATABASE_URL SCHEMA --chain 100 --runs 100 --steps 10 [--queue]

Written the way DBOS's documentation writes an application: steps are
``@DBOS.step()`` functions, a workflow is a ``@DBOS.workflow()`` function that
calls them in order, DBOS is configured with ``DBOS(config=...)`` and started
with ``DBOS.launch()``, with DBOS's defaults for everything the benchmark does
not name (durability: the server's ``synchronous_commit``; the system database
pool; unlimited executor threads; a queue polled every second). Each step does nothing and runs in the
workflow's own thread. Prints one JSON line of figures.
"""

from __future__ import annotations

import argparse
import json
import time

from dbos import DBOS, DBOSConfig


@DBOS.step()
def noop() -> None:
    """A step that does nothing: what is measured is DBOS recording it."""


@DBOS.workflow()
def steps(count: int) -> int:
    """``count`` sequential no-op steps."""
    for _ in range(count):
        noop()
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("schema")
    parser.add_argument("--chain", type=int, default=100)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--queue", action="store_true", help="also start the fan-out through a DBOS Queue")
    args = parser.parse_args()
    config: DBOSConfig = {
        "name": "mayfly-bench-vs-dbos",
        "system_database_url": args.url,
        "dbos_system_schema": args.schema,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()  # creates and migrates the schema: not timed
    try:
        steps(2)  # warm-up: the pool's first connections, untimed

        started = time.perf_counter()
        assert steps(args.chain) == args.chain
        chain = args.chain / (time.perf_counter() - started)

        started = time.perf_counter()
        handles = [DBOS.start_workflow(steps, args.steps) for _ in range(args.runs)]
        assert all(handle.get_result() == args.steps for handle in handles)
        fan = args.runs * args.steps / (time.perf_counter() - started)

        figures = {"chain": chain, "fan": fan}
        if args.queue:
            # DBOS 3.4 stores a queue's settings in the system database (DBOS.register_queue, after
            # launch); the defaults: no concurrency limit, polled every second.
            queue = DBOS.register_queue("bench_fan")
            started = time.perf_counter()
            handles = [queue.enqueue(steps, args.steps) for _ in range(args.runs)]
            assert all(handle.get_result() == args.steps for handle in handles)
            figures["fan_queue"] = args.runs * args.steps / (time.perf_counter() - started)
    finally:
        DBOS.destroy()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
