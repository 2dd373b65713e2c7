"""``LmdbLeaseStore``: recovery leases from per-run OS file locks plus fencing tokens in the environment.

A lease is a non-blocking exclusive ``flock`` on ``DIR/leases/<run_id>.lock``.
The OS releases it when the holder closes it or its process dies, so a
crashed owner never blocks recovery and no clocks are compared. Expiry,
honestly: a lease is held until it is released or its process dies;
``ttl_ms`` is validated and otherwise unused, ``renew`` confirms the lease is
still held and not superseded, and the backend declares ``lease_expiry=False``.
A hung (not dead) holder therefore keeps its lease: the right trade-off for
processes sharing one host, where death is what the OS can observe.

Each grant bumps the run's fencing token in the run's head inside an LMDB
write transaction, the same kind of transaction appends check it in, so a
grant and an append are totally ordered across processes. The token is
flushed to disk before the grant returns even with ``durability=nosync``:
a token that went backwards after a host crash could be granted twice.
"""

from __future__ import annotations

import fcntl
import os
import threading
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


@final
class LmdbLeaseGuard:
    """A held LMDB-store recovery lease; release it (or leave the ``with`` block) when done."""

    __slots__ = ("_fd", "_lock", "_owner", "_run_id", "_store", "_token")

    def __init__(self, store: LmdbLeaseStore, run_id: str, owner: str, token: int, fd: int) -> None:
        self._store = store
        self._run_id = run_id
        self._owner = owner
        self._token = token
        self._fd: int | None = fd
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
        """Whether this guard still holds its lock."""
        return self._fd is not None

    def renew(self, ttl_ms: int | None = None) -> None:
        """Confirm the lease is still held and current (leases here do not expire); else LeaseLost."""
        if ttl_ms is not None:
            validate_acquire(self._run_id, self._owner, ttl_ms)
        with self._lock:
            if self._fd is None:
                raise LeaseLost(f"recovery lease of run {self._run_id} was released; acquire it again")
            current = self._store.current_fence(self._run_id)
            if current != self._token:
                raise LeaseLost(
                    f"recovery lease of run {self._run_id} was superseded: token {self._token} < "
                    f"current {current}; acquire it again"
                )

    def release(self) -> None:
        """Unlock and close the lease file; idempotent."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            self._store._forget(self)
            os.close(fd)  # closing the last descriptor drops the flock

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

    def acquire(self, run_id: str, owner: str, ttl_ms: int) -> LmdbLeaseGuard:
        """Take the run's lease now with a new, higher fencing token, or raise ``LeaseHeld``."""
        run_id, owner, _ = validate_acquire(run_id, owner, ttl_ms)
        shared = self._env
        path = os.path.join(self._leases, f"{run_id}.lock")
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise JournalUnavailable(f"cannot open lease file {path}: {error}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, _NOTE_LIMIT, 0).decode("ascii", "replace").strip() or None
            os.close(fd)
            raise LeaseHeld(run_id, holder) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            token = self._grant(shared, run_id)
            note = f"{owner} (pid {os.getpid()}, token {token})".encode("ascii", "replace")
            os.ftruncate(fd, 0)
            os.pwrite(fd, note, 0)
        except BaseException:
            os.close(fd)
            raise
        guard = LmdbLeaseGuard(self, run_id, owner, token, fd)
        with self._guard:
            self._held.add(guard)
        return guard

    @staticmethod
    def _grant(shared: SharedEnv, run_id: str) -> int:
        """Bump the run's fencing token in its head, durably even in ``nosync`` mode."""
        run = _codec.run_key(run_id)

        def body(txn: lmdb.Transaction[bytes]) -> int:
            next_sequence, fence = _codec.decode_head(txn.get(run, db=shared.heads), run_id)
            txn.put(run, _codec.encode_head(next_sequence, fence + 1), db=shared.heads)
            return fence + 1

        token = shared.write(body, f"lease grant of run {run_id}")
        if not shared.sync:
            shared.flush(f"lease grant of run {run_id}")
        return token

    def current_fence(self, run_id: str) -> int:
        """Return the newest token granted for the run (0 if never leased)."""
        run_id = parse_run_id(run_id)
        shared = self._env
        run = _codec.run_key(run_id)
        value = shared.read(lambda txn: txn.get(run, db=shared.heads), f"fence of run {run_id}")
        return _codec.decode_head(value, run_id)[1]

    def _forget(self, guard: LmdbLeaseGuard) -> None:
        with self._guard:
            self._held.discard(guard)

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
