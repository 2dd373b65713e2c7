"""Contract clauses of recovery leases: exclusivity, release, renewal, expiry and process death."""

from __future__ import annotations

import itertools
import json
import time

import pytest

from mayfly.journal import WorkflowJournal
from mayfly.lease import RecoveryLeaseStore
from mayfly.model.errors import FencingRejected, InvalidIdentifier, InvalidRecord, LeaseHeld, LeaseLost
from mayfly_contract.support import Child, Records


@pytest.mark.clause("lease.acquire.exclusive")
def test_second_acquire_is_refused(mayfly_leases: RecoveryLeaseStore, run_id: str) -> None:
    """While a lease is held, another acquire for the run raises LeaseHeld at once."""
    with mayfly_leases.acquire(run_id, "holder", 30_000) as guard:
        assert (guard.run_id, guard.owner) == (run_id, "holder")
        started = time.monotonic()
        with pytest.raises(LeaseHeld):
            mayfly_leases.acquire(run_id, "contender", 30_000)
        assert time.monotonic() - started < 5, "acquire must not block"


@pytest.mark.clause("lease.release.reacquire")
def test_release_allows_a_new_grant(mayfly_leases: RecoveryLeaseStore, run_id: str) -> None:
    """After release the run can be leased again, with a higher token; release is idempotent."""
    guard = mayfly_leases.acquire(run_id, "first", 30_000)
    guard.release()
    guard.release()
    with mayfly_leases.acquire(run_id, "second", 30_000) as again:
        assert again.fencing_token > guard.fencing_token


@pytest.mark.clause("lease.renew")
def test_renew_holds_and_fails_after_release(mayfly_leases: RecoveryLeaseStore, run_id: str) -> None:
    """A held lease renews; a released one raises LeaseLost on renew."""
    guard = mayfly_leases.acquire(run_id, "holder", 30_000)
    guard.renew()
    guard.renew(30_000)
    guard.release()
    with pytest.raises(LeaseLost):
        guard.renew()


@pytest.mark.clause("lease.inputs")
def test_bad_acquire_arguments_are_refused(mayfly_leases: RecoveryLeaseStore, run_id: str) -> None:
    """Malformed run ids, owners and ttls are refused with typed errors and grant nothing."""
    with pytest.raises(InvalidIdentifier):
        mayfly_leases.acquire("run-1", "w", 1000)
    for owner, ttl in (("", 1000), ("w\n", 1000), ("w", 0), ("w", -5)):
        with pytest.raises(InvalidRecord):
            mayfly_leases.acquire(run_id, owner, ttl)
    assert mayfly_leases.current_fence(run_id) == 0


@pytest.mark.clause("lease.expiry.takeover")
@pytest.mark.capability("lease_expiry")
@pytest.mark.capability("fencing")
def test_expired_lease_is_taken_over_and_fenced(
    mayfly_journal: WorkflowJournal, mayfly_leases: RecoveryLeaseStore, run_id: str, records: Records
) -> None:
    """A lease not renewed within its ttl is taken over with a higher token; the old one is fenced."""
    old = mayfly_leases.acquire(run_id, "old", 200)
    time.sleep(0.5)
    new = mayfly_leases.acquire(run_id, "new", 30_000)
    assert new.fencing_token > old.fencing_token
    with pytest.raises(LeaseLost):
        old.renew()
    with pytest.raises(FencingRejected):
        mayfly_journal.append(run_id, 1, records.batch(run_id, 1), fence=old.fencing_token)
    mayfly_journal.append(run_id, 1, records.batch(run_id, 1), fence=new.fencing_token)
    new.release()


