"""Recovery leases: flock exclusivity, death of a holder, and fencing tokens kept in the environment."""

from __future__ import annotations

from pathlib import Path

import pytest
from lmdb_support import Worker, batch, new_id

from mayfly.model.errors import FencingRejected, InvalidBackendURL, InvalidRecord, LeaseHeld, LeaseLost
from mayfly_lmdb import LmdbJournal, LmdbLeaseStore


def test_a_held_lease_refuses_a_second_guard_in_the_same_process(url: str) -> None:
    """Two stores (or one) of the same process cannot both hold a run's lease; the holder is named."""
    run = new_id()
    with LmdbLeaseStore(url) as first, LmdbLeaseStore(url) as second:
        guard = first.acquire(run, "first-owner", 1000)
        with pytest.raises(LeaseHeld, match="first-owner"):
            second.acquire(run, "second", 1000)
        with pytest.raises(LeaseHeld):
            first.acquire(run, "again", 1000)
        guard.release()
        with second.acquire(run, "second", 1000) as taken:
            assert taken.fencing_token == guard.fencing_token + 1


def test_a_killed_holder_frees_the_lease_at_once(url: str, workers: list[Worker]) -> None:
    """The OS drops a SIGKILLed holder's lock: the lease is free immediately, with a higher token."""
    run = new_id()
    holder = Worker("hold", url=url, run_id=run)
    workers.append(holder)
    held, token = holder.readline().split()
    assert held == "held"
    with LmdbLeaseStore(url) as leases:
        with pytest.raises(LeaseHeld, match="worker"):
            leases.acquire(run, "parent", 1000)
        holder.kill()
        with leases.acquire(run, "parent", 1000) as guard:
            assert guard.fencing_token == int(token) + 1


def test_tokens_persist_in_the_environment(env_dir: Path) -> None:
    """Fencing tokens survive closing every handle, in sync and in nosync mode alike."""
    run = new_id()
    for options in ("", "?durability=nosync"):
        with LmdbLeaseStore(f"lmdb://{env_dir}{options}") as leases:
            leases.acquire(run, "a", 1000).release()
    with LmdbLeaseStore(f"lmdb://{env_dir}") as leases:
        assert leases.current_fence(run) == 2
        with leases.acquire(run, "b", 1000) as guard:
            assert guard.fencing_token == 3


def test_a_grant_fences_appends_of_the_previous_holder(url: str) -> None:
    """After a new grant, an append under the previous token is rejected and writes nothing."""
    run = new_id()
    with LmdbJournal(url) as journal, LmdbLeaseStore(url) as leases:
        old = leases.acquire(run, "old", 1000)
        journal.append(run, 1, batch(run, 1), fence=old.fencing_token)
        old.release()
        with leases.acquire(run, "new", 1000) as new:
            with pytest.raises(FencingRejected):
                journal.append(run, 2, batch(run, 2), fence=old.fencing_token)
            assert journal.next_sequence(run) == 2
            journal.append(run, 2, batch(run, 2), fence=new.fencing_token)


def test_renew_confirms_and_validates(url: str) -> None:
    """renew confirms a held lease, validates a given ttl, and raises LeaseLost once released."""
    run = new_id()
    with LmdbLeaseStore(url) as leases:
        guard = leases.acquire(run, "a", 1000)
        guard.renew()
        guard.renew(5000)
        with pytest.raises(InvalidRecord):
            guard.renew(0)
        assert guard.held
        guard.release()
        assert not guard.held
        with pytest.raises(LeaseLost, match="released"):
            guard.renew()


def test_closing_the_store_releases_its_leases(url: str) -> None:
    """Closing a lease store releases every lease it still holds."""
    run = new_id()
    store = LmdbLeaseStore(url)
    guard = store.acquire(run, "a", 1000)
    store.close()
    assert not guard.held
    with LmdbLeaseStore(url) as again, again.acquire(run, "b", 1000) as taken:
        assert taken.fencing_token == 2


def test_a_readonly_lease_url_is_refused(url: str) -> None:
    """Leases write tokens, so a readonly=true lease URL raises InvalidBackendURL."""
    with pytest.raises(InvalidBackendURL, match="readonly"):
        LmdbLeaseStore(url + "?readonly=true")
