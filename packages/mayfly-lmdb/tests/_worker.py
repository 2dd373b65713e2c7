"""Child-process modes for the multi-process tests: ``python _worker.py MODE JSON-ARGS``.

Each mode opens the environment by URL like a separate runtime would and
reports through stdout lines, flushed at once.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import uuid

from mayfly.journal import JournalRecord
from mayfly.model.errors import AppendConflict, LeaseHeld
from mayfly.plugins import open_journal, open_leases


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _batch(run_id: str, first: int, count: int, size: int, tag: str) -> list[JournalRecord]:
    return [
        JournalRecord.seal(
            run_id=run_id,
            sequence=sequence,
            event_id=_event_id(tag, sequence),
            event_type="Probe",
            schema_version=1,
            payload=json.dumps({"sequence": sequence, "fill": "x" * size}).encode(),
        )
        for sequence in range(first, first + count)
    ]


def _event_id(tag: str, sequence: int) -> str:
    """A deterministic UUID per (tag, sequence), so the parent can check exactly what was acked."""
    return f"{tag}-0000-7000-8000-{sequence:012x}"


def append(url: str, run_id: str, batches: int, batch: int, size: int, tag: str) -> None:
    """Append ``batches`` batches (forever when negative), printing each acknowledgement."""
    journal = open_journal(url)
    _say("ready")
    done = 0
    while batches < 0 or done < batches:
        first = journal.next_sequence(run_id)
        try:
            result = journal.append(run_id, first, _batch(run_id, first, batch, size, tag))
        except AppendConflict:
            continue
        _say(f"ack {result.last_sequence}")
        done += 1
    journal.close()
    _say("done")


def inspect(url: str, run_id: str, until: int, timeout: float) -> None:
    """Read the run from a read-only journal until it holds ``until`` records; report every read."""
    journal = open_journal(url)
    deadline = time.monotonic() + timeout
    reads = 0
    grew = 0
    last = 0
    while last < until:
        records = journal.read(run_id)
        if [r.sequence for r in records] != list(range(1, len(records) + 1)):
            _say("gap")
            return
        if len(records) < last:
            _say("shrank")
            return
        grew += len(records) > last
        last = len(records)
        reads += 1
        if time.monotonic() > deadline:
            _say(f"timeout {last}")
            return
    journal.close()
    _say(json.dumps({"reads": reads, "grew": grew, "last": last}))


def hold(url: str, run_id: str, ttl_ms: int = 60_000) -> None:
    """Acquire the run's lease, report its token, then wait (never renewing) to be killed."""
    leases = open_leases(url)
    guard = leases.acquire(run_id, "worker", ttl_ms)
    _say(f"held {guard.fencing_token}")
    sys.stdin.readline()


def fenced(url: str, run_id: str, seed: int) -> None:
    """Forever: take the run's lease, append a few batches under its fence, print each ack, release."""
    rng = random.Random(seed)
    journal = open_journal(url)
    leases = open_leases(url)
    _say("ready")
    while True:
        try:
            guard = leases.acquire(run_id, f"chaos-{seed}", 2_000)
        except LeaseHeld:
            time.sleep(rng.random() / 100)
            continue
        for _ in range(rng.randint(1, 5)):
            first = journal.next_sequence(run_id)
            batch = [
                JournalRecord.seal(
                    run_id=run_id,
                    sequence=sequence,
                    event_id=str(uuid.uuid4()),
                    event_type="Chaos",
                    schema_version=1,
                    payload=b'{"fill":"' + b"x" * rng.randint(0, 3000) + b'"}',
                )
                for sequence in range(first, first + rng.randint(1, 4))
            ]
            journal.append(run_id, first, batch, fence=guard.fencing_token)
            _say("ack " + json.dumps([[r.sequence, r.event_id] for r in batch]))
            guard.renew()
        guard.release()


def read_hold(url: str) -> None:
    """Open a read transaction, report this pid, and hold the transaction until killed."""
    journal = open_journal(url)
    txn = journal._env.env.begin()  # type: ignore[attr-defined]  # an LmdbJournal
    _say(f"reading {os.getpid()} {txn.id()}")
    sys.stdin.readline()


def die_writing(url: str) -> None:
    """Take LMDB's writer lock, report it, and hold it until killed (the lock's owner then dies)."""
    journal = open_journal(url)
    txn = journal._env.env.begin(write=True)  # type: ignore[attr-defined]  # an LmdbJournal
    _say(f"writing {txn.id()}")
    sys.stdin.readline()


def write_hold(url: str) -> None:
    """Take LMDB's writer lock, report it, hold it until a line arrives on stdin, then give it up."""
    journal = open_journal(url)
    txn = journal._env.env.begin(write=True)  # type: ignore[attr-defined]  # an LmdbJournal
    _say(f"writing {txn.id()}")
    sys.stdin.readline()
    txn.abort()
    _say("released")
    sys.stdin.readline()


def claim(url: str, owner: str, seed: int) -> None:
    """After a line on stdin, claim runs in small random batches until none is left; print each claim.

    The leases are held (never released) until the parent kills this process.
    """
    rng = random.Random(seed)
    journal = open_journal(url)
    _say("ready")
    sys.stdin.readline()
    held = []
    empty = 0
    while empty < 3:
        guards = journal.claim(  # type: ignore[attr-defined]  # an LmdbJournal
            owner, limit=rng.randint(1, 5), ttl_ms=600_000, now_ms=int(time.time() * 1000)
        )
        empty = 0 if guards else empty + 1
        for guard in guards:
            _say(f"claimed {guard.run_id} {guard.fencing_token}")
        held.extend(guards)
    _say(f"done {len(held)}")
    sys.stdin.readline()


def main() -> None:
    """Dispatch to the mode named on the command line."""
    modes = {
        "append": append,
        "inspect": inspect,
        "hold": hold,
        "fenced": fenced,
        "read-hold": read_hold,
        "die-writing": die_writing,
        "write-hold": write_hold,
        "claim": claim,
    }
    modes[sys.argv[1]](**json.loads(sys.argv[2]))


if __name__ == "__main__":
    main()
