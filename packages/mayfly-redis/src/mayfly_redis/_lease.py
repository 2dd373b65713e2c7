"""``RedisLeaseStore``: expiring recovery leases (``SET NX PX``) fenced by a per-run counter.

A grant sets ``P:{R}:lease`` with ``NX PX ttl`` and increments ``P:{R}:fence``
in the same script, so every grant's token is strictly greater than all
earlier ones for the run, across processes and restarts (the counter is an
ordinary key, persisted like the journal). The journal's append script reads
the same counter, so a holder that lost its lease is fenced inside the server.
Renew and release compare the stored ``"<token> <nonce> <owner>"`` value first:
a guard can never extend or delete someone else's lease.
"""

from __future__ import annotations

import threading
import uuid
from types import TracebackType
from typing import Self, final

from mayfly.lease import validate_acquire
from mayfly.model.errors import LeaseHeld, LeaseLost
from mayfly.model.ids import parse_run_id
from mayfly_redis import _scripts
from mayfly_redis._client import RedisStore, open_store

__all__ = ["RedisLeaseGuard", "RedisLeaseStore"]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@final
class RedisLeaseGuard:
    """A granted Redis lease: valid until released, or expired and taken over."""

    def __init__(
        self, store: RedisLeaseStore, run_id: str, owner: str, *, token: int, value: str, ttl_ms: int
    ) -> None:
        self._store = store
        self._run_id = run_id
        self._owner = owner
        self._token = token
        self._value = value
        self._ttl_ms = ttl_ms
        self._released = False

    @property
    def run_id(self) -> str:
        """The leased run."""
        return self._run_id

    @property
    def owner(self) -> str:
        """The owner description given to ``acquire``."""
        return self._owner

    @property
    def fencing_token(self) -> int:
        """This grant's fencing token: pass it as ``fence`` to every append under the lease."""
        return self._token

    def renew(self, ttl_ms: int | None = None) -> None:
        """Extend the lease by ``ttl_ms`` (default: the acquire ttl); ``LeaseLost`` if it is gone."""
        ttl = self._ttl_ms if ttl_ms is None else validate_acquire(self._run_id, self._owner, ttl_ms)[2]
        renewed = not self._released and int(
            self._store._redis.script(
                f"renew lease of run {self._run_id}",
                _scripts.RENEW,
                [self._store._lease_key(self._run_id)],
                [self._value, ttl],
            )
        )
        if not renewed:
            raise LeaseLost(
                f"recovery lease of run {self._run_id} (token {self._token}) was released, or expired "
                "and was taken over; stop appending and acquire it again"
            )

    def release(self) -> None:
        """Give the lease up (idempotent); a lease already taken over is left to its new owner."""
        if self._released:
            return
        self._released = True
        self._store._forget(self)
        self._store._redis.script(
            f"release lease of run {self._run_id}",
            _scripts.RELEASE,
            [self._store._lease_key(self._run_id)],
            [self._value],
        )

    def __enter__(self) -> Self:
        """Return the guard."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Release the lease."""
        self.release()


@final
class RedisLeaseStore:
    """A ``RecoveryLeaseStore`` on Redis: non-blocking, exclusive, expiring and fenced."""

    def __init__(self, url: str, *, store: RedisStore | None = None) -> None:
        self._redis = store if store is not None else open_store(url)
        self._held: set[RedisLeaseGuard] = set()
        self._guard = threading.Lock()

    @property
    def url(self) -> str:
        """The URL the store was opened from, password redacted."""
        return self._redis.target.url

    def _lease_key(self, run_id: str) -> str:
        return self._redis.target.key(run_id, "lease")

    def _forget(self, guard: RedisLeaseGuard) -> None:
        with self._guard:
            self._held.discard(guard)

    def acquire(self, run_id: str, owner: str, ttl_ms: int) -> RedisLeaseGuard:
        """Grant the lease now with the next fencing token, or raise ``LeaseHeld``; never waits."""
        run, owner, ttl = validate_acquire(run_id, owner, ttl_ms)
        nonce = uuid.uuid4().hex
        status, detail = self._redis.script(
            f"acquire lease of run {run}",
            _scripts.ACQUIRE,
            [self._lease_key(run), self._redis.target.key(run, "fence")],
            [nonce, owner, ttl],
        )
        if _text(status) != "granted":
            raise LeaseHeld(run, _text(detail))
        token = int(detail)
        guard = RedisLeaseGuard(self, run, owner, token=token, value=f"{token} {nonce} {owner}", ttl_ms=ttl)
        with self._guard:
            self._held.add(guard)
        return guard

    def current_fence(self, run_id: str) -> int:
        """The newest fencing token granted for the run (0 if it was never leased)."""
        run = parse_run_id(run_id)
        token = self._redis.call(f"read fence of run {run}", "GET", self._redis.target.key(run, "fence"))
        return 0 if token is None else int(token)

    def close(self) -> None:
        """Release the leases this store granted and still holds, then close the pool."""
        with self._guard:
            held = list(self._held)
        try:
            for guard in held:
                guard.release()
        finally:
            self._redis.close()

    def __enter__(self) -> Self:
        """Return the store."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the store."""
        self.close()
