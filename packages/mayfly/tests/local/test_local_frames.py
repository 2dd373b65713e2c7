"""Golden-fixture tests of the MWJ1/MWS1 frame formats: stored bytes stay readable and stable."""

from __future__ import annotations

import shutil
import struct
import zlib
from array import array
from pathlib import Path

from mayfly.journal import JournalRecord, SnapshotRecord
from mayfly.local import LocalWorkflowJournal
from mayfly.local._frames import (
    HEADER,
    HINT_HEADER,
    RunIndex,
    decode_frame,
    decode_frames,
    decode_hint,
    decode_snapshot,
    encode_batch,
    encode_hint,
    encode_snapshot,
    scan,
    walk,
)

GOLDEN = Path(__file__).parent / "golden"
RUN = "00000000-0000-7000-8000-000000000001"


def golden_records() -> list[JournalRecord]:
    return [
        JournalRecord.seal(
            run_id=RUN,
            sequence=1,
            event_id="00000000-0000-7000-8000-000000000002",
            event_type="RunStarted",
            schema_version=1,
            payload=b'{"a":1}',
        ),
        JournalRecord.seal(
            run_id=RUN,
            sequence=2,
            event_id="00000000-0000-7000-8000-000000000003",
            event_type="NodeStarted",
            schema_version=1,
            payload='{"text":"ünï ✓"}'.encode(),
        ),
    ]


def golden_snapshot() -> SnapshotRecord:
    last = golden_records()[1]
    return SnapshotRecord.seal(
        run_id=RUN,
        schema_version=1,
        last_sequence=2,
        last_event_id=last.event_id,
        last_record_checksum=last.checksum,
        spec_checksum="sha256:abc",
        state_checksum="sha256:def",
        state=b'{"nodes":{}}',
    )


def test_journal_frames_encode_to_the_golden_bytes() -> None:
    """Encoding a batch yields exactly the committed version-1 MWJ1 bytes."""
    assert b"".join(encode_batch(golden_records())) == (GOLDEN / "batch-v1.mwj").read_bytes()


def test_golden_journal_frames_decode() -> None:
    """The committed MWJ1 bytes decode to the same records, as one committed batch."""
    data = (GOLDEN / "batch-v1.mwj").read_bytes()
    index = RunIndex()
    scan(index, data, 0, RUN)
    assert (index.next_sequence, index.end, index.torn) == (3, len(data), False)
    assert decode_frames(data, RUN, 1) == golden_records()


def test_golden_snapshot_frame_round_trips() -> None:
    """The committed MWS1 bytes decode to the snapshot and re-encode identically."""
    data = (GOLDEN / "snapshot-v1.mws").read_bytes()
    assert data[:4] == b"MWS1"
    assert decode_snapshot(data, RUN) == golden_snapshot()
    assert encode_snapshot(golden_snapshot()) == data


def test_golden_files_open_as_a_store(tmp_path: Path) -> None:
    """A store directory holding the golden files is read by the journal like any other."""
    with LocalWorkflowJournal(str(tmp_path)) as journal:
        shutil.copy(GOLDEN / "batch-v1.mwj", tmp_path / "runs" / f"{RUN}.mwj")
        shutil.copy(GOLDEN / "snapshot-v1.mws", tmp_path / "snapshots" / f"{RUN}.mws")
        assert journal.read(RUN) == golden_records()
        assert journal.read_snapshot(RUN) == golden_snapshot()
        assert journal.list_runs() == [RUN]


def test_header_layout() -> None:
    """A frame header is 12 bytes: 4-byte magic, big-endian u32 length and u32 CRC-32."""
    assert HEADER.size == 12
    assert HEADER.format == ">4sII"


def test_hint_layout_is_pinned() -> None:
    """An MWX1 hint is a 36-byte big-endian header (magic, version, inode, end, count, CRC) and little-endian i64s."""
    offsets = array("q", [0, 40, 95])
    body = struct.pack("<3q", 0, 40, 95)
    expected = struct.pack(">4sIQQQI", b"MWX1", 1, 7, 130, 3, zlib.crc32(body)) + body
    assert HINT_HEADER.size == 36
    assert encode_hint(7, 130, offsets) == expected
    assert decode_hint(expected) == (7, 130, offsets)


def test_damaged_hints_decode_to_none() -> None:
    """A hint with a bad CRC, magic, count or first offset is rejected, never half-trusted."""
    good = encode_hint(7, 130, array("q", [0, 40, 95]))
    flipped = bytearray(good)
    flipped[-1] ^= 0x01
    assert decode_hint(bytes(flipped)) is None
    assert decode_hint(b"MWX2" + good[4:]) is None
    assert decode_hint(good[:-8]) is None
    assert decode_hint(encode_hint(7, 130, array("q", [8, 40]))) is None
    assert decode_hint(encode_hint(7, 40, array("q", [0, 40]))) is None


def test_walk_locates_complete_frames_from_headers() -> None:
    """The header walk counts complete frames without checking bodies and stops before an incomplete one."""
    frames = encode_batch(golden_records())
    data = b"".join(frames)
    offsets: array[int] = array("q")
    consumed = walk(data + frames[0][:-1], 100, offsets, RUN)
    assert consumed == len(data)
    assert list(offsets) == [100 + sum(len(f) for f in frames[:i]) for i in range(len(frames))]
    record, batch_last = decode_frame(frames[-1], RUN, len(frames))
    assert record == golden_records()[-1]
    assert batch_last == len(frames)
