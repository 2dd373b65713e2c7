"""The run index in the LMDB environment: entries by run, and claim orders that claims read as range scans.

Four named databases (``R`` is a run id's 16 bytes, ``P`` the priority as
``u64be(2**63 - 1 - priority)`` so higher priorities sort first, ``T`` a
wake time as ``u8 absent || u64be(ready_at + 2**63)`` so absent times sort
last)::

    index    R           -> entry value (below)       every entry
    claims   P || T || R -> queue                     root runs claimable at any time:
                                                      new, running, or waiting with wake set
    timers   P || T || R -> queue                     root runs waiting for their time (no wake)
    waits    T || R      -> queue                     root runs waiting with a time (next_wake)

Entry value: ``u64be sequence || u8 status || u8 flags (1 wake, 2 has
ready_at, 4 has parent, 8 has started_ms, 16 has dedup_id) || i64be ready_at
|| i64be priority || [parent R] || [i64be started_ms] || [u8 length ||
dedup_id] || queue``. Terminal entries and child runs (a parent set) are
only in ``index``: they are never claimed. Queue flow control keeps two
more derived databases, written with the entries::

    dedup    queue || 0 || dedup_id         -> R      live entries with a dedup id: one per id
    starts   queue || 0 || u64be(started) || R -> ""  every recorded start (rate limits count them)

A claim at ``now`` merges ``claims`` (all claimable) with the prefix of each
priority band of ``timers`` whose time is ``<= now``, in key order — which
is the claim order, priority descending, then ``ready_at`` (absent last),
then run id — and jumps over the rest of a band with one seek. So a claim
reads the runs it hands out and the leased runs it skips, never the runs
that wait. Every entry is written in the write transaction of the append
that produces it (:mod:`mayfly_lmdb._journal`), so index and history never
disagree.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Final

import lmdb
import msgspec

from mayfly.errors import CorruptionError, DuplicateRun, InvalidRecord
from mayfly.ids import DEDUP_ID, QUEUE_NAME, is_uuid
from mayfly.runindex import IndexEntry, IndexStatus
from mayfly_lmdb import _codec
from mayfly_lmdb._env import SharedEnv

__all__ = [
    "OrderScan",
    "check_entry",
    "claimable_at",
    "claimed",
    "decode_entry",
    "encode_entry",
    "get_entry",
    "next_wake",
    "put_entry",
    "remove_entry",
    "wake",
]

_ENTRY: Final = struct.Struct(">QBBqq")
_U64: Final = struct.Struct(">Q")
_WAKE: Final = 1
_HAS_READY: Final = 2
_HAS_PARENT: Final = 4
_HAS_STARTED: Final = 8
_HAS_DEDUP: Final = 16
_FLAGS: Final = 31
_I64: Final = struct.Struct(">q")
_STATUS: Final = (IndexStatus.NEW, IndexStatus.RUNNING, IndexStatus.WAITING, IndexStatus.TERMINAL)
_STATUS_CODE: Final = {status: code for code, status in enumerate(_STATUS)}
_INT64: Final = 1 << 63
_PRIORITY_MAX: Final = _INT64 - 1
_ABSENT: Final = b"\x01" + b"\xff" * 8
_BAND: Final = 8  # bytes of P
_TIME: Final = 9  # bytes of T


def check_entry(entry: object) -> IndexEntry:
    """Validate one entry to store; anything it could not be stored or ordered by raises InvalidRecord."""
    if not isinstance(entry, IndexEntry):
        raise InvalidRecord(f"index entries must be IndexEntry values, got {type(entry).__name__}")
    run_id = entry.run_id
    if not isinstance(run_id, str) or not is_uuid(run_id):
        raise InvalidRecord(f"index entry run id {run_id!r:.80} must be a canonical lowercase UUID")
    if not isinstance(entry.status, IndexStatus):
        raise InvalidRecord(f"index entry of run {run_id}: status {entry.status!r:.40} is not an IndexStatus")
    if not isinstance(entry.queue, str) or QUEUE_NAME.fullmatch(entry.queue) is None:
        raise InvalidRecord(
            f"index entry of run {run_id}: queue {entry.queue!r:.80} must match {QUEUE_NAME.pattern}"
        )
    for name, value, low in (("sequence", entry.sequence, 0), ("priority", entry.priority, -_INT64)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= _PRIORITY_MAX:
            raise InvalidRecord(
                f"index entry of run {run_id}: {name} must be a 64-bit integer, got {value!r:.40}"
            )
    ready_at = entry.ready_at_ms
    if ready_at is not None and (
        isinstance(ready_at, bool) or not isinstance(ready_at, int) or not -_INT64 <= ready_at < _INT64
    ):
        raise InvalidRecord(f"index entry of run {run_id}: ready_at_ms must be a 64-bit integer or None")
    if not isinstance(entry.wake, bool):
        raise InvalidRecord(f"index entry of run {run_id}: wake must be a bool, got {entry.wake!r:.40}")
    parent = entry.parent
    if parent is not None and (not isinstance(parent, str) or not is_uuid(parent)):
        raise InvalidRecord(f"index entry of run {run_id}: parent {parent!r:.80} must be a run id or None")
    dedup = entry.dedup_id
    if dedup is not None and (not isinstance(dedup, str) or DEDUP_ID.fullmatch(dedup) is None):
        raise InvalidRecord(
            f"index entry of run {run_id}: dedup id {dedup!r:.80} must match {DEDUP_ID.pattern} or be None"
        )
    started = entry.started_ms
    if started is not None and (
        isinstance(started, bool) or not isinstance(started, int) or not -_INT64 <= started < _INT64
    ):
        raise InvalidRecord(f"index entry of run {run_id}: started_ms must be a 64-bit integer or None")
    return entry


def encode_entry(entry: IndexEntry) -> bytes:
    """The stored value of a checked entry."""
    flags = (_WAKE if entry.wake else 0) | (0 if entry.ready_at_ms is None else _HAS_READY)
    flags |= 0 if entry.parent is None else _HAS_PARENT
    flags |= 0 if entry.started_ms is None else _HAS_STARTED
    flags |= 0 if entry.dedup_id is None else _HAS_DEDUP
    head = _ENTRY.pack(
        entry.sequence, _STATUS_CODE[entry.status], flags, entry.ready_at_ms or 0, entry.priority
    )
    parent = b"" if entry.parent is None else _codec.uuid_bytes(entry.parent)
    started = b"" if entry.started_ms is None else _I64.pack(entry.started_ms)
    dedup = b""
    if entry.dedup_id is not None:
        text = entry.dedup_id.encode("ascii")
        dedup = bytes((len(text),)) + text
    return head + parent + started + dedup + entry.queue.encode("ascii")


def decode_entry(run_id: str, value: bytes) -> IndexEntry:
    """Decode a stored entry; damage raises CorruptionError naming the run."""
    try:
        sequence, status, flags, ready_at, priority = _ENTRY.unpack_from(value)
        offset = _ENTRY.size
        parent = started = dedup = None
        if flags & _HAS_PARENT:
            parent = _codec.run_text(value[offset : offset + 16])
            offset += 16
        if flags & _HAS_STARTED:
            (started,) = _I64.unpack_from(value, offset)
            offset += 8
        if flags & _HAS_DEDUP:
            length = value[offset]
            dedup = value[offset + 1 : offset + 1 + length].decode("ascii")
            offset += 1 + length
            if len(dedup) != length or not dedup:
                raise ValueError("bad dedup id")
        queue = value[offset:].decode("ascii")
        if status >= len(_STATUS) or flags & ~_FLAGS or (parent is not None and len(parent) != 36):
            raise ValueError("bad header")
        if QUEUE_NAME.fullmatch(queue) is None:
            raise ValueError("bad queue")
    except (struct.error, ValueError, UnicodeDecodeError, IndexError):
        raise CorruptionError(
            f"run index entry of run {run_id} is undecodable; the LMDB environment is damaged, "
            "restore it from a backup"
        ) from None
    return IndexEntry(
        run_id=run_id,
        queue=queue,
        status=_STATUS[status],
        ready_at_ms=ready_at if flags & _HAS_READY else None,
        sequence=sequence,
        wake=bool(flags & _WAKE),
        parent=parent,
        priority=priority,
        dedup_id=dedup,
        started_ms=started,
    )


def _time(ready_at: int | None) -> bytes:
    return _ABSENT if ready_at is None else b"\x00" + _U64.pack(ready_at + _INT64)


def _band(priority: int) -> bytes:
    return _U64.pack(_PRIORITY_MAX - priority)


def claimable_at(entry: IndexEntry, now_ms: int) -> bool:
    """Whether the entry (its lease aside) is claimable at ``now_ms`` (see :mod:`mayfly.runindex`)."""
    if entry.parent is not None:
        return False
    if entry.status in (IndexStatus.NEW, IndexStatus.RUNNING):
        return True
    if entry.status is not IndexStatus.WAITING:
        return False
    return entry.wake or (entry.ready_at_ms is not None and entry.ready_at_ms <= now_ms)


def _order(entry: IndexEntry, run: bytes, shared: SharedEnv) -> Iterator[tuple[lmdb._Database, bytes]]:
    """The (database, key) pairs that place ``entry`` in the claim orders."""
    if entry.parent is not None or entry.status is IndexStatus.TERMINAL:
        return
    waiting = entry.status is IndexStatus.WAITING
    key = _band(entry.priority) + _time(entry.ready_at_ms) + run
    assert shared.claims is not None and shared.timers is not None and shared.waits is not None
    if not waiting or entry.wake:
        yield shared.claims, key
    elif entry.ready_at_ms is not None:
        yield shared.timers, key
    if waiting and entry.ready_at_ms is not None:
        yield shared.waits, _time(entry.ready_at_ms) + run


def _replace(
    txn: lmdb.Transaction[bytes],
    shared: SharedEnv,
    run: bytes,
    old: IndexEntry | None,
    new: IndexEntry,
    *,
    strict: bool = False,
) -> None:
    """Store ``new`` in place of ``old`` with its places in the claim orders, dedup ids and starts.

    ``strict``: a live dedup id another run holds raises DuplicateRun
    (appends); otherwise the other run keeps it and ``new`` is stored
    without holding it (a rebuild of runs appended without the index).
    """
    new_dedup = _dedup_key(new)
    old_dedup = None if old is None else _dedup_key(old)
    hold = False
    if new_dedup is not None:
        holder = txn.get(new_dedup, db=shared.dedup)
        if holder is not None and holder != run:
            if strict:
                assert new.dedup_id is not None
                raise DuplicateRun(new.run_id, new.queue, new.dedup_id, _codec.run_text(holder))
            new_dedup = None
        hold = holder is None
    if old is not None:
        for db, key in _order(old, run, shared):
            txn.delete(key, db=db)
        if old_dedup is not None and old_dedup != new_dedup and txn.get(old_dedup, db=shared.dedup) == run:
            txn.delete(old_dedup, db=shared.dedup)
        old_start = _start_key(old, run)
        if old_start is not None and old_start != _start_key(new, run):
            txn.delete(old_start, db=shared.starts)
    txn.put(run, encode_entry(new), db=shared.index)
    queue = new.queue.encode("ascii")
    for db, key in _order(new, run, shared):
        txn.put(key, queue, db=db)
    if hold and new_dedup is not None:
        txn.put(new_dedup, run, db=shared.dedup)
    new_start = _start_key(new, run)
    if new_start is not None:
        txn.put(new_start, b"", db=shared.starts)


def _dedup_key(entry: IndexEntry) -> bytes | None:
    """Where a live entry's dedup id is held (``None``: it holds none)."""
    if entry.dedup_id is None or entry.status is IndexStatus.TERMINAL:
        return None
    return entry.queue.encode("ascii") + b"\x00" + entry.dedup_id.encode("ascii")


