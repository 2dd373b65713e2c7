"""MWJ1 journal frames and MWS1 snapshot frames: the on-disk encoding of the local backend.

Every frame is ``magic (4 bytes) || u32 body length || u32 CRC-32 of the
body || body``, big-endian, with a bounded compact JSON body. A journal frame
body carries one record envelope plus ``batch_last``, the sequence of the last
record of the atomic batch the record was appended in: a batch is committed
only once its closing frame (``sequence == batch_last``) is on disk, which is
what lets torn-tail recovery drop a half-written batch as a whole.

Readers do not need every frame verified to find their records: :func:`walk`
locates frames from their headers alone (magic and length, no CRC, no JSON),
and only the frames a read returns are CRC-checked and decoded. The batch
boundary at the end of the file is found by decoding backwards from the last
complete frame to the nearest batch-closing one (:func:`decode_frame`).

MWX1 offset hints (``snapshots/<run>.idx``) persist a run's frame offsets so
that a fresh process can locate the records after a snapshot without walking
the whole file. A hint is derived data: :func:`decode_hint` checks its own
CRC, and the journal verifies it against the run file before trusting it.
"""

from __future__ import annotations

import struct
import sys
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
HINT_MAGIC: Final = b"MWX1"
# magic, version, run file inode, committed end covered, frame count, CRC-32 of the offsets.
HINT_HEADER: Final = struct.Struct(">4sIQQQI")
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

    ``verified`` says every committed frame was CRC-checked and decoded and
    ``event_ids`` is complete (:func:`scan`); appends need that. Otherwise the
    offsets come from a header walk (``hinted`` False) or partly from an MWX1
    hint (``hinted`` True), and readers verify each frame they return.
    """

    inode: int = -1
    size: int = 0
    end: int = 0
    offsets: array[int] = field(default_factory=lambda: array("q"))
    event_ids: dict[str, int] = field(default_factory=dict)
    verified: bool = False
    hinted: bool = False
    hint_end: int = -1

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


def walk(data: bytes, base: int, offsets: array[int], run_id: str) -> int:
    """Append the offsets of the complete frames in ``data`` (the file from ``base``); return bytes consumed.

    Reads headers only. A bad magic or an impossible length fails closed; a
    frame that runs past the end of ``data`` ends the walk (the caller widens
    its window or treats it as the torn tail).
    """
    position = 0
    total = len(data)
    header = HEADER.size
    unpack = HEADER.unpack_from
    append = offsets.append
    while total - position >= header:
        magic, length, _crc = unpack(data, position)
        if magic != JOURNAL_MAGIC or length > MAX_JOURNAL_BODY:
            where = f"run {run_id} offset {base + position} (sequence {len(offsets) + 1})"
            if magic != JOURNAL_MAGIC:
                raise CorruptionError(f"bad frame magic {magic!r} at {where}; the journal is damaged")
            raise CorruptionError(f"frame length {length} over the limit at {where}")
        following = position + header + length
        if following > total:
            break
        append(base + position)
        position = following
    return position


def decode_frame(data: bytes, run_id: str, sequence: int) -> tuple[JournalRecord, int]:
    """Verify and decode the complete frame ``data`` holding ``sequence``; return it and ``batch_last``."""
    where = f"run {run_id} sequence {sequence}"
    if len(data) < HEADER.size:
        raise CorruptionError(f"truncated frame at {where}")
    magic, length, crc = HEADER.unpack_from(data, 0)
    body = data[HEADER.size :]
    if magic != JOURNAL_MAGIC or len(body) != length:
        raise CorruptionError(f"bad frame at {where}; the journal is damaged")
    if zlib.crc32(body) != crc:
        raise ChecksumMismatch(f"frame CRC-32 mismatch at {where}; the journal is damaged")
    record, batch_last = decode_journal_body(body, where)
    if record.run_id != run_id:
        raise CorruptionError(f"frame at {where} belongs to run {record.run_id}")
    if record.sequence != sequence:
        if record.sequence > sequence:
            raise JournalGap(
                f"journal gap in run {run_id}: expected sequence {sequence}, found {record.sequence}"
            )
        raise ConflictingRecord(f"run {run_id} holds sequence {record.sequence} twice")
    if batch_last < record.sequence:
        raise CorruptionError(f"frame at {where} closes batch {batch_last} before itself")
    record.verify()
    return record, batch_last


def encode_hint(inode: int, end: int, offsets: array[int]) -> bytes:
    """Return the MWX1 hint recording ``offsets`` of a run file (``inode``) committed up to ``end``."""
    packed = array("q", offsets)
    if sys.byteorder != "little":
        packed.byteswap()
    body = packed.tobytes()
    return HINT_HEADER.pack(HINT_MAGIC, FRAME_VERSION, inode, end, len(offsets), zlib.crc32(body)) + body


def decode_hint(data: bytes) -> tuple[int, int, array[int]] | None:
    """Return ``(inode, end, offsets)`` of an intact MWX1 hint, or ``None`` for anything else."""
    if len(data) < HINT_HEADER.size:
        return None
    magic, version, inode, end, count, crc = HINT_HEADER.unpack_from(data, 0)
    body = data[HINT_HEADER.size :]
    if magic != HINT_MAGIC or version != FRAME_VERSION or count < 1 or len(body) != 8 * count:
        return None
    if zlib.crc32(body) != crc:
        return None
    offsets = array("q")
    offsets.frombytes(body)
    if sys.byteorder != "little":
        offsets.byteswap()
    if offsets[0] != 0 or not offsets[-1] < end:
        return None
    return inode, end, offsets


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
    body = memoryview(data)[HEADER.size :]  # a snapshot can be megabytes: check and decode it in place
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