@pytest.mark.clause("lease.cross-process.exclusive")
@pytest.mark.capability("cross_process")
def test_lease_is_exclusive_across_processes(
    mayfly_leases: RecoveryLeaseStore, mayfly_leases_url: str, run_id: str
) -> None:
    """A lease held by another process refuses this one until that process releases it."""
    child = Child("hold-lease", url=mayfly_leases_url, run_id=run_id, ttl_ms=60_000)
    try:
        held, token = child.readline().split()
        assert held == "held"
        with pytest.raises(LeaseHeld):
            mayfly_leases.acquire(run_id, "parent", 60_000)
        child.send("release")
        assert child.readline() == "released"
        child.finish()
        with mayfly_leases.acquire(run_id, "parent", 60_000) as guard:
            assert guard.fencing_token > int(token)
    finally:
        child.close()


@pytest.mark.clause("lease.cross-process.holder-killed")
@pytest.mark.capability("cross_process")
def test_lease_of_a_killed_holder_becomes_available(
    mayfly_leases: RecoveryLeaseStore, mayfly_leases_url: str, run_id: str
) -> None:
    """After the holding process is SIGKILLed, the lease can be acquired (at once or after its ttl)."""
    child = Child("hold-lease", url=mayfly_leases_url, run_id=run_id, ttl_ms=500)
    try:
        held, token = child.readline().split()
        assert held == "held"
        child.kill()
        deadline = time.monotonic() + 15
        while True:
            try:
                guard = mayfly_leases.acquire(run_id, "parent", 60_000)
                break
            except LeaseHeld:
                assert time.monotonic() < deadline, "lease of a killed holder never freed"
                time.sleep(0.1)
        assert guard.fencing_token > int(token)
        guard.release()
    finally:
        child.close()


@pytest.mark.clause("lease.cross-process.race")
@pytest.mark.capability("cross_process")
def test_processes_racing_for_a_lease_get_one_grant(mayfly_leases_url: str, run_id: str) -> None:
    """Processes racing to acquire one run's lease at the same moment: exactly one is granted."""
    children = [Child("try-lease", url=mayfly_leases_url, run_id=run_id, ttl_ms=60_000) for _ in range(4)]
    try:
        for child in children:
            assert child.readline() == "ready"
        for child in children:
            child.send("go")
        outcomes = [child.readline() for child in children]
        for child in children:
            child.send("exit")
        for child in children:
            child.finish()
    finally:
        for child in children:
            child.close()
    winners = [outcome for outcome in outcomes if outcome.startswith("won ")]
    assert len(winners) == 1, outcomes
    assert sorted(outcomes) == sorted([winners[0], "held", "held", "held"])


@pytest.mark.clause("lease.cross-process.churn")
@pytest.mark.capability("cross_process")
def test_processes_churning_one_lease_never_err_and_never_overlap(
    mayfly_leases_url: str, run_id: str
) -> None:
    """Processes acquiring and releasing one run's lease in a tight loop: each attempt is granted
    or refused with LeaseHeld, nothing else; grants never overlap in time and tokens never repeat.

    This is the interleaving where a refusal meets a release that lands just after it: an
    acquirer that then reads the holder must see a free lease, not fail.
    """
    children = [
        Child("churn-lease", url=mayfly_leases_url, run_id=run_id, wins=20, seed=seed) for seed in range(3)
    ]
    try:
        for child in children:
            assert child.readline() == "ready"
        for child in children:
            child.send("go")
        reports = [json.loads(child.readline()) for child in children]
        for child in children:
            child.finish()
    finally:
        for child in children:
            child.close()
    grants = sorted(
        (held_from, held_until, int(token)) for r in reports for token, held_from, held_until in r["won"]
    )
    # Each holder lets go within a few milliseconds, so every process wins its 20 grants in time;
    # one that does not was refused a lease that was free.
    assert [len(r["won"]) for r in reports] == [20, 20, 20], f"grants won in 60 s: {reports}"
    tokens = [token for _, _, token in grants]
    assert len(set(tokens)) == len(tokens), "a fencing token was granted twice"
    assert tokens == sorted(tokens), "a later grant carries a lower fencing token"
    for (_, until, token), (start, _, next_token) in itertools.pairwise(grants):
        assert until <= start, f"grants {token} and {next_token} overlapped in time"
