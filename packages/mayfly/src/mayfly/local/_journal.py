"""``LocalWorkflowJournal``: the embedded default journal, append-only MWJ2 files per run.

Deviation from ADR-0032 Story 1.6. The ADR's local format replaces the whole
per-run journal file through a same-directory temporary file on every append.
That costs O(history) bytes written and fsynced per append, so a run with
100k events rewrites gigabytes. This journal appends frames instead and keeps
the ADR's guarantees:

* Atomic batches: every frame names its batch's last sequence; a batch counts
  only once its closing frame is complete, so a crash mid-batch leaves a torn
  tail that is ignored by readers and truncated by the next writer, never a
  half-applied batch.
* Acknowledgement after the declared durability: ``write`` and ``flush``
  return after the frames are handed to the OS with one unbuffered
  ``os.write`` (this journal has no userspace buffer, so the two are the
  same and both survive the process being killed); ``fsync`` also calls
  ``fdatasync`` on the file, and fsyncs the directory when the file is new.
* Fail closed: only a genuine torn tail — the prefix of one batch, cut at
  the physical end of the file, with no valid frame after the cut (see
  :mod:`mayfly.local._frames`) — is treated as never acknowledged. Every byte
  of a frame is covered by a CRC-32 (version-2 frames check their header
  separately, so a damaged length is told apart from a torn write); a bad
  magic, header, length or CRC, a gap or a duplicate raises and names the
  run, the offset and the last good sequence. Bytes that might hold an
  acknowledged record are never truncated or overwritten: evidence that
  committed bytes are gone (an intact offset hint, or a snapshot, that
  reaches beyond the file) raises :class:`~mayfly.model.errors.HistoryLost`.
* Cross-process safety, beyond the ADR: an exclusive ``flock`` on the run
  file makes compare-and-append atomic across processes, and a shared one
  keeps readers from seeing a batch while it is being written.

An in-process index (frame offsets, event ids) keeps appends
O(batch); it is refreshed from the file's tail when another process grew it.
It is built in two strengths, so that opening a long run to read its end
costs the end, not the history:

* Readers (``read``, ``next_sequence``) get a *located* index: frame offsets
  from the run's MWX2 hint (``snapshots/<run>.idx``, written beside each
  snapshot) and a header-only walk of the frames after it (magic, length and
  header CRC; no body CRC, no JSON). The batch boundary at the end is found by verifying and
  decoding backwards from the last complete frame to the nearest one that
  closes its batch. Every frame a read returns is CRC-checked, decoded and
  checked for its sequence, so damage to a returned record fails closed.
  The hint is trusted only if it names this file's inode, ends inside the
  file, and its last frame verifies as a batch end with the right sequence;
  if a read through hinted offsets still fails, the frames are located again
  from the file alone and the read is retried once. When locating fails
  (a gap or damage inside the history), the whole file is scanned so the
  error names the record where it is.
* Writers (``append``, the fault hooks) get a *verified* index, built under
  the exclusive lock: every frame CRC-checked and decoded, order and
  event-id uniqueness over the whole history checked, and only then a torn
  tail truncated. So the first append after open costs one full scan, as
  before; :meth:`LocalWorkflowJournal.verify_run` runs the same check on
  demand (``mayfly replay``).
"""

from __future__ import annotations

import fcntl
import functools
import os
import threading
import time
import weakref
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any, Final, TypeAlias, final

from mayfly.backend import FifoWakeupListener, JournalBase, notify_fifo_wakeups
from mayfly.journal import (
    AppendResult,
    Durability,
    JournalCapabilities,
    JournalRecord,
    SnapshotRecord,
)
from mayfly.lease import RecoveryLeaseGuard
from mayfly.local import _frames
from mayfly.local._index import LocalRunIndex
from mayfly.local._lease import LocalLeaseStore
from mayfly.local._schedules import LocalSchedules
from mayfly.local._store import (
    MAX_FENCE_TEXT,
    Layout,
    check_durability,
    locked,
    off_hub,
    open_run_file,
    parse_fence,
    parse_url,
    read_whole,
    sync_data,
    sync_directory,
)
from mayfly.model.errors import (
    CorruptionError,
    HistoryLost,
    InvalidRecord,
    JournalUnavailable,
    LeaseHeld,
)
from mayfly.model.ids import is_uuid, parse_run_id
from mayfly.queues import QueueSettings, QueueUsage, check_held, plan_claim
from mayfly.queues import check_queue_name as _check_queue
from mayfly.runindex import IndexEntry, IndexStatus, check_claim
from mayfly.substrate import GroupCommit

__all__ = ["LocalWorkflowJournal"]

_INDEX_CACHE_LIMIT: Final = 1024
# Run files and fencing counters kept open, each (about twice this many descriptors at most).
_OPEN_FILES_LIMIT: Final = 128
_SCAN_WINDOW: Final = 4 << 20
# Leases never expire here: a local lease lasts until release or process death.
_FEATURES: Final = (
    "cross_process fencing crash_durable fault_injection snapshots run_verification run_purge run_index "
    "run_wakeups queue_control schedule_store"
)
_QUEUE_LOCK: Final = "queues.lock"
_LISTING_SETTLE_NS: Final = 2_000_000_000
# Group flushes of one hub that may run at once: ext4's journal merges concurrent fdatasyncs into
# shared commits (measured: 100 files synced from 4 threads take 0.43x the time of one thread).
_GROUP_FLUSHERS: Final = 8
_Item: TypeAlias = tuple[str, int, tuple[JournalRecord, ...], int | None, Callable[[], IndexEntry] | None]
"""One queued append: run id, expected next sequence, batch, fencing token, run-index entry maker."""


