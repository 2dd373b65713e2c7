"""Keys and values of the LMDB environment: compact binary layouts, decoded fail-closed.

Named databases and their entries (``R`` is a run id as its 16 UUID bytes,
whose byte order equals the text order of canonical lowercase UUIDs)::

    records    R || u64be sequence    -> record value (below)
    events     R || event id (16 B)   -> u64be sequence          (dedup index)
    heads      R                      -> u64be next sequence || u64be fence
    snapshots  R                      -> snapshot value (below)
    runs       R                      -> b""                     (run listing)
    leases     R                      -> lease value (below)     (current lease grant)
    meta       b"format"              -> FORMAT
    index, claims, timers, waits                                 (the run index: mayfly_lmdb._index)

Record value: ``0x01 || checksum (32 B) || event id (16 B) || u64be
schema_version || u8 len || event_type || payload``. Snapshot value:
``0x01 || checksum (32 B) || u64be schema_version || u64be last_sequence ||
last event id (16 B) || last record checksum (32 B) || u16be len ||
spec_checksum || u16be len || state_checksum || state``. Lease value:
``u64be token || u64be expires (unix ms) || u8 flock-held || u32be pid ||
owner``. Checksums are stored
raw and every decoded record is verified against its SHA-256 checksum, so a
damaged byte anywhere (key included) fails closed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from mayfly.errors import ChecksumMismatch, SnapshotCorrupt
from mayfly.journal import JournalRecord, SnapshotRecord

__all__ = [
    "FORMAT",
    "LeaseState",
    "decode_head",
    "decode_lease",
    "decode_record",
    "decode_snapshot",
    "encode_head",
    "encode_lease",
    "encode_record",
    "encode_snapshot",
    "record_key",
    "run_key",
    "run_text",
    "sequence_bytes",
    "uuid_bytes",
]

FORMAT: Final = b"mayfly-lmdb/1"
"""Format marker stored under ``meta[b"format"]``; any other value is refused."""

_VERSION: Final = 1
_RECORD_HEAD = struct.Struct(">B32s16sQB")
_SNAPSHOT_HEAD = struct.Struct(">B32sQQ16s32sH")
_HEAD = struct.Struct(">QQ")
_LEASE = struct.Struct(">QQBI")
_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")


def uuid_bytes(text: str) -> bytes:
    """The 16 bytes of a canonical UUID string (callers validated it)."""
    return bytes.fromhex(text.replace("-", ""))


def _uuid_text(raw: bytes) -> str:
    hexed = raw.hex()
    return f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"


run_key = uuid_bytes
"""The key of a run in ``heads``, ``snapshots`` and ``runs``."""


def run_text(key: bytes) -> str:
    """The canonical run id of a 16-byte run key."""
    return _uuid_text(key)


def sequence_bytes(sequence: int) -> bytes:
    """A sequence as 8 big-endian bytes, so keys sort in sequence order."""
    return _U64.pack(sequence)


def record_key(run: bytes, sequence: int) -> bytes:
    """The ``records`` key of one sequence of a run."""
    return run + _U64.pack(sequence)


def encode_head(next_sequence: int, fence: int) -> bytes:
    """A run head: the next sequence and the newest fencing token."""
    return _HEAD.pack(next_sequence, fence)


def decode_head(value: bytes | None, run_id: str) -> tuple[int, int]:
    """``(next_sequence, fence)`` of a stored head, ``(1, 0)`` when absent."""
    if value is None:
        return 1, 0
    if len(value) != _HEAD.size:
        raise ChecksumMismatch(
            f"head of run {run_id} is {len(value)} bytes, expected {_HEAD.size}; the LMDB "
            "environment is damaged, restore it from a backup"
        )
    next_sequence, fence = _HEAD.unpack(value)
    return int(next_sequence), int(fence)


def encode_record(record: JournalRecord, event_id: bytes | None = None) -> bytes:
    """The stored value of a validated, sealed record (``event_id``: its 16 bytes, if known)."""
    event_type = record.event_type.encode("ascii")
    return b"".join(
        (
            _RECORD_HEAD.pack(
                _VERSION,
                bytes.fromhex(record.checksum),
                uuid_bytes(record.event_id) if event_id is None else event_id,
                record.schema_version,
                len(event_type),
            ),
            event_type,
            record.payload,
        )
    )


def decode_record(run_id: str, sequence: int, value: bytes) -> JournalRecord:
    """Decode a stored record and verify it; damage raises ChecksumMismatch naming run and sequence."""
    try:
        version, checksum, event_id, schema_version, type_length = _RECORD_HEAD.unpack_from(value)
        start = _RECORD_HEAD.size
        if version != _VERSION or len(value) < start + type_length:
            raise ValueError("bad header")
        event_type = value[start : start + type_length].decode("ascii")
    except (struct.error, ValueError):
        raise ChecksumMismatch(
            f"record of run {run_id} sequence {sequence} is undecodable; the LMDB environment is "
            "damaged, restore it from a backup"
        ) from None
    record = JournalRecord(
        run_id=run_id,
        sequence=sequence,
        event_id=_uuid_text(event_id),
        event_type=event_type,
        schema_version=schema_version,
        payload=value[start + type_length :],
        checksum=checksum.hex(),
    )
    try:
        record.verify()
    except ChecksumMismatch:
        raise
    except ValueError as error:  # a damaged field breaks the input rules before the checksum
        raise ChecksumMismatch(
            f"record of run {run_id} sequence {sequence} is damaged ({error}); restore the "
            "LMDB environment from a backup"
        ) from None
    return record


def encode_snapshot(snapshot: SnapshotRecord) -> bytes:
    """The stored value of a validated, sealed snapshot."""
    spec = snapshot.spec_checksum.encode("ascii")
    state_checksum = snapshot.state_checksum.encode("ascii")
    return b"".join(
        (
            _SNAPSHOT_HEAD.pack(
                _VERSION,
                bytes.fromhex(snapshot.checksum),
                snapshot.schema_version,
                snapshot.last_sequence,
                uuid_bytes(snapshot.last_event_id),
                bytes.fromhex(snapshot.last_record_checksum),
                len(spec),
            ),
            spec,
            _U16.pack(len(state_checksum)),
            state_checksum,
            snapshot.state,
        )
    )


def decode_snapshot(run_id: str, value: bytes, *, verify: bool = True) -> SnapshotRecord:
    """Decode a stored snapshot and (unless ``verify=False``) verify it; any damage raises SnapshotCorrupt."""
    try:
        version, checksum, schema, last_sequence, last_event, last_checksum, spec_length = (
            _SNAPSHOT_HEAD.unpack_from(value)
        )
        offset = _SNAPSHOT_HEAD.size
        spec = value[offset : offset + spec_length].decode("ascii")
        offset += spec_length
        (state_checksum_length,) = _U16.unpack_from(value, offset)
        offset += _U16.size
        state_checksum = value[offset : offset + state_checksum_length].decode("ascii")
        offset += state_checksum_length
        if version != _VERSION or offset > len(value):
            raise ValueError("bad header")
    except (struct.error, ValueError):
        raise SnapshotCorrupt(run_id, "undecodable bytes") from None
    snapshot = SnapshotRecord(
        run_id=run_id,
        schema_version=schema,
        last_sequence=last_sequence,
        last_event_id=_uuid_text(last_event),
        last_record_checksum=last_checksum.hex(),
        spec_checksum=spec,
        state_checksum=state_checksum,
        state=value[offset:],
        checksum=checksum.hex(),
    )
    if verify:
        snapshot.verify()
    return snapshot


@dataclass(frozen=True, slots=True)
class LeaseState:
    """The stored grant of a run's lease: token, expiry, whether its holder holds the flock, who."""

    token: int
    expires_ms: int
    locked: bool
    pid: int
    owner: str


def encode_lease(state: LeaseState) -> bytes:
    """The stored value of a lease grant (owner is validated printable ASCII)."""
    return _LEASE.pack(
        state.token, state.expires_ms, int(state.locked), state.pid & 0xFFFFFFFF
    ) + state.owner.encode("ascii")


def decode_lease(value: bytes | None, run_id: str) -> LeaseState | None:
    """The stored lease grant of a run, ``None`` when the lease is free."""
    if value is None:
        return None
    try:
        token, expires_ms, locked, pid = _LEASE.unpack_from(value)
        owner = value[_LEASE.size :].decode("ascii")
    except (struct.error, UnicodeDecodeError):
        raise ChecksumMismatch(
            f"lease of run {run_id} is undecodable; the LMDB environment is damaged, restore it from a backup"
        ) from None
    return LeaseState(token=token, expires_ms=expires_ms, locked=bool(locked), pid=pid, owner=owner)
