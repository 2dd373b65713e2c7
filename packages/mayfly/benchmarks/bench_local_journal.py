"""Local journal appends per second in each durability mode, beside raw writes of the same bytes.

Each append is one batch of 3 records (~1.5 KB of frames). The raw baselines
write exactly the frame bytes the journal writes, to a file in the same
directory, in the same run: ``os.write`` alone, ``os.write`` + ``os.fsync``
and ``os.write`` + ``os.fdatasync`` (what the journal calls in fsync mode).
The synced series (journal fsync mode, raw fsync, raw fdatasync) are measured
op by op in rotation, so disk drift hits them alike; the unsynced series are
measured back to back. Records are sealed before timing starts (sealing is the
caller's work); the journal's own input validation and checksum verification
are timed.

Run: ``python packages/mayfly/benchmarks/bench_local_journal.py [--appends N] [--dir DIR]``.
Prints figures and ratios; it asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord
from mayfly.local import LocalWorkflowJournal
from mayfly.local._frames import encode_batch

BATCH = 3
PAYLOAD = b'{"output":"' + b"x" * 200 + b'"}'


def batches(run_id: str, count: int) -> list[list[JournalRecord]]:
    """Return ``count`` sealed batches of ``BATCH`` records for consecutive sequences."""
    ids = Uuid7IdSource()
    return [
        [
            JournalRecord.seal(
                run_id=run_id,
                sequence=first + offset,
                event_id=ids.new_id(),
                event_type="NodeOutcomeCommitted",
                schema_version=1,
                payload=PAYLOAD,
            )
            for offset in range(BATCH)
        ]
        for first in range(1, count * BATCH + 1, BATCH)
    ]


def journal_rate(root: Path, mode: str, count: int) -> tuple[float, int]:
    """Appends per second of the local journal in ``mode``, and the bytes per append."""
    ids = Uuid7IdSource()
    run_id = ids.new_id()
    work = batches(run_id, count)
    with LocalWorkflowJournal(f"file://{root / mode}?durability={mode}") as journal:
        journal.append(run_id, 1, work[0])  # creates the run file outside the timing
        started = time.perf_counter()
        for batch in work[1:]:
            journal.append(run_id, batch[0].sequence, batch)
        elapsed = time.perf_counter() - started
    frame_bytes = len(b"".join(encode_batch(work[0])))
    return (count - 1) / elapsed, frame_bytes


def raw_rate(root: Path, name: str, count: int, sync: Callable[[int], None] | None) -> float:
    """Writes per second of the same frame bytes with ``os.write`` and an optional sync."""
    run_id = Uuid7IdSource().new_id()
    payloads = [b"".join(encode_batch(batch)) for batch in batches(run_id, count)]
    path = root / f"raw-{name}.bin"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, payloads[0])
        if sync is not None:
            sync(fd)
        started = time.perf_counter()
        for data in payloads[1:]:
            os.write(fd, data)
            if sync is not None:
                sync(fd)
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
    return (count - 1) / elapsed


def paired_synced_rates(root: Path, count: int) -> dict[str, float]:
    """Synced appends/s of the journal and of raw writes, measured op by op in rotation.

    Synced writes on a shared disk drift a lot from second to second; rotating
    one journal append, one raw write+fsync and one raw write+fdatasync per
    round exposes every series to the same conditions, so the ratios compare
    like with like.
    """
    run_id = Uuid7IdSource().new_id()
    work = batches(run_id, count)
    frames = [b"".join(encode_batch(batch)) for batch in work]
    totals = {"journal durability=fsync": 0.0, "raw os.write+os.fsync": 0.0}
    totals["raw os.write+os.fdatasync"] = 0.0
    fsync_fd = os.open(root / "raw-fsync.bin", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    fdatasync_fd = os.open(root / "raw-fdatasync.bin", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        with LocalWorkflowJournal(f"file://{root / 'journal'}?durability=fsync") as journal:
            journal.append(run_id, 1, work[0])
            for fd, sync in ((fsync_fd, os.fsync), (fdatasync_fd, os.fdatasync)):
                os.write(fd, frames[0])
                sync(fd)

            def journal_op(index: int) -> None:
                journal.append(run_id, work[index][0].sequence, work[index])

            def raw_fsync_op(index: int) -> None:
                os.write(fsync_fd, frames[index])
                os.fsync(fsync_fd)

            def raw_fdatasync_op(index: int) -> None:
                os.write(fdatasync_fd, frames[index])
                os.fdatasync(fdatasync_fd)

            ops = list(zip(totals, (journal_op, raw_fsync_op, raw_fdatasync_op), strict=True))
            for index in range(1, count):
                shift = index % len(ops)  # rotate who goes first each round
                for name, op in ops[shift:] + ops[:shift]:
                    started = time.perf_counter()
                    op(index)
                    totals[name] += time.perf_counter() - started
    finally:
        os.close(fsync_fd)
        os.close(fdatasync_fd)
    return {name: (count - 1) / total for name, total in totals.items()}


def main() -> None:
    """Measure, print figures and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=2000, help="appends per synced measurement")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions; the median is reported")
    parser.add_argument("--dir", default=None, help="directory to write in (default: a temp dir)")
    args = parser.parse_args()
    unsynced = args.appends * 10

    measures: dict[str, Callable[[Path], float]] = {
        "raw os.write": lambda root: raw_rate(root, "write", unsynced, None),
        "journal durability=write": lambda root: journal_rate(root, "write", unsynced)[0],
        "journal durability=flush": lambda root: journal_rate(root, "flush", unsynced)[0],
    }
    samples: dict[str, list[float]] = {name: [] for name in measures}
    for name in ("raw os.write+os.fsync", "raw os.write+os.fdatasync", "journal durability=fsync"):
        samples[name] = []
    # Interleave the measurements so disk and cache drift hits every series alike.
    for _ in range(args.repeat):
        for name, measure in measures.items():
            with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
                samples[name].append(measure(Path(scratch)))
        with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
            for name, rate in paired_synced_rates(Path(scratch), args.appends).items():
                samples[name].append(rate)
    results = {name: statistics.median(values) for name, values in samples.items()}
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        frame_bytes = journal_rate(Path(scratch), "write", 2)[1]
    print(f"batch: {BATCH} records, {frame_bytes} bytes of frames per append; median of {args.repeat}")
    for name, rate in results.items():
        print(f"{name:28s} {rate:12,.0f} appends/s")
    print(
        "ratio fsync mode / raw os.write+os.fsync:     "
        f"{results['journal durability=fsync'] / results['raw os.write+os.fsync']:.2f}"
    )
    print(
        "ratio fsync mode / raw os.write+os.fdatasync: "
        f"{results['journal durability=fsync'] / results['raw os.write+os.fdatasync']:.2f}"
    )
    print(
        "ratio write mode / raw os.write:              "
        f"{results['journal durability=write'] / results['raw os.write']:.2f}"
    )
    print(
        "ratio flush mode / raw os.write:              "
        f"{results['journal durability=flush'] / results['raw os.write']:.2f}"
    )


if __name__ == "__main__":
    main()
