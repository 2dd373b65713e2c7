"""Binary layouts of records, snapshots and heads: exact round trips and fail-closed decoding."""

from __future__ import annotations

import pytest
from lmdb_support import batch, new_id

from mayfly.journal import JournalRecord, SnapshotRecord
from mayfly.model.errors import ChecksumMismatch, SnapshotCorrupt
from mayfly_lmdb import _codec


def _snapshot(record: JournalRecord, state: bytes = b'{"s":1}') -> SnapshotRecord:
    return SnapshotRecord.seal(
        run_id=record.run_id,
        schema_version=1,
        last_sequence=record.sequence,
        last_event_id=record.event_id,
        last_record_checksum=record.checksum,
        spec_checksum="sha256:" + "a" * 64,
        state_checksum="sha256:" + "b" * 64,
        state=state,
    )


def test_run_keys_sort_like_run_ids() -> None:
    """16-byte run keys sort in the same order as canonical run id strings, and decode back."""
    runs = [new_id() for _ in range(200)]
    assert sorted(runs, key=_codec.run_key) == sorted(runs)
    assert all(_codec.run_text(_codec.run_key(run)) == run for run in runs)


def test_record_keys_sort_by_sequence() -> None:
    """Record keys of one run sort by sequence, including across byte boundaries."""
    run = _codec.run_key(new_id())
    sequences = [1, 2, 255, 256, 65_536, 2**40]
    assert sorted(sequences, key=lambda s: _codec.record_key(run, s)) == sequences


def test_record_round_trips_exactly() -> None:
    """A stored record decodes to an equal, verified record (unicode payload bytes exact)."""
    (record,) = batch(new_id(), 7, size=3)
    record = JournalRecord.seal(
        run_id=record.run_id,
        sequence=7,
        event_id=record.event_id,
        event_type="Probe",
        schema_version=3,
        payload='{"t":"ünï ✓"}'.encode(),
    )
    assert _codec.decode_record(record.run_id, 7, _codec.encode_record(record)) == record


@pytest.mark.parametrize("position", [0, 1, 20, 40, 50, 57, -1])
def test_a_damaged_record_byte_fails_closed(position: int) -> None:
    """Flipping any byte of a stored record raises ChecksumMismatch naming the run and sequence."""
    (record,) = batch(new_id(), 1, size=20)
    value = bytearray(_codec.encode_record(record))
    value[position] ^= 0x01
    with pytest.raises(ChecksumMismatch, match=record.run_id):
        _codec.decode_record(record.run_id, 1, bytes(value))


def test_a_record_under_the_wrong_key_fails_closed() -> None:
    """A record value read under another sequence or run fails its checksum."""
    (record,) = batch(new_id(), 1)
    value = _codec.encode_record(record)
    with pytest.raises(ChecksumMismatch):
        _codec.decode_record(record.run_id, 2, value)
    with pytest.raises(ChecksumMismatch):
        _codec.decode_record(new_id(), 1, value)


def test_truncated_values_fail_closed() -> None:
    """A truncated record value is undecodable: ChecksumMismatch, never a struct error."""
    (record,) = batch(new_id(), 1)
    value = _codec.encode_record(record)
    for cut in (0, 10, 58):
        with pytest.raises(ChecksumMismatch):
            _codec.decode_record(record.run_id, 1, value[:cut])


def test_snapshot_round_trips_exactly() -> None:
    """A stored snapshot decodes to an equal, verified snapshot with opaque state bytes intact."""
    (record,) = batch(new_id(), 4)
    snapshot = _snapshot(record, state=bytes(range(256)))
    assert _codec.decode_snapshot(record.run_id, _codec.encode_snapshot(snapshot)) == snapshot


@pytest.mark.parametrize("position", [0, 5, 40, 60, 120, 140, -1])
def test_a_damaged_snapshot_raises_snapshot_corrupt(position: int) -> None:
    """Flipping any byte of a stored snapshot, or truncating it, raises SnapshotCorrupt."""
    (record,) = batch(new_id(), 4)
    value = bytearray(_codec.encode_snapshot(_snapshot(record)))
    value[position] ^= 0x01
    with pytest.raises(SnapshotCorrupt):
        _codec.decode_snapshot(record.run_id, bytes(value))
    with pytest.raises(SnapshotCorrupt):
        _codec.decode_snapshot(record.run_id, bytes(value[:30]))


def test_heads_round_trip_and_fail_closed() -> None:
    """A head holds the next sequence and fence; absent means (1, 0); a bad length is corruption."""
    run = new_id()
    assert _codec.decode_head(_codec.encode_head(12, 3), run) == (12, 3)
    assert _codec.decode_head(None, run) == (1, 0)
    with pytest.raises(ChecksumMismatch, match=run):
        _codec.decode_head(b"\x00" * 15, run)