def _start_key(entry: IndexEntry, run: bytes) -> bytes | None:
    if entry.started_ms is None or entry.parent is not None:
        return None
    return queue_prefix(entry.queue) + _U64.pack(entry.started_ms + _INT64) + run


def queue_prefix(queue: str) -> bytes:
    """The key prefix of one queue in ``qruns`` and ``starts``."""
    return queue.encode("ascii") + b"\x00"


def starts_since(txn: lmdb.Transaction[bytes], shared: SharedEnv, queue: str, since_ms: int) -> int:
    """How many root runs of ``queue`` started after ``since_ms`` (a range count of ``starts``)."""
    prefix = queue_prefix(queue)
    cursor = txn.cursor(db=shared.starts)
    low = max(since_ms + 1, -_INT64)
    if low > _PRIORITY_MAX or not cursor.set_range(prefix + _U64.pack(low + _INT64)):
        return 0
    count = 0
    for key in cursor.iternext(values=False):
        if not key.startswith(prefix):
            break
        count += 1
    return count


def get_entry(txn: lmdb.Transaction[bytes], shared: SharedEnv, run: bytes, run_id: str) -> IndexEntry | None:
    """The run's stored entry, or ``None`` (also when the environment has no index yet)."""
    if shared.index is None:
        return None
    value = txn.get(run, db=shared.index)
    return None if value is None else decode_entry(run_id, value)


