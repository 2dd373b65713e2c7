"""LeaseStoreBase and LeaseGuardBase: validation, closed checks, held-guard bookkeeping and LeaseLost once."""

from __future__ import annotations

import pytest

from mayfly.backend import LeaseGuardBase, LeaseStoreBase
from mayfly.errors import (
    CompatibilityError,
    InvalidIdentifier,
    InvalidRecord,
    JournalUnavailable,
    LeaseHeld,
    LeaseLost,
)
from mayfly.identity import Uuid7IdSource
from mayfly.lease import (
    LEASE_LISTING,
    MAX_LEASE_LISTING,
    LeaseCapabilities,
    LeaseInfo,
    RecoveryLeaseGuard,
    RecoveryLeaseStore,
)

IDS = Uuid7IdSource()


class DictGuard(LeaseGuardBase[int]):
    """A guard whose grant is its token in the store's dict."""

    _store: DictLeases

    def _renew(self, ttl_ms: int) -> None:
        self._store.calls.append(("renew", self.run_id, ttl_ms))
        if self._store.holders.get(self.run_id) != self._grant:
            raise self.lost("was taken over by someone else")

    def _release(self) -> None:
        self._store.calls.append(("release", self.run_id, self._grant))
        if self._store.holders.get(self.run_id) == self._grant:
            del self._store.holders[self.run_id]


class DictLeases(LeaseStoreBase[DictGuard]):
    """The smallest lease store on the kit: holders and counters in dicts."""

    def __init__(self) -> None:
        super().__init__(url="dict://")
        self.holders: dict[str, int] = {}
        self.fences: dict[str, int] = {}
        self.calls: list[tuple[str, str, int]] = []
        self.closes = 0

    def _acquire(self, run_id: str, owner: str, ttl_ms: int) -> DictGuard:
        if run_id in self.holders:
            raise LeaseHeld(run_id, "someone")
        token = self.fences[run_id] = self.fences.get(run_id, 0) + 1
        self.holders[run_id] = token
        return DictGuard(self, run_id, owner, token=token, ttl_ms=ttl_ms, grant=token)

    def _current_fence(self, run_id: str) -> int:
        return self.fences.get(run_id, 0)

    def _close(self) -> None:
        self.closes += 1


def test_a_store_of_hooks_alone_implements_the_protocols() -> None:
    """The subclasses are a RecoveryLeaseStore and RecoveryLeaseGuard with the contract's behaviour."""
    leases = DictLeases()
    run = IDS.new_id()
    guard = leases.acquire(run, "worker", 1000)
    assert isinstance(leases, RecoveryLeaseStore) and isinstance(guard, RecoveryLeaseGuard)
    assert (guard.run_id, guard.owner, guard.fencing_token, guard.ttl_ms) == (run, "worker", 1, 1000)
    with pytest.raises(LeaseHeld):
        leases.acquire(run, "other", 1000)
    assert leases.current_fence(run) == 1


def test_bad_arguments_are_refused_before_any_hook_runs() -> None:
    """Malformed run ids, owners and ttls raise typed errors and grant nothing; renew checks its ttl too."""
    leases = DictLeases()
    run = IDS.new_id()
    with pytest.raises(InvalidIdentifier):
        leases.acquire("run-1", "w", 1000)
    for owner, ttl in (("", 1000), ("w\n", 1000), ("w", 0), ("w", True)):
        with pytest.raises(InvalidRecord):
            leases.acquire(run, owner, ttl)  # type: ignore[arg-type]  # bad input on purpose
    assert leases.fences == {}
    guard = leases.acquire(run, "w", 1000)
    with pytest.raises(InvalidRecord):
        guard.renew(0)
    assert leases.calls == []


def test_renew_defaults_to_the_acquire_ttl_and_refuses_after_release() -> None:
    """renew() extends by the acquire ttl; after release it raises LeaseLost without asking the store."""
    leases = DictLeases()
    run = IDS.new_id()
    guard = leases.acquire(run, "w", 1500)
    guard.renew()
    guard.renew(200)
    guard.renew()
    assert [call for call in leases.calls if call[0] == "renew"] == [
        ("renew", run, 1500),
        ("renew", run, 200),
        ("renew", run, 1500),
    ]
    guard.release()
    with pytest.raises(
        LeaseLost, match=rf"^recovery lease of run {run} \(token 1, owner 'w'\) was released; "
    ):
        guard.renew()
    assert leases.calls[-1][0] == "release"


