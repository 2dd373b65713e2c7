"""The storage-neutral recovery-lease contract: one owner per run, with fencing tokens.

Only one runtime may own recovery of a run (ADR-0032 "Restart recovery",
Story 1.7). A :class:`RecoveryLeaseStore` grants that ownership without
blocking; every grant carries a fencing token, strictly greater than every
token granted before for the run, across processes and restarts. The journal
of the same store checks the token on each append, so a holder that lost its
lease (expired, taken over) can no longer write: its appends fail with
``FencingRejected`` atomically, inside the store.
"""

from __future__ import annotations

import re
from types import TracebackType
from typing import Final, Protocol, Self, runtime_checkable

from mayfly.model.errors import InvalidRecord
from mayfly.model.ids import RunId, parse_run_id

__all__ = [
    "MAX_LEASE_TTL_MS",
    "MAX_OWNER_LENGTH",
    "RecoveryLeaseGuard",
    "RecoveryLeaseStore",
    "validate_acquire",
    "validate_ttl",
]

MAX_OWNER_LENGTH: Final = 256
"""Longest accepted owner description, in ASCII characters."""

MAX_LEASE_TTL_MS: Final = 24 * 60 * 60 * 1000
"""Longest accepted lease ttl: one day."""

_OWNER = re.compile(r"[\x20-\x7e]+")


@runtime_checkable
class RecoveryLeaseGuard(Protocol):
    """A granted recovery lease; hold it while recovering and appending to the run."""

    @property
    def run_id(self) -> str:
        """The run this lease owns."""
        ...

    @property
    def owner(self) -> str:
        """The owner description given to ``acquire``."""
        ...

    @property
    def fencing_token(self) -> int:
        """This grant's token: pass it as ``fence`` to every append made under the lease."""
        ...

    def renew(self, ttl_ms: int | None = None) -> None:
        """Extend the lease by ``ttl_ms`` (default: the ttl it was acquired with).

        Raises ``LeaseLost`` if the lease was released or taken over; a backend
        may also raise it as soon as the lease expired, taken over or not.
        """
        ...

    def release(self) -> None:
        """Give the lease up; idempotent. Appends with its token stay valid until the next grant."""
        ...

    def __enter__(self) -> Self:
        """Return the guard itself."""
        ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release the lease."""
        ...


@runtime_checkable
class RecoveryLeaseStore(Protocol):
    """Grants recovery leases for runs of one store; non-blocking, exclusive, fenced."""

    @property
    def url(self) -> str:
        """The URL the store was opened from, with any password replaced by ``***``."""
        ...

    def acquire(self, run_id: str, owner: str, ttl_ms: int) -> RecoveryLeaseGuard:
        """Grant the run's lease to ``owner`` now or raise ``LeaseHeld``; never waits."""
        ...

    def current_fence(self, run_id: str) -> int:
        """Return the newest fencing token granted for the run (0 if it was never leased)."""
        ...

    def close(self) -> None:
        """Release the store's resources (held leases are released too)."""
        ...

    def __enter__(self) -> Self:
        """Return the store itself."""
        ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the store."""
        ...


def validate_acquire(run_id: object, owner: object, ttl_ms: object) -> tuple[RunId, str, int]:
    """Check ``acquire`` arguments; return them typed or raise a typed input error."""
    run = parse_run_id(run_id)
    if not isinstance(owner, str) or len(owner) > MAX_OWNER_LENGTH or _OWNER.fullmatch(owner) is None:
        raise InvalidRecord(
            f"lease owner {owner!r} must be 1 to {MAX_OWNER_LENGTH} printable ASCII characters"
        )
    return run, owner, validate_ttl(ttl_ms)


def validate_ttl(ttl_ms: object) -> int:
    """Check a lease ttl (``acquire`` or ``renew``); return it or raise ``InvalidRecord``."""
    if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or not 1 <= ttl_ms <= MAX_LEASE_TTL_MS:
        raise InvalidRecord(f"lease ttl_ms must be an int in [1, {MAX_LEASE_TTL_MS}], got {ttl_ms!r}")
    return ttl_ms