def put_entry(
    txn: lmdb.Transaction[bytes], shared: SharedEnv, entry: IndexEntry, *, strict: bool = False
) -> IndexEntry:
    """Store ``entry`` unless the stored one reflects a later sequence; a stored wake and start are kept.

    ``strict`` (an append): refuse, with DuplicateRun, a live dedup id another run holds. The result.
    """
    run = _codec.run_key(entry.run_id)
    old = get_entry(txn, shared, run, entry.run_id)
    if old is not None:
        if entry.sequence < old.sequence:
            return old
        if old.wake and not entry.wake:
            entry = msgspec.structs.replace(entry, wake=True)
        if old.started_ms is not None and entry.started_ms is None:
            entry = msgspec.structs.replace(entry, started_ms=old.started_ms)
        if old == entry:
            return old
    _replace(txn, shared, run, old, entry, strict=strict)
    return entry


def _with_wake(entry: IndexEntry, wake: bool) -> IndexEntry:
    return msgspec.structs.replace(entry, wake=wake)


def wake(txn: lmdb.Transaction[bytes], shared: SharedEnv, run_id: str) -> IndexEntry | None:
    """Set the run's wake; the entry now, or ``None`` if it has none or ended."""
    run = _codec.run_key(run_id)
    old = get_entry(txn, shared, run, run_id)
    if old is None or old.status is IndexStatus.TERMINAL:
        return None
    if old.wake:
        return old
    new = _with_wake(old, True)
    _replace(txn, shared, run, old, new)
    return new


