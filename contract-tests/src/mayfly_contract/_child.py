"""Child-process entry point for the cross-process clauses: ``python -m mayfly_contract._child MODE ARGS``.

Each mode reopens the backend from its URL, like a separate runtime would,
and talks to the parent through stdout lines (flushed at once) and stdin.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

from mayfly.lease import RecoveryLeaseGuard
from mayfly.model.errors import AppendConflict, LeaseHeld
from mayfly.plugins import open_journal, open_leases
from mayfly_contract.support import Records


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def hold_lease(url: str, run_id: str, ttl_ms: int) -> None:
    """Acquire the run's lease, report its token, hold it until told to release (or killed)."""
    leases = open_leases(url)
    guard = leases.acquire(run_id, "contract-child", ttl_ms)
    _say(f"held {guard.fencing_token}")
    if sys.stdin.readline().strip() == "release":
        guard.release()
        _say("released")
    leases.close()


def try_lease(url: str, run_id: str, ttl_ms: int) -> None:
    """On "go", try once to acquire the run's lease; report the outcome, hold until "exit"."""
    leases = open_leases(url)
    _say("ready")
    sys.stdin.readline()
    guard: RecoveryLeaseGuard | None = None
    try:
        guard = leases.acquire(run_id, "contract-racer", ttl_ms)
    except LeaseHeld:
        _say("held")
    else:
        _say(f"won {guard.fencing_token}")
    sys.stdin.readline()
    if guard is not None:
        guard.release()
    leases.close()


def append_until_killed(url: str, run_id: str) -> None:
    """Append batches of 1-3 records forever, printing each acknowledgement right after it."""
    journal = open_journal(url)
    records = Records()
    size = 0
    while True:
        next_sequence = journal.next_sequence(run_id)
        batch = records.batch(run_id, next_sequence, 1 + size % 3)
        result = journal.append(run_id, next_sequence, batch)
        _say("ack " + json.dumps([[r.sequence, r.event_id] for r in result.records]))
        size += 1


def race(url: str, run_id: str, wins: int, batch: int) -> None:
    """Wait for "go", then compare-and-append until ``wins`` batches won; print what was won."""
    journal = open_journal(url)
    records = Records()
    _say("ready")
    sys.stdin.readline()
    won: list[list[object]] = []
    conflicts = 0
    while len(won) < wins * batch:
        expected = journal.next_sequence(run_id)
        attempt = records.batch(run_id, expected, batch)
        try:
            result = journal.append(run_id, expected, attempt)
        except AppendConflict:
            conflicts += 1
            continue
        assert not result.already_committed
        won.extend([r.sequence, r.event_id] for r in result.records)
    _say(json.dumps({"won": won, "conflicts": conflicts}))
    journal.close()


def main() -> None:
    """Dispatch to the mode named on the command line."""
    mode, arguments = sys.argv[1], json.loads(sys.argv[2])
    modes: dict[str, Callable[..., None]] = {
        "hold-lease": hold_lease,
        "append-until-killed": append_until_killed,
        "race": race,
        "try-lease": try_lease,
    }
    modes[mode](**arguments)


if __name__ == "__main__":
    main()
