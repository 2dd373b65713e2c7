"""MWJ2 journal frames, MWS1 snapshot frames and MWX2 offset hints: the on-disk encoding of the local backend.

Journal frames
--------------
A journal frame is ``header || body``, big-endian, with a bounded compact JSON
body. Version 2 (``MWJ2``, written since wave 2) covers every byte::

    magic "MWJ2" (4) || u32 body length || u32 CRC-32 of the body || u32 CRC-32 of the first 12 bytes

The header CRC is what makes a damaged length detectable *before* the body
is read: a frame whose header verifies but whose body runs past the end of the
file is a torn write, while a header that does not verify is damage. Version-1
frames (``MWJ1``: magic, length, body CRC; no header CRC) are still read, so
stores written before stay readable; appends always write version 2, and a
file may hold both.

A frame body carries one record envelope plus ``batch_last``, the sequence of
the last record of the atomic batch the record was appended in: a batch is
committed only once its closing frame (``sequence == batch_last``) is on disk.

Torn tails
----------
A crash mid-append can leave a batch that never completed at the physical end
of the file; it was never acknowledged, so readers ignore it and the next
writer cuts it. :func:`check_torn_tail` decides whether the bytes after the
last committed batch really are such a tail. They must be, in order: complete
and valid frames of one unfinished batch, then at most one incomplete frame
(a header prefix, or a verified header whose body runs past the end). Anything
else — a header that fails its CRC, garbage, a complete batch-closing frame,
a version-1 length that points past the end while the frame's real body is all
there, or any valid frame further on — is damage to bytes that may hold
acknowledged records, and fails closed.

Readers do not need every frame verified to find their records: :func:`walk`
locates frames from their headers alone (magic, length and, for version 2,
the header CRC; no body CRC, no JSON), and only the frames a read returns are
CRC-checked and decoded (:func:`decode_frame`, :func:`decode_frames`).

Offset hints
------------
MWX2 hints (``snapshots/<run>.idx``) persist a run's frame offsets so that a
fresh process can locate the records after a snapshot without walking the
whole file. A hint is derived data; its CRC covers its header and offsets, and
the journal verifies it against the run file before trusting it. A hint that
names the run file but ends beyond it is evidence of lost records, not a
wrong guess.
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

JOURNAL_MAGIC: Final = b"MWJ2"
"""Magic of the journal frames this code writes (version 2: the header has its own CRC)."""
JOURNAL_MAGIC_V1: Final = b"MWJ1"
"""Magic of version-1 journal frames (no header CRC); read, never written."""
SNAPSHOT_MAGIC: Final = b"MWS1"
FRAME_VERSION: Final = 2
"""Version of the journal frames this code writes (the ``v`` of their bodies)."""
SNAPSHOT_FRAME_VERSION: Final = 1
HEADER: Final = struct.Struct(">4sIII")
"""Version-2 journal frame header: magic, body length, body CRC-32, CRC-32 of the preceding 12 bytes."""
HEADER_V1: Final = struct.Struct(">4sII")
"""Version-1 journal frame header (and the MWS1 snapshot header): magic, body length, body CRC-32."""
_CRC_COVERED: Final = 12  # header bytes covered by a version-2 header CRC

VERIFY_HEADER_CRC = True
"""TEST-ONLY switch; never change it in production. ``False`` skips the version-2 header CRC check.

It exists so the simulator's test can show it finds real bugs: with the
check off, a damaged length field reads as a torn tail and acknowledged
records are silently cut (the bug the header CRC fixed); with it on, the
same seed fails closed. ``mayfly_contract.sim`` and its test flip it."""
HINT_MAGIC: Final = b"MWX2"
HINT_VERSION: Final = 2
# magic, version, run file inode, committed end covered, frame count, CRC-32 of everything after it.
HINT_HEADER: Final = struct.Struct(">4sIQQQI")
_HINT_COVERED: Final = 32  # hint header bytes before the CRC
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


def _journal_frame(body: bytes) -> bytes:
    head = struct.pack(">4sII", JOURNAL_MAGIC, len(body), zlib.crc32(body))
    return head + zlib.crc32(head).to_bytes(4, "big") + body


def encode_batch(records: Sequence[JournalRecord]) -> list[bytes]:
    """Return one MWJ2 frame per record, each naming the batch's last sequence."""
    batch_last = records[-1].sequence
    return [
        _journal_frame(
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
            )
        )
        for record in records
    ]


