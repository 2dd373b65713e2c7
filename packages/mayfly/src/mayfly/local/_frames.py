"""MWJ1 journal frames and MWS1 snapshot frames: the on-disk encoding of the local backend.

Every frame is ``magic (4 bytes) || u32 body length || u32 CRC-32 of the
body || body``, big-endian, with a bounded compact JSON body. A journal frame
body carries one record envelope plus ``batch_last``, the sequence of the last
record of the atomic batch the record was appended in: a batch is committed
only once its closing frame (``sequence == batch_last``) is on disk, which is
what lets torn-tail recovery drop a half-written batch as a whole.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import msgspec

from mayfly.journal import MAX_RECORD_PAYLOAD, MAX_SNAPSHOT_STATE, JournalRecord, SnapshotRecord
from mayfly.model.errors import (
    ChecksumMismatch,
    ConflictingRecord,
    CorruptionError,
    JournalGap,
    SnapshotCorrupt,
)

JOURNAL_MAGIC: Final = b"MWJ1"
SNAPSHOT_MAGIC: Final = b"MWS1"
FRAME_VERSION: Final = 1
HEADER: Final = struct.Struct(">4sII")
# JSON escaping can grow a payload up to 6x (\u00XX for control bytes); the
# envelope fields add well under 1 KiB. Anything longer was never written by us.
MAX_JOURNAL_BODY: Final = 6 * MAX_RECORD_PAYLOAD + (64 << 10)
MAX_SNAPSHOT_BODY: Final = (MAX_SNAPSHOT_STATE * 4) // 3 + (64 << 10)


class _JournalBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    v: int
    run_id: str
    sequence: int
    batch_last: int
    event_id: str
    event_type: str
    schema_version: int
    checksum: str
    # Payloads are validated UTF-8, so they are stored as JSON text (readable
    # with any JSON tool) instead of base64; decoding and re-encoding UTF-8 is
    # an exact round trip.
    payload: str


class _SnapshotBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    v: int
    run_id: str
    schema_version: int
    last_sequence: int
    last_event_id: str
    last_record_checksum: str
    spec_checksum: str
    state_checksum: str
    checksum: str
    state: bytes  # opaque, so base64 in JSON


_journal_encoder = msgspec.json.Encoder()
_journal_decoder = msgspec.json.Decoder(_JournalBody)
_snapshot_decoder = msgspec.json.Decoder(_SnapshotBody)


def _frame(magic: bytes, body: bytes) -> bytes:
    return HEADER.pack(magic, len(body), zlib.crc32(body)) + body


def encode_batch(records: Sequence[JournalRecord]) -> list[bytes]:
    """Return one MWJ1 frame per record, each naming the batch's last sequence."""
    batch_last = records[-1].sequence
    return [
        _frame(
            JOURNAL_MAGIC,
            _journal_encoder.encode(
                _JournalBody(
                    v=FRAME_VERSION,
                    run_id=record.run_id,
                    sequence=record.sequence,
                    batch_last=batch_last,
                    event_id=record.event_id,
                    event_type=record.event_type,
                    schema_version=record.schema_version,
                    checksum=record.checksum,
                    payload=record.payload.decode("utf-8"),
                )
            ),
        )
        for record in records
    ]


def decode_journal_body(body: bytes, where: str) -> tuple[JournalRecord, int]:
    """Decode one MWJ1 body into its record and ``batch_last``; raise CorruptionError if invalid."""
    try:
        decoded = _journal_decoder.decode(body)
    except msgspec.DecodeError as error:
        raise CorruptionError(f"unreadable journal frame at {where}: {error}") from None
    if decoded.v != FRAME_VERSION:
        raise CorruptionError(
            f"journal frame at {where} has unknown version {decoded.v}; upgrade Mayfly to read this journal"
        )
    record = JournalRecord(
        run_id=decoded.run_id,
        sequence=decoded.sequence,
        event_id=decoded.event_id,
        event_type=decoded.event_type,
        schema_version=decoded.schema_version,
        payload=decoded.payload.encode("utf-8"),
        checksum=decoded.checksum,
    )
    return record, decoded.batch_last


@dataclass(slots=True)
class RunIndex:
    """What a scan learned about one run file: frame offsets and event ids.

    Kept small (an 8-byte offset and one dict entry per record), since it
    stays in memory for every recently used run; stored checksums are read
    back from the file on the rare replay path instead.

    ``end`` is the offset just past the last committed batch; ``size`` is the
    file size the scan saw. ``size > end`` means a torn tail: bytes of a batch
    that never completed, so it was never acknowledged.
    """

    inode: int = -1
    size: int = 0
    end: int = 0
    offsets: array[int] = field(default_factory=lambda: array("q"))
    event_ids: dict[str, int] = field(default_factory=dict)

    @property
    def next_sequence(self) -> int:
        """The sequence the next append must carry."""
        return len(self.offsets) + 1

    @property
    def torn(self) -> bool:
        """Whether bytes follow the last committed batch."""
        return self.size > self.end


