"""``LocalLeaseStore``: recovery leases from OS file locks plus a persistent fencing counter.

A lease is a non-blocking exclusive ``flock`` on ``leases/<run_id>.lock``.
The OS releases it when the holder closes it or its process dies, so a
crashed owner never blocks recovery, and there is no clock involved.
Expiry semantics, honestly: a local lease is held until it is released or its
process dies; ``ttl_ms`` is accepted and ignored, ``renew`` only confirms the
lease is still held, and the backend declares ``lease_expiry=False``. A hung
(not dead) holder therefore keeps its lease; that is the price of needing no
clock agreement and the right trade-off for one host.

Each grant bumps the run's fencing counter (``fences/<run_id>``, written
durably) while holding the run file's exclusive ``flock``, the same lock
appends take, so a grant and an append are totally ordered and an append
carrying an older token is rejected by the journal.
"""

from __future__ import annotations

import fcntl
import os
import threading
from types import TracebackType
from typing import Self, final

from mayfly.lease import validate_acquire
from mayfly.local._store import (
    Layout,
    locked,
    open_run_file,
    parse_url,
    read_fence,
    write_fence,
)
from mayfly.model.errors import JournalUnavailable, LeaseHeld, LeaseLost
from mayfly.model.ids import parse_run_id

__all__ = ["LocalLeaseGuard", "LocalLeaseStore"]


@final
class LocalLeaseGuard:
    """A held local recovery lease; release it (or leave the ``with`` block) when done."""

    __slots__ = ("_fd", "_lock", "_owner", "_run_id", "_store", "_token")

    def __init__(self, store: LocalLeaseStore, run_id: str, owner: str, token: int, fd: int) -> None:
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
        """Confirm the lease is still held (local leases do not expire); else raise LeaseLost."""
        del ttl_ms  # local leases last until release or process death
        with self._lock:
            if self._fd is None:
                raise LeaseLost(f"recovery lease of run {self._run_id} was released; acquire again")
            current = self._store.current_fence(self._run_id)
            if current != self._token:
                raise LeaseLost(
                    f"recovery lease of run {self._run_id} was superseded: token "
                    f"{self._token} < current {current}"
                )

    def release(self) -> None:
        """Unlock and close the lease file; idempotent."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            self._store._forget(self)
            os.close(fd)  # closing drops the flock

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
        return f"LocalLeaseGuard(run_id={self._run_id!r}, token={self._token}, held={self.held})"


@final
class LocalLeaseStore:
    """Recovery leases of a ``file://DIR`` store, shared with the journal of the same directory."""

    def __init__(self, url: str) -> None:
        target = parse_url(url)
        self._url = target.url
        self._layout = Layout(target.root)
        self._layout.prepare()
        self._held: set[LocalLeaseGuard] = set()
        self._guard = threading.Lock()
        self._closed = False

    @property
    def url(self) -> str:
        """The store URL."""
        return self._url

    def acquire(self, run_id: str, owner: str, ttl_ms: int) -> LocalLeaseGuard:
        """Take the run's lease now with a new, higher fencing token, or raise ``LeaseHeld``."""
        run, owner, _ = validate_acquire(run_id, owner, ttl_ms)
        if self._closed:
            raise JournalUnavailable(f"lease store {self._url} is closed")
        path = self._layout.lease_file(run)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("ascii", "replace").strip() or None
            os.close(fd)
            raise LeaseHeld(run, holder) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            token = self._grant(run)
            note = f"{owner} (pid {os.getpid()}, token {token})".encode("ascii", "replace")
            os.ftruncate(fd, 0)
            os.pwrite(fd, note, 0)
        except BaseException:
            os.close(fd)
            raise
        guard = LocalLeaseGuard(self, run, owner, token, fd)
        with self._guard:
            self._held.add(guard)
        return guard

    def _grant(self, run_id: str) -> int:
        """Bump the run's fencing counter under the run file's exclusive lock."""
        run_fd = open_run_file(self._layout, run_id, create=True)
        assert run_fd is not None  # created when absent
        try:
            with locked(run_fd, fcntl.LOCK_EX):
                token = read_fence(self._layout, run_id) + 1
                write_fence(self._layout, run_id, token)
                return token
        finally:
            os.close(run_fd)

    def current_fence(self, run_id: str) -> int:
        """Return the newest token granted for the run (0 if never leased)."""
        return read_fence(self._layout, parse_run_id(run_id))

    def _forget(self, guard: LocalLeaseGuard) -> None:
        with self._guard:
            self._held.discard(guard)

    def close(self) -> None:
        """Release every lease this store still holds."""
        self._closed = True
        with self._guard:
            held = list(self._held)
        for guard in held:
            guard.release()

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
        return f"LocalLeaseStore({self._url!r})"
