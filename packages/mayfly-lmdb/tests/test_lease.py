"""Recovery leases: exclusivity, expiry and takeover, death of a holder, and fencing tokens."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from lmdb_support import Worker, batch, new_id

from mayfly.lease import LEASE_LISTING
from mayfly.model.errors import FencingRejected, InvalidBackendURL, InvalidRecord, LeaseHeld, LeaseLost
from mayfly.substrate import Hub, spawn
from mayfly_lmdb import LmdbJournal, LmdbLeaseStore

LONG = 60_000


def test_a_held_lease_refuses_a_second_guard_in_the_same_process(url: str) -> None:
    """Two stores (or one) of the same process cannot both hold a run's lease; the holder is named."""
    run = new_id()
    with LmdbLeaseStore(url) as first, LmdbLeaseStore(url) as second:
        guard = first.acquire(run, "first-owner", LONG)
        assert guard.holds_lock
        with pytest.raises(
            LeaseHeld, match=r"first-owner .*\(it expires in \d+\.\d s unless renewed\)"
        ) as held:
            second.acquire(run, "second", LONG)
        assert held.value.expires_in_ms is not None and 0 < held.value.expires_in_ms <= LONG
        with pytest.raises(LeaseHeld):
            first.acquire(run, "again", LONG)
        guard.release()
        with second.acquire(run, "second", LONG) as taken:
            assert taken.fencing_token == guard.fencing_token + 1


def test_a_killed_holder_frees_the_lease_at_once(url: str, workers: list[Worker]) -> None:
    """The OS drops a SIGKILLed holder's file lock: its lease is free long before its ttl ends."""
    run = new_id()
    holder = Worker("hold", url=url, run_id=run, ttl_ms=LONG)
    workers.append(holder)
    held, token = holder.readline().split()
    assert held == "held"
    with LmdbLeaseStore(url) as leases:
        with pytest.raises(LeaseHeld, match="worker"):
            leases.acquire(run, "parent", LONG)
        holder.kill()
        with leases.acquire(run, "parent", LONG) as guard:
            assert guard.fencing_token == int(token) + 1
            assert guard.holds_lock


def test_a_hung_holder_is_taken_over_after_its_ttl_and_fenced(url: str, workers: list[Worker]) -> None:
    """A living holder that stops renewing loses its lease at expiry; the taker gets the lock later."""
    run = new_id()
    holder = Worker("hold", url=url, run_id=run, ttl_ms=300)
    workers.append(holder)
    held, token = holder.readline().split()
    assert held == "held"
    with LmdbJournal(url) as journal, LmdbLeaseStore(url) as leases:
        time.sleep(0.6)
        guard = leases.acquire(run, "taker", LONG)
        assert guard.fencing_token == int(token) + 1
        assert not guard.holds_lock  # the hung holder still has the file lock
        with pytest.raises(FencingRejected):
            journal.append(run, 1, batch(run, 1), fence=int(token))
        holder.kill()
        guard.renew()
        assert guard.holds_lock  # picked up once the OS dropped the old holder's lock
        journal.append(run, 1, batch(run, 1), fence=guard.fencing_token)
        guard.release()


def test_an_expired_guard_in_this_process_is_lost_and_frees_its_lock(url: str) -> None:
    """After a takeover the old guard's renew raises LeaseLost and hands the file lock on."""
    run = new_id()
    with LmdbLeaseStore(url) as leases:
        old = leases.acquire(run, "old", 100)
        time.sleep(0.3)
        new = leases.acquire(run, "new", LONG)
        assert not new.holds_lock
        with pytest.raises(LeaseLost, match="taken over by new"):
            old.renew()
        assert not old.holds_lock
        new.renew()
        assert new.holds_lock
        old.release()  # leaves the new grant alone
        with pytest.raises(LeaseHeld, match="new"):
            leases.acquire(run, "third", LONG)
        new.release()


def test_renewal_keeps_a_short_lease(url: str) -> None:
    """A holder renewing within its ttl keeps the lease well past the first ttl."""
    run = new_id()
    with LmdbLeaseStore(url) as leases:
        guard = leases.acquire(run, "holder", 300)
        for _ in range(6):
            time.sleep(0.1)
            guard.renew()
        with pytest.raises(LeaseHeld):
            leases.acquire(run, "contender", LONG)
        guard.release()