def decode_journal_body(body: bytes, where: str, version: int = FRAME_VERSION) -> tuple[JournalRecord, int]:
    """Decode one journal frame body of frame ``version`` into its record and ``batch_last``.

    Raises :class:`CorruptionError` if the body is unreadable or names another frame version.
    """
    try:
        decoded = _journal_decoder.decode(body)
    except msgspec.DecodeError as error:
        raise CorruptionError(f"unreadable journal frame at {where}: {error}") from None
    if decoded.v != version:
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


def _where(run_id: str, offset: int, last_good: int) -> str:
    return f"run {run_id} offset {offset} (after sequence {last_good}, the last good record)"


def read_header(
    data: bytes, position: int, run_id: str, base: int, last_good: int
) -> tuple[int, int, int] | None:
    """Parse the journal frame header at ``position``: ``(header size, body length, body CRC)``.

    Returns ``None`` when ``data`` ends inside the header. Raises when the
    bytes cannot be a header: a bad magic, a version-2 header whose CRC fails,
    or a length over the limit. ``base`` is the file offset of ``data[0]`` and
    ``last_good`` the sequence before the frame, both for the error message.
    """
    available = len(data) - position
    magic = data[position : position + 4]
    if magic == JOURNAL_MAGIC:
        if available < HEADER.size:
            return None
        _, length, crc, header_crc = HEADER.unpack_from(data, position)
        if VERIFY_HEADER_CRC and zlib.crc32(data[position : position + _CRC_COVERED]) != header_crc:
            raise ChecksumMismatch(
                f"frame header CRC-32 mismatch at {_where(run_id, base + position, last_good)}; "
                "the journal is damaged"
            )
        size = HEADER.size
    elif magic == JOURNAL_MAGIC_V1:
        if available < HEADER_V1.size:
            return None
        _, length, crc = HEADER_V1.unpack_from(data, position)
        size = HEADER_V1.size
    elif available < 4 and (JOURNAL_MAGIC.startswith(magic) or JOURNAL_MAGIC_V1.startswith(magic)):
        return None
    else:
        where = _where(run_id, base + position, last_good)
        raise CorruptionError(f"bad frame magic {magic!r} at {where}; the journal is damaged")
    if length > MAX_JOURNAL_BODY:
        raise CorruptionError(
            f"frame length {length} over the limit at {_where(run_id, base + position, last_good)}; "
            "the journal is damaged"
        )
    return size, length, crc


