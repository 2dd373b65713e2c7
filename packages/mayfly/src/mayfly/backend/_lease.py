"""``LeaseStoreBase`` and ``LeaseGuardBase``: the lease contract written once, over storage hooks.

The bases own argument validation, the closed-state check, the bookkeeping of
guards a store still holds (``close`` releases them), idempotent release, the
context managers and the wording of ``LeaseLost``. A backend implements the
grant, renewal, release and fence reads against its store.

No lock of the bases is held while a hook runs: a network backend's hooks
park the calling hub task on a socket, and a lock held across that switch
would stop every other task of the thread that touched it.
"""

from __future__ import annotations

import abc
import threading
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

from mayfly.lease import LeaseCapabilities, LeaseInfo, validate_acquire, validate_lease_listing, validate_ttl
from mayfly.model.errors import CompatibilityError, JournalUnavailable, LeaseLost
from mayfly.model.ids import parse_run_id

__all__ = ["LeaseGuardBase", "LeaseStoreBase"]

_G = TypeVar("_G", bound="LeaseGuardBase[Any]")
_Grant = TypeVar("_Grant")


class LeaseGuardBase(abc.ABC, Generic[_Grant]):
    """A granted recovery lease (:class:`~mayfly.lease.RecoveryLeaseGuard`) over two hooks.

    Build one in the store's ``_acquire`` with the grant's run, owner, token,
    ttl and ``grant``: whatever the store needs to recognise this grant again
    (a nonce, a grant id, the descriptor of a lock), kept as ``self._grant``.
    Implement ``_renew(ttl_ms)`` (extend the grant if it is still the run's
    current one, else raise :meth:`lost`) and ``_release()`` (give the grant
    up unless it was taken over). :meth:`renew` refuses a released guard;
    :meth:`release` runs its hook at most once.
    """

    def __init__(
        self, store: LeaseStoreBase[Any], run_id: str, owner: str, *, token: int, ttl_ms: int, grant: _Grant
    ) -> None:
        self._store = store
        self._run_id = run_id
        self._owner = owner
        self._token = token
        self._ttl_ms = ttl_ms
        self._grant = grant
        self._released = False
        # Guards _released, and a subclass's own state in hooks that never switch greenlets.
        # Never held by the base while a hook runs.
        self._state = threading.Lock()

    @property
    def run_id(self) -> str:
        """The run this lease owns."""
        return self._run_id

    @property
    def owner(self) -> str:
        """The owner description given to ``acquire``."""
        return self._owner

    @property
    def fencing_token(self) -> int:
        """This grant's token: pass it as ``fence`` to every append made under the lease."""
        return self._token

    @property
    def ttl_ms(self) -> int:
        """The ttl the lease was acquired with (what :meth:`renew` extends by default)."""
        return self._ttl_ms

    @property
    def held(self) -> bool:
        """Whether this guard was not released (an expired grant may still have been taken over)."""
        return not self._released

    def renew(self, ttl_ms: int | None = None) -> None:
        """Extend the lease by ``ttl_ms`` (default: the ttl it was acquired with); ``LeaseLost`` if gone."""
        ttl = self._ttl_ms if ttl_ms is None else validate_ttl(ttl_ms)
        if self._released:
            raise self.lost("was released")
        self._renew(ttl)

    def release(self) -> None:
        """Give the lease up; idempotent, and a grant already taken over is left to its new owner."""
        with self._state:
            if self._released:
                return
            self._released = True
        try:
            self._release()
        finally:
            self._store._forget(self)

    def lost(self, how: str) -> LeaseLost:
        """The ``LeaseLost`` saying how this grant was lost (``"was taken over by w-2 (token 4)"``)."""
        return LeaseLost(
            f"recovery lease of run {self._run_id} (token {self._token}, owner {self._owner!r}) {how}; "
            "stop working on the run and acquire it again"
        )

    def __enter__(self) -> Self:
        """Return the guard itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release the lease."""
        self.release()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(run_id={self._run_id!r}, token={self._token}, held={self.held})"

    @abc.abstractmethod
    def _renew(self, ttl_ms: int) -> None:
        """Extend the grant to ``ttl_ms`` from now if it is still current; otherwise raise :meth:`lost`."""

    @abc.abstractmethod
    def _release(self) -> None:
        """Give the grant up in the store, unless another grant replaced it."""


