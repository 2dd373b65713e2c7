"""Tests of local recovery leases: flock exclusivity, fencing counters and process death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mayfly.backend import parse_held_flocks
from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord
from mayfly.lease import LEASE_LISTING, LeaseInfo
from mayfly.local import LocalLeaseStore, LocalWorkflowJournal
from mayfly.model.errors import FencingRejected, LeaseHeld, LeaseLost

IDS = Uuid7IdSource()


def record(run_id: str, sequence: int) -> JournalRecord:
    return JournalRecord.seal(
        run_id=run_id,
        sequence=sequence,
        event_id=IDS.new_id(),
        event_type="Tested",
        schema_version=1,
        payload=b"{}",
    )


def test_lease_is_exclusive_within_a_process(tmp_path: Path) -> None:
    """A second acquire of a held run is refused at once, naming the holder."""
    run = IDS.new_id()
    with LocalLeaseStore(str(tmp_path)) as leases:
        guard = leases.acquire(run, "first", 1000)
        with pytest.raises(LeaseHeld, match="first"):
            leases.acquire(run, "second", 1000)
        guard.release()
        with leases.acquire(run, "second", 1000) as again:
            assert again.fencing_token == guard.fencing_token + 1


def test_tokens_increase_across_store_instances(tmp_path: Path) -> None:
    """Fencing tokens keep increasing after the store is closed and reopened."""
    run = IDS.new_id()
    tokens = []
    for _ in range(3):
        with LocalLeaseStore(str(tmp_path)) as leases, leases.acquire(run, "w", 10) as guard:
            tokens.append(guard.fencing_token)
            assert leases.current_fence(run) == guard.fencing_token
    assert tokens == [1, 2, 3]


def test_a_fence_counter_is_overwritten_in_place_with_one_fixed_width_record(tmp_path: Path) -> None:
    """Grants after the first rewrite one 21-byte record in place; a counter in the old free form reads on."""
    run = IDS.new_id()
    with LocalLeaseStore(str(tmp_path)) as leases:
        leases.acquire(run, "w", 10).release()
        [counter] = [p for p in tmp_path.rglob(run) if p.parent.name == "fences"]
        inode = counter.stat().st_ino
        assert counter.read_bytes() == b"1".rjust(20) + b"\n"
        leases.acquire(run, "w", 10).release()
        assert counter.stat().st_ino == inode  # no new file, no rename: one write and one sync
        assert counter.read_bytes() == b"2".rjust(20) + b"\n"
        counter.write_bytes(b"99")  # as an earlier Mayfly wrote it
        with leases.acquire(run, "w", 10) as guard:
            assert guard.fencing_token == 100
        assert counter.read_bytes() == b"100".rjust(20) + b"\n"
        assert leases.current_fence(run) == 100


def test_journal_enforces_the_current_token(tmp_path: Path) -> None:
    """Appends must carry the newest token; older, absent or never-granted tokens are rejected."""
    run = IDS.new_id()
    journal = LocalWorkflowJournal(str(tmp_path))
    leases = LocalLeaseStore(str(tmp_path))
    journal.append(run, 1, [record(run, 1)], fence=None)
    old = leases.acquire(run, "old", 10)
    old.release()
    new = leases.acquire(run, "new", 10)
    for fence in (None, old.fencing_token, new.fencing_token + 1):
        with pytest.raises(FencingRejected):
            journal.append(run, 2, [record(run, 2)], fence=fence)
    journal.append(run, 2, [record(run, 2)], fence=new.fencing_token)
    assert journal.next_sequence(run) == 3
    assert journal.list_runs() == [run]


def test_renew_after_release_raises_lease_lost(tmp_path: Path) -> None:
    """A released guard cannot be renewed; a held one renews (local leases do not expire)."""
    with LocalLeaseStore(str(tmp_path)) as leases:
        guard = leases.acquire(IDS.new_id(), "w", 1)
        guard.renew(5)
        guard.release()
        guard.release()
        with pytest.raises(LeaseLost):
            guard.renew()


def test_store_close_releases_held_leases(tmp_path: Path) -> None:
    """Closing the store releases its leases so another store can acquire them."""
    run = IDS.new_id()
    first = LocalLeaseStore(str(tmp_path))
    first.acquire(run, "w", 10)
    first.close()
    with LocalLeaseStore(str(tmp_path)) as second, second.acquire(run, "v", 10) as guard:
        assert guard.fencing_token == 2


def test_lease_of_a_killed_process_is_released_by_the_os(tmp_path: Path) -> None:
    """A holder killed with SIGKILL loses its lease; another process can then acquire it."""
    run = IDS.new_id()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from mayfly.local import LocalLeaseStore;"
            f"g = LocalLeaseStore({str(tmp_path)!r}).acquire({run!r}, 'child', 10);"
            "print(g.fencing_token, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "1"
        with LocalLeaseStore(str(tmp_path)) as leases:
            with pytest.raises(LeaseHeld, match="child"):
                leases.acquire(run, "parent", 10)
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=10)
            with leases.acquire(run, "parent", 10) as guard:
                assert guard.fencing_token == 2
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_threads_racing_for_one_lease_get_exactly_one_grant(tmp_path: Path) -> None:
    """Threads of one process racing to acquire a run's lease: exactly one wins, the rest see LeaseHeld."""
    from concurrent.futures import ThreadPoolExecutor

    run = IDS.new_id()
    with LocalLeaseStore(str(tmp_path)) as leases:

        def attempt(index: int) -> int | None:
            try:
                return leases.acquire(run, f"thread-{index}", 10).fencing_token
            except LeaseHeld:
                return None

        with ThreadPoolExecutor(max_workers=8) as pool:
            tokens = [token for token in pool.map(attempt, range(8)) if token is not None]
        assert tokens == [1]


