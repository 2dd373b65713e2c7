"""``LmdbLeaseStore``: expiring recovery leases whose holders' deaths the OS reports at once.

The authority is the run's lease grant, stored in the environment (``leases``
database: token, expiry, owner) and changed only inside LMDB write
transactions, together with the run's fencing token in its head. Appends
check that token in their own write transaction, so a grant and an append
are totally ordered across processes, and a holder whose lease was taken
over can no longer append (``FencingRejected``).

A grant is free to take when it was released, when it expired (``ttl_ms``
passed without ``renew``), or when its holder died. Death is seen without
waiting for the expiry through an OS file lock: a holder keeps an exclusive
``flock`` on ``DIR/leases/<run_id>.lock``, which the kernel drops when the
holder's process dies. An acquirer that obtains that lock while the stored
grant says its holder held it knows the holder is gone. A holder granted
the lease while another process momentarily had the lock (a hung
predecessor whose grant expired, or a contender being refused) runs without
it, its death then seen at expiry, and picks the lock up on a later
``renew`` once it is free.

Expiry compares wall-clock milliseconds of processes on one host. New tokens
are flushed to disk before a grant returns, even with ``durability=nosync``:
a token that went backwards after a host crash could be granted twice.

The live leases are listed (``lease_listing``) from one read transaction
over the ``leases`` database, in run id order; a grant whose holder took
the file lock counts while ``/proc/locks`` shows that holder's process
holding it (where ``/proc/locks`` is unreadable, a probe tells, as claims do).
"""

from __future__ import annotations

import fcntl
import functools
import os
import time
from typing import Final, final

import lmdb

from mayfly.backend import LeaseGuardBase, LeaseStoreBase, held_flocks
from mayfly.errors import JournalUnavailable, LeaseHeld, LeaseLost
from mayfly.lease import LeaseCapabilities, LeaseInfo
from mayfly_lmdb import _codec
from mayfly_lmdb._env import SharedEnv, acquire_env, off_hub, release_env
from mayfly_lmdb._url import parse_url

__all__ = ["LmdbLeaseGuard", "LmdbLeaseStore", "grant_in", "lease_live", "lock_held", "now_ms", "try_lock"]

_NOTE_LIMIT: Final = 512


def now_ms() -> int:
    """Wall-clock milliseconds: expiries are compared across processes of one host."""
    return time.time_ns() // 1_000_000


def grant_in(
    txn: lmdb.Transaction[bytes],
    shared: SharedEnv,
    run: bytes,
    run_id: str,
    *,
    owner: str,
    ttl_ms: int,
    locked: bool,
) -> int | _codec.LeaseState:
    """Grant the run's lease inside ``txn`` with a new, higher token; the live grant in the way, if any.

    The lease is free when no grant is stored, the stored one expired, or its
    holder held the run's file lock and this caller holds it now (``locked``):
    the holder is gone. The new token is written to the run's head, which
    every append checks in its own transaction.
    """
    now = now_ms()
    current = _codec.decode_lease(txn.get(run, db=shared.leases), run_id)
    if current is not None and not (current.locked and locked) and current.expires_ms > now:
        return current
    next_sequence, fence = _codec.decode_head(txn.get(run, db=shared.heads), run_id)
    token = fence + 1
    txn.put(run, _codec.encode_head(next_sequence, token), db=shared.heads)
    grant = _codec.LeaseState(
        token=token, expires_ms=now + ttl_ms, locked=locked, pid=os.getpid(), owner=owner
    )
    txn.put(run, _codec.encode_lease(grant), db=shared.leases)
    return token


def lock_held(path: str) -> bool:
    """Whether a process holds ``path``'s exclusive flock: a shared probe without waiting, released at once.

    The probe writes nothing: no note, no grant, no token. An acquirer that
    meets it in the instant it is held takes its grant without the lock.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except OSError as error:
        raise JournalUnavailable(f"cannot open lease file {path}: {error}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError as error:
        raise JournalUnavailable(
            f"cannot lock lease file {path}: {error}; keep the environment on a local filesystem"
        ) from None
    finally:
        os.close(fd)
    return False


def lease_live(
    txn: lmdb.Transaction[bytes], shared: SharedEnv, run: bytes, run_id: str, *, path: str, wall_ms: int
) -> bool:
    """Whether the run's stored grant is live: unexpired, and, if its holder took the file lock, still held.

    A holder that had the lock and lost it died (a release deletes the grant
    after dropping the lock), so its grant no longer counts.
    """
    current = _codec.decode_lease(txn.get(run, db=shared.leases), run_id)
    if current is None or current.expires_ms <= wall_ms:
        return False
    if not current.locked:
        return True  # its holder's death shows only at expiry
    if current.pid == os.getpid() and shared.locked_here.get(run) == current.token:
        return True
    return lock_held(path)


def try_lock(path: str, note: str) -> int | None:
    """Open ``path`` and take its exclusive flock without waiting; the descriptor, or None if held."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise JournalUnavailable(f"cannot open lease file {path}: {error}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError as error:
        os.close(fd)
        raise JournalUnavailable(
            f"cannot lock lease file {path}: {error}; keep the environment on a local filesystem"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, note.encode("ascii", "replace")[:_NOTE_LIMIT], 0)
    except OSError:
        pass  # the note is for operators only; the lock is what counts
    return fd


