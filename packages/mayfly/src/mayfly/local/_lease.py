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

Listing the live leases (``lease_listing``, declared where the kernel lists
held locks in ``/proc/locks``, i.e. on Linux) takes no lock at all: a lease
is live when ``/proc/locks`` shows an exclusive ``flock`` on its lock file's
inode, taken by the process the holder note names. Probing each file with a
lock of its own would refuse a concurrent ``acquire`` (it cannot wait), and
would cost a system call per run ever leased. Leases held by processes of
another PID namespace (another container on the same volume) are not shown.
"""

from __future__ import annotations

import fcntl
import os
import re
from typing import Final, final

from mayfly.backend import PROC_LOCKS, LeaseGuardBase, LeaseStoreBase, held_flocks
from mayfly.journal import Durability
from mayfly.lease import LeaseCapabilities, LeaseInfo
from mayfly.local._store import (
    Layout,
    locked,
    off_hub,
    open_run_file,
    parse_url,
    read_fence,
    write_fence,
)
from mayfly.model.errors import CorruptionError, JournalUnavailable, LeaseHeld

__all__ = ["LocalLeaseGuard", "LocalLeaseStore"]

_RUN_ID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# The holder note _take writes into the lock file, owner first: the pid and token end it.
_NOTE: Final = re.compile(r"(?s)(.+) \(pid (\d+), token (\d+)\)")


@final
class LocalLeaseGuard(LeaseGuardBase[int]):
    """A held local recovery lease; release it (or leave the ``with`` block) when done.

    Its grant is the descriptor holding the lease file's ``flock``. ``renew``
    only confirms the lease is still held: local leases last until release or
    process death, so ``ttl_ms`` is accepted and ignored.
    """

    _store: LocalLeaseStore

    def _renew(self, ttl_ms: int) -> None:
        current = self._store.current_fence(self.run_id)
        if current != self.fencing_token:
            raise self.lost(f"was superseded: token {self.fencing_token} < current {current}")

    def _release(self) -> None:
        os.close(self._grant)  # closing drops the flock


@final
class LocalLeaseStore(LeaseStoreBase[LocalLeaseGuard]):
    """Recovery leases of a ``file://DIR`` store, shared with the journal of the same directory."""

    def __init__(self, url: str) -> None:
        target = parse_url(url)
        self._layout = Layout(target.root)
        self._layout.prepare()
        self._durable = target.durability is Durability.DURABLE
        listing = os.access(PROC_LOCKS, os.R_OK)
        super().__init__(url=target.url, capabilities=LeaseCapabilities(lease_listing=listing))

    def _acquire(self, run_id: str, owner: str, ttl_ms: int) -> LocalLeaseGuard:
        """Take the run's lease now with a new, higher fencing token, or raise ``LeaseHeld``.

        In ``fsync`` mode the token is written durably, so from a hub task this
        runs on an offload thread; otherwise it takes no sync and runs inline.
        """
        if not self._durable:
            return self._take(run_id, owner, ttl_ms)
        return off_hub(self._take, run_id, owner, ttl_ms)

    def _take(self, run_id: str, owner: str, ttl_ms: int) -> LocalLeaseGuard:
        path = self._layout.lease_file(run_id)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("ascii", "replace").strip() or None
            os.close(fd)
            raise LeaseHeld(run_id, holder) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            token = self._grant(run_id)
            note = f"{owner} (pid {os.getpid()}, token {token})".encode("ascii", "replace")
            os.ftruncate(fd, 0)
            os.pwrite(fd, note, 0)
        except BaseException:
            os.close(fd)
            raise
        return LocalLeaseGuard(self, run_id, owner, token=token, ttl_ms=ttl_ms, grant=fd)

    def _grant(self, run_id: str) -> int:
        """Bump the run's fencing counter under the run file's exclusive lock."""
        run_fd = open_run_file(self._layout, run_id, create=True, durable=self._durable)
        assert run_fd is not None  # created when absent
        try:
            with locked(run_fd, fcntl.LOCK_EX):
                token = read_fence(self._layout, run_id) + 1
                write_fence(self._layout, run_id, token, durable=self._durable)
                return token
        finally:
            os.close(run_fd)

    def _current_fence(self, run_id: str) -> int:
        return read_fence(self._layout, run_id)

    def _list_leases(self, after: str | None, limit: int) -> list[LeaseInfo]:
        """The held lease files, by ``/proc/locks`` (see the module docstring); reads only, off the hub."""
        return off_hub(self._listed, after, limit)

    def _listed(self, after: str | None, limit: int) -> list[LeaseInfo]:
        held = held_flocks()
        if held is None:
            raise JournalUnavailable(f"listing leases of {self.url} needs {PROC_LOCKS}, which is unreadable")
        if not held:
            return []
        candidates: list[tuple[str, set[int]]] = []
        try:
            with os.scandir(self._layout.leases) as entries:
                for entry in entries:
                    # The inode comes with the directory entry: no system call per lease file.
                    pids = held.get(entry.inode())
                    run_id = entry.name.removesuffix(".lock")
                    if pids is None or _RUN_ID.fullmatch(run_id) is None:
                        continue
                    if after is not None and run_id <= after:
                        continue
                    candidates.append((run_id, pids))
        except OSError as error:
            raise JournalUnavailable(f"lease listing of {self.url}: {error}") from None
        candidates.sort()
        found: list[LeaseInfo] = []
        for run_id, pids in candidates:
            lease = self._holder(run_id, pids)
            if lease is not None:
                found.append(lease)
                if len(found) == limit:
                    break
        return found

    def _holder(self, run_id: str, pids: set[int]) -> LeaseInfo | None:
        """The lease of a locked lease file, if its note names a holding process and the run's current token.

        A note of another process or an older token belongs to a grant being
        made (or to a purge's momentary lock): that lease is not listed yet.
        """
        try:
            fd = os.open(self._layout.lease_file(run_id), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            note = os.pread(fd, 512, 0).decode("ascii", "replace")
        finally:
            os.close(fd)
        written = _NOTE.fullmatch(note)
        if written is None or int(written.group(2)) not in pids:
            return None
        token = int(written.group(3))
        try:
            if read_fence(self._layout, run_id) != token:
                return None
        except CorruptionError:
            return None  # the run's own reads say so; a listing shows what it can
        return LeaseInfo(
            run_id=run_id, owner=written.group(1), fencing_token=token, expires_at_ms=None, expires_in_ms=None
        )

    def _close(self) -> None:
        """Nothing to release beyond the held leases (the base released them)."""
