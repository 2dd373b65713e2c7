"""Group commit across runs (issue 18 §2): the file journal and LMDB against their raw commit floors.

For each store (``file://`` in fsync mode; ``lmdb://`` in sync mode when
mayfly-lmdb is installed), all measured in this one run, beside the load
average:

1. the raw floor: one durable commit at a time (``write`` + ``fdatasync`` of a
   small record in the store's directory; for LMDB one-put write
   transactions with a synced commit), commits/s;
2. the serial chain: one run of ``--chain`` (100) cooperative no-op nodes,
   ``WorkflowRuntime.execute``, nodes/s and its ratio to the floor (target
   >= 0.8; the chain makes one commit per node);
3. concurrent runs: ``--runs`` (100) runs of ``--nodes`` (10) nodes started,
   then one ``mayfly.Worker`` of concurrency ``--runs`` drives them all,
   nodes/s and its ratio to the serial chain (target >= 5x);
4. what bounds those figures: the journal alone (serial appends/s, and
   ``--runs`` runs appending at once on one hub, with the group size),
   and the serial chain with ``durability=write`` (file) / ``nosync`` (LMDB),
   where no commit waits for the disk: the runtime's own cost per node.

Timings are printed, never asserted. Run:
``python packages/mayfly/benchmarks/bench_group_commit.py [--chain 100] [--runs 100] [--nodes 10]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_worker import chain, drive_all, raw_floor, registry

from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord
from mayfly.plugins import open_journal
from mayfly.runtime import WorkflowRuntime
from mayfly.substrate import Hub, spawn


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


def lmdb_floor(directory: Path, count: int = 300) -> float:
    """One-put LMDB write transactions, each commit synced: the LMDB one-commit floor."""
    import lmdb  # noqa: PLC0415 - only when mayfly-lmdb is installed

    env = lmdb.open(str(directory / "lmdb-floor"), map_size=64 << 20, sync=True, metasync=True)
    try:
        started = time.perf_counter()
        for n in range(count):
            with env.begin(write=True) as txn:
                txn.put(b"k%d" % n, b"x" * 300)
        return count / (time.perf_counter() - started)
    finally:
        env.close()


def serial_chain(url: str, length: int) -> float:
    runtime = WorkflowRuntime(url, registry())
    started = time.perf_counter()
    runtime.execute(chain("chain", length))
    return length / (time.perf_counter() - started)


def concurrent_runs(url: str, runs: int, nodes: int) -> float:
    runtime = WorkflowRuntime(url, registry())
    spec = chain("fan", nodes)
    for _ in range(runs):
        runtime.start(spec)
    return runs * nodes / drive_all(url, runs)


def journal_appends(url: str, runs: int, appends: int) -> float:
    """``runs`` hub tasks each appending ``appends`` one-record batches to its own run: appends/s."""
    journal = open_journal(url)
    ids = Uuid7IdSource()
    names = [ids.new_id() for _ in range(runs)]

    def one(run: str) -> None:
        for sequence in range(1, appends + 1):
            record = JournalRecord.seal(
                run_id=run,
                sequence=sequence,
                event_id=ids.new_id(),
                event_type="Probe",
                schema_version=1,
                payload=json.dumps({"sequence": sequence, "fill": "x" * 200}).encode(),
            )
            journal.append(run, sequence, [record])

    def main() -> float:
        started = time.perf_counter()
        for task in [spawn(one, run) for run in names]:
            task.join()
        return time.perf_counter() - started

    try:
        return runs * appends / Hub().run(main)
    finally:
        journal.close()


def report(  # noqa: PLR0917 - a benchmark's one entry point
    name: str,
    url: str,
    fast_url: str,
    floor: Callable[[], float],
    args: argparse.Namespace,
    alone_url: str | None = None,
) -> None:
    """Print one store's figures; ``alone_url`` takes the journal-alone appends (default: beside ``url``)."""
    print(f"--- {name}: {url}")
    print(f"  {load()}")
    # The disk is shared: the floor is measured on both sides of the chain, and their mean is used.
    first = floor()
    serial = serial_chain(url, args.chain)
    second = floor()
    rate_floor = (first + second) / 2
    print(
        f"  raw floor, one durable commit at a time:        {rate_floor:9,.0f} commits/s  "
        f"(before the chain {first:,.0f}, after {second:,.0f})"
    )
    print(
        f"  serial chain of {args.chain} nodes:                   {serial:9,.0f} nodes/s  "
        f"ratio {serial / rate_floor:.2f}x the floor (target >= 0.8x)"
    )
    together = concurrent_runs(url, args.runs, args.nodes)
    print(
        f"  {args.runs} runs x {args.nodes} nodes on one worker:        {together:9,.0f} nodes/s  "
        f"ratio {together / serial:.2f}x the serial chain (target >= 5x)"
    )
    lone = journal_appends(alone_url or url + "-appends-1", 1, 300)
    many = journal_appends(alone_url or url + "-appends-n", args.runs, 20)
    print(
        f"  journal alone, one run appending:             {lone:9,.0f} appends/s  "
        f"({lone / rate_floor:.2f}x the floor)"
    )
    print(
        f"  journal alone, {args.runs} runs appending at once:     {many:9,.0f} appends/s  "
        f"({many / lone:.2f}x one run)"
    )
    fast = serial_chain(fast_url, args.chain)
    print(
        f"  serial chain with no commit waiting for disk: {fast:9,.0f} nodes/s  "
        "(the runtime's own cost per node bounds the chain)"
    )
    print(f"  {load()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chain", type=int, default=100)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=10)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="mayfly-bench-group-", dir=os.environ.get("MAYFLY_BENCH_DIR")))
    report(
        "file journal, fsync",
        f"file://{scratch}/store",
        f"file://{scratch}/store-write?durability=write",
        lambda: raw_floor(scratch),
        args,
    )
    try:
        import mayfly_lmdb  # noqa: F401, PLC0415 - optional
    except ImportError:
        print("--- lmdb: mayfly-lmdb is not installed, skipped")
        return
    report(
        "LMDB, sync",
        f"lmdb://{scratch}/env",
        f"lmdb://{scratch}/env-nosync?durability=nosync",
        lambda: lmdb_floor(scratch),
        args,
    )


if __name__ == "__main__":
    main()