def scan(index: RunIndex, data: bytes, base: int, run_id: str) -> None:
    """Extend ``index`` with the frames in ``data`` (the file's bytes from offset ``base``).

    Complete frames must be valid: a bad magic, length, CRC, body, sequence
    or duplicate event id fails closed. Bytes after the last complete batch
    that end before a frame or batch is complete are a torn tail and are left
    out of the index (``index.size`` records that they exist).
    """
    position = 0
    length_total = len(data)
    pending: list[tuple[int, JournalRecord]] = []
    sequence = index.next_sequence
    while position < length_total:
        if length_total - position < HEADER.size:
            break
        magic, length, crc = HEADER.unpack_from(data, position)
        where = f"run {run_id} offset {base + position} (sequence {sequence})"
        if magic != JOURNAL_MAGIC:
            raise CorruptionError(f"bad frame magic {magic!r} at {where}; the journal is damaged")
        if length > MAX_JOURNAL_BODY:
            raise CorruptionError(f"frame length {length} over the limit at {where}")
        body_start = position + HEADER.size
        if length_total - body_start < length:
            break
        body = data[body_start : body_start + length]
        if zlib.crc32(body) != crc:
            raise ChecksumMismatch(f"frame CRC-32 mismatch at {where}; the journal is damaged")
        record, batch_last = decode_journal_body(body, where)
        if record.run_id != run_id:
            raise CorruptionError(f"frame at {where} belongs to run {record.run_id}")
        if record.sequence != sequence:
            if record.sequence > sequence:
                raise JournalGap(
                    f"journal gap in run {run_id}: expected sequence {sequence}, "
                    f"found {record.sequence} at offset {base + position}"
                )
            raise ConflictingRecord(
                f"run {run_id} holds sequence {record.sequence} twice (offset {base + position})"
            )
        if batch_last < record.sequence:
            raise CorruptionError(f"frame at {where} closes batch {batch_last} before itself")
        pending.append((base + position, record))
        sequence += 1
        position = body_start + length
        if record.sequence == batch_last:
            for offset, committed in pending:
                if committed.event_id in index.event_ids:
                    raise ConflictingRecord(
                        f"run {run_id} holds event id {committed.event_id} at sequences "
                        f"{index.event_ids[committed.event_id]} and {committed.sequence}"
                    )
                index.offsets.append(offset)
                index.event_ids[committed.event_id] = committed.sequence
            pending.clear()
            index.end = base + position
    index.size = base + length_total


def decode_frames(data: bytes, run_id: str, first_sequence: int) -> list[JournalRecord]:
    """Decode consecutive complete MWJ1 frames, checking CRCs, order and record checksums."""
    records: list[JournalRecord] = []
    position = 0
    sequence = first_sequence
    while position < len(data):
        where = f"run {run_id} sequence {sequence}"
        if len(data) - position < HEADER.size:
            raise CorruptionError(f"truncated frame at {where}")
        magic, length, crc = HEADER.unpack_from(data, position)
        body = data[position + HEADER.size : position + HEADER.size + length]
        if magic != JOURNAL_MAGIC or len(body) != length:
            raise CorruptionError(f"bad frame at {where}; the journal is damaged")
        if zlib.crc32(body) != crc:
            raise ChecksumMismatch(f"frame CRC-32 mismatch at {where}; the journal is damaged")
        record, _ = decode_journal_body(body, where)
        if record.sequence != sequence:
            raise JournalGap(
                f"journal gap in run {run_id}: expected sequence {sequence}, found {record.sequence}"
            )
        record.verify()
        records.append(record)
        sequence += 1
        position += HEADER.size + length
    return records


def encode_snapshot(snapshot: SnapshotRecord) -> bytes:
    """Return the MWS1 frame of ``snapshot``."""
    body = msgspec.json.encode(
        _SnapshotBody(
            v=FRAME_VERSION,
            run_id=snapshot.run_id,
            schema_version=snapshot.schema_version,
            last_sequence=snapshot.last_sequence,
            last_event_id=snapshot.last_event_id,
            last_record_checksum=snapshot.last_record_checksum,
            spec_checksum=snapshot.spec_checksum,
            state_checksum=snapshot.state_checksum,
            checksum=snapshot.checksum,
            state=snapshot.state,
        )
    )
    return _frame(SNAPSHOT_MAGIC, body)


def decode_snapshot(data: bytes, run_id: str) -> SnapshotRecord:
    """Decode and verify an MWS1 frame; raise :class:`SnapshotCorrupt` with the reason."""
    if len(data) < HEADER.size:
        raise SnapshotCorrupt(run_id, "truncated header")
    magic, length, crc = HEADER.unpack_from(data, 0)
    if magic != SNAPSHOT_MAGIC:
        raise SnapshotCorrupt(run_id, f"bad magic {magic!r}")
    if length > MAX_SNAPSHOT_BODY or len(data) != HEADER.size + length:
        raise SnapshotCorrupt(run_id, f"frame length {length} does not match the file")
    body = data[HEADER.size :]
    if zlib.crc32(body) != crc:
        raise SnapshotCorrupt(run_id, "CRC-32 mismatch")
    try:
        decoded = _snapshot_decoder.decode(body)
    except msgspec.DecodeError as error:
        raise SnapshotCorrupt(run_id, f"unreadable body: {error}") from None
    if decoded.v != FRAME_VERSION:
        raise SnapshotCorrupt(run_id, f"unknown snapshot frame version {decoded.v}")
    snapshot = SnapshotRecord(
        run_id=decoded.run_id,
        schema_version=decoded.schema_version,
        last_sequence=decoded.last_sequence,
        last_event_id=decoded.last_event_id,
        last_record_checksum=decoded.last_record_checksum,
        spec_checksum=decoded.spec_checksum,
        state_checksum=decoded.state_checksum,
        state=decoded.state,
        checksum=decoded.checksum,
    )
    snapshot.verify()
    if snapshot.run_id != run_id:
        raise SnapshotCorrupt(run_id, f"file holds the snapshot of run {snapshot.run_id}")
    return snapshot
