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
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from types import TracebackType
from typing import Final, Self, final

import lmdb

from mayfly.lease import validate_acquire
from mayfly.model.errors import InvalidBackendURL, JournalUnavailable, LeaseHeld, LeaseLost
from mayfly.model.ids import parse_run_id
from mayfly_lmdb import _codec
from mayfly_lmdb._env import SharedEnv, acquire_env, release_env
from mayfly_lmdb._url import parse_url

__all__ = ["LmdbLeaseGuard", "LmdbLeaseStore"]

_NOTE_LIMIT: Final = 512


def _now_ms() -> int:
    # Wall-clock milliseconds: expiries are compared across processes of one host.
    return time.time_ns() // 1_000_000


def _try_lock(path: str, note: str) -> int | None:
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
class LmdbLeaseGuard:
    """A granted LMDB-store recovery lease; renew it within its ttl, release it when done."""

    __slots__ = ("_fd", "_lock", "_owner", "_released", "_run_id", "_store", "_token", "_ttl_ms")

    def __init__(
        self, store: LmdbLeaseStore, run_id: str, owner: str, *, token: int, ttl_ms: int, fd: int | None
    ) -> None:
        self._store = store
        self._run_id = run_id
        self._owner = owner
        self._token = token
        self._ttl_ms = ttl_ms
        self._fd = fd
        self._released = False
        self._lock = threading.Lock()

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
        """This grant's fencing token; pass it as ``fence`` to every append."""
        return self._token

    @property
    def held(self) -> bool:
        """Whether this guard was not released (it may still have expired and been taken over)."""
        return not self._released

    @property
    def holds_lock(self) -> bool:
        """Whether this guard holds the run's OS file lock (its death is then seen at once)."""
        return self._fd is not None

    def renew(self, ttl_ms: int | None = None) -> None:
        """Extend the lease by ``ttl_ms`` (default: the acquire ttl); LeaseLost if released or taken over."""
        ttl = self._ttl_ms if ttl_ms is None else validate_acquire(self._run_id, self._owner, ttl_ms)[2]
        with self._lock:
            if self._released:
                raise LeaseLost(f"recovery lease of run {self._run_id} was released; acquire it again")
            if self._fd is None:
                self._fd = _try_lock(self._store._lock_path(self._run_id), self._note())
            try:
                self._store._renew(self, ttl, locked=self._fd is not None)
            except LeaseLost:
                # The run belongs to another grant now: free the file lock for its holder.
                fd, self._fd = self._fd, None
                if fd is not None:
                    os.close(fd)
                raise

    def release(self) -> None:
        """Give the lease up (idempotent); a grant already taken over is left to its new owner."""
        with self._lock:
            if self._released:
                return
            self._released = True
            fd, self._fd = self._fd, None
        if fd is not None:
            # Drop the file lock first: an acquirer that gets it while this grant (marked as
            # holding the lock) is still stored takes over at once, and holds the lock itself.
            os.close(fd)
        self._store._release(self)

    def _note(self) -> str:
        return f"{self._owner} (pid {os.getpid()}, token {self._token})"

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
        return f"LmdbLeaseGuard(run_id={self._run_id!r}, token={self._token}, held={self.held})"


