"""The storage-neutral recovery-lease contract: one owner per run, with fencing tokens.

Only one runtime may own recovery of a run (ADR-0032 "Restart recovery",
Story 1.7). A :class:`RecoveryLeaseStore` grants that ownership without
blocking; every grant carries a fencing token, strictly greater than every
token granted before for the run, across processes and restarts. The journal
of the same store checks the token on each append, so a holder that lost its
lease (expired, taken over) can no longer write: its appends fail with
``FencingRejected`` atomically, inside the store.

Optional lease-store features
-----------------------------
Beyond :class:`RecoveryLeaseStore`, a store may offer features, each a
:class:`LeaseCapabilities` flag and a Protocol, as journals do
(:class:`mayfly.journal.Feature`): :data:`LEASE_LISTING`, a read-only list of
the live leases (who owns which run, with which token, until when). Callers
ask ``FEATURE.of(store)``; a store's attributes are never probed.
"""

from __future__ import annotations

import re
from types import TracebackType
from typing import Any, Final, Generic, Protocol, Self, TypeVar, cast, final, runtime_checkable

import msgspec

from mayfly.model.errors import CompatibilityError, InvalidRecord
from mayfly.model.ids import RunId, parse_run_id

__all__ = [
    "LEASE_FEATURES",
    "LEASE_LISTING",
    "MAX_LEASE_LISTING",
    "MAX_LEASE_TTL_MS",
    "MAX_OWNER_LENGTH",
    "LeaseCapabilities",
    "LeaseFeature",
    "LeaseInfo",
    "LeaseListing",
    "RecoveryLeaseGuard",
    "RecoveryLeaseStore",
    "validate_acquire",
    "validate_lease_listing",
    "validate_ttl",
]

MAX_OWNER_LENGTH: Final = 256
"""Longest accepted owner description, in ASCII characters."""

MAX_LEASE_TTL_MS: Final = 24 * 60 * 60 * 1000
"""Longest accepted lease ttl: one day."""

MAX_LEASE_LISTING: Final = 1_000
"""The most leases one ``list_leases`` call may ask for."""

_OWNER = re.compile(r"[\x20-\x7e]+")


@final
class LeaseCapabilities(msgspec.Struct, frozen=True, kw_only=True):
    """The optional features a lease store declares; every flag is false unless declared.

    A flag declared true obliges the store to implement the feature's
    Protocol (see :class:`LeaseFeature`), and callers ask through the
    feature, never by probing attributes. ``lease_listing``:
    :class:`LeaseListing`, a read-only list of the live leases.

    What the store's leases *do* (expire, fence appends, work across
    processes) is declared with the journal of the same store
    (:class:`mayfly.journal.JournalCapabilities`), which checks their tokens.
    """

    lease_listing: bool = False

    @classmethod
    def declare(cls, *flags: str) -> LeaseCapabilities:
        """The capabilities with exactly the named flags true (names may be space-separated in one string).

        An unknown name raises ``ValueError``.
        """
        names = set(cls.__struct_fields__)
        wanted = {name for group in flags for name in group.split()}
        unknown = sorted(wanted - names)
        if unknown:
            raise ValueError(
                f"unknown lease capability flag(s) {', '.join(unknown)}; the flags are {sorted(names)}"
            )
        return cls(**{name: name in wanted for name in names})


@final
class LeaseInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One live recovery lease, as :meth:`LeaseListing.list_leases` reports it.

    ``owner`` is what the holder passed to ``acquire`` (a worker's id), and
    ``fencing_token`` the grant's token. ``expires_at_ms`` is when the lease
    ends unless renewed, in wall-clock Unix milliseconds of the store's own
    clock (a PostgreSQL or Redis server's), and ``expires_in_ms`` how long
    that was from the moment it was listed, on the same clock, so a reader
    on another host needs no clock agreement. Both are ``None`` for a store
    whose leases do not expire (``file://``: a lease lasts until its holder
    releases it or its process ends).
    """

    run_id: str
    owner: str
    fencing_token: int
    expires_at_ms: int | None
    expires_in_ms: int | None


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

    @property
    def capabilities(self) -> LeaseCapabilities:
        """The optional features this store offers (see :class:`LeaseCapabilities`)."""
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


@runtime_checkable
class LeaseListing(Protocol):
    """Optional feature ``lease_listing``: the live leases, read without changing or stalling anything."""

    def list_leases(self, *, after: str | None = None, limit: int = 100) -> list[LeaseInfo]:
        """Up to ``limit`` live leases in run id order, each of a run id greater than ``after``.

        Live: granted and neither released nor expired (by the store's clock),
        as a grant would judge it. Page by passing the last listed run id as
        ``after``; fewer than ``limit`` leases means there are no more. The
        listing writes nothing and takes no lock a grant, renewal or append
        waits for beyond a single read, so a console may poll it. A malformed
        ``after`` raises ``InvalidIdentifier``; a ``limit`` outside
        ``[1, MAX_LEASE_LISTING]`` raises ``InvalidRecord``.
        """
        ...


_P = TypeVar("_P")


@final
class LeaseFeature(Generic[_P]):
    """An optional lease-store feature: a :class:`LeaseCapabilities` flag and the Protocol serving it.

    Ask a store for a feature with :meth:`of`, never by probing its
    attributes (as with :class:`mayfly.journal.Feature`)::

        listing = LEASE_LISTING.of(leases)
        if listing is not None:
            held = listing.list_leases(limit=50)
    """

    __slots__ = ("flag", "protocol")

    def __init__(self, flag: str, protocol: Any) -> None:
        if flag not in LeaseCapabilities.__struct_fields__:
            raise ValueError(f"{flag!r} is not a LeaseCapabilities flag")
        self.flag = flag
        self.protocol: type[Any] = protocol

    def declared(self, store: RecoveryLeaseStore) -> bool:
        """Whether ``store`` declares the feature in its capabilities."""
        return bool(getattr(store.capabilities, self.flag))

    def of(self, store: RecoveryLeaseStore) -> _P | None:
        """Return ``store`` as the feature's Protocol if it declares the flag, else ``None``.

        A store that declares the flag but does not implement the Protocol
        raises ``CompatibilityError``: the declaration is the promise.
        """
        if not self.declared(store):
            return None
        if not isinstance(store, self.protocol):
            raise CompatibilityError(
                f"{type(store).__qualname__} ({store.url}) declares {self.flag}=True but does not "
                f"implement {self.protocol.__qualname__}; fix the lease store's capabilities"
            )
        return cast(_P, store)

    def __repr__(self) -> str:
        return f"LeaseFeature({self.flag!r}, {self.protocol.__qualname__})"


LEASE_LISTING: Final[LeaseFeature[LeaseListing]] = LeaseFeature("lease_listing", LeaseListing)
"""A read-only list of the live leases: run, owner, token, expiry."""
LEASE_FEATURES: Final = (LEASE_LISTING,)
"""Every optional feature a lease store may declare."""


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


def validate_lease_listing(after: object, limit: object) -> tuple[RunId | None, int]:
    """Check ``list_leases`` arguments: return them typed, or raise a typed input error."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LEASE_LISTING:
        raise InvalidRecord(f"list_leases limit must be an int in [1, {MAX_LEASE_LISTING}], got {limit!r}")
    return (None if after is None else parse_run_id(after)), limit
