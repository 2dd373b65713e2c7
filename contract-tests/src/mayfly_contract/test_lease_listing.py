"""Contract clauses of the optional lease-store features: the listing of live leases (``lease_listing``).

A lease store declares its optional features in its own
:class:`~mayfly.lease.LeaseCapabilities`; declaring one is the promise that
it implements the feature's Protocol (``mayfly.lease.LeaseFeature``). The
listing is what an operator reads to see who owns which run: each clause
checks one thing a console relies on, and that reading it never changes or
stalls what it reads. Each test looks only at runs of its own, so the store
need not be empty; every lease a test takes is released before it ends.
"""

from __future__ import annotations

import time
import uuid

import pytest

from mayfly.journal import WorkflowJournal
from mayfly.lease import (
    LEASE_FEATURES,
    LEASE_LISTING,
    MAX_LEASE_LISTING,
    LeaseInfo,
    LeaseListing,
    RecoveryLeaseStore,
)
from mayfly.model.errors import InvalidIdentifier, InvalidRecord, LeaseHeld
from mayfly.runindex import RUN_INDEX
from mayfly_contract.support import Child, Records, ScriptedRun

TTL_MS = 60_000


def _below(run_id: str) -> str:
    """The run id one below ``run_id``: listing after it starts exactly at ``run_id``."""
    return str(uuid.UUID(int=uuid.UUID(run_id).int - 1))


def _listing(leases: RecoveryLeaseStore) -> LeaseListing:
    listing = LEASE_LISTING.of(leases)
    assert listing is not None, "lease_listing is declared, so LEASE_LISTING.of must serve the store"
    return listing


def _listed(listing: LeaseListing, run_id: str) -> LeaseInfo | None:
    """The run's lease as listed, or ``None`` when the listing does not show it."""
    found = listing.list_leases(after=_below(run_id), limit=1)
    return found[0] if found and found[0].run_id == run_id else None


@pytest.mark.clause("lease.features.declared-implemented")
def test_every_declared_lease_feature_is_implemented(mayfly_leases: RecoveryLeaseStore) -> None:
    """Each optional feature the lease store declares is served by its Protocol; the others are absent."""
    for feature in LEASE_FEATURES:
        served = feature.of(mayfly_leases)  # CompatibilityError if declared but not implemented
        assert (served is not None) == feature.declared(mayfly_leases), feature


@pytest.mark.clause("lease.listing.granted")
@pytest.mark.capability("lease_listing")
def test_a_granted_lease_is_listed_with_its_owner_token_and_expiry(
    mayfly_journal: WorkflowJournal, mayfly_leases: RecoveryLeaseStore, run_id: str
) -> None:
    """A held lease is listed with the owner given to acquire, the grant's token and, if leases expire,
    when: within the ttl from now. A store whose leases do not expire reports no expiry."""
    listing = _listing(mayfly_leases)
    with mayfly_leases.acquire(run_id, "contract lister", TTL_MS) as guard:
        listed = _listed(listing, run_id)
        assert listed is not None, f"the held lease of run {run_id} is not listed"
        assert (listed.run_id, listed.owner, listed.fencing_token) == (
            run_id,
            "contract lister",
            guard.fencing_token,
        )
        if mayfly_journal.capabilities.lease_expiry:
            assert listed.expires_at_ms is not None and listed.expires_in_ms is not None
            assert 0 < listed.expires_in_ms <= TTL_MS
        else:
            assert (listed.expires_at_ms, listed.expires_in_ms) == (None, None)


@pytest.mark.clause("lease.listing.released")
@pytest.mark.capability("lease_listing")
def test_a_released_lease_is_not_listed(mayfly_leases: RecoveryLeaseStore, records: Records) -> None:
    """Once released, a lease is gone from the listing; a lease of another run stays."""
    listing = _listing(mayfly_leases)
    released, kept = records.new_id(), records.new_id()
    guard = mayfly_leases.acquire(released, "contract released", TTL_MS)
    with mayfly_leases.acquire(kept, "contract kept", TTL_MS):
        assert _listed(listing, released) is not None
        guard.release()
        assert _listed(listing, released) is None
        listed = _listed(listing, kept)
        assert listed is not None and listed.owner == "contract kept"


@pytest.mark.clause("lease.listing.expired")
@pytest.mark.capability("lease_listing")
@pytest.mark.capability("lease_expiry")
def test_an_expired_lease_is_not_listed(mayfly_leases: RecoveryLeaseStore, run_id: str) -> None:
    """A lease not renewed within its ttl is not listed, though nobody took it over or released it."""
    listing = _listing(mayfly_leases)
    guard = mayfly_leases.acquire(run_id, "contract expiring", 200)
    time.sleep(0.5)
    assert _listed(listing, run_id) is None
    guard.release()


@pytest.mark.clause("lease.listing.renew-moves-expiry")
@pytest.mark.capability("lease_listing")
@pytest.mark.capability("lease_expiry")
def test_renewing_moves_the_listed_expiry(mayfly_leases: RecoveryLeaseStore, run_id: str) -> None:
    """After renew(ttl) the listed expiry is about ttl from now: later than before, by the store's clock."""
    listing = _listing(mayfly_leases)
    with mayfly_leases.acquire(run_id, "contract renewer", 5_000) as guard:
        before = _listed(listing, run_id)
        assert before is not None and before.expires_in_ms is not None and before.expires_at_ms is not None
        assert before.expires_in_ms <= 5_000
        guard.renew(600_000)
        after = _listed(listing, run_id)
        assert after is not None and after.expires_in_ms is not None and after.expires_at_ms is not None
        assert after.expires_in_ms > 5_000 and after.expires_at_ms > before.expires_at_ms
        assert after.fencing_token == before.fencing_token