def test_an_expired_lease_nobody_took_renews(url: str) -> None:
    """A lease past its ttl but not taken over can still be renewed and stays exclusive."""
    run = new_id()
    with LmdbLeaseStore(url) as leases:
        guard = leases.acquire(run, "holder", 50)
        time.sleep(0.15)
        guard.renew(LONG)
        with pytest.raises(LeaseHeld):
            leases.acquire(run, "contender", LONG)
        guard.release()


def test_a_dead_takeover_holder_is_freed_by_expiry(url: str, workers: list[Worker]) -> None:
    """A holder without the file lock that dies is seen gone when its ttl ends, not before."""
    run = new_id()
    first = Worker("hold", url=url, run_id=run, ttl_ms=200)
    workers.append(first)
    assert first.readline().startswith("held")
    time.sleep(0.4)
    second = Worker("hold", url=url, run_id=run, ttl_ms=3000)
    workers.append(second)
    assert second.readline() == "held 2"  # took over without the lock, which the first still has
    granted = time.monotonic()
    first.kill()
    second.kill()
    with LmdbLeaseStore(url) as leases:
        with pytest.raises(LeaseHeld, match="pid"):
            leases.acquire(run, "early", LONG)
        assert time.monotonic() - granted < 3, "the check above ran too late to mean anything"
        started = time.monotonic()
        while True:
            try:
                guard = leases.acquire(run, "parent", LONG)
                break
            except LeaseHeld:
                assert time.monotonic() - started < 10
                time.sleep(0.05)
        assert guard.fencing_token == 3
        guard.release()


def test_tokens_persist_in_the_environment(env_dir: Path) -> None:
    """Fencing tokens survive closing every handle, in sync and in nosync mode alike."""
    run = new_id()
    for options in ("", "?durability=nosync"):
        with LmdbLeaseStore(f"lmdb://{env_dir}{options}") as leases:
            leases.acquire(run, "a", LONG).release()
    with LmdbLeaseStore(f"lmdb://{env_dir}") as leases:
        assert leases.current_fence(run) == 2
        with leases.acquire(run, "b", LONG) as guard:
            assert guard.fencing_token == 3


def test_a_grant_fences_appends_of_the_previous_holder(url: str) -> None:
    """After a new grant, an append under the previous token is rejected and writes nothing."""
    run = new_id()
    with LmdbJournal(url) as journal, LmdbLeaseStore(url) as leases:
        old = leases.acquire(run, "old", LONG)
        journal.append(run, 1, batch(run, 1), fence=old.fencing_token)
        old.release()
        with leases.acquire(run, "new", LONG) as new:
            with pytest.raises(FencingRejected):
                journal.append(run, 2, batch(run, 2), fence=old.fencing_token)
            assert journal.next_sequence(run) == 2
            journal.append(run, 2, batch(run, 2), fence=new.fencing_token)


def test_renew_validates_and_fails_after_release(url: str) -> None:
    """renew validates a given ttl and raises LeaseLost once the guard was released."""
    run = new_id()
    with LmdbLeaseStore(url) as leases:
        guard = leases.acquire(run, "a", LONG)
        guard.renew()
        guard.renew(5000)
        with pytest.raises(InvalidRecord):
            guard.renew(0)
        assert guard.held
        guard.release()
        guard.release()
        assert not guard.held
        with pytest.raises(LeaseLost, match="released"):
            guard.renew()


def test_closing_the_store_releases_its_leases(url: str) -> None:
    """Closing a lease store releases every lease it still holds."""
    run = new_id()
    store = LmdbLeaseStore(url)
    guard = store.acquire(run, "a", LONG)
    store.close()
    assert not guard.held
    with LmdbLeaseStore(url) as again, again.acquire(run, "b", LONG) as taken:
        assert taken.fencing_token == 2


def test_a_readonly_lease_url_is_refused(url: str) -> None:
    """Leases write tokens, so a readonly=true lease URL raises InvalidBackendURL."""
    with pytest.raises(InvalidBackendURL, match="readonly"):
        LmdbLeaseStore(url + "?readonly=true")