@dataclass(slots=True)
class RunIndex:
    """What a scan learned about one run file: frame offsets and event ids.

    Kept small (an 8-byte offset and one dict entry per record), since it
    stays in memory for every recently used run; stored checksums are read
    back from the file on the rare replay path instead.

    ``end`` is the offset just past the last committed batch; ``size`` is the
    file size the scan saw. ``size > end`` means a torn tail: bytes of a batch
    that never completed, so it was never acknowledged (:func:`check_torn_tail`
    has confirmed that before an index with a tail is used).

    ``verified`` says every committed frame was CRC-checked and decoded and
    ``event_ids`` is complete (:func:`scan`); appends need that. Otherwise the
    offsets come from a header walk (``hinted`` False) or partly from an MWX2
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


def _check_sequence(record: JournalRecord, sequence: int, run_id: str, offset: int) -> None:
    if record.run_id != run_id:
        raise CorruptionError(
            f"frame at {_where(run_id, offset, sequence - 1)} belongs to run {record.run_id}"
        )
    if record.sequence != sequence:
        if record.sequence > sequence:
            raise JournalGap(
                f"journal gap in run {run_id}: expected sequence {sequence}, "
                f"found {record.sequence} at offset {offset}"
            )
        raise ConflictingRecord(
            f"run {run_id} holds sequence {record.sequence} twice (again at offset {offset}, "
            f"where sequence {sequence} belongs)"
        )


def _decode_at(
    data: bytes, position: int, header: tuple[int, int, int], *, run_id: str, base: int, sequence: int
) -> tuple[JournalRecord, int]:
    """Verify and decode the complete frame at ``position`` whose header is ``header``."""
    size, length, crc = header
    body = data[position + size : position + size + length]
    where = _where(run_id, base + position, sequence - 1)
    if zlib.crc32(body) != crc:
        raise ChecksumMismatch(f"frame CRC-32 mismatch at {where}; the journal is damaged")
    version = FRAME_VERSION if size == HEADER.size else 1
    record, batch_last = decode_journal_body(body, where, version)
    _check_sequence(record, sequence, run_id, base + position)
    if batch_last < record.sequence:
        raise CorruptionError(f"frame at {where} closes batch {batch_last} before itself")
    return record, batch_last


def scan(index: RunIndex, data: bytes, base: int, run_id: str) -> None:
    """Extend ``index`` with the committed batches in ``data`` (the file's bytes from offset ``base``).

    Complete frames must be valid: a bad magic, header CRC, length, body CRC,
    body, sequence or duplicate event id fails closed. Scanning stops at the
    first frame that ``data`` does not hold completely; bytes after the last
    committed batch are left out of the index (``index.size`` records that
    they exist). Whether they are a genuine torn tail is for the caller to
    decide, with :func:`check_torn_tail`, once it knows they end the file.
    """
    position = 0
    length_total = len(data)
    pending: list[tuple[int, JournalRecord]] = []
    sequence = index.next_sequence
    while position < length_total:
        header = read_header(data, position, run_id, base, sequence - 1)
        if header is None or length_total - position - header[0] < header[1]:
            break
        record, batch_last = _decode_at(data, position, header, run_id=run_id, base=base, sequence=sequence)
        pending.append((base + position, record))
        sequence += 1
        position += header[0] + header[1]
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


def check_torn_tail(tail: bytes, base: int, run_id: str, next_sequence: int) -> None:
    """Raise unless ``tail``, the file's bytes from its last committed batch (at ``base``) on, is a torn tail.

    A torn tail is the prefix of one batch that a crash cut short: complete,
    valid, non-closing frames of that batch, then at most one incomplete
    frame. The incomplete frame must be a header prefix, or a header that
    verifies and announces a body longer than what is left. For a version-1
    header, which has no CRC of its own, the length is also cross-checked:
    if the rest of the file is exactly a body matching the header's CRC, the
    frame was complete and its length is damaged. In every case no valid
    frame may start anywhere after the point where the tail stops parsing,
    since a frame there would be an acknowledged record behind the damage.
    """
    position = 0
    sequence = next_sequence
    while position < len(tail):
        header = read_header(tail, position, run_id, base, sequence - 1)
        if header is None:
            return  # a header cut short: nothing can follow it
        size, length, crc = header
        if len(tail) - position - size < length:
            if size == HEADER_V1.size and zlib.crc32(tail[position + size :]) == crc:
                raise CorruptionError(
                    f"frame length {length} at {_where(run_id, base + position, sequence - 1)} "
                    "points past the end of the file, but the frame's body is all there: "
                    "its header is damaged"
                )
            found = _frame_after(tail, position + 1)
            if found is not None:
                raise CorruptionError(
                    f"the frame at {_where(run_id, base + position, sequence - 1)} runs past the end of "
                    f"the file, yet a valid frame follows at offset {base + found}: the journal is "
                    "damaged, and records after the damage may have been acknowledged"
                )
            return
        record, batch_last = _decode_at(tail, position, header, run_id=run_id, base=base, sequence=sequence)
        if record.sequence == batch_last:
            raise CorruptionError(
                f"run {run_id}: a committed batch ends at offset {base + position + size + length}, "
                "after bytes that were taken for a torn tail; the journal is damaged"
            )
        sequence += 1
        position += size + length


def _frame_after(data: bytes, start: int) -> int | None:
    """The offset of the first position at or after ``start`` where a valid journal frame begins, if any.

    "Valid" is what damage cannot forge by chance: a version-2 header whose
    CRC verifies, or a complete version-1 frame whose body CRC verifies.
    """
    best: int | None = None
    for magic in (JOURNAL_MAGIC, JOURNAL_MAGIC_V1):
        position = data.find(magic, start)
        while position != -1 and (best is None or position < best):
            if _plausible(data, position, magic):
                best = position
                break
            position = data.find(magic, position + 1)
    return best


def _plausible(data: bytes, position: int, magic: bytes) -> bool:
    if magic == JOURNAL_MAGIC:
        if len(data) - position < HEADER.size:
            return False
        length: int
        header_crc: int
        _, length, _, header_crc = HEADER.unpack_from(data, position)
        covered = data[position : position + _CRC_COVERED]
        return length <= MAX_JOURNAL_BODY and (not VERIFY_HEADER_CRC or zlib.crc32(covered) == header_crc)
    if len(data) - position < HEADER_V1.size:
        return False
    crc: int
    _, length, crc = HEADER_V1.unpack_from(data, position)
    body_start = position + HEADER_V1.size
    if length > MAX_JOURNAL_BODY or len(data) - body_start < length:
        return False
    return zlib.crc32(data[body_start : body_start + length]) == crc


def walk(data: bytes, base: int, offsets: array[int], run_id: str) -> int:
    """Append the offsets of the complete frames in ``data`` (the file from ``base``); return bytes consumed.

    Reads headers only (magic, length and the version-2 header CRC). A bad
    magic, a header that fails its CRC or an impossible length fails closed;
    a frame that runs past the end of ``data`` ends the walk (the caller
    widens its window, or checks the rest with :func:`check_torn_tail`).
    """
    position = 0
    total = len(data)
    append = offsets.append
    v2_size = HEADER.size
    unpack = HEADER.unpack_from
    crc32 = zlib.crc32
    while total - position >= 4:
        if data[position : position + 4] == JOURNAL_MAGIC and total - position >= v2_size:
            # The common case, inline: a version-2 header whose own CRC verifies.
            _, length, _, header_crc = unpack(data, position)
            if crc32(data[position : position + _CRC_COVERED]) == header_crc and length <= MAX_JOURNAL_BODY:
                following = position + v2_size + length
                if following > total:
                    break
                append(base + position)
                position = following
                continue
        header = read_header(data, position, run_id, base, len(offsets))
        if header is None:
            break
        following = position + header[0] + header[1]
        if following > total:
            break
        append(base + position)
        position = following
    return position


def decode_frame(data: bytes, run_id: str, sequence: int, offset: int = -1) -> tuple[JournalRecord, int]:
    """Verify and decode the complete frame ``data`` holding ``sequence``; return it and ``batch_last``.

    ``offset`` (the frame's file offset, when known) only improves error messages.
    """
    header = read_header(data, 0, run_id, offset, sequence - 1)
    if header is None or len(data) != header[0] + header[1]:
        raise CorruptionError(
            f"frame of sequence {sequence} at {_where(run_id, offset, sequence - 1)} does not have the "
            "length its header states; the journal is damaged"
        )
    record, batch_last = _decode_at(data, 0, header, run_id=run_id, base=offset, sequence=sequence)
    record.verify()
    return record, batch_last


def decode_frames(data: bytes, run_id: str, first_sequence: int, offset: int = -1) -> list[JournalRecord]:
    """Decode consecutive complete journal frames, checking CRCs, order and record checksums."""
    records: list[JournalRecord] = []
    position = 0
    sequence = first_sequence
    while position < len(data):
        header = read_header(data, position, run_id, offset, sequence - 1)
        if header is None or len(data) - position - header[0] < header[1]:
            raise CorruptionError(
                f"frame of sequence {sequence} at {_where(run_id, offset + position, sequence - 1)} is "
                "cut short inside committed history; the journal is damaged"
            )
        record, _ = _decode_at(data, position, header, run_id=run_id, base=offset, sequence=sequence)
        record.verify()
        records.append(record)
        sequence += 1
        position += header[0] + header[1]
    return records


def encode_hint(inode: int, end: int, offsets: array[int]) -> bytes:
    """Return the MWX2 hint recording ``offsets`` of a run file (``inode``) committed up to ``end``."""
    packed = array("q", offsets)
    if sys.byteorder != "little":
        packed.byteswap()
    body = packed.tobytes()
    head = HINT_HEADER.pack(HINT_MAGIC, HINT_VERSION, inode, end, len(offsets), 0)[:_HINT_COVERED]
    return head + zlib.crc32(body, zlib.crc32(head)).to_bytes(4, "big") + body


def decode_hint(data: bytes) -> tuple[int, int, array[int]] | None:
    """Return ``(inode, end, offsets)`` of an intact MWX2 hint, or ``None`` for anything else.

    The CRC covers every byte but its own, so an intact hint's ``end`` is what
    was written: the committed end of the run file when the hint was made.
    Older (MWX1) hints are ignored; the next snapshot writes a new one.
    """
    if len(data) < HINT_HEADER.size:
        return None
    magic, version, inode, end, count, crc = HINT_HEADER.unpack_from(data, 0)
    body = data[HINT_HEADER.size :]
    if magic != HINT_MAGIC or version != HINT_VERSION or count < 1 or len(body) != 8 * count:
        return None
    if zlib.crc32(body, zlib.crc32(data[:_HINT_COVERED])) != crc:
        return None
    offsets = array("q")
    offsets.frombytes(body)
    if sys.byteorder != "little":
        offsets.byteswap()
    if offsets[0] != 0 or not offsets[-1] < end:
        return None
    return inode, end, offsets


def encode_snapshot(snapshot: SnapshotRecord) -> bytes:
    """Return the MWS1 frame of ``snapshot``."""
    body = msgspec.json.encode(
        _SnapshotBody(
            v=SNAPSHOT_FRAME_VERSION,
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
    return HEADER_V1.pack(SNAPSHOT_MAGIC, len(body), zlib.crc32(body)) + body


def decode_snapshot(data: bytes, run_id: str, *, verify: bool = True) -> SnapshotRecord:
    """Decode an MWS1 frame, verified unless ``verify=False``; raise :class:`SnapshotCorrupt` naming why."""
    if len(data) < HEADER_V1.size:
        raise SnapshotCorrupt(run_id, "truncated header")
    magic, length, crc = HEADER_V1.unpack_from(data, 0)
    if magic != SNAPSHOT_MAGIC:
        raise SnapshotCorrupt(run_id, f"bad magic {magic!r}")
    if length > MAX_SNAPSHOT_BODY or len(data) != HEADER_V1.size + length:
        raise SnapshotCorrupt(run_id, f"frame length {length} does not match the file")
    body = memoryview(data)[HEADER_V1.size :]  # a snapshot can be megabytes: check and decode it in place
    if zlib.crc32(body) != crc:
        raise SnapshotCorrupt(run_id, "CRC-32 mismatch")
    try:
        decoded = _snapshot_decoder.decode(body)
    except msgspec.DecodeError as error:
        raise SnapshotCorrupt(run_id, f"unreadable body: {error}") from None
    if decoded.v != SNAPSHOT_FRAME_VERSION:
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
    if not verify:
        return snapshot
    snapshot.verify()
    if snapshot.run_id != run_id:
        raise SnapshotCorrupt(run_id, f"file holds the snapshot of run {snapshot.run_id}")
    return snapshot