@pytest.mark.clause("lease.listing.read-only")
@pytest.mark.capability("lease_listing")
def test_listing_changes_nothing(mayfly_leases: RecoveryLeaseStore, records: Records) -> None:
    """Listing grants, renews and releases nothing: the holder keeps its lease, others are still refused,
    the fence stays, and later grants still work with rising tokens."""
    listing = _listing(mayfly_leases)
    run, fresh = records.new_id(), records.new_id()
    guard = mayfly_leases.acquire(run, "contract holder", TTL_MS)
    fence = mayfly_leases.current_fence(run)
    for _ in range(3):
        listing.list_leases(after=_below(run), limit=MAX_LEASE_LISTING)
        listing.list_leases(limit=1)
    assert mayfly_leases.current_fence(run) == fence == guard.fencing_token
    assert mayfly_leases.current_fence(fresh) == 0
    with pytest.raises(LeaseHeld):
        mayfly_leases.acquire(run, "contract contender", TTL_MS)
    guard.renew()
    guard.release()
    with mayfly_leases.acquire(run, "contract next", TTL_MS) as later:
        assert later.fencing_token > guard.fencing_token
        listed = _listed(listing, run)
        assert listed is not None and (listed.owner, listed.fencing_token) == (
            "contract next",
            later.fencing_token,
        )
    with mayfly_leases.acquire(fresh, "contract fresh", TTL_MS) as first:
        assert first.fencing_token >= 1


@pytest.mark.clause("lease.listing.pages")
@pytest.mark.capability("lease_listing")
def test_the_listing_pages_in_run_id_order_within_the_limit(
    mayfly_leases: RecoveryLeaseStore, records: Records
) -> None:
    """Pages never exceed the limit, run ids rise strictly across pages (each after the cursor), and
    following the last listed run id as ``after`` lists each held lease exactly once."""
    listing = _listing(mayfly_leases)
    runs = sorted(records.new_id() for _ in range(5))
    guards = [mayfly_leases.acquire(run, f"contract pager {n}", TTL_MS) for n, run in enumerate(runs)]
    try:
        for limit in (1, 2, 3):
            seen: list[str] = []
            after = _below(runs[0])
            while True:
                page = listing.list_leases(after=after, limit=limit)
                assert len(page) <= limit
                ids = [lease.run_id for lease in page]
                assert all(run > after for run in ids) and ids == sorted(set(ids)), (after, ids)
                seen.extend(ids)
                if len(page) < limit or ids[-1] >= runs[-1]:
                    break
                after = ids[-1]
            assert [run for run in seen if run in runs] == runs, (limit, seen)
            owners = {lease.run_id: lease.owner for lease in listing.list_leases(after=_below(runs[0]))}
            assert [owners[run] for run in runs] == [f"contract pager {n}" for n in range(5)]
    finally:
        for guard in guards:
            guard.release()


@pytest.mark.clause("lease.listing.inputs")
@pytest.mark.capability("lease_listing")
def test_bad_listing_arguments_are_refused(mayfly_leases: RecoveryLeaseStore) -> None:
    """A malformed ``after`` is an InvalidIdentifier; a limit outside [1, MAX_LEASE_LISTING] or not an int
    is an InvalidRecord."""
    listing = _listing(mayfly_leases)
    for bad in ("run-1", "", "0193A5C4-7B1E-7C3D-9F00-1234567890AB", 7):
        with pytest.raises(InvalidIdentifier):
            listing.list_leases(after=bad)  # type: ignore[arg-type]  # bad input on purpose
    for limit in (0, -1, MAX_LEASE_LISTING + 1, True, "5", 2.0, None):
        with pytest.raises(InvalidRecord):
            listing.list_leases(limit=limit)  # type: ignore[arg-type]  # bad input on purpose


@pytest.mark.clause("lease.listing.cross-process")
@pytest.mark.capability("lease_listing")
@pytest.mark.capability("cross_process")
def test_a_lease_held_by_another_process_is_listed(
    mayfly_leases: RecoveryLeaseStore, mayfly_leases_url: str, run_id: str
) -> None:
    """Another process's lease is listed with its owner and token, and not once that process released it."""
    listing = _listing(mayfly_leases)
    child = Child("hold-lease", url=mayfly_leases_url, run_id=run_id, ttl_ms=TTL_MS)
    try:
        held, token = child.readline().split()
        assert held == "held"
        listed = _listed(listing, run_id)
        assert listed is not None and (listed.owner, listed.fencing_token) == ("contract-child", int(token))
        child.send("release")
        assert child.readline() == "released"
        child.finish()
        assert _listed(listing, run_id) is None
    finally:
        child.close()


@pytest.mark.clause("lease.listing.claimed")
@pytest.mark.capability("lease_listing")
@pytest.mark.capability("run_index")
def test_a_claimed_run_s_lease_is_listed(
    mayfly_journal: WorkflowJournal, mayfly_leases: RecoveryLeaseStore, records: Records
) -> None:
    """A lease granted by a run-index claim is listed like an acquired one, with the claimant as owner."""
    listing = _listing(mayfly_leases)
    index = RUN_INDEX.of(mayfly_journal)
    assert index is not None
    queue = f"contract-{uuid.uuid4().hex[:16]}"
    now = time.time_ns() // 1_000_000
    run = ScriptedRun(records.new_id(), queue=queue, epoch_ms=now)
    run.advance_to(1, mayfly_journal)
    (guard,) = index.claim("contract claimant", limit=1, ttl_ms=TTL_MS, now_ms=now, queues=[queue])
    try:
        listed = _listed(listing, run.run_id)
        assert listed is not None
        assert (listed.owner, listed.fencing_token) == ("contract claimant", guard.fencing_token)
    finally:
        guard.release()
    assert _listed(listing, run.run_id) is None