@final
class LmdbLeaseGuard(LeaseGuardBase[int | None]):
    """A granted LMDB-store recovery lease; renew it within its ttl, release it when done.

    Its grant is the descriptor holding the run's lock file, or ``None`` while
    another process has it (``_state`` guards it: LMDB calls never switch).
    """

    _store: LmdbLeaseStore

    @property
    def holds_lock(self) -> bool:
        """Whether this guard holds the run's OS file lock (its death is then seen at once)."""
        return self._grant is not None

    def _renew(self, ttl_ms: int) -> None:
        # The state lock is never held across the store call: that write parks a hub task (offload),
        # and another task of the same hub may release this guard meanwhile.
        with self._state:
            if self._grant is None:
                self._grant = try_lock(self._store._lock_path(self.run_id), self._note())
                if self._grant is not None:
                    self._store._holding(self, True)
            locked = self._grant is not None
        try:
            self._store._renew(self, ttl_ms, locked=locked)
        except LeaseLost:
            # The run belongs to another grant now: free the file lock for its holder.
            self._drop_lock()
            raise

    def _release(self) -> None:
        # Drop the file lock first: an acquirer that gets it while this grant (marked as holding
        # the lock) is still stored takes over at once, and holds the lock itself.
        self._drop_lock()
        self._store._release(self)

    def _drop_lock(self) -> None:
        with self._state:
            fd, self._grant = self._grant, None
            if fd is not None:
                self._store._holding(self, False)
                os.close(fd)

    def _note(self) -> str:
        return f"{self.owner} (pid {os.getpid()}, token {self.fencing_token})"