def test_a_taken_over_grant_is_lost_in_the_backend_s_words() -> None:
    """A hook's lost() carries the kit's prefix and the backend's account of what happened."""
    leases = DictLeases()
    run = IDS.new_id()
    guard = leases.acquire(run, "w", 1000)
    leases.holders[run] = 99
    with pytest.raises(LeaseLost, match="was taken over by someone else; stop working on the run"):
        guard.renew()


def test_release_is_idempotent_and_runs_its_hook_once() -> None:
    """Releasing twice, or through the context manager after an explicit release, releases once."""
    leases = DictLeases()
    run = IDS.new_id()
    with leases.acquire(run, "w", 1000) as guard:
        guard.release()
        guard.release()
    assert [call for call in leases.calls if call[0] == "release"] == [("release", run, 1)]
    assert not guard.held
    assert leases.acquire(run, "again", 1000).fencing_token == 2


def test_close_releases_guards_still_held_even_dropped_ones() -> None:
    """Closing the store releases every guard it granted and did not see released; close runs once."""
    leases = DictLeases()
    runs = [IDS.new_id() for _ in range(3)]
    kept = leases.acquire(runs[0], "w", 1000)
    for run in runs[1:]:
        leases.acquire(run, "w", 1000)  # dropped without release
    kept.release()
    leases.close()
    leases.close()
    assert leases.closes == 1 and leases.closed
    assert leases.holders == {}
    assert sorted(call[1] for call in leases.calls if call[0] == "release") == sorted(runs)


def test_a_closed_store_refuses_naming_the_operation() -> None:
    """acquire and current_fence on a closed store raise JournalUnavailable naming the run."""
    leases = DictLeases()
    run = IDS.new_id()
    leases.close()
    with pytest.raises(
        JournalUnavailable, match=f"^lease grant of run {run} refused: lease store dict:// is closed"
    ):
        leases.acquire(run, "w", 1000)
    with pytest.raises(JournalUnavailable, match=f"^fence read of run {run} refused"):
        leases.current_fence(run)


def test_a_store_that_does_not_declare_the_listing_refuses_it_after_checking_arguments() -> None:
    """list_leases checks after and limit first, then refuses with CompatibilityError unless declared."""
    leases = DictLeases()
    assert not leases.capabilities.lease_listing and LEASE_LISTING.of(leases) is None
    with pytest.raises(InvalidIdentifier):
        leases.list_leases(after="run-1")
    for limit in (0, MAX_LEASE_LISTING + 1, True, "5"):
        with pytest.raises(InvalidRecord):
            leases.list_leases(limit=limit)  # type: ignore[arg-type]  # bad input on purpose
    with pytest.raises(CompatibilityError, match="does not declare lease_listing"):
        leases.list_leases()
    leases.close()
    with pytest.raises(JournalUnavailable, match=r"^lease listing refused"):
        leases.list_leases()


class ListedLeases(DictLeases):
    """DictLeases declaring lease_listing, listing its holders in run id order."""

    def __init__(self) -> None:
        super().__init__()
        self._capabilities = LeaseCapabilities.declare("lease_listing")

    def _list_leases(self, after: str | None, limit: int) -> list[LeaseInfo]:
        self.calls.append(("list", after or "", limit))
        return [
            LeaseInfo(run_id=run, owner="w", fencing_token=token, expires_at_ms=None, expires_in_ms=None)
            for run, token in sorted(self.holders.items())
            if after is None or run > after
        ][:limit]


def test_a_declared_listing_reaches_its_hook_with_checked_arguments() -> None:
    """LEASE_LISTING serves a declaring store; the hook gets a canonical after and the limit."""
    leases = ListedLeases()
    runs = sorted(IDS.new_id() for _ in range(2))
    for run in runs:
        leases.acquire(run, "w", 1000)
    listing = LEASE_LISTING.of(leases)
    assert listing is leases
    assert [lease.run_id for lease in listing.list_leases(after=runs[0], limit=5)] == [runs[1]]
    assert leases.calls[-1] == ("list", runs[0], 5)