class LeaseStoreBase(abc.ABC, Generic[_G]):
    """A :class:`~mayfly.lease.RecoveryLeaseStore` whose public methods are implemented once.

    Call ``super().__init__(url=..., capabilities=...)`` with the redacted URL
    and the optional features the store offers (none by default), and
    implement ``_acquire(run_id, owner, ttl_ms)`` (grant now with a new,
    higher token, or raise ``LeaseHeld``; never wait), ``_current_fence(run_id)``
    and ``_close()``; a store declaring ``lease_listing`` implements
    ``_list_leases(after, limit)`` too. Every guard the store grants is kept
    until it is released, so :meth:`close` releases what is still held, even
    guards the caller dropped without releasing.
    """

    def __init__(self, *, url: str, capabilities: LeaseCapabilities | None = None) -> None:
        self._url = url
        self._capabilities = LeaseCapabilities() if capabilities is None else capabilities
        self._closed = False
        self._held: set[_G] = set()
        self._held_lock = threading.Lock()

    @property
    def url(self) -> str:
        """The URL the store was opened from, with any password replaced by ``***``."""
        return self._url

    @property
    def capabilities(self) -> LeaseCapabilities:
        """The optional features this store offers (see :class:`~mayfly.lease.LeaseCapabilities`)."""
        return self._capabilities

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def acquire(self, run_id: str, owner: str, ttl_ms: int) -> _G:
        """Grant the run's lease to ``owner`` now with a new, higher fencing token, or raise ``LeaseHeld``."""
        run, owner, ttl = validate_acquire(run_id, owner, ttl_ms)
        self.ensure_open(f"lease grant of run {run}")
        guard = self._acquire(run, owner, ttl)
        with self._held_lock:
            self._held.add(guard)
        return guard

    def current_fence(self, run_id: str) -> int:
        """Return the newest fencing token granted for the run (0 if it was never leased)."""
        run = parse_run_id(run_id)
        self.ensure_open(f"fence read of run {run}")
        return self._current_fence(run)

    def list_leases(self, *, after: str | None = None, limit: int = 100) -> list[LeaseInfo]:
        """Up to ``limit`` live leases in run id order after ``after`` (:class:`~mayfly.lease.LeaseListing`).

        Only for a store declaring ``lease_listing`` (``CompatibilityError`` otherwise).
        """
        start, count = validate_lease_listing(after, limit)
        self.ensure_open("lease listing")
        if not self._capabilities.lease_listing:
            raise CompatibilityError(
                f"{type(self).__qualname__} ({self._url}) does not declare lease_listing: it lists no leases"
            )
        return self._list_leases(start, count)

    def close(self) -> None:
        """Release every lease this store still holds, then the store's resources. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._held_lock:
            held = list(self._held)
        try:
            for guard in held:
                guard.release()
        finally:
            self._close()

    def ensure_open(self, operation: str) -> None:
        """Raise ``JournalUnavailable`` naming ``operation`` if the store is closed."""
        if self._closed:
            raise JournalUnavailable(f"{operation} refused: lease store {self._url} is closed; open it again")

    def _forget(self, guard: LeaseGuardBase[Any]) -> None:
        with self._held_lock:
            self._held.discard(guard)

    def __enter__(self) -> Self:
        """Return the store itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the store."""
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._url!r})"

    @abc.abstractmethod
    def _acquire(self, run_id: str, owner: str, ttl_ms: int) -> _G:
        """Grant the lease now (arguments validated) and return its guard, or raise ``LeaseHeld``."""

    @abc.abstractmethod
    def _current_fence(self, run_id: str) -> int:
        """Return the run's newest token (0 if never leased)."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Release the store's resources (called once, after held guards were released)."""

    def _list_leases(self, after: str | None, limit: int) -> list[LeaseInfo]:
        """Up to ``limit`` live leases after ``after`` in run id order (where ``lease_listing`` is declared).

        Read them without writing and without holding a lock a grant waits
        for; judge liveness as a grant does (released, expired or, where the
        store knows it, a dead holder's lease is not live).
        """
        raise CompatibilityError(f"{type(self).__qualname__} declares lease_listing but lists no leases")