def test_chaos_of_killed_lease_holders_loses_and_duplicates_nothing(env_dir: Path) -> None:
    """Writers appending under leases, SIGKILLed at random and restarted, leave one exact history."""
    import json
    import random
    import select

    url = f"lmdb://{env_dir}?map_size=64k"
    run = new_id()
    rng = random.Random(8)
    acknowledged: dict[int, str] = {}
    live: list[Worker] = []
    started = 0
    kills = 0

    def start() -> None:
        nonlocal started
        worker = Worker("fenced", url=url, run_id=run, seed=started)
        started += 1
        assert worker.readline() == "ready"
        live.append(worker)

    def drain(worker: Worker, wait: float) -> None:
        assert worker.process.stdout is not None
        while select.select([worker.process.stdout], [], [], wait)[0]:
            line = worker.process.stdout.readline()
            if not line:
                return
            for sequence, event in json.loads(line[4:]):
                assert acknowledged.setdefault(sequence, event) == event, "two acks for one sequence"
            wait = 0

    try:
        for _ in range(3):
            start()
        while kills < 6:
            for worker in live:
                drain(worker, 0.1)
            victim = live.pop(rng.randrange(len(live)))
            drain(victim, 0.0)
            victim.kill()
            kills += 1
            start()
        for worker in live:
            drain(worker, 0.2)
    finally:
        for worker in live:
            worker.close()
    with LmdbJournal(url) as journal, LmdbLeaseStore(url) as leases:
        records = journal.read(run)
        assert [r.sequence for r in records] == list(range(1, len(records) + 1))
        assert len({r.event_id for r in records}) == len(records)
        stored = {r.sequence: r.event_id for r in records}
        assert all(stored.get(sequence) == event for sequence, event in acknowledged.items())
        assert len(acknowledged) > 20
        # A killed holder with the file lock frees the lease at once; one that had taken over a
        # slow holder's expired grant (no lock) frees it at its 2 s expiry.
        give_up = time.monotonic() + 10
        while True:
            try:
                guard = leases.acquire(run, "after", LONG)
                break
            except LeaseHeld:
                assert time.monotonic() < give_up, "a killed holder's lease never became free"
                time.sleep(0.05)
        assert guard.fencing_token > 1
        guard.release()


def test_a_guard_released_by_one_hub_task_while_another_renews_it_never_stalls_the_hub(url: str) -> None:
    """Renewal parks its task on an offload thread; a release from another task meanwhile goes through."""
    run = new_id()
    outcome: list[str] = []

    def serve() -> None:
        with LmdbLeaseStore(url) as leases:
            guard = leases.acquire(run, "owner", LONG)

            def renew() -> None:
                try:
                    guard.renew()
                    outcome.append("renewed")
                except LeaseLost:
                    outcome.append("lost")  # the release won the race: also an answer

            def release() -> None:
                guard.release()
                outcome.append("released")

            def main() -> None:
                tasks = [spawn(renew), spawn(release)]
                for task in tasks:
                    task.join()

            Hub().run(main)
            leases.acquire(run, "next", LONG).release()  # the lease is free again

    thread = threading.Thread(target=serve)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the hub stalled: a lock was held across a parked renewal"
    assert sorted(outcome) in (["released", "renewed"], ["lost", "released"])


def test_the_listing_drops_a_killed_holder_s_lease_before_its_ttl(url: str, workers: list[Worker]) -> None:
    """A live holder's grant is listed with its owner, token and expiry; once it is SIGKILLed (its file
    lock dropped) the grant is not listed, although its ttl has a minute to run."""
    run = new_id()
    holder = Worker("hold", url=url, run_id=run, ttl_ms=LONG)
    workers.append(holder)
    held, token = holder.readline().split()
    assert held == "held"
    with LmdbLeaseStore(url) as leases:
        listing = LEASE_LISTING.of(leases)
        assert listing is not None
        (lease,) = [lease for lease in listing.list_leases() if lease.run_id == run]
        assert lease.fencing_token == int(token) and "worker" in lease.owner
        assert lease.expires_in_ms is not None and 0 < lease.expires_in_ms <= LONG
        holder.kill()
        assert [lease for lease in listing.list_leases() if lease.run_id == run] == []
