"""Tests of the storage-neutral recovery-lease contract helpers."""

from __future__ import annotations

import pytest

from mayfly.lease import (
    LEASE_FEATURES,
    LEASE_LISTING,
    MAX_LEASE_LISTING,
    MAX_LEASE_TTL_MS,
    LeaseCapabilities,
    LeaseFeature,
    LeaseInfo,
    LeaseListing,
    validate_acquire,
    validate_lease_listing,
)
from mayfly.model.errors import CompatibilityError, InvalidIdentifier, InvalidRecord

RUN = "00000000-0000-7000-8000-000000000001"


def test_validate_acquire_accepts_good_arguments() -> None:
    """Well-formed acquire arguments come back unchanged."""
    assert validate_acquire(RUN, "worker-1 pid 42", 1000) == (RUN, "worker-1 pid 42", 1000)


@pytest.mark.parametrize(
    ("run_id", "owner", "ttl_ms", "error"),
    [
        ("run", "w", 1, InvalidIdentifier),
        (RUN, "", 1, InvalidRecord),
        (RUN, "é", 1, InvalidRecord),
        (RUN, "w" * 257, 1, InvalidRecord),
        (RUN, "w", 0, InvalidRecord),
        (RUN, "w", True, InvalidRecord),
        (RUN, "w", MAX_LEASE_TTL_MS + 1, InvalidRecord),
    ],
)
def test_validate_acquire_rejects_bad_arguments(
    run_id: str, owner: str, ttl_ms: int, error: type[Exception]
) -> None:
    """Malformed run ids, owners or ttls are refused with a typed error."""
    with pytest.raises(error):
        validate_acquire(run_id, owner, ttl_ms)


def test_lease_capabilities_declare_exactly_the_named_flags() -> None:
    """declare() sets the named flags and no other; an unknown name is a ValueError naming the flags."""
    assert LeaseCapabilities.declare("lease_listing").lease_listing
    assert not LeaseCapabilities.declare().lease_listing
    with pytest.raises(ValueError, match="unknown lease capability flag"):
        LeaseCapabilities.declare("lease_listing teleport")


class _Store:
    """A lease-store-shaped object: what it declares, and whatever methods it happens to have."""

    url = "probe://"

    def __init__(self, capabilities: LeaseCapabilities) -> None:
        self.capabilities = capabilities

    def list_leases(self, *, after: str | None = None, limit: int = 100) -> list[LeaseInfo]:
        """A method with the feature's name and signature."""
        return []


class _Undeclared:
    """Declares the listing and implements nothing."""

    url = "probe://"
    capabilities = LeaseCapabilities.declare("lease_listing")


def test_a_lease_feature_is_its_declaration_never_a_method_alone() -> None:
    """A method without the flag is not the feature; the flag without the Protocol is a CompatibilityError."""
    assert LEASE_LISTING.of(_Store(LeaseCapabilities())) is None  # type: ignore[arg-type]  # shaped on purpose
    declared = _Store(LeaseCapabilities.declare("lease_listing"))
    assert LEASE_LISTING.of(declared) is declared  # type: ignore[arg-type]
    with pytest.raises(CompatibilityError, match="declares lease_listing=True but does not implement"):
        LEASE_LISTING.of(_Undeclared())  # type: ignore[arg-type]
    assert LEASE_FEATURES == (LEASE_LISTING,)
    with pytest.raises(ValueError, match="not a LeaseCapabilities flag"):
        LeaseFeature("teleport", LeaseListing)


def test_validate_lease_listing_checks_the_cursor_and_the_limit() -> None:
    """A canonical after and a limit in [1, MAX_LEASE_LISTING] pass; anything else is a typed error."""
    assert validate_lease_listing(None, 1) == (None, 1)
    assert validate_lease_listing(RUN, MAX_LEASE_LISTING) == (RUN, MAX_LEASE_LISTING)
    with pytest.raises(InvalidIdentifier):
        validate_lease_listing("run", 10)
    for limit in (0, -1, MAX_LEASE_LISTING + 1, True, 2.0, None):
        with pytest.raises(InvalidRecord):
            validate_lease_listing(None, limit)
