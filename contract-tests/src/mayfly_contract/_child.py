"""Child-process entry point for the cross-process clauses: ``python -m mayfly_contract._child MODE ARGS``.

Each mode reopens the backend from its URL, like a separate runtime would,
and talks to the parent through stdout lines (flushed at once) and stdin.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable

from mayfly.lease import RecoveryLeaseGuard
from mayfly.model.errors import AppendConflict, LeaseHeld
from mayfly.plugins import open_journal, open_leases
from mayfly.runindex import RUN_INDEX, RUN_WAKEUPS
from mayfly_contract.support import Records, ScriptedRun


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


def churn_lease(url: str, run_id: str, wins: int, seed: int) -> None:
    """On "go", acquire and release the run's lease until ``wins`` grants were won (or 60 s passed).

    A refused acquire (``LeaseHeld``) is retried after a pause of up to 2 ms;
    any other error ends the process with a traceback. Prints one JSON object:
    every grant won, as ``[token, held_from, held_until]`` on the machine's
    monotonic clock (one clock for every process here), and the number of
    refusals.
    """
    leases = open_leases(url)
    chooser = random.Random(seed)
    _say("ready")
    sys.stdin.readline()
    won: list[list[float]] = []
    refused = 0
    deadline = time.monotonic() + 60
    while len(won) < wins and time.monotonic() < deadline:
        try:
            guard = leases.acquire(run_id, f"contract-churner-{seed}", 30_000)
        except LeaseHeld:
            refused += 1
            time.sleep(chooser.uniform(0, 0.002))
            continue
        held_from = time.monotonic()
        time.sleep(chooser.uniform(0, 0.002))
        held_until = time.monotonic()
        guard.release()
        won.append([guard.fencing_token, held_from, held_until])
    _say(json.dumps({"won": won, "refused": refused}))
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


def claim_race(url: str, queue: str, ttl_ms: int, seed: int) -> None:
    """On "go", claim from ``queue`` in small random batches until nothing is left; hold until "release".

    Prints one JSON list of ``[run_id, fencing_token]`` pairs, every run this
    process was granted. Between claims it pauses a few milliseconds, as a
    worker starting its runs would. A claim that comes back empty is retried
    twice after a short pause, so a run another claimant had locked for a
    moment is not taken for a run that was never claimable.
    """
    journal = open_journal(url)
    index = RUN_INDEX.of(journal)
    assert index is not None
    chooser = random.Random(seed)
    owner = f"contract-claimant-{seed}"
    # Warm up (connections, lazily opened lease stores) on a queue nobody uses, so that the race
    # starts at "go" and not when the slowest process has finished opening its store.
    assert (
        index.claim(
            owner, limit=1, ttl_ms=ttl_ms, now_ms=time.time_ns() // 1_000_000, queues=[f"{queue}-warm-up"]
        )
        == []
    )
    _say("ready")
    sys.stdin.readline()
    held: list[RecoveryLeaseGuard] = []
    empty = 0
    while empty < 3:
        now_ms = time.time_ns() // 1_000_000
        got = index.claim(owner, limit=chooser.randint(1, 4), ttl_ms=ttl_ms, now_ms=now_ms, queues=[queue])
        held.extend(got)
        empty = 0 if got else empty + 1
        # Like a worker, start what was claimed before claiming more: the others get their turn.
        time.sleep(chooser.uniform(0.001, 0.004) if got else 0.02)
    _say(json.dumps([[guard.run_id, guard.fencing_token] for guard in held]))
    if sys.stdin.readline().strip() == "release":
        for guard in held:
            guard.release()
        _say("released")
    journal.close()


def script_until_killed(url: str, queue: str, runs: list[str], epoch_ms: int, seed: int) -> None:
    """Move every run in ``runs`` through its :class:`ScriptedRun` history, in a random interleaving.

    Each step is one ``append_indexed`` (through ``commit_command``); its
    acknowledgement is printed right after it as ``ack RUN SEQUENCE``. The
    parent SIGKILLs this process at a random point, most likely between an
    append and the index write that goes with it.
    """
    journal = open_journal(url)
    chooser = random.Random(seed)
    scripted = [
        ScriptedRun(run_id, queue=queue, epoch_ms=epoch_ms, delay_ms=chooser.randrange(1_000))
        for run_id in runs
    ]
    while scripted:
        run = chooser.choice(scripted)
        state = run.advance(journal)
        _say(f"ack {run.run_id} {state.sequence}")
        if run.done:
            scripted.remove(run)
    _say("done")
    journal.close()


def notify_wakeups(url: str) -> None:
    """Tell every worker listening on the store that a run became claimable, then exit."""
    journal = open_journal(url)
    wakeups = RUN_WAKEUPS.of(journal)
    assert wakeups is not None
    wakeups.notify_wakeups()
    _say("notified")
    journal.close()


def main() -> None:
    """Dispatch to the mode named on the command line."""
    mode, arguments = sys.argv[1], json.loads(sys.argv[2])
    modes: dict[str, Callable[..., None]] = {
        "hold-lease": hold_lease,
        "append-until-killed": append_until_killed,
        "race": race,
        "try-lease": try_lease,
        "churn-lease": churn_lease,
        "claim-race": claim_race,
        "script-until-killed": script_until_killed,
        "notify-wakeups": notify_wakeups,
    }
    modes[mode](**arguments)


if __name__ == "__main__":
    main()