@final
class LmdbLeaseStore:
    """Recovery leases of an ``lmdb:///DIR`` environment, shared with the journal of the same URL."""

    def __init__(self, url: str) -> None:
        target = parse_url(url)
        if target.readonly:
            raise InvalidBackendURL(
                f"lmdb lease URL {url!r} is readonly=true; granting a lease writes its fencing token"
            )
        self._url = target.url
        self._held: set[LmdbLeaseGuard] = set()
        self._guard = threading.Lock()
        self._shared: SharedEnv | None = acquire_env(target)
        self._leases = os.path.join(target.path, "leases")
        try:
            os.makedirs(self._leases, exist_ok=True)
        except OSError as error:
            self.close()
            raise JournalUnavailable(f"cannot create lease directory {self._leases}: {error}") from None

    @property
    def url(self) -> str:
        """The store URL."""
        return self._url

    @property
    def _env(self) -> SharedEnv:
        shared = self._shared
        if shared is None:
            raise JournalUnavailable(f"lmdb lease store {self._url} is closed; open it again")
        return shared

    def _lock_path(self, run_id: str) -> str:
        return os.path.join(self._leases, f"{run_id}.lock")

    def acquire(self, run_id: str, owner: str, ttl_ms: int) -> LmdbLeaseGuard:
        """Grant the run's lease now with a new, higher fencing token, or raise ``LeaseHeld``.

        The lease is free if it was released, expired, or its holder's process
        died while holding the run's file lock; acquiring never waits.
        """
        run_id, owner, ttl = validate_acquire(run_id, owner, ttl_ms)
        shared = self._env
        fd = _try_lock(self._lock_path(run_id), f"{owner} (pid {os.getpid()}, acquiring)")
        locked = fd is not None
        run = _codec.run_key(run_id)

        def body(txn: lmdb.Transaction[bytes]) -> int | _codec.LeaseState:
            now = _now_ms()
            current = _codec.decode_lease(txn.get(run, db=shared.leases), run_id)
            # A holder that held the file lock, whose lock this acquirer now holds, is gone.
            if current is not None and not (current.locked and locked) and current.expires_ms > now:
                return current
            next_sequence, fence = _codec.decode_head(txn.get(run, db=shared.heads), run_id)
            token = fence + 1
            txn.put(run, _codec.encode_head(next_sequence, token), db=shared.heads)
            grant = _codec.LeaseState(
                token=token, expires_ms=now + ttl, locked=locked, pid=os.getpid(), owner=owner
            )
            txn.put(run, _codec.encode_lease(grant), db=shared.leases)
            return token

        try:
            outcome = shared.write(body, f"lease grant of run {run_id}")
            if isinstance(outcome, _codec.LeaseState):
                raise LeaseHeld(run_id, f"{outcome.owner} (pid {outcome.pid}, token {outcome.token})")
            if not shared.sync:
                shared.flush(f"lease grant of run {run_id}")
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        guard = LmdbLeaseGuard(self, run_id, owner, token=outcome, ttl_ms=ttl, fd=fd)
        if fd is not None:
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, guard._note().encode("ascii", "replace"), 0)
            except OSError:
                pass  # the note is for operators only
        with self._guard:
            self._held.add(guard)
        return guard

    def _renew(self, guard: LmdbLeaseGuard, ttl_ms: int, *, locked: bool) -> None:
        """Extend ``guard``'s grant if it is still the run's current one, else raise LeaseLost."""
        shared = self._env
        run_id = guard.run_id
        run = _codec.run_key(run_id)

        def body(txn: lmdb.Transaction[bytes]) -> None:
            current = _codec.decode_lease(txn.get(run, db=shared.leases), run_id)
            if current is None or current.token != guard.fencing_token:
                raise LeaseLost(
                    f"recovery lease of run {run_id} (token {guard.fencing_token}) expired and was "
                    f"taken over{f' by {current.owner} (token {current.token})' if current else ''}; "
                    "acquire it again"
                )
            renewed = _codec.LeaseState(
                token=current.token,
                expires_ms=_now_ms() + ttl_ms,
                locked=locked,
                pid=os.getpid(),
                owner=current.owner,
            )
            txn.put(run, _codec.encode_lease(renewed), db=shared.leases)

        shared.write(body, f"lease renewal of run {run_id}")

    def _release(self, guard: LmdbLeaseGuard) -> None:
        """Delete ``guard``'s grant if it is still current; a taken-over grant is left alone."""
        with self._guard:
            self._held.discard(guard)
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

    def current_fence(self, run_id: str) -> int:
        """Return the newest token granted for the run (0 if never leased)."""
        run_id = parse_run_id(run_id)
        shared = self._env
        run = _codec.run_key(run_id)
        value = shared.read(lambda txn: txn.get(run, db=shared.heads), f"fence of run {run_id}")
        return _codec.decode_head(value, run_id)[1]

    def close(self) -> None:
        """Release every lease this store still holds and its share of the environment."""
        with self._guard:
            held = list(self._held)
        for guard in held:
            guard.release()
        shared, self._shared = self._shared, None
        if shared is not None:
            release_env(shared)

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
        return f"LmdbLeaseStore({self._url!r})"