@final
class LmdbLeaseStore(LeaseStoreBase[LmdbLeaseGuard]):
    """Recovery leases of an ``lmdb:///DIR`` environment, shared with the journal of the same URL."""

    def __init__(self, url: str) -> None:
        target = parse_url(url)
        if target.readonly:
            assert target.source is not None
            raise target.source.invalid("readonly=true cannot serve leases: a grant writes its fencing token")
        self._shared: SharedEnv | None = acquire_env(target)
        super().__init__(url=target.url, capabilities=LeaseCapabilities.declare("lease_listing"))
        self._leases = os.path.join(target.path, "leases")
        try:
            os.makedirs(self._leases, exist_ok=True)
        except OSError as error:
            self.close()
            raise JournalUnavailable(f"cannot create lease directory {self._leases}: {error}") from None

    @property
    def _env(self) -> SharedEnv:
        shared = self._shared
        if shared is None:
            raise JournalUnavailable(f"use of the environment refused: lease store {self.url} is closed")
        return shared

    def _lock_path(self, run_id: str) -> str:
        return os.path.join(self._leases, f"{run_id}.lock")

    def _acquire(self, run_id: str, owner: str, ttl_ms: int) -> LmdbLeaseGuard:
        """Grant the run's lease now with a new, higher fencing token, or raise ``LeaseHeld``.

        The lease is free if it was released, expired, or its holder's process
        died while holding the run's file lock; acquiring never waits.
        """
        shared = self._env
        fd = try_lock(self._lock_path(run_id), f"{owner} (pid {os.getpid()}, acquiring)")
        locked = fd is not None
        run = _codec.run_key(run_id)

        def body(txn: lmdb.Transaction[bytes]) -> int | _codec.LeaseState:
            return grant_in(txn, shared, run, run_id, owner=owner, ttl_ms=ttl_ms, locked=locked)

        operation = f"lease grant of run {run_id}"
        try:
            outcome = shared.write(body, operation)
            if isinstance(outcome, _codec.LeaseState):
                raise LeaseHeld(
                    run_id,
                    f"{outcome.owner} (pid {outcome.pid}, token {outcome.token})",
                    expires_in_ms=max(0, outcome.expires_ms - now_ms()),
                )
            if not shared.sync:
                off_hub(shared.flush, operation)
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        return self.adopt(run_id, owner, ttl_ms, outcome, fd)

    def adopt(self, run_id: str, owner: str, ttl_ms: int, token: int, fd: int | None) -> LmdbLeaseGuard:
        """The guard of a grant committed with ``token`` (its file lock ``fd``), held by this store.

        ``acquire`` and the journal's claims build their guards here, so a
        claimed run's guard renews, releases and is released on ``close``
        like an acquired one.
        """
        guard = LmdbLeaseGuard(self, run_id, owner, token=token, ttl_ms=ttl_ms, grant=fd)
        if fd is not None:
            self._holding(guard, True)
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, guard._note().encode("ascii", "replace"), 0)
            except OSError:
                pass  # the note is for operators only
        with self._held_lock:
            self._held.add(guard)
        return guard

    def _holding(self, guard: LmdbLeaseGuard, held: bool) -> None:
        """Note that a guard of this process holds (or no longer holds) its run's file lock."""
        shared = self._shared
        if shared is None:
            return
        run = _codec.run_key(guard.run_id)
        if held:
            shared.locked_here[run] = guard.fencing_token
        elif shared.locked_here.get(run) == guard.fencing_token:
            del shared.locked_here[run]

    def lock_path(self, run_id: str) -> str:
        """The run's lock file, whose exclusive flock a live holder keeps."""
        return self._lock_path(run_id)

    def _renew(self, guard: LmdbLeaseGuard, ttl_ms: int, *, locked: bool) -> None:
        """Extend ``guard``'s grant if it is still the run's current one, else raise LeaseLost."""
        shared = self._env
        run_id = guard.run_id
        run = _codec.run_key(run_id)

        def body(txn: lmdb.Transaction[bytes]) -> None:
            current = _codec.decode_lease(txn.get(run, db=shared.leases), run_id)
            if current is None or current.token != guard.fencing_token:
                taker = f" by {current.owner} (token {current.token})" if current else ""
                raise guard.lost(f"expired and was taken over{taker}")
            renewed = _codec.LeaseState(
                token=current.token,
                expires_ms=now_ms() + ttl_ms,
                locked=locked,
                pid=os.getpid(),
                owner=current.owner,
            )
            txn.put(run, _codec.encode_lease(renewed), db=shared.leases)

        shared.write(body, f"lease renewal of run {run_id}")

    def _release(self, guard: LmdbLeaseGuard) -> None:
        """Delete ``guard``'s grant if it is still current; a taken-over grant is left alone."""
        shared = self._shared
        if shared is None:
            return
        run_id = guard.run_id
        run = _codec.run_key(run_id)

        def body(txn: lmdb.Transaction[bytes]) -> None:
            current = _codec.decode_lease(txn.get(run, db=shared.leases), run_id)
            if current is not None and current.token == guard.fencing_token:
                txn.delete(run, db=shared.leases)

        shared.write(body, f"lease release of run {run_id}")

    def _list_leases(self, after: str | None, limit: int) -> list[LeaseInfo]:
        """The unexpired grants after ``after`` in key (run id) order, from one read transaction.

        A grant whose holder took the run's file lock is live only while that
        holder still holds it (its death drops the lock): checked against
        ``/proc/locks`` after the transaction ended, or by a probe where that
        is unreadable. The scan stops at ``limit`` live grants; an expired
        grant in the way (a holder that died unlocked or hung) costs one read.
        """
        shared = self._env
        start = None if after is None else _codec.run_key(after)
        held = held_flocks()
        found: list[LeaseInfo] = []
        while len(found) < limit:
            wall = now_ms()
            read = functools.partial(self._grants, shared=shared, start=start, limit=limit, wall=wall)
            page = shared.read(read, "lease listing")
            for run, grant in page:
                if not grant.locked or self._still_locked(run, grant, held):
                    found.append(
                        LeaseInfo(
                            run_id=_codec.run_text(run),
                            owner=grant.owner,
                            fencing_token=grant.token,
                            expires_at_ms=grant.expires_ms,
                            expires_in_ms=grant.expires_ms - wall,
                        )
                    )
            if len(page) < limit:
                break
            start = page[-1][0]
        return found[:limit]

    @staticmethod
    def _grants(
        txn: lmdb.Transaction[bytes], shared: SharedEnv, start: bytes | None, limit: int, wall: int
    ) -> list[tuple[bytes, _codec.LeaseState]]:
        """Up to ``limit`` unexpired grants with keys after ``start``, in key order."""
        cursor = txn.cursor(db=shared.leases)
        positioned = cursor.first() if start is None else cursor.set_range(start)
        grants: list[tuple[bytes, _codec.LeaseState]] = []
        while positioned and len(grants) < limit:
            key = cursor.key()
            if key != start:
                grant = _codec.decode_lease(cursor.value(), _codec.run_text(key))
                if grant is not None and grant.expires_ms > wall:
                    grants.append((key, grant))
            positioned = cursor.next()
        return grants

    def _still_locked(self, run: bytes, grant: _codec.LeaseState, held: dict[int, set[int]] | None) -> bool:
        """Whether the holder of a grant that took the run's file lock holds it still."""
        path = self._lock_path(_codec.run_text(run))
        if held is None:
            return lock_held(path)
        try:
            inode = os.stat(path).st_ino
        except FileNotFoundError:
            return False
        except OSError as error:
            raise JournalUnavailable(f"cannot read lease file {path}: {error}") from None
        return grant.pid in held.get(inode, ())

    def _current_fence(self, run_id: str) -> int:
        shared = self._env
        run = _codec.run_key(run_id)
        value = shared.read(lambda txn: txn.get(run, db=shared.heads), f"fence of run {run_id}")
        return _codec.decode_head(value, run_id)[1]

    def _close(self) -> None:
        """Release this store's share of the environment."""
        shared, self._shared = self._shared, None
        if shared is not None:
            release_env(shared)