def remove_entry(txn: lmdb.Transaction[bytes], shared: SharedEnv, run: bytes, run_id: str) -> None:
    """Delete the run's entry and its places in the claim orders, dedup ids and starts (a purge)."""
    old = get_entry(txn, shared, run, run_id)
    if old is not None:
        for db, key in _order(old, run, shared):
            txn.delete(key, db=db)
        dedup = _dedup_key(old)
        if dedup is not None and txn.get(dedup, db=shared.dedup) == run:
            txn.delete(dedup, db=shared.dedup)
        start = _start_key(old, run)
        if start is not None:
            txn.delete(start, db=shared.starts)
        txn.delete(run, db=shared.index)


def claimed(txn: lmdb.Transaction[bytes], shared: SharedEnv, run: bytes, run_id: str, now_ms: int) -> None:
    """A claim took the run: its wake request is answered, and a first claim of a new run is its start."""
    old = get_entry(txn, shared, run, run_id)
    if old is None:
        return
    start = old.status is IndexStatus.NEW and old.started_ms is None
    if old.wake or start:
        new = msgspec.structs.replace(old, wake=False, started_ms=now_ms if start else old.started_ms)
        _replace(txn, shared, run, old, new)


class OrderScan:
    """Root runs claimable at ``now_ms`` in claim order, as ``(run key, queue)``, read from two cursors.

    The caller may write to other databases of the transaction while it
    iterates (lease grants), but must not change the claim orders until the
    scan is done.
    """

    def __init__(
        self, txn: lmdb.Transaction[bytes], shared: SharedEnv, now_ms: int, queues: Sequence[str] | None
    ) -> None:
        assert shared.claims is not None and shared.timers is not None
        self._ready = txn.cursor(db=shared.claims)
        self._timed = txn.cursor(db=shared.timers)
        self._due = b"\x00" + _U64.pack(now_ms + _INT64) if -_INT64 <= now_ms <= _PRIORITY_MAX else None
        self._queues = None if queues is None else {queue.encode("ascii") for queue in queues}

    def __iter__(self) -> Iterator[tuple[bytes, bytes]]:
        ready, timed = self._ready, self._timed
        has_ready = ready.first()
        has_timed = self._settle(timed.first())
        queues = self._queues
        while has_ready or has_timed:
            if has_ready and (not has_timed or ready.key() < timed.key()):
                key, queue = ready.item()
                has_ready = ready.next()
            else:
                key, queue = timed.item()
                has_timed = self._settle(timed.next())
            if queues is None or queue in queues:
                yield key[_BAND + _TIME :], queue

    def _settle(self, positioned: bool) -> bool:
        """Move the timers cursor to the next due key: past a band's future times with one seek."""
        timed = self._timed
        due = self._due
        while positioned:
            key = timed.key()
            if due is not None and key[_BAND : _BAND + _TIME] <= due:
                return True
            band = int.from_bytes(key[:_BAND], "big")
            if band == (1 << 64) - 1:
                return False
            positioned = timed.set_range(_U64.pack(band + 1))
        return False


def next_wake(
    txn: lmdb.Transaction[bytes], shared: SharedEnv, now_ms: int, queues: Sequence[str] | None
) -> int | None:
    """The earliest wake time after ``now_ms`` of a waiting root run (in ``queues``)."""
    if shared.waits is None:
        return None
    cursor = txn.cursor(db=shared.waits)
    after = now_ms + 1
    if after > _PRIORITY_MAX:
        return None
    start = b"\x00" + _U64.pack(max(after, -_INT64) + _INT64)
    if not cursor.set_range(start):
        return None
    wanted = None if queues is None else {queue.encode("ascii") for queue in queues}
    for key, queue in cursor:
        if key[:1] != b"\x00":
            return None
        if wanted is None or queue in wanted:
            return int.from_bytes(key[1:_TIME], "big") - _INT64
    return None
