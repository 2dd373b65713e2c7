"""``LmdbJournal``: the ``lmdb://`` journal, compare-and-append inside one LMDB write transaction.

Every rule of an append (fencing, the expected next sequence, exact replay,
event-id dedup) is checked in the same write transaction that stores the
records, the event-id index and the run head. LMDB allows one writer per
environment across all processes, so the check and the write are atomic
for every process on the host; readers see committed transactions only.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Final, final

import lmdb
import msgspec

from mayfly.backend import FifoWakeupListener, JournalBase, notify_fifo_wakeups
from mayfly.errors import CorruptionError, InvalidRecord, JournalUnavailable, LeaseHeld
from mayfly.journal import AppendResult, JournalCapabilities, JournalRecord, SnapshotRecord
from mayfly.lease import RecoveryLeaseGuard, validate_acquire
from mayfly.queues import QueueSettings, QueueUsage, check_held, plan_claim
from mayfly.queues import check_queue_name as _check_queue
from mayfly.runindex import IndexEntry, IndexStatus, check_claim
from mayfly_lmdb import _codec, _index
from mayfly_lmdb._env import SharedEnv, acquire_env, off_hub, release_env
from mayfly_lmdb._lease import LmdbLeaseStore, grant_in, lease_live, now_ms, try_lock
from mayfly_lmdb._schedules import LmdbSchedules
from mayfly_lmdb._url import parse_url

__all__ = ["LmdbJournal"]

_EMPTY_RUN: Final = b""
_KEY_LENGTH: Final = 24  # run id (16 bytes) || u64be sequence
_FEATURES: Final = (
    "cross_process fencing crash_durable fault_injection snapshots lease_expiry run_purge "
    "run_index run_wakeups queue_control schedule_store"
)
_INT64: Final = 1 << 63
_NIL_RUN: Final = "00000000-0000-0000-0000-000000000000"  # validates a claim's owner and ttl


@final
class LmdbJournal(LmdbSchedules, JournalBase):
    """The ``lmdb:///DIR`` journal: one LMDB environment, safe across threads and processes.

    ``DIR`` is created on first use. ``?durability=sync`` (the default)
    acknowledges after LMDB's durable commit, ``nosync`` after the pages are
    handed to the OS. See :mod:`mayfly_lmdb` for every URL option. Declares
    cross-process, fenced, crash-durable, fault injection, expiring leases,
    run purging, the run index (written in each append's transaction) and
    wake-ups for idle workers.
    """

    remedy = "restore the LMDB environment from a backup"

    def __init__(self, url: str) -> None:
        target = parse_url(url)
        self._readonly = target.readonly
        self._source = target.url
        self._shared: SharedEnv | None = acquire_env(target)
        self._wakeups = os.path.join(target.path, "wakeups")
        self._lock_dir = os.path.join(target.path, "leases")  # the lease store's file locks
        self._guard = threading.Lock()
        self._leases: LmdbLeaseStore | None = None
        super().__init__(
            url=target.url, capabilities=JournalCapabilities.declare(target.durability, _FEATURES)
        )

    @property
    def path(self) -> str:
        """The environment directory."""
        return self._env.path

    @property
    def map_size(self) -> int:
        """The current size of this process's LMDB map, in bytes (it grows on demand)."""
        return self._env.map_size

    @property
    def _env(self) -> SharedEnv:
        shared = self._shared
        if shared is None:
            raise self.closed_error("use of the environment")
        return shared

    def _writable(self, operation: str) -> SharedEnv:
        # A readonly journal may share a read-write handle opened by another journal of this process.
        if self._readonly:
            raise JournalUnavailable(
                f"{operation} refused: lmdb journal {self.url} was opened with readonly=true"
            )
        return self._env

    # -- the journal contract ----------------------------------------------------------------

    def _append(
        self, run_id: str, expected_next: int, batch: tuple[JournalRecord, ...], fence: int | None
    ) -> AppendResult:
        operation = f"append to run {run_id}"
        shared = self._writable(operation)
        result, _ = shared.write(self._append_body(run_id, expected_next, batch, fence, None), operation)
        return result

    def _append_indexed(
        self,
        run_id: str,
        expected_next: int,
        batch: tuple[JournalRecord, ...],
        fence: int | None,
        entry: Callable[[], IndexEntry],
    ) -> AppendResult:
        operation = f"append to run {run_id}"
        shared = self._writable(operation)
        result, claimable = shared.write(
            self._append_body(run_id, expected_next, batch, fence, entry), operation
        )
        if claimable:
            self.notify_wakeups()
        return result

    def _append_body(
        self,
        run_id: str,
        expected_next: int,
        batch: tuple[JournalRecord, ...],
        fence: int | None,
        entry: Callable[[], IndexEntry] | None,
    ) -> Callable[[lmdb.Transaction[bytes]], tuple[AppendResult, bool]]:
        """The write of one append: compare, fence, records, head and (with ``entry``) the run's index entry.

        Answers the result and whether the run is claimable now with no live
        lease (idle workers are then told). ``entry()`` is called once the
        batch can no longer be refused, and only once, though a full map
        makes LMDB run the write again.
        """
        shared = self._env
        run = _codec.run_key(run_id)
        events_of = [_codec.uuid_bytes(record.event_id) for record in batch]
        values = [
            (event, _codec.encode_record(record, event))
            for event, record in zip(events_of, batch, strict=True)
        ]
        heads, events, stored, runs = shared.heads, shared.events, shared.records, shared.runs
        computed: list[IndexEntry] = []

        def body(txn: lmdb.Transaction[bytes]) -> tuple[AppendResult, bool]:
            next_sequence, current = _codec.decode_head(txn.get(run, db=heads), run_id)
            self.check_fence(run_id, fence, current)
            if expected_next != next_sequence:
                replayed = self._replayed(
                    txn=txn,
                    run_id=run_id,
                    run=run,
                    batch=batch,
                    actual_next=next_sequence,
                    expected_next=expected_next,
                )
                return replayed, False
            sequence = expected_next
            for event, value in values:
                index = _codec.sequence_bytes(sequence)
                # put(overwrite=False) checks and claims the event id in one call.
                if not txn.put(run + event, index, overwrite=False, db=events):
                    used = int.from_bytes(txn.get(run + event, db=events) or b"", "big")
                    raise self.event_id_taken(run_id, batch[sequence - expected_next].event_id, used)
                # Never overwrite: a record already stored at the head's next sequence means the
                # head is behind the records (damage), and that record may be acknowledged.
                if not txn.put(run + index, value, overwrite=False, db=stored):
                    raise CorruptionError(
                        f"append rejected: run {run_id} already holds a record at sequence {sequence} "
                        f"although its head is at {next_sequence}; the LMDB environment is damaged, "
                        "restore it from a backup (nothing was written)"
                    )
                sequence += 1
            txn.put(run, _codec.encode_head(sequence, current), db=heads)
            if next_sequence == 1:
                txn.put(run, _EMPTY_RUN, db=runs)
            claimable = False
            if entry is not None:
                # Every check passed: the batch commits with this entry (or not at all).
                if not computed:
                    computed.append(_index.check_entry(entry()))
                # strict: a live run's dedup id refuses the batch, and the transaction writes nothing.
                stored_entry = _index.put_entry(txn, shared, computed[0], strict=True)
                claimable = self._claimable_now(txn, run, run_id, stored_entry)
            return AppendResult(run_id=run_id, last_sequence=sequence - 1, records=batch), claimable

        return body

    def _claimable_now(
        self, txn: lmdb.Transaction[bytes], run: bytes, run_id: str, entry: IndexEntry | None
    ) -> bool:
        """Whether a worker could claim the run at once: claimable by the wall clock, and no live lease."""
        if entry is None:
            return False
        now = now_ms()
        if not _index.claimable_at(entry, now):
            return False
        grant = _codec.decode_lease(txn.get(run, db=self._env.leases), run_id)
        return grant is None or grant.expires_ms <= now

    def _replayed(
        self,
        *,
        txn: lmdb.Transaction[bytes],
        run_id: str,
        run: bytes,
        batch: tuple[JournalRecord, ...],
        actual_next: int,
        expected_next: int,
    ) -> AppendResult:
        """Answer an append whose expected sequence is not the next one (the kit's ``refused``).

        Stored records are decoded and verified before they are compared, so a
        damaged copy raises ``ChecksumMismatch`` instead of passing for committed.
        """
        shared = self._env
        found: dict[int, JournalRecord | None] = {}

        def stored_at(sequence: int) -> JournalRecord | None:
            if sequence not in found:
                value = txn.get(_codec.record_key(run, sequence), db=shared.records)
                found[sequence] = None if value is None else _codec.decode_record(run_id, sequence, value)
            return found[sequence]

        def sequence_of(event_id: str) -> int | None:
            index = txn.get(run + _codec.uuid_bytes(event_id), db=shared.events)
            return None if index is None else int.from_bytes(index, "big")

        return self.refused(
            run_id,
            expected_next,
            batch,
            actual_next=actual_next,
            stored_at=stored_at,
            sequence_of=sequence_of,
        )

    def _read(self, run_id: str, after: int, limit: int | None) -> list[JournalRecord]:
        shared = self._env
        run = _codec.run_key(run_id)

        def body(txn: lmdb.Transaction[bytes]) -> tuple[int, list[tuple[bytes, bytes]]]:
            next_sequence, _ = _codec.decode_head(txn.get(run, db=shared.heads), run_id)
            found: list[tuple[bytes, bytes]] = []
            if next_sequence <= after + 1:
                return next_sequence, found
            cursor = txn.cursor(db=shared.records)
            if not cursor.set_range(_codec.record_key(run, after + 1)):
                return next_sequence, found
            for key, value in cursor:
                if key[:16] != run:
                    break
                found.append((key, value))
                if limit is not None and len(found) == limit:
                    break
            return next_sequence, found

        next_sequence, found = shared.read(body, f"read of run {run_id}")
        return self.window(
            run_id,
            after,
            limit,
            self._sequenced(run_id, after, found),
            lambda sequence, value: _codec.decode_record(run_id, sequence, value),
            next_sequence=next_sequence,
        )

    def _sequenced(
        self, run_id: str, after: int, found: list[tuple[bytes, bytes]]
    ) -> Iterator[tuple[int, bytes]]:
        """The sequence of each stored key; a key of the wrong length is damage where it lies."""
        for offset, (key, value) in enumerate(found):
            if len(key) != _KEY_LENGTH:
                raise CorruptionError(
                    f"run {run_id} holds a malformed record key ({len(key)} bytes, not {_KEY_LENGTH}) "
                    f"where sequence {after + 1 + offset} belongs; {self.remedy}"
                )
            yield int.from_bytes(key[16:], "big"), value

    def _next_sequence(self, run_id: str) -> int:
        shared = self._env
        run = _codec.run_key(run_id)
        value = shared.read(lambda txn: txn.get(run, db=shared.heads), f"head of run {run_id}")
        return _codec.decode_head(value, run_id)[0]

    def _list_runs(self, after: str | None, limit: int) -> list[str]:
        start = None if after is None else _codec.run_key(after)
        shared = self._env

        def body(txn: lmdb.Transaction[bytes]) -> list[bytes]:
            cursor = txn.cursor(db=shared.runs)
            if not (cursor.first() if start is None else cursor.set_range(start)):
                return []
            keys: list[bytes] = []
            for key in cursor.iternext(values=False):
                if key == start:
                    continue
                keys.append(key)
                if len(keys) == limit:
                    break
            return keys

        keys = shared.read(body, "listing runs")
        return [_codec.run_text(key) for key in keys]

    def _write_snapshot(self, run_id: str, snapshot: SnapshotRecord) -> None:
        shared = self._writable(f"snapshot of run {run_id}")
        value = _codec.encode_snapshot(snapshot)
        run = _codec.run_key(run_id)
        shared.write(lambda txn: txn.put(run, value, db=shared.snapshots), f"snapshot of run {run_id}")

    def _read_snapshot(self, run_id: str) -> SnapshotRecord | None:
        shared = self._env
        run = _codec.run_key(run_id)
        value = shared.read(lambda txn: txn.get(run, db=shared.snapshots), f"snapshot of run {run_id}")
        # Verified once, by the base.
        return None if value is None else _codec.decode_snapshot(run_id, value, verify=False)

    # -- purging (capabilities.run_purge) ------------------------------------------------------

    def purge_run(self, run_id: str) -> bool:
        """Delete the run's records, event ids, snapshot, listing and lease grant in one transaction.

        The run's head keeps its fencing token (with next sequence 1), so
        tokens stay monotonic. An unexpired grant raises ``LeaseHeld`` and
        nothing changes.
        """
        run_id = self.open_run(run_id, "purge")
        shared = self._writable(f"purge of run {run_id}")
        run = _codec.run_key(run_id)

        def prefixed(txn: lmdb.Transaction[bytes], db: lmdb._Database) -> int:
            cursor = txn.cursor(db=db)
            removed = 0
            if cursor.set_range(run):
                while cursor.key()[:16] == run and cursor.delete():
                    removed += 1
                    if not cursor.key():
                        break
            return removed

        def body(txn: lmdb.Transaction[bytes]) -> bool:
            grant = _codec.decode_lease(txn.get(run, db=shared.leases), run_id)
            if grant is not None and grant.expires_ms > time.time_ns() // 1_000_000:
                raise LeaseHeld(run_id, f"{grant.owner} (pid {grant.pid}, token {grant.token})")
            next_sequence, fence = _codec.decode_head(txn.get(run, db=shared.heads), run_id)
            removed = prefixed(txn, shared.records) + prefixed(txn, shared.events)
            removed += txn.delete(run, db=shared.snapshots) + txn.delete(run, db=shared.runs)
            txn.delete(run, db=shared.leases)
            _index.remove_entry(txn, shared, run, run_id)
            if next_sequence != 1:
                txn.put(run, _codec.encode_head(1, fence), db=shared.heads)
            return bool(removed) or next_sequence != 1

        return shared.write(body, f"purge of run {run_id}")

    # -- operations --------------------------------------------------------------------------

    def backup(self, destination: str | os.PathLike[str], *, compact: bool = True) -> Path:
        """Write a consistent copy of the whole environment to a new directory and return it.

        Safe while any process appends: the copy is one read transaction's
        snapshot (LMDB's ``mdb_env_copy2``, the same as ``mdb_copy``), so it
        holds every record committed before it began and nothing partial.
        ``compact`` leaves free pages out. Open the copy with its own URL.
        The call blocks for the copy's duration: from a hub task, run it
        through :func:`mayfly.substrate.offload`.
        """
        target = Path(destination).expanduser().absolute()
        shared = self._env
        try:
            target.mkdir(parents=True, exist_ok=True)
            if any(target.iterdir()):
                raise JournalUnavailable(f"backup destination {target} is not empty; choose a new directory")
        except OSError as error:
            raise JournalUnavailable(f"cannot create backup directory {target}: {error}") from None
        shared.copy(str(target), compact=compact, operation=f"backup to {target}")
        return target

    # -- fault injection for the contract suite ----------------------------------------------

    def corrupt_record(self, run_id: str, sequence: int) -> None:
        """Flip one bit of the stored checksum of ``sequence`` (contract-suite fault hook)."""
        self._edit_record(run_id, sequence, remove=False)

    def remove_record(self, run_id: str, sequence: int) -> None:
        """Delete the stored record of ``sequence``, leaving a gap (contract-suite fault hook)."""
        self._edit_record(run_id, sequence, remove=True)

    def _edit_record(self, run_id: str, sequence: int, *, remove: bool) -> None:
        run_id = self.open_run(run_id, "fault injection")
        shared = self._writable(f"fault injection on run {run_id}")
        key = _codec.record_key(_codec.run_key(run_id), sequence)

        def body(txn: lmdb.Transaction[bytes]) -> None:
            value = txn.get(key, db=shared.records)
            if value is None:
                raise InvalidRecord(f"run {run_id} has no sequence {sequence}")
            if remove:
                txn.delete(key, db=shared.records)
            else:
                damaged = bytearray(value)
                damaged[5] ^= 0x20
                txn.put(key, bytes(damaged), db=shared.records)

        shared.write(body, f"fault injection on run {run_id}")

    def corrupt_snapshot(self, run_id: str) -> None:
        """Flip one bit inside the stored snapshot (contract-suite fault hook)."""
        run_id = self.open_run(run_id, "fault injection")
        shared = self._writable(f"fault injection on run {run_id}")
        run = _codec.run_key(run_id)

        def body(txn: lmdb.Transaction[bytes]) -> None:
            value = txn.get(run, db=shared.snapshots)
            if value is None:
                raise InvalidRecord(f"run {run_id} has no snapshot")
            damaged = bytearray(value)
            damaged[min(len(damaged) - 1, 40)] ^= 0x20
            txn.put(run, bytes(damaged), db=shared.snapshots)

        shared.write(body, f"fault injection on run {run_id}")

    # -- the run index (mayfly.runindex) -----------------------------------------------------

    def _lease_store(self) -> LmdbLeaseStore:
        """The store whose guards claims return, opened on first claim and closed with the journal."""
        with self._guard:
            if self._leases is None:
                self._leases = LmdbLeaseStore(self._source)
            return self._leases

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
        """Lease up to ``limit`` root runs claimable at ``now_ms`` to ``owner`` in claim order, atomically.

        One write transaction scans the claim order (priority descending,
        then ``ready_at``, absent last, then run id), skips runs whose lease
        is live, and grants each chosen run's lease (a new fencing token, the
        owner, the expiry) exactly as ``LmdbLeaseStore.acquire`` does, taking
        the run's file lock where it is free. LMDB's single writer makes the
        selection and the grants atomic across processes: no run is handed to
        two claimants. The commit is durable before the guards are returned
        (from a hub task it waits on an offload thread).

        Queues with settings are obeyed in the same transaction: their runs
        in progress (recorded claims whose grants are live) and recent starts
        are counted there, and ``held`` is what the claimant holds of each
        queue (per-worker limits). A first claim of a new run records its start.
        """
        limit, names = check_claim(limit, queues)
        holding = check_held(held)
        _, owner, ttl = validate_acquire(_NIL_RUN, owner, ttl_ms)
        if isinstance(now_ms, bool) or not isinstance(now_ms, int):
            raise InvalidRecord(f"claim now_ms must be an int (wall-clock ms), got {now_ms!r:.40}")
        now = max(-_INT64, min(now_ms, _INT64 - 1))
        operation = "claim of runs"
        shared = self._writable(operation)
        self.ensure_open(operation)
        if shared.claims is None:
            return []
        store = self._lease_store()
        locks: dict[bytes, int | None] = {}

        def unlock_all() -> None:
            for fd in locks.values():
                if fd is not None:
                    os.close(fd)
            locks.clear()

        def body(txn: lmdb.Transaction[bytes]) -> list[tuple[str, int]]:
            unlock_all()  # a retried write (the map grew) starts again from nothing
            granted: list[tuple[str, int]] = []
            wall = time.time_ns() // 1_000_000
            pid = os.getpid()
            settings = self._settings(txn, names)
            usage = {name: self._usage(txn, queue, now, wall) for name, queue in settings.items()}
            mine = dict(holding)
            limited = {name.encode("ascii"): name for name in settings}
            full = {key for key, name in limited.items() if _room(settings[name], usage[name], mine) <= 0}
            if names is not None and full >= {name.encode("ascii") for name in names}:
                return granted
            for run, queue in _index.OrderScan(txn, shared, now, names):
                if queue in full:
                    continue
                run_id = _codec.run_text(run)
                name = limited.get(queue)
                entry = None
                if name is not None:
                    entry = _index.get_entry(txn, shared, run, run_id)
                    if entry is None or not plan_claim(
                        [entry], limit=1, settings=settings, usage=usage, held=mine
                    ):
                        continue
                current = _codec.decode_lease(txn.get(run, db=shared.leases), run_id)
                if current is not None and current.expires_ms > wall:
                    if not current.locked:
                        continue  # live, and its holder's death could only show at expiry
                    if current.pid == pid and shared.locked_here.get(run) == current.token:
                        continue  # a guard of this very process holds its lock: no need to try it
                fd = try_lock(store.lock_path(run_id), f"{owner} (pid {os.getpid()}, claiming)")
                outcome = grant_in(txn, shared, run, run_id, owner=owner, ttl_ms=ttl, locked=fd is not None)
                if isinstance(outcome, _codec.LeaseState):
                    if fd is not None:
                        os.close(fd)
                    continue
                locks[run] = fd
                granted.append((run_id, outcome))
                if name is not None and entry is not None:
                    txn.put(_index.queue_prefix(name) + run, b"", db=shared.qruns)
                    used = usage[name]
                    start = entry.status is IndexStatus.NEW and entry.started_ms is None
                    usage[name] = QueueUsage(
                        in_progress=used.in_progress + 1, recent_starts=used.recent_starts + start
                    )
                    mine[name] = mine.get(name, 0) + 1
                    if _room(settings[name], usage[name], mine) <= 0:
                        full.add(queue)
                if len(granted) == limit:
                    break
            # The scan is done: now the claim orders may change (a claim clears the runs' wake).
            for run_id, _token in granted:
                _index.claimed(txn, shared, _codec.run_key(run_id), run_id, now)
            return granted

        try:
            granted = shared.write(body, operation)
            if granted and not shared.sync:
                off_hub(shared.flush, operation)  # tokens never go backwards, even after a host crash
        except BaseException:
            unlock_all()
            raise
        guards: list[RecoveryLeaseGuard] = [
            store.adopt(run_id, owner, ttl, token, locks.pop(_codec.run_key(run_id), None))
            for run_id, token in granted
        ]
        return guards

    def _settings(
        self, txn: lmdb.Transaction[bytes], names: Sequence[str] | None
    ) -> dict[str, QueueSettings]:
        """The settings of the queues named (``None``: every queue with settings), by name."""
        shared = self._env
        if shared.queues is None:
            return {}
        found: dict[str, QueueSettings] = {}
        if names is None:
            cursor = txn.cursor(db=shared.queues)
            items: list[tuple[bytes, bytes]] = list(cursor.iternext())
        else:
            items = []
            for name in names:
                key = name.encode("ascii")
                value = txn.get(key, db=shared.queues)
                if value is not None:
                    items.append((key, value))
        for key, value in items:
            name = key.decode("ascii", "replace")
            try:
                found[name] = msgspec.json.decode(value, type=QueueSettings)
            except (msgspec.ValidationError, msgspec.DecodeError):
                raise CorruptionError(
                    f"the settings of queue {name!r} are undecodable; set them again with "
                    f"`mayfly queue set {name}`, or restore the LMDB environment from a backup"
                ) from None
        return found

    def _usage(self, txn: lmdb.Transaction[bytes], queue: QueueSettings, now: int, wall: int) -> QueueUsage:
        """The queue's runs in progress and recent starts, in a write transaction.

        A recorded claim counts while its run is a live root and its grant is
        live (see ``lease_live``); the others are deleted, so a killed
        claimant's runs free their slots as soon as its file locks are gone.
        """
        shared = self._env
        prefix = _index.queue_prefix(queue.name)
        cursor = txn.cursor(db=shared.qruns)
        dead: list[bytes] = []
        in_progress = 0
        if cursor.set_range(prefix):
            for key in cursor.iternext(values=False):
                if not key.startswith(prefix):
                    break
                run = key[len(prefix) :]
                run_id = _codec.run_text(run)
                entry = _index.get_entry(txn, shared, run, run_id)
                live = (
                    entry is not None
                    and entry.status is not IndexStatus.TERMINAL
                    and entry.parent is None
                    and lease_live(
                        txn,
                        shared,
                        run,
                        run_id,
                        path=os.path.join(self._lock_dir, f"{run_id}.lock"),
                        wall_ms=wall,
                    )
                )
                if live:
                    in_progress += 1
                else:
                    dead.append(key)
        for key in dead:
            txn.delete(key, db=shared.qruns)
        period = queue.rate_period_ms
        starts = 0 if period is None else _index.starts_since(txn, shared, queue.name, now - period)
        return QueueUsage(in_progress=in_progress, recent_starts=starts)

    def _lock_path(self, run_id: str) -> str:
        """The run's lease file lock (as ``LmdbLeaseStore.lock_path``)."""
        return os.path.join(self._lock_dir, f"{run_id}.lock")

    # -- queue flow control (capabilities.queue_control; mayfly.queues.QueueControl) ---------

    def queue_set(self, settings: QueueSettings) -> None:
        """Store the queue's settings durably, replacing any it had; claims obey them from now on.

        Runs of the queue leased while it had no settings were not recorded as
        claimed: every live root run of the queue with a stored grant is
        recorded now, and the next count forgets those whose grant is gone.
        """
        if not isinstance(settings, QueueSettings):
            raise InvalidRecord(f"queue settings must be a QueueSettings, got {type(settings).__name__}")
        operation = f"settings of queue {settings.name}"
        shared = self._writable(operation)
        self.ensure_open(operation)
        value = msgspec.json.encode(settings)
        prefix = _index.queue_prefix(settings.name)

        def body(txn: lmdb.Transaction[bytes]) -> None:
            txn.put(settings.name.encode("ascii"), value, db=shared.queues)
            for run in txn.cursor(db=shared.leases).iternext(values=False):
                entry = _index.get_entry(txn, shared, run, _codec.run_text(run))
                if (
                    entry is not None
                    and entry.queue == settings.name
                    and entry.parent is None
                    and entry.status is not IndexStatus.TERMINAL
                ):
                    txn.put(prefix + run, b"", db=shared.qruns)

        shared.write(body, operation)

    def queue_get(self, name: str) -> QueueSettings | None:
        """The queue's settings, or ``None`` if it has none."""
        _check_queue(name)
        self.ensure_open("queue settings")
        shared = self._env
        return shared.read(lambda txn: self._settings(txn, [name]), f"settings of queue {name}").get(name)

    def queue_list(self) -> list[QueueSettings]:
        """Every queue with settings, by name."""
        self.ensure_open("queue settings")
        found = self._env.read(lambda txn: self._settings(txn, None), "queue settings")
        return [found[name] for name in sorted(found)]

    def queue_remove(self, name: str) -> bool:
        """Remove the queue's settings (its runs are claimed without limits); ``False`` if it had none."""
        _check_queue(name)
        operation = f"settings of queue {name}"
        shared = self._writable(operation)
        self.ensure_open(operation)
        prefix = _index.queue_prefix(name)

        def body(txn: lmdb.Transaction[bytes]) -> bool:
            removed = bool(txn.delete(name.encode("ascii"), db=shared.queues))
            cursor = txn.cursor(db=shared.qruns)
            if cursor.set_range(prefix):
                while cursor.key().startswith(prefix) and cursor.delete():
                    if not cursor.key():
                        break
            return removed

        return shared.write(body, operation)

    def queue_usage(self, name: str, *, now_ms: int) -> QueueUsage:
        """The queue's runs in progress now and its starts within its rate window ending at ``now_ms``."""
        _check_queue(name)
        operation = f"usage of queue {name}"
        shared = self._writable(operation)
        self.ensure_open(operation)

        def body(txn: lmdb.Transaction[bytes]) -> QueueUsage:
            queue = self._settings(txn, [name]).get(name) or QueueSettings(name=name)
            return self._usage(txn, queue, now_ms, time.time_ns() // 1_000_000)

        return shared.write(body, operation)

    def next_wake(self, *, now_ms: int, queues: Sequence[str] | None = None) -> int | None:
        """The earliest ``ready_at_ms`` after ``now_ms`` of a waiting root run (one range read)."""
        _, names = check_claim(1, queues)
        if isinstance(now_ms, bool) or not isinstance(now_ms, int):
            raise InvalidRecord(f"next_wake now_ms must be an int (wall-clock ms), got {now_ms!r:.40}")
        self.ensure_open("next wake")
        shared = self._env
        return shared.read(
            lambda txn: _index.next_wake(txn, shared, now_ms, names), "next wake of the run index"
        )

    def index_get(self, run_id: str) -> IndexEntry | None:
        """The run's index entry, or ``None``."""
        run_id = self.open_run(run_id, "index read")
        shared = self._env
        run = _codec.run_key(run_id)
        return shared.read(
            lambda txn: _index.get_entry(txn, shared, run, run_id), f"index read of run {run_id}"
        )

    def index_put(self, entries: Sequence[IndexEntry]) -> None:
        """Store entries in one transaction; a lower sequence never replaces one, a stored wake is kept."""
        if not isinstance(entries, Sequence):
            raise InvalidRecord(
                f"index_put takes a sequence of IndexEntry values, got {type(entries).__name__}"
            )
        checked = [_index.check_entry(entry) for entry in entries]
        operation = "index write"
        shared = self._writable(operation)
        self.ensure_open(operation)
        if not checked:
            return

        def body(txn: lmdb.Transaction[bytes]) -> bool:
            claimable = False
            for entry in checked:
                stored = _index.put_entry(txn, shared, entry)
                run = _codec.run_key(entry.run_id)
                claimable = self._claimable_now(txn, run, entry.run_id, stored) or claimable
            return claimable

        if shared.write(body, operation):
            self.notify_wakeups()

    def index_wake(self, run_id: str) -> bool:
        """Set the run's ``wake`` so a worker claims it; ``False`` if it has no entry or has ended."""
        run_id = self.open_run(run_id, "index wake")
        operation = f"index wake of run {run_id}"
        shared = self._writable(operation)
        run = _codec.run_key(run_id)

        def body(txn: lmdb.Transaction[bytes]) -> tuple[bool, bool]:
            entry = _index.wake(txn, shared, run_id)
            return entry is not None, self._claimable_now(txn, run, run_id, entry)

        woken, claimable = shared.write(body, operation)
        if claimable:
            self.notify_wakeups()
        return woken

    def listen_wakeups(self) -> FifoWakeupListener:
        """A FIFO in ``DIR/wakeups``, readable when a run became claimable now (the kit's FIFO wake-ups)."""
        self.ensure_open("listening for wake-ups")
        return FifoWakeupListener(self._wakeups)

    def notify_wakeups(self) -> None:
        """Write a wake-up into every listening worker's FIFO (never blocks: the FIFOs are non-blocking)."""
        notify_fifo_wakeups(self._wakeups)

    # -- lifecycle ---------------------------------------------------------------------------

    def _close(self) -> None:
        """Release the claimed leases still held, then this journal's share of the environment."""
        with self._guard:
            leases, self._leases = self._leases, None
        try:
            if leases is not None:
                leases.close()
        finally:
            shared, self._shared = self._shared, None
            if shared is not None:
                release_env(shared)


def _room(queue: QueueSettings, used: QueueUsage, held: Mapping[str, int]) -> int:
    """How many more runs of the queue may be in progress (concurrency and per-worker limits alone)."""
    caps = [1]
    if queue.concurrency is not None:
        caps.append(queue.concurrency - used.in_progress)
    if queue.worker_concurrency is not None:
        caps.append(queue.worker_concurrency - held.get(queue.name, 0))
    return min(caps)
