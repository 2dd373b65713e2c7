"""Tests of the storage-neutral recovery-lease contract helpers."""

from __future__ import annotations

import pytest

from mayfly.lease import MAX_LEASE_TTL_MS, validate_acquire
from mayfly.model.errors import InvalidIdentifier, InvalidRecord

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