def test_held_flocks_reads_exclusive_flocks_from_proc_locks_text() -> None:
    """Exclusive flocks map inode to holding pids; shared, POSIX and waiting locks are left out."""
    text = (
        "1: FLOCK  ADVISORY  WRITE 4242 fd:00:1474578 0 EOF\n"
        "1: -> FLOCK  ADVISORY  WRITE 4343 fd:00:1474578 0 EOF\n"
        "2: FLOCK  ADVISORY  READ 4444 fd:00:99 0 EOF\n"
        "3: POSIX  ADVISORY  WRITE 4545 fd:00:100 0 EOF\n"
        "4: FLOCK  ADVISORY  WRITE 4646 08:01:100 0 EOF\n"
        "garbage\n"
    )
    assert parse_held_flocks(text) == {1474578: {4242}, 100: {4646}}


def test_the_live_leases_are_listed_in_run_id_order_and_released_ones_are_not(tmp_path: Path) -> None:
    """Held leases are listed with owner and token, no expiry; a released lease disappears; paging works."""
    runs = sorted(IDS.new_id() for _ in range(3))
    with LocalLeaseStore(str(tmp_path)) as leases:
        listing = LEASE_LISTING.of(leases)
        assert listing is not None
        guards = [leases.acquire(run, f"worker {n}", 10) for n, run in enumerate(runs)]
        assert listing.list_leases() == [
            LeaseInfo(
                run_id=run, owner=f"worker {n}", fencing_token=1, expires_at_ms=None, expires_in_ms=None
            )
            for n, run in enumerate(runs)
        ]
        assert [lease.run_id for lease in listing.list_leases(after=runs[0], limit=1)] == [runs[1]]
        guards[1].release()
        assert [lease.run_id for lease in listing.list_leases()] == [runs[0], runs[2]]
        assert leases.acquire(runs[1], "again", 10).fencing_token == 2  # listing changed nothing


def test_a_lease_held_by_another_process_is_listed_until_it_is_killed(tmp_path: Path) -> None:
    """Another process's lease is listed with its owner; once the OS drops its lock it is not."""
    run = IDS.new_id()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from mayfly.local import LocalLeaseStore;"
            f"g = LocalLeaseStore({str(tmp_path)!r}).acquire({run!r}, 'child worker', 10);"
            "print(g.fencing_token, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "1"
        with LocalLeaseStore(str(tmp_path)) as leases:
            listing = LEASE_LISTING.of(leases)
            assert listing is not None
            (held,) = listing.list_leases()
            assert (held.run_id, held.owner, held.fencing_token) == (run, "child worker", 1)
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=10)
            assert listing.list_leases() == []
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
