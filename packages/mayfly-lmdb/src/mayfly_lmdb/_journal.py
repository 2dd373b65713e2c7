"""``LmdbJournal``: the ``lmdb://`` journal, compare-and-append inside one LMDB write transaction.

Every rule of an append (fencing, the expected next sequence, exact replay,
event-id dedup) is checked in the same write transaction that stores the
records, the event-id index and the run head. LMDB allows one writer per
environment across all processes, so the check and the write are atomic
for every process on the host; readers see committed transactions only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Self, final

import lmdb

from mayfly.journal import (
    AppendResult,
    Durability,
    JournalCapabilities,
    JournalRecord,
    SnapshotRecord,
    validate_batch,
    validate_read,
)
from mayfly.model.errors import (
    AppendConflict,
    ConflictingRecord,
    CorruptionError,
    FencingRejected,
    InvalidRecord,
    JournalGap,
    JournalUnavailable,
)
from mayfly.model.ids import parse_run_id
from mayfly_lmdb import _codec
from mayfly_lmdb._env import SharedEnv, acquire_env, release_env
from mayfly_lmdb._url import parse_url

__all__ = ["LmdbJournal"]

_MAX_LIST_LIMIT: Final = 100_000
_EMPTY_RUN: Final = b""
_KEY_LENGTH: Final = 24  # run id (16 bytes) || u64be sequence


@final
class LmdbJournal:
    """The ``lmdb:///DIR`` journal: one LMDB environment, safe across threads and processes.

    ``DIR`` is created on first use. ``?durability=sync`` (the default)
    acknowledges after LMDB's durable commit, ``nosync`` after the pages are
    handed to the OS. See :mod:`mayfly_lmdb` for every URL option.
    """

    def __init__(self, url: str) -> None:
        target = parse_url(url)
        self._url = target.url
        self._durability = target.durability
        self._readonly = target.readonly
        self._shared: SharedEnv | None = acquire_env(target)

    @property
    def url(self) -> str:
        """The environment URL (local paths carry no password)."""
        return self._url

    @property
    def durability(self) -> Durability:
        """``durable`` with ``durability=sync``, ``write`` with ``durability=nosync``."""
        return self._durability

    @property
    def capabilities(self) -> JournalCapabilities:
        """Cross-process, fenced, crash-durable, with fault injection and expiring leases."""
        return JournalCapabilities(
            durability=self._durability,
            cross_process=True,
            fencing=True,
            crash_durable=True,
            fault_injection=True,
            snapshots=True,
            lease_expiry=True,
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
            raise JournalUnavailable(f"lmdb journal {self._url} is closed; open it again")
        return shared

    def _writable(self, operation: str) -> SharedEnv:
        # A readonly journal may share a read-write handle opened by another journal of this process.
        if self._readonly:
            raise JournalUnavailable(
                f"{operation} refused: lmdb journal {self._url} was opened with readonly=true"
            )
        return self._env

    # -- the journal contract ----------------------------------------------------------------

    def append(
        self,
        run_id: str,
        expected_next: int,
        records: Sequence[JournalRecord],
        fence: int | None = None,
    ) -> AppendResult:
        """Compare-and-append an atomic batch; see :meth:`mayfly.journal.WorkflowJournal.append`."""
        batch = validate_batch(run_id, expected_next, records, fence)
        operation = f"append to run {run_id}"
        shared = self._writable(operation)
        run = _codec.run_key(run_id)
        events_of = [_codec.uuid_bytes(record.event_id) for record in batch]
        values = [
            (event, _codec.encode_record(record, event))
            for event, record in zip(events_of, batch, strict=True)
        ]
        heads, events, stored, runs = shared.heads, shared.events, shared.records, shared.runs

        def body(txn: lmdb.Transaction[bytes]) -> AppendResult:
            next_sequence, current = _codec.decode_head(txn.get(run, db=heads), run_id)
            if (fence is None and current != 0) or (fence is not None and fence != current):
                raise FencingRejected(run_id, 0 if fence is None else fence, current)
            if expected_next != next_sequence:
                return self._replayed(
                    txn=txn,
                    run_id=run_id,
                    run=run,
                    batch=batch,
                    actual_next=next_sequence,
                    expected_next=expected_next,
                )
            sequence = expected_next
            for event, value in values:
                index = _codec.sequence_bytes(sequence)
                # put(overwrite=False) checks and claims the event id in one call.
                if not txn.put(run + event, index, overwrite=False, db=events):
                    used = int.from_bytes(txn.get(run + event, db=events) or b"", "big")
                    raise ConflictingRecord(
                        f"append rejected: run {run_id} event id {batch[sequence - expected_next].event_id}"
                        f" is already committed at sequence {used}"
                    )
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
            return AppendResult(run_id=run_id, last_sequence=sequence - 1, records=batch)

        return shared.write(body, operation)

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
        """Answer an append whose expected sequence is not the next one: replay or conflict.

        An exact re-append (every stored record at the batch's sequences,
        decoded and verified, equal to the batch) is acknowledged without
        writing; a damaged stored record raises ``ChecksumMismatch``. A batch
        event id committed with other content or at another sequence is a
        ``ConflictingRecord``; anything else is an ordinary lost race.
        """
        shared = self._env
        found: dict[int, JournalRecord | None] = {}

        def stored_at(sequence: int) -> JournalRecord | None:
            if sequence not in found:
                value = txn.get(_codec.record_key(run, sequence), db=shared.records)
                found[sequence] = None if value is None else _codec.decode_record(run_id, sequence, value)
            return found[sequence]

        if all(record.sequence < actual_next and stored_at(record.sequence) == record for record in batch):
            return AppendResult(
                run_id=run_id, last_sequence=batch[-1].sequence, records=batch, already_committed=True
            )
        for record in batch:
            index = txn.get(run + _codec.uuid_bytes(record.event_id), db=shared.events)
            if index is None:
                continue
            used = int.from_bytes(index, "big")
            if stored_at(used) is None:
                raise CorruptionError(
                    f"append rejected: run {run_id} event id {record.event_id} is indexed at sequence "
                    f"{used}, which holds no record; restore the LMDB environment from a backup"
                )
            if used != record.sequence or stored_at(used) != record:
                raise ConflictingRecord(
                    f"append rejected: run {run_id} event id {record.event_id} is already committed "
                    f"at sequence {used} with different content"
                )
        raise AppendConflict(run_id, expected_next, actual_next)

    def read(self, run_id: str, after: int = 0, limit: int | None = None) -> list[JournalRecord]:
        """Return records after ``after`` in order, checksum-verified; see the Protocol."""
        run_id, start, count = validate_read(run_id, after, limit)
        shared = self._env
        run = _codec.run_key(run_id)
        if count == 0:
            return []

        def body(txn: lmdb.Transaction[bytes]) -> tuple[int, list[tuple[bytes, bytes]]]:
            next_sequence, _ = _codec.decode_head(txn.get(run, db=shared.heads), run_id)
            found: list[tuple[bytes, bytes]] = []
            if next_sequence <= start + 1:
                return next_sequence, found
            cursor = txn.cursor(db=shared.records)
            if not cursor.set_range(_codec.record_key(run, start + 1)):
                return next_sequence, found
            for key, value in cursor:
                if key[:16] != run:
                    break
                found.append((key, value))
                if count is not None and len(found) == count:
                    break
            return next_sequence, found

        next_sequence, found = shared.read(body, f"read of run {run_id}")
        records: list[JournalRecord] = []
        expected = start + 1
        for key, value in found:
            if len(key) != _KEY_LENGTH:
                raise CorruptionError(
                    f"run {run_id} holds a malformed record key ({len(key)} bytes, not {_KEY_LENGTH}) "
                    f"where sequence {expected} belongs; restore the LMDB environment from a backup"
                )
            sequence = int.from_bytes(key[16:], "big")
            if sequence != expected:
                raise JournalGap(
                    f"journal gap in run {run_id}: expected sequence {expected}, found {sequence}; "
                    "restore the LMDB environment from a backup"
                    if sequence > expected
                    else f"run {run_id} holds a malformed record key at sequence {sequence}"
                )
            if sequence >= next_sequence:
                raise CorruptionError(
                    f"run {run_id} holds sequence {sequence} beyond its head (next {next_sequence}); "
                    "restore the LMDB environment from a backup"
                )
            records.append(_codec.decode_record(run_id, sequence, value))
            expected += 1
        wanted_end = next_sequence if count is None else min(next_sequence, start + 1 + count)
        if expected < wanted_end:
            raise JournalGap(
                f"journal gap in run {run_id}: expected sequence {expected}, found none (the run's head "
                f"is at {next_sequence}); restore the LMDB environment from a backup"
            )
        return records

    def next_sequence(self, run_id: str) -> int:
        """Return the sequence the next append must carry (1 for a new run)."""
        run_id = parse_run_id(run_id)
        shared = self._env
        run = _codec.run_key(run_id)
        value = shared.read(lambda txn: txn.get(run, db=shared.heads), f"head of run {run_id}")
        return _codec.decode_head(value, run_id)[0]

    def list_runs(self, after: str | None = None, limit: int = 1000) -> list[str]:
        """Return up to ``limit`` sorted run ids holding records, all greater than ``after``."""
        start = None if after is None else _codec.run_key(parse_run_id(after))
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _MAX_LIST_LIMIT:
            raise InvalidRecord(f"list_runs limit must be an int in [1, {_MAX_LIST_LIMIT}], got {limit!r}")
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

    def write_snapshot(self, run_id: str, snapshot: SnapshotRecord) -> None:
        """Store ``snapshot`` as the run's snapshot, replacing any earlier one in one transaction."""
        run_id = parse_run_id(run_id)
        if not isinstance(snapshot, SnapshotRecord):
            raise InvalidRecord(f"snapshot must be a SnapshotRecord, got {type(snapshot).__name__}")
        snapshot.validate()
        if snapshot.run_id != run_id:
            raise InvalidRecord(f"snapshot of run {snapshot.run_id} cannot be stored for run {run_id}")
        if snapshot.checksum != snapshot.expected_checksum():
            raise InvalidRecord(f"snapshot of run {run_id} does not match its checksum; reseal it")
        shared = self._writable(f"snapshot of run {run_id}")
        value = _codec.encode_snapshot(snapshot)
        run = _codec.run_key(run_id)
        shared.write(lambda txn: txn.put(run, value, db=shared.snapshots), f"snapshot of run {run_id}")

    def read_snapshot(self, run_id: str) -> SnapshotRecord | None:
        """Return the run's snapshot, ``None`` if absent; raise ``SnapshotCorrupt`` if unusable."""
        run_id = parse_run_id(run_id)
        shared = self._env
        run = _codec.run_key(run_id)
        value = shared.read(lambda txn: txn.get(run, db=shared.snapshots), f"snapshot of run {run_id}")
        return None if value is None else _codec.decode_snapshot(run_id, value)

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
        run_id = parse_run_id(run_id)
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
        run_id = parse_run_id(run_id)
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

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Release this journal's share of the environment; further calls raise JournalUnavailable."""
        shared, self._shared = self._shared, None
        if shared is not None:
            release_env(shared)

    def __enter__(self) -> Self:
        """Return the journal itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the journal."""
        self.close()

    def __repr__(self) -> str:
        return f"LmdbJournal({self._url!r})"