@final
class LocalWorkflowJournal(LocalSchedules, JournalBase):
    """The ``file://DIR`` journal: one append-only journal file per run, safe across threads and processes.

    ``DIR`` is created on first use. ``?durability=fsync`` (the default),
    ``flush`` or ``write`` selects when appends are acknowledged; ``fsync`` on
    tmpfs/ramfs is refused with ``DurabilityUnavailable``, since fsync keeps
    nothing there. Declares cross-process, fenced, crash-durable, fault
    injection, run verification and purging; leases never expire.
    """

    remedy = "restore the run's journal file from a backup"

    def __init__(self, url: str) -> None:
        target = parse_url(url)
        check_durability(target)
        self._durability = target.durability
        self._durable_files = target.durability is Durability.DURABLE
        self._layout = Layout(target.root)
        self._layout.prepare()
        self._guard = threading.Lock()
        # Per-run thread locks, counted so a run's entry goes once no thread holds or waits for it:
        # a worker serving millions of runs keeps only the locks in use.
        self._run_locks: dict[str, list[Any]] = {}
        self._indexes: dict[str, _frames.RunIndex] = {}
        # Run files and fencing counters kept open across appends (see _run_file and _fence).
        self._files: dict[str, int] = {}
        self._fences: dict[str, int] = {}
        self._listing: tuple[tuple[int, int], list[str]] | None = None
        self._index_db: LocalRunIndex | None = None
        self._leases: LocalLeaseStore | None = None
        self._group: GroupCommit[_Item, AppendResult] = GroupCommit(
            self._flush_group, name="file-journal", flushers=_GROUP_FLUSHERS, key=_run_of
        )
        super().__init__(
            url=target.url, capabilities=JournalCapabilities.declare(target.durability, _FEATURES)
        )
        _OPEN_JOURNALS.add(self)

    @property
    def root(self) -> str:
        """The store directory."""
        return str(self._layout.root)

    # -- locking and the index ------------------------------------------------------------

    def _run_lock(self, run_id: str) -> threading.Lock:
        """The run's thread lock, counted as in use until :meth:`_run_unlock` (lock it after this)."""
        with self._guard:
            entry = self._run_locks.get(run_id)
            if entry is None:
                entry = self._run_locks[run_id] = [threading.Lock(), 0]
            entry[1] += 1
            lock: threading.Lock = entry[0]
            return lock

    def _run_unlock(self, run_id: str) -> None:
        """Done with the run's lock (released): forget it if no other thread uses it."""
        with self._guard:
            entry = self._run_locks[run_id]
            entry[1] -= 1
            if entry[1] == 0:
                del self._run_locks[run_id]

    def _run_file(self, run_id: str) -> tuple[int, bool]:
        """The run's journal file, open for appending, and whether this call created it.

        The caller holds the run's thread lock (:meth:`_run_lock`). The
        descriptor stays open for the next append (two system calls fewer per
        append): run files are never unlinked or replaced here (a purge
        empties one in place). One removed from outside while kept open is
        found by :meth:`_index` (no links left), which fails closed; the
        caller then drops the descriptor. A new file's directory entry is
        fsynced by the caller (once per group).
        """
        fd = self._existing_file(run_id)
        if fd is not None:
            return fd, False
        fd = open_run_file(self._layout, run_id, create=True, durable=False)
        assert fd is not None  # created when absent
        self._keep(self._files, run_id, fd)
        return fd, True

    def _existing_file(self, run_id: str) -> int | None:
        """The run's journal file (kept open, see :meth:`_run_file`), or ``None`` if it has none.

        The caller holds the run's thread lock. Readers share the descriptor
        with appends: one journal's readers and writers of a run are serialised
        by that lock, so a shared and an exclusive ``flock`` on it never overlap.
        """
        fd = self._files.get(run_id)
        if fd is None:
            fd = open_run_file(self._layout, run_id, create=False)
            if fd is not None:
                self._keep(self._files, run_id, fd)
        return fd

    def _fence(self, run_id: str) -> int:
        """The run's current fencing token (0 if it was never leased); the caller holds its thread lock.

        A counter file, once created, is only ever rewritten in place
        (:func:`~mayfly.local._store.write_fence`), so its descriptor is kept
        open and each append reads the token with one ``pread``.
        """
        fd = self._fences.get(run_id)
        if fd is None:
            try:
                fd = os.open(self._layout.fence_path(run_id), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return 0
            self._keep(self._fences, run_id, fd)
        return parse_fence(run_id, os.pread(fd, MAX_FENCE_TEXT, 0))

    def _keep(self, table: dict[str, int], run_id: str, fd: int) -> None:
        """Keep ``fd`` open in ``table``; close the oldest kept descriptors of runs no thread is using."""
        with self._guard:
            table[run_id] = fd
            if len(table) <= _OPEN_FILES_LIMIT:
                return
            # A run no thread holds or waits for has no lock entry: nobody is using its descriptor.
            idle = [run for run in table if run not in self._run_locks][: len(table) - _OPEN_FILES_LIMIT]
            for run in idle:
                os.close(table.pop(run))

    def _drop_files(self, run_id: str | None = None) -> None:
        """Close the kept descriptors (of ``run_id``, or all); the caller holds the run's lock or closes."""
        with self._guard:
            for table in (self._files, self._fences):
                for run in [run_id] if run_id is not None else list(table):
                    fd = table.pop(run, None)
                    if fd is not None:
                        os.close(fd)

    def _after_fork(self) -> None:
        """In a forked child: forget the parent's descriptors without using them.

        A descriptor shared across a fork shares its ``flock``: the child
        locking it would not exclude the parent. Closing the child's copies
        leaves the parent's locks and files as they were.
        """
        for table in (self._files, self._fences):
            for fd in table.values():
                with suppress(OSError):
                    os.close(fd)
            table.clear()
        self._guard = threading.Lock()  # a lock held in the parent at the fork stays held in the child
        self._run_locks = {}

    @contextmanager
    def _run(self, run_id: str) -> Iterator[None]:
        lock = self._run_lock(run_id)
        try:
            with lock:
                yield
        finally:
            self._run_unlock(run_id)

    def _index(self, run_id: str, fd: int, *, exclusive: bool, hint: bool = True) -> _frames.RunIndex:
        """Return the run's index, brought up to date with the file (caller holds its flock).

        ``exclusive`` (a writer holding ``LOCK_EX``) gets a verified index: every
        frame CRC-checked and decoded, every event id known, and a torn tail cut.
        Readers get a located index: frame offsets from the MWX2 hint and a
        header-only walk, with the last committed frame verified; they verify
        each frame they return.
        """
        stat = os.fstat(fd)
        if not stat.st_nlink:
            # Only a kept descriptor (see _run_file) can outlive its file's name.
            self._forget(run_id)
            raise HistoryLost(
                run_id,
                "its journal file was removed while this process had it open",
                remedy=f"restore {self._layout.run_file(run_id)} from a backup",
            )
        with self._guard:
            index = self._indexes.get(run_id)
        if index is not None and index.inode == stat.st_ino and stat.st_size < index.end:
            # Nothing in this journal cuts a file below a committed end it has seen.
            self._forget(run_id)
            raise HistoryLost(
                run_id,
                f"its journal file shrank to {stat.st_size} bytes while {len(index.offsets)} "
                f"committed records ended at byte {index.end}",
                remedy=f"restore {self._layout.run_file(run_id)} from a backup",
            )
        if index is not None and index.inode == stat.st_ino and (index.verified or not exclusive):
            if stat.st_size == index.size and not index.torn:
                return index
            base = index.end
        else:
            index = None
            base = 0
        try:
            if exclusive or (index is not None and index.verified):
                if index is None:
                    index = _frames.RunIndex(inode=stat.st_ino, verified=True)
                self._scan(run_id, fd, index, base, stat.st_size)
            else:
                index = self._located(run_id, fd, stat, index, base, hint=hint)
        except BaseException:
            self._forget(run_id)
            raise
        if index.torn and exclusive:
            # The tail is a batch whose closing frame never reached the file, so
            # no append of it was acknowledged: drop it before writing after it.
            os.ftruncate(fd, index.end)
            if self._durability is Durability.DURABLE:
                sync_data(fd)
            index.size = index.end
        with self._guard:
            if len(self._indexes) >= _INDEX_CACHE_LIMIT and run_id not in self._indexes:
                self._indexes.pop(next(iter(self._indexes)))
            self._indexes[run_id] = index
        return index

    @staticmethod
    def _scan(run_id: str, fd: int, index: _frames.RunIndex, base: int, size: int) -> None:
        """Scan the file from ``base`` to ``size`` in bounded windows (memory stays O(window)).

        Bytes left after the last committed batch must be a genuine torn tail
        (:func:`mayfly.local._frames.check_torn_tail`), or the scan fails closed.
        """
        index.end = base
        window = _SCAN_WINDOW
        while index.end < size:
            start = index.end
            length = min(window, size - start)
            _frames.scan(index, os.pread(fd, length, start), start, run_id)
            if start + length >= size:
                break  # reached the end: whatever is left past index.end must be a torn tail
            # A batch larger than the window made no progress: widen the window for it.
            window = _SCAN_WINDOW if index.end > start else window * 2
        index.size = size
        if index.torn:
            _frames.check_torn_tail(
                os.pread(fd, size - index.end, index.end), index.end, run_id, index.next_sequence
            )

    def _located(
        self,
        run_id: str,
        fd: int,
        stat: os.stat_result,
        index: _frames.RunIndex | None,
        base: int,
        *,
        hint: bool,
    ) -> _frames.RunIndex:
        """Bring a located index up to date, or build one; fall back to a full scan if it fails.

        A located index counts frames by their headers and verifies only the
        last one, so a missing, repeated or damaged record inside the history
        shows up far from where it is (a gap after record 4 of 9 would be
        reported at the end as "expected 8, found 9"). On any such failure the
        whole file is scanned and verified, which either raises the error at
        the record where it is, or — when only a hint misled the walk — yields
        a verified index.
        """
        try:
            if index is None:
                return self._locate(run_id, fd, stat, hint=hint)
            self._walk(run_id, fd, index, base, stat.st_size)
            return index
        except HistoryLost:
            raise
        except CorruptionError:
            verified = _frames.RunIndex(inode=stat.st_ino, verified=True)
            self._scan(run_id, fd, verified, 0, stat.st_size)
            return verified

    def _locate(self, run_id: str, fd: int, stat: os.stat_result, *, hint: bool) -> _frames.RunIndex:
        """Build a located index: offsets from a hint that matches the file, then a walk of the rest."""
        index = self._load_hint(run_id, fd, stat) if hint else None
        if index is None:
            index = _frames.RunIndex(inode=stat.st_ino)
        self._walk(run_id, fd, index, index.end, stat.st_size)
        return index

    def _load_hint(self, run_id: str, fd: int, stat: os.stat_result) -> _frames.RunIndex | None:
        """The run's MWX2 hint as an index, if it names this file and its last frame checks out.

        A hint is a guess about offsets, so one that does not match is ignored,
        with one exception: an intact hint for this very file (same inode) that
        ends beyond the file's size proves that committed bytes were cut off,
        since nothing in this journal ever shortens a file below a committed
        end. That fails closed with :class:`HistoryLost`.
        """
        try:
            data = read_whole(self._layout.hint_path(run_id))
        except OSError:
            return None
        if data is None:
            return None
        decoded = _frames.decode_hint(data)
        if decoded is None:
            return None
        inode, end, offsets = decoded
        if inode != stat.st_ino:
            return None
        if end > stat.st_size:
            raise HistoryLost(
                run_id,
                f"its offset hint records {len(offsets)} committed records ending at byte {end}, "
                f"but the journal file is only {stat.st_size} bytes long",
                remedy=f"restore {self._layout.run_file(run_id)} from a backup; to accept the loss, "
                f"delete {self._layout.hint_file(run_id)} and {self._layout.snapshot_file(run_id)}",
            )
        last = offsets[-1]
        try:
            record, batch_last = _frames.decode_frame(
                os.pread(fd, end - last, last), run_id, len(offsets), last
            )
        except CorruptionError:
            return None  # the hint does not match the frames: walk the file instead
        if batch_last != record.sequence:
            return None
        return _frames.RunIndex(inode=inode, size=end, end=end, offsets=offsets, hinted=True, hint_end=end)

    @staticmethod
    def _walk(run_id: str, fd: int, index: _frames.RunIndex, base: int, size: int) -> None:
        """Locate the frames from ``base`` by their headers, then find the last committed batch.

        Frames after ``base`` are only counted; the batch boundary is found by
        verifying and decoding backwards from the last complete frame to the
        nearest one that closes its batch (normally just the last frame).
        Anything after that boundary must be a genuine torn tail.
        """
        first = len(index.offsets)
        position = base
        window = _SCAN_WINDOW
        while size - position >= 4:
            length = min(window, size - position)
            consumed = _frames.walk(os.pread(fd, length, position), position, index.offsets, run_id)
            position += consumed
            if position + (length - consumed) >= size:
                break  # reached the end: whatever follows position is an incomplete frame
            # A frame larger than the window made no progress: widen the window for it.
            window = _SCAN_WINDOW if consumed else window * 2
        end = base
        committed = first
        offsets = index.offsets
        for i in range(len(offsets) - 1, first - 1, -1):
            start = offsets[i]
            stop = offsets[i + 1] if i + 1 < len(offsets) else position
            record, batch_last = _frames.decode_frame(os.pread(fd, stop - start, start), run_id, i + 1, start)
            if record.sequence == batch_last:
                committed = i + 1
                end = stop
                break
        del offsets[committed:]
        index.end = end
        index.size = size
        if index.torn:
            _frames.check_torn_tail(os.pread(fd, size - end, end), end, run_id, index.next_sequence)

    def _forget(self, run_id: str) -> None:
        with self._guard:
            self._indexes.pop(run_id, None)

    # -- the journal contract ---------------------------------------------------------------

    def _append(
        self, run_id: str, expected_next: int, batch: tuple[JournalRecord, ...], fence: int | None
    ) -> AppendResult:
        if self._durability is Durability.DURABLE:
            return self._group.submit((run_id, expected_next, batch, fence, None))
        return self._append_one((run_id, expected_next, batch, fence, None))

    def _append_indexed(
        self,
        run_id: str,
        expected_next: int,
        batch: tuple[JournalRecord, ...],
        fence: int | None,
        entry: Callable[[], IndexEntry],
    ) -> AppendResult:
        self._run_index()  # opened before the run's lock is taken
        if self._durability is Durability.DURABLE:
            return self._group.submit((run_id, expected_next, batch, fence, entry))
        return self._append_one((run_id, expected_next, batch, fence, entry))

    def _append_one(self, item: _Item) -> AppendResult:
        """One append flushed alone (``write`` and ``flush`` mode: there is no sync to share)."""
        (outcome,) = self._flush_group((item,))
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _flush_group(self, items: Sequence[_Item]) -> list[AppendResult | BaseException]:
        """Append one group of batches, each to a different run, with one sync per file (group commit).

        Runs on an offload thread (:class:`~mayfly.substrate.GroupCommit`), or
        inline in ``write`` mode. In four steps, holding every run's thread
        lock and exclusive ``flock`` from the first to the last, so no reader
        sees a frame before it is durable and no grant slips in between:

        1. each batch is checked on its own (fencing token, expected sequence,
           event ids), in run-id order; a refused one gets its error, nothing
           of it is written;
        2. the run-index entries of the remaining batches are written, more
           claimable first, in one SQLite transaction (one sync); a batch
           whose dedup id a live run holds is refused there;
        3. the frames are written, then, in ``fsync`` mode, the ``runs/``
           directory is fsynced once for all the files created, and each file
           written is ``fdatasync``-ed; a file whose write or sync fails is
           cut back to where the group found it and its batch fails;
        4. the exact run-index entries are recorded, and the results returned;
           no caller is woken before this returns.
        """
        count = len(items)
        outcomes: list[AppendResult | BaseException | None] = [None] * count
        opened: list[tuple[str, threading.Lock, int, bool]] = []
        staged: list[tuple[int, int, _frames.RunIndex]] = []  # (item, fd, index) to write
        # Locks are taken in run-id order, so two groups (flushers here or in another process)
        # that share runs wait for each other instead of deadlocking.
        order = sorted(range(count), key=lambda i: items[i][0]) if count > 1 else range(count)
        entries: dict[int, IndexEntry] = {}
        try:
            for i in order:
                run_id, expected_next, batch, fence, _ = items[i]
                try:
                    lock = self._run_lock(run_id)
                    lock.acquire()
                    try:
                        # A new file's directory entry is fsynced once for the whole group (_sync_group).
                        fd, created = self._run_file(run_id)
                    except BaseException:
                        lock.release()
                        self._run_unlock(run_id)
                        raise
                    opened.append((run_id, lock, fd, created))
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    index = self._index(run_id, fd, exclusive=True)
                    self.check_fence(run_id, fence, self._fence(run_id))
                    if expected_next != index.next_sequence:
                        outcomes[i] = self.refused(
                            run_id,
                            expected_next,
                            batch,
                            actual_next=index.next_sequence,
                            stored_at=functools.partial(self._stored, fd, index, run_id),
                            sequence_of=index.event_ids.get,
                        )
                        continue
                    used = index.event_ids
                    for record in batch:
                        if record.event_id in used:
                            raise self.event_id_taken(run_id, record.event_id, used[record.event_id])
                    staged.append((i, fd, index))
                except Exception as error:  # it is this batch's outcome
                    outcomes[i] = error
            wanted: list[int] = []
            for i, _, _ in staged:
                make = items[i][4]
                if make is None:
                    continue
                try:
                    entries[i] = make()
                except Exception as error:  # it is this batch's outcome
                    outcomes[i] = error
                    continue
                wanted.append(i)
            if wanted:
                try:
                    refusals = self._run_index().before_append_many([entries[i] for i in wanted])
                except Exception as error:  # nothing written: every indexed batch fails
                    refusals = [error] * len(wanted)  # type: ignore[list-item]
                for i, refusal in zip(wanted, refusals, strict=True):
                    if refusal is not None:
                        outcomes[i] = refusal
            bases: dict[int, int] = {}
            written: list[tuple[int, int, _frames.RunIndex]] = []
            for staging in staged:
                i, fd, index = staging
                if outcomes[i] is not None:
                    continue
                bases[i] = index.end
                try:
                    self._write(items[i][0], fd, index, items[i][2], sync=False)
                except Exception as error:  # _write cut the file back
                    outcomes[i] = error
                    continue
                written.append(staging)
            if self._durable_files and written:
                self._sync_group(items, written, bases, opened, outcomes)
            for i, _, _ in written:
                if outcomes[i] is not None:
                    continue
                run_id, _, batch, _, _ = items[i]
                entry = entries.get(i)
                if entry is not None:
                    try:
                        self._run_index().after_append(entry)
                    except Exception as error:  # as before group commit: the caller sees it
                        outcomes[i] = error
                        continue
                outcomes[i] = self.acknowledged(run_id, batch)
        finally:
            lost = [items[i][0] for i in range(count) if isinstance(outcomes[i], HistoryLost)]
            for run_id, lock, fd, _ in opened:
                try:
                    # Unlock explicitly: the descriptor stays open, and a child forked meanwhile shares it.
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    if run_id in lost:
                        self._drop_files(run_id)  # the next append opens the path again
                finally:
                    lock.release()
                    self._run_unlock(run_id)
        if None in outcomes:
            missing = JournalUnavailable("append not attempted")
            return [missing if outcome is None else outcome for outcome in outcomes]
        return outcomes  # type: ignore[return-value]  # no None left

    def _sync_group(
        self,
        items: Sequence[_Item],
        staged: list[tuple[int, int, _frames.RunIndex]],
        bases: dict[int, int],
        opened: list[tuple[str, threading.Lock, int, bool]],
        outcomes: list[AppendResult | BaseException | None],
    ) -> None:
        """Make a group's frames durable: one ``runs/`` fsync for the new files, one fdatasync per file."""
        created = {run_id for run_id, _, _, new in opened if new}
        failure: OSError | None = None
        if any(items[i][0] in created for i, _, _ in staged):
            try:
                sync_directory(self._layout.runs)
            except OSError as error:
                failure = error
        for i, fd, _ in staged:
            run_id = items[i][0]
            problem = failure if run_id in created else None
            if problem is None:
                try:
                    sync_data(fd)
                except OSError as error:
                    problem = error
            if problem is not None:
                # Nothing of it was acknowledged: cut it back so the file ends on a committed batch.
                self._forget(run_id)
                with suppress(OSError):
                    os.ftruncate(fd, bases[i])
                outcomes[i] = JournalUnavailable(
                    f"append to run {run_id} failed to reach the disk: {problem}; "
                    "nothing was acknowledged, retry when the disk is writable"
                )

    @staticmethod
    def _stored(fd: int, index: _frames.RunIndex, run_id: str, sequence: int) -> JournalRecord | None:
        """Read back and verify the committed record at ``sequence`` (caller holds the flock)."""
        if not 1 <= sequence <= len(index.offsets):
            return None
        start = index.offsets[sequence - 1]
        end = index.offsets[sequence] if sequence < len(index.offsets) else index.end
        (record,) = _frames.decode_frames(os.pread(fd, end - start, start), run_id, sequence, start)
        return record

    def _write(
        self,
        run_id: str,
        fd: int,
        index: _frames.RunIndex,
        batch: tuple[JournalRecord, ...],
        *,
        sync: bool = True,
    ) -> None:
        frames = _frames.encode_batch(batch)
        data = b"".join(frames)
        written = 0
        try:
            while written < len(data):
                written += os.write(fd, data[written:])
            if sync and self._durability is Durability.DURABLE:
                sync_data(fd)
        except OSError as error:
            # Nothing was acknowledged: cut the partial batch so the file ends
            # on a committed batch again, then report the store unavailable.
            self._forget(run_id)
            with suppress(OSError):
                os.ftruncate(fd, index.end)
            raise JournalUnavailable(
                f"append to run {run_id} failed after {written} of {len(data)} bytes: {error}; "
                "nothing was acknowledged, retry when the disk is writable"
            ) from None
        offset = index.end
        for frame, record in zip(frames, batch, strict=True):
            index.offsets.append(offset)
            index.event_ids[record.event_id] = record.sequence
            offset += len(frame)
        index.end = index.size = offset

    def _read(self, run_id: str, after: int, limit: int | None) -> list[JournalRecord]:
        try:
            return self._read_frames(run_id, after, limit, hint=True)
        except CorruptionError:
            # Offsets that came from a hint are only a guess: locate the frames
            # again from the file itself; if that read fails too, it is the journal.
            if not self._hinted(run_id):
                raise
        return self._read_frames(run_id, after, limit, hint=False)

    def _hinted(self, run_id: str) -> bool:
        with self._guard:
            index = self._indexes.pop(run_id, None)
        return index is not None and index.hinted

    def _read_frames(self, run: str, start: int, count: int | None, *, hint: bool) -> list[JournalRecord]:
        with self._run(run):
            fd = self._existing_file(run)
            if fd is None:
                return []
            try:
                with locked(fd, fcntl.LOCK_SH):
                    index = self._index(run, fd, exclusive=False, hint=hint)
                    hinted = index.hinted
                    last = len(index.offsets)
                    if count is not None:
                        last = min(last, start + count)
                    if start >= last:
                        return []
                    begin = index.offsets[start]
                    end = index.offsets[last] if last < len(index.offsets) else index.end
                    if not 0 <= begin < end <= index.end:
                        # Only a hint can hold such offsets; read() retries from the file itself.
                        raise CorruptionError(
                            f"run {run}: frame offsets out of order at sequence {start + 1}"
                        )
                    data = os.pread(fd, end - begin, begin)
            except HistoryLost:
                self._drop_files(run)  # the next read or append opens the path again
                raise
        try:
            return _frames.decode_frames(data, run, start + 1, begin)
        except BaseException:
            if not hinted:
                self._forget(run)
            raise

    def verify_run(self, run_id: str) -> int:
        """CRC-check and decode every frame of a run, with order and event-id uniqueness; return the count.

        Reads verify only the records they return, and the full check of a
        file otherwise runs on the first append after open; ``mayfly replay``
        calls this to audit a whole history. Raises the typed corruption error.
        """
        run = self.open_run(run_id, "verification")
        with self._run(run):
            fd = open_run_file(self._layout, run, create=False)
            if fd is None:
                return 0
            try:
                with locked(fd, fcntl.LOCK_SH):
                    self._forget(run)
                    stat = os.fstat(fd)
                    index = _frames.RunIndex(inode=stat.st_ino, verified=True)
                    self._scan(run, fd, index, 0, stat.st_size)
                    with self._guard:
                        self._indexes[run] = index
                    return len(index.offsets)
            finally:
                os.close(fd)

    def _next_sequence(self, run_id: str) -> int:
        run = run_id
        with self._run(run):
            fd = self._existing_file(run)
            if fd is None:
                return 1
            try:
                with locked(fd, fcntl.LOCK_SH):
                    return self._index(run, fd, exclusive=False).next_sequence
            except HistoryLost:
                self._drop_files(run)  # the next read or append opens the path again
                raise

    def _list_runs(self, after: str | None, limit: int) -> list[str]:
        names = self._run_names()
        runs: list[str] = []
        for name in names[bisect_right(names, after) if after else 0 :]:
            # A lease grant creates the run file before any record exists.
            try:
                if self._layout.run_file(name).stat().st_size == 0:
                    continue
            except FileNotFoundError:
                continue
            runs.append(name)
            if len(runs) == limit:
                break
        return runs

    def _run_names(self) -> list[str]:
        """The sorted run ids that have a file, cached while the directory is unchanged.

        The cache is keyed by the directory's inode and mtime, and only kept
        once the mtime is safely in the past, so an entry created within the
        same clock tick as the listing cannot be missed.
        """
        stat = os.stat(self._layout.runs)
        key = (stat.st_ino, stat.st_mtime_ns)
        with self._guard:
            if self._listing is not None and self._listing[0] == key:
                return self._listing[1]
        names = sorted(
            name[:-4]
            for name in os.listdir(self._layout.runs)
            if name.endswith(".mwj") and is_uuid(name[:-4])
        )
        if time.time_ns() - stat.st_mtime_ns > _LISTING_SETTLE_NS:
            with self._guard:
                self._listing = (key, names)
        return names

    def _write_snapshot(self, run_id: str, snapshot: SnapshotRecord) -> None:
        """Replace the run's snapshot atomically (tmp file, fsync, rename, directory fsync), off the hub."""
        if self._durability is Durability.DURABLE:
            off_hub(self._store_snapshot, run_id, snapshot)
        else:
            self._store_snapshot(run_id, snapshot)

    def _store_snapshot(self, run_id: str, snapshot: SnapshotRecord) -> None:
        try:
            self._replace_snapshot(run_id, snapshot)
        except OSError as error:  # a full or failing disk: typed, and the old snapshot is still in place
            raise JournalUnavailable(
                f"writing the snapshot of run {run_id} failed: {error}; the previous snapshot and the "
                "journal are unchanged, retry when the disk is writable"
            ) from None

    def _replace_snapshot(self, run_id: str, snapshot: SnapshotRecord) -> None:
        run = run_id
        frame = _frames.encode_snapshot(snapshot)
        durable = self._durability is Durability.DURABLE
        final_path = self._layout.snapshot_file(run)
        with self._run(run):
            temporary = final_path.with_name(f".{run}.{os.getpid()}.{threading.get_ident()}.tmp")
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                written = 0
                while written < len(frame):
                    written += os.write(fd, frame[written:])
                if durable:
                    os.fsync(fd)
            except BaseException:
                os.close(fd)
                temporary.unlink(missing_ok=True)
                raise
            os.close(fd)
            os.replace(temporary, final_path)
            if durable:
                sync_directory(self._layout.snapshots)
            self._write_hint(run)

    def _write_hint(self, run: str) -> None:
        """Persist the run's frame offsets (MWX2) so a fresh process resumes without walking the file.

        The hint is derived data, checked against the run file before use and
        ignored when wrong, so it is neither fsynced nor allowed to fail the
        snapshot that triggered it. Caller holds the run's thread lock.
        """
        fd = open_run_file(self._layout, run, create=False)
        if fd is None:
            return
        try:
            with locked(fd, fcntl.LOCK_SH):
                index = self._index(run, fd, exclusive=False)
                if not index.offsets or index.hint_end == index.end:
                    return
                hint = _frames.encode_hint(index.inode, index.end, index.offsets[: len(index.offsets)])
                end = index.end
        except CorruptionError:
            return  # a damaged journal gets no hint; its reads and appends report the damage
        finally:
            os.close(fd)
        path = self._layout.hint_file(run)
        temporary = path.with_name(f".{run}.{os.getpid()}.{threading.get_ident()}.idx.tmp")
        try:
            temporary.write_bytes(hint)
            os.replace(temporary, path)
        except OSError:
            temporary.unlink(missing_ok=True)
            return
        index.hint_end = end

    def _read_snapshot(self, run_id: str) -> SnapshotRecord | None:
        data = read_whole(self._layout.snapshot_path(run_id))
        if data is None:
            return None
        return _frames.decode_snapshot(data, run_id, verify=False)  # the base verifies it

    # -- purging (capabilities.run_purge) ----------------------------------------------------

    def purge_run(self, run_id: str) -> bool:
        """Empty the run's journal file and delete its snapshot and hint; the fencing counter stays.

        Runs under the run file's exclusive lock, after the run's lease lock
        was taken without waiting: a held lease raises ``LeaseHeld`` and
        nothing changes. The emptied file stays so that a later grant still
        orders itself against appends; ``list_runs`` skips empty files.
        """
        run = self.open_run(run_id, "purge")
        with self._run(run):
            fd = open_run_file(self._layout, run, create=False)
            if fd is None:
                return self._remove_snapshot(run)
            try:
                with locked(fd, fcntl.LOCK_EX):
                    lease = self._free_lease(run)
                    try:
                        # The index entry first: a crash after it leaves history no worker claims, which
                        # is what a purge is for; the other order would leave a claimable empty run.
                        self._run_index().delete(run)
                        self._forget(run)
                        # The hint first: one naming this inode past its size would read as lost history.
                        self._layout.hint_file(run).unlink(missing_ok=True)
                        removed = self._remove_snapshot(run)
                        if os.fstat(fd).st_size:
                            os.ftruncate(fd, 0)
                            if self.durability is Durability.DURABLE:
                                sync_data(fd)
                            removed = True
                        return removed
                    finally:
                        if lease is not None:
                            os.close(lease)
            finally:
                os.close(fd)

    def _free_lease(self, run: str) -> int | None:
        """Take the run's lease lock without waiting (its descriptor), or raise ``LeaseHeld``."""
        try:
            lease = os.open(self._layout.lease_file(run), os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(lease, 512, 0).decode("ascii", "replace").strip() or None
            os.close(lease)
            raise LeaseHeld(run, holder) from None
        return lease

    def _remove_snapshot(self, run: str) -> bool:
        try:
            self._layout.snapshot_file(run).unlink()
        except FileNotFoundError:
            return False
        if self.durability is Durability.DURABLE:
            sync_directory(self._layout.snapshots)
        return True

    # -- fault injection for the contract suite ---------------------------------------------

    def corrupt_record(self, run_id: str, sequence: int) -> None:
        """Flip one byte inside the stored frame of ``sequence`` (contract-suite fault hook)."""
        with self._frame_edit(run_id, sequence) as (fd, start, _end):
            position = start + _frames.HEADER.size + 2
            byte = os.pread(fd, 1, position)
            os.pwrite(fd, bytes([byte[0] ^ 0x20]), position)

    def remove_record(self, run_id: str, sequence: int) -> None:
        """Cut the stored frame of ``sequence`` out of the file (contract-suite fault hook)."""
        with self._frame_edit(run_id, sequence) as (fd, start, end):
            size = os.fstat(fd).st_size
            rest = os.pread(fd, size - end, end)
            os.pwrite(fd, rest, start)
            os.ftruncate(fd, start + len(rest))

    def corrupt_snapshot(self, run_id: str) -> None:
        """Flip one byte inside the stored snapshot frame (contract-suite fault hook)."""
        path = self._layout.snapshot_file(self.open_run(run_id, "fault injection"))
        data = bytearray(path.read_bytes())
        data[min(len(data) - 1, _frames.HEADER.size + 2)] ^= 0x20
        path.write_bytes(bytes(data))

    @contextmanager
    def _frame_edit(self, run_id: str, sequence: int) -> Iterator[tuple[int, int, int]]:
        run = self.open_run(run_id, "fault injection")
        with self._run(run):
            fd = open_run_file(self._layout, run, create=False)
            if fd is None:
                raise InvalidRecord(f"run {run} has no journal file")
            try:
                with locked(fd, fcntl.LOCK_EX):
                    index = self._index(run, fd, exclusive=True)
                    if not 1 <= sequence <= len(index.offsets):
                        raise InvalidRecord(f"run {run} has no sequence {sequence}")
                    start = index.offsets[sequence - 1]
                    end = index.offsets[sequence] if sequence < len(index.offsets) else index.end
                    self._forget(run)
                    # The frames move or change under the hint: drop it rather than let it be checked.
                    self._layout.hint_file(run).unlink(missing_ok=True)
                    # pwrite ignores its offset on an O_APPEND descriptor (Linux).
                    editor = os.open(self._layout.run_file(run), os.O_RDWR | os.O_CLOEXEC)
                    try:
                        yield editor, start, end
                    finally:
                        os.close(editor)
            finally:
                os.close(fd)

    # -- the run index (mayfly.runindex) -----------------------------------------------------

    def _run_index(self) -> LocalRunIndex:
        """The store's run index, opened on first use (read-only commands never create it)."""
        if self._closed:
            raise self.closed_error("run index")
        with self._guard:
            if self._index_db is None:
                durable = self._durability is Durability.DURABLE
                self._index_db = LocalRunIndex(self._layout.root, durable=durable)
                self._leases = LocalLeaseStore(self._url)
            return self._index_db

    def claim(
        self,
        owner: str,
        *,
        limit: int,
        ttl_ms: int,
        now_ms: int,
        queues: Sequence[str] | None = None,
        held: Mapping[str, int] | None = None,
    ) -> list[RecoveryLeaseGuard]:
        """Lease up to ``limit`` claimable root runs to ``owner``: each its OS lock, in wake order.

        A candidate whose lock another holder has (a live owner, or a
        concurrent claimant that got there first) is skipped, so no run is
        handed out twice. Each grant writes a fencing counter durably, so a
        claim from a hub task runs on an offload thread. Queues with settings
        are claimed from under the store's queue lock (``DIR/queues.lock``),
        which serialises their counts and grants across processes; ``held``
        is what the claimant holds of each queue (per-worker limits).
        """
        check_claim(limit, queues)
        holding = check_held(held)
        return off_hub(self._claim, owner, limit, ttl_ms, now_ms, queues, holding)

    def _claim(  # noqa: PLR0917 - one internal call site passes the checked claim as is
        self,
        owner: str,
        limit: int,
        ttl_ms: int,
        now_ms: int,
        queues: Sequence[str] | None,
        held: dict[str, int],
    ) -> list[RecoveryLeaseGuard]:
        db = self._run_index()
        settings = db.queue_settings(queues)
        if settings:
            with self._queue_lock():
                return self._claim_limited(db, owner, limit, ttl_ms, now_ms, queues, held)
        leases = self._leases
        assert leases is not None
        claimed: list[RecoveryLeaseGuard] = []
        offset = 0
        page = max(limit * 2, 32)
        while len(claimed) < limit:
            candidates = db.candidates(now_ms=now_ms, queues=queues, limit=page, offset=offset)
            for run_id in candidates:
                try:
                    guard = leases.acquire(run_id, owner, ttl_ms)
                except LeaseHeld:
                    continue
                db.claimed(run_id, now_ms)
                claimed.append(guard)
                if len(claimed) == limit:
                    break
            if len(candidates) < page:
                break
            offset += page
        return claimed

    def _claim_limited(  # noqa: PLR0917 - one internal call site
        self,
        db: LocalRunIndex,
        owner: str,
        limit: int,
        ttl_ms: int,
        now_ms: int,
        queues: Sequence[str] | None,
        held: dict[str, int],
    ) -> list[RecoveryLeaseGuard]:
        """A claim that involves queues with settings, under the queue lock (rules: ``plan_claim``).

        The settings are read again under the lock, each limited queue's usage
        is counted once (probing the recorded holders' locks), and every grant
        updates it, so the rules hold across all claimants of the store.
        """
        leases = self._leases
        assert leases is not None
        settings = db.queue_settings(queues)
        usage = {name: self._usage(db, queue, now_ms) for name, queue in settings.items()}
        full = [name for name, queue in settings.items() if _room(queue, usage[name], held) <= 0]
        if queues is not None and set(queues) <= set(full):
            return []
        holding = dict(held)
        claimed: list[RecoveryLeaseGuard] = []
        offset = 0
        page = max(limit * 2, 32)
        while len(claimed) < limit:
            candidates = db.candidate_entries(
                now_ms=now_ms, queues=queues, limit=page, offset=offset, exclude=full
            )
            for entry in candidates:
                name = entry.queue
                limited = name in settings
                if limited and not plan_claim([entry], limit=1, settings=settings, usage=usage, held=holding):
                    continue
                try:
                    guard = leases.acquire(entry.run_id, owner, ttl_ms)
                except LeaseHeld:
                    continue
                db.claimed(entry.run_id, now_ms, name if limited else None)
                claimed.append(guard)
                if limited:
                    used = usage[name]
                    start = entry.status is IndexStatus.NEW and entry.started_ms is None
                    usage[name] = QueueUsage(
                        in_progress=used.in_progress + 1, recent_starts=used.recent_starts + start
                    )
                    holding[name] = holding.get(name, 0) + 1
                if len(claimed) == limit:
                    break
            if len(candidates) < page:
                break
            offset += page
        return claimed

    @contextmanager
    def _queue_lock(self) -> Iterator[None]:
        """The store's queue lock (an exclusive ``flock``): limited queues' counts and grants, serialised."""
        path = self._layout.root / _QUEUE_LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise JournalUnavailable(f"cannot open the queue lock {path}: {error}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the flock

    def _usage(self, db: LocalRunIndex, queue: QueueSettings, now_ms: int) -> QueueUsage:
        """The queue's runs in progress and its recent starts (caller holds the queue lock).

        A recorded claim counts while its run is a live root and its lease
        lock is held; the others are forgotten, so a killed claimant's runs
        free their slots as soon as its process is gone.
        """
        recorded = db.claimed_runs(queue.name)
        live = [run_id for run_id, open_entry in recorded if open_entry and self._lease_held(run_id)]
        if len(live) < len(recorded):
            kept = set(live)
            db.forget_claims(queue.name, [run_id for run_id, _ in recorded if run_id not in kept])
        period = queue.rate_period_ms
        starts = 0 if period is None else db.recent_starts(queue.name, now_ms - period)
        return QueueUsage(in_progress=len(live), recent_starts=starts)

    def _lease_held(self, run_id: str) -> bool:
        """Whether someone holds the run's lease lock: a shared lock probe, released at once.

        The probe writes nothing (the fencing counter and the holder note are
        untouched); a concurrent ``acquire`` of the same run that meets it is
        refused as if the run were leased, and may try again.
        """
        try:
            fd = os.open(self._layout.lease_file(run_id), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    # -- queue flow control (capabilities.queue_control; mayfly.queues.QueueControl) ---------

    def queue_set(self, settings: QueueSettings) -> None:
        """Store the queue's settings durably, replacing any it had; claims obey them from now on."""
        if not isinstance(settings, QueueSettings):
            raise InvalidRecord(f"queue settings must be a QueueSettings, got {type(settings).__name__}")
        off_hub(self._locked_queue_op, self._run_index().queue_set, settings)

    def queue_get(self, name: str) -> QueueSettings | None:
        """The queue's settings, or ``None`` if it has none."""
        _check_queue(name)
        return self._run_index().queue_settings([name]).get(name)

    def queue_list(self) -> list[QueueSettings]:
        """Every queue with settings, by name."""
        return list(self._run_index().queue_settings().values())

    def queue_remove(self, name: str) -> bool:
        """Remove the queue's settings (its runs are claimed without limits); ``False`` if it had none."""
        _check_queue(name)
        removed: bool = off_hub(self._locked_queue_op, self._run_index().queue_remove, name)
        return removed

    def queue_usage(self, name: str, *, now_ms: int) -> QueueUsage:
        """The queue's runs in progress now and its starts within its rate window ending at ``now_ms``."""
        _check_queue(name)
        usage: QueueUsage = off_hub(self._locked_queue_op, self._queue_usage, name, now_ms)
        return usage

    def _queue_usage(self, name: str, now_ms: int) -> QueueUsage:
        db = self._run_index()
        queue = db.queue_settings([name]).get(name) or QueueSettings(name=name)
        return self._usage(db, queue, now_ms)

    def _locked_queue_op(self, operation: Callable[..., Any], *args: object) -> Any:
        """Run ``operation`` under the queue lock (it may wait for another process's claim: off the hub)."""
        with self._queue_lock():
            return operation(*args)

    def next_wake(self, *, now_ms: int, queues: Sequence[str] | None = None) -> int | None:
        """The earliest wake time after ``now_ms`` of a waiting root run."""
        check_claim(1, queues)
        return self._run_index().next_wake(now_ms=now_ms, queues=queues)

    def index_get(self, run_id: str) -> IndexEntry | None:
        """The run's index entry, or ``None``."""
        return self._run_index().get(parse_run_id(run_id))

    def index_put(self, entries: Sequence[IndexEntry]) -> None:
        """Store index entries (rebuild, repair, a detaching driver); see ``RunIndexJournal.index_put``.

        One more rule than the SPI's, for this store alone: a stored entry of a
        later sequence than the run's journal holds (written before frames a
        crash lost) is replaced, under the run's exclusive lock, so that
        a rebuild or a parking driver repairs it.
        """
        for entry in entries:
            if not isinstance(entry, IndexEntry):
                raise InvalidRecord(f"index entries must be IndexEntry values, got {type(entry).__name__}")
            parse_run_id(entry.run_id)
        db = self._run_index()
        db.put(entries)
        for entry in entries:
            stored = db.get(entry.run_id)
            if stored is not None and stored.sequence > entry.sequence:
                self._repair_ahead(db, entry)

    def _repair_ahead(self, db: LocalRunIndex, entry: IndexEntry) -> None:
        """Replace the run's entry with ``entry`` if the stored one is ahead of the run's journal."""
        run = entry.run_id
        with self._run(run):
            fd = open_run_file(self._layout, run, create=False)
            if fd is None:
                return
            try:
                with locked(fd, fcntl.LOCK_EX):
                    last = self._index(run, fd, exclusive=True).next_sequence - 1
                    stored = db.get(run)
                    if stored is not None and stored.sequence > last >= entry.sequence:
                        db.replace(entry)
            finally:
                os.close(fd)

    def index_wake(self, run_id: str) -> bool:
        """Ask for the run to be claimed although it waits; ``False`` if it has no entry or ended."""
        return self._run_index().wake(parse_run_id(run_id))

    def listen_wakeups(self) -> FifoWakeupListener:
        """A FIFO in ``DIR/wakeups``, readable when a run became claimable now (the kit's FIFO wake-ups)."""
        return FifoWakeupListener(self._layout.root / "wakeups")

    def notify_wakeups(self) -> None:
        """Write a wake-up into every listening worker's FIFO."""
        notify_fifo_wakeups(self._layout.root / "wakeups")

    # -- lifecycle ---------------------------------------------------------------------------

    def _close(self) -> None:
        """Drop the in-process index and close the run index; the base refuses further operations."""
        self._drop_files()
        with self._guard:
            self._indexes.clear()
            if self._index_db is not None:
                self._index_db.close()
                self._index_db = None
            if self._leases is not None:
                self._leases.close()
                self._leases = None


_OPEN_JOURNALS: Final[weakref.WeakSet[LocalWorkflowJournal]] = weakref.WeakSet()


def _forget_descriptors_in_child() -> None:
    for journal in list(_OPEN_JOURNALS):
        journal._after_fork()


os.register_at_fork(after_in_child=_forget_descriptors_in_child)


def _run_of(item: _Item) -> str:
    """A queued append's run: one group flush holds at most one batch per run."""
    return item[0]


def _room(queue: QueueSettings, used: QueueUsage, held: Mapping[str, int]) -> int:
    """How many more runs of the queue may be in progress (concurrency and per-worker limits alone)."""
    caps = [1]
    if queue.concurrency is not None:
        caps.append(queue.concurrency - used.in_progress)
    if queue.worker_concurrency is not None:
        caps.append(queue.worker_concurrency - held.get(queue.name, 0))
    return min(caps)
