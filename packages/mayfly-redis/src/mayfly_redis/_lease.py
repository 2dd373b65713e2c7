"""``RedisLeaseStore``: expiring recovery leases (``SET NX PX``) fenced by a per-run counter.

A grant sets ``P:{R}:lease`` with ``NX PX ttl`` and increments ``P:{R}:fence``
in the same script, so every grant's token is strictly greater than all
earlier ones for the run, across processes and restarts (the counter is an
ordinary key, persisted like the journal). The journal's append script reads
the same counter, so a holder that lost its lease is fenced inside the server.
Renew and release compare the stored ``"<token> <nonce> <owner>"`` value first:
a guard can never extend or delete someone else's lease.

On a standalone server the store lists its live leases (``lease_listing``):
every grant files its run in the sorted set ``P:leases`` (all scores 0, so
members sort by run id), a release or purge takes it out, and a renewal files
it again (so a lease granted before the set existed shows from its next
renewal). A lease that expired unreleased leaves its member behind until the
run is leased and released again; the listing script skips it by ``PTTL``,
reads nothing else and writes nothing, and looks at a bounded number of
members per call so the server is never held up. A Cluster store declares no
listing: its runs' leases live in every shard's slots, so one page would take
a script on every shard (up to 1,024), and its scripts would have to file
them per shard.
"""

from __future__ import annotations

import uuid
from typing import final

from mayfly.backend import LeaseGuardBase, LeaseStoreBase
from mayfly.errors import CorruptionError, LeaseHeld
from mayfly.lease import LeaseCapabilities, LeaseInfo
from mayfly_redis import _scripts
from mayfly_redis._client import RedisStore, open_store
from mayfly_redis._layout import LayoutKind

__all__ = ["RedisLeaseGuard", "RedisLeaseStore"]

_LISTING_BUDGET = 512
"""The most members of ``P:leases`` one listing script looks at (each costs a ``PTTL``)."""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@final
class RedisLeaseGuard(LeaseGuardBase[str]):
    """A granted Redis lease: valid until released, or expired and taken over.

    Its grant is the exact lease value ``"<token> <nonce> <owner>"``: renew and
    release compare it first, so a guard never touches another grant.
    """

    _store: RedisLeaseStore

    def _renew(self, ttl_ms: int) -> None:
        store = self._store
        args: list[object] = [self._grant, ttl_ms]
        if store.capabilities.lease_listing:
            args += [store._redis.layout.prefix, self.run_id]  # (re)files the run in P:leases
        renewed = store._redis.script(
            f"renew lease of run {self.run_id}", _scripts.RENEW, [store._lease_key(self.run_id)], args
        )
        if not int(renewed):
            raise self.lost("expired and was taken over")

    def _release(self) -> None:
        store = self._store
        layout = store._redis.layout
        self._store._redis.script(
            f"release lease of run {self.run_id}",
            _scripts.for_layout(_scripts.RELEASE, layout.sharded),
            [store._lease_key(self.run_id), layout.key(self.run_id, "index")],
            # The run index files a released run where claims find it at once.
            [self._grant, layout.run_base(self.run_id) if layout.indexed else "", self.run_id],
        )


@final
class RedisLeaseStore(LeaseStoreBase[RedisLeaseGuard]):
    """A ``RecoveryLeaseStore`` on Redis: non-blocking, exclusive, expiring and fenced."""

    def __init__(self, url: str, *, store: RedisStore | None = None) -> None:
        self._redis = store if store is not None else open_store(url)
        standalone = self._redis.layout.kind is LayoutKind.STANDALONE
        super().__init__(url=self._redis.target.url, capabilities=LeaseCapabilities(lease_listing=standalone))

    def _lease_key(self, run_id: str) -> str:
        """The key holding the run's lease, ``"<token> <nonce> <owner>"``."""
        return self._redis.layout.key(run_id, "lease")

    def _acquire(self, run_id: str, owner: str, ttl_ms: int) -> RedisLeaseGuard:
        nonce = uuid.uuid4().hex
        layout = self._redis.layout
        keys = [self._lease_key(run_id), layout.key(run_id, "fence")]
        args: list[object] = [nonce, owner, ttl_ms]
        if not self._redis.cluster:
            # A standalone server counts the run in progress in its queue (queue_control).
            keys.append(layout.key(run_id, "index"))
            args += [layout.prefix, run_id]
        status, detail, *rest = self._redis.script(
            f"acquire lease of run {run_id}", _scripts.ACQUIRE, keys, args
        )
        if _text(status) != "granted":
            left = int(rest[0]) if rest and int(rest[0]) >= 0 else None
            raise LeaseHeld(run_id, _text(detail), expires_in_ms=left)
        token = int(detail)
        return RedisLeaseGuard(
            self, run_id, owner, token=token, ttl_ms=ttl_ms, grant=f"{token} {nonce} {owner}"
        )

    def adopt(self, run_id: str, owner: str, ttl_ms: int, token: int, nonce: str) -> RedisLeaseGuard:
        """The guard of a grant a claim script made (``"<token> <nonce> <owner>"``), held by this store."""
        guard = RedisLeaseGuard(
            self, run_id, owner, token=token, ttl_ms=ttl_ms, grant=f"{token} {nonce} {owner}"
        )
        with self._held_lock:
            self._held.add(guard)
        return guard

    def _list_leases(self, after: str | None, limit: int) -> list[LeaseInfo]:
        """Live leases from ``P:leases`` in run id order: one bounded, read-only script per call of it."""
        prefix = self._redis.layout.prefix
        found: list[LeaseInfo] = []
        cursor = after or ""
        while len(found) < limit:
            now, seen_all, cursor, *leases = self._redis.script(
                "list leases",
                _scripts.LIST_LEASES,
                [f"{prefix}:leases"],
                [prefix, cursor, limit - len(found), _LISTING_BUDGET],
            )
            cursor = _text(cursor)
            for offset in range(0, len(leases), 3):
                run, value, left = _text(leases[offset]), _text(leases[offset + 1]), int(leases[offset + 2])
                token, _, rest = value.partition(" ")
                owner = rest.partition(" ")[2]
                if not token.isdigit() or not owner:
                    raise CorruptionError(f"the lease of run {run} holds {value[:80]!r}, not a grant")
                found.append(
                    LeaseInfo(
                        run_id=run,
                        owner=owner,
                        fencing_token=int(token),
                        expires_at_ms=int(now) + left,
                        expires_in_ms=left,
                    )
                )
            if int(seen_all):
                break
        return found

    def _current_fence(self, run_id: str) -> int:
        token = self._redis.call(
            f"read fence of run {run_id}", "GET", self._redis.layout.key(run_id, "fence")
        )
        return 0 if token is None else int(token)

    def _close(self) -> None:
        self._redis.close()
