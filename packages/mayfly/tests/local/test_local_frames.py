"""Golden-fixture tests of the MWJ2/MWJ1/MWS1/MWX2 formats: stored bytes stay readable and stable."""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from array import array
from pathlib import Path

import pytest

from mayfly.journal import JournalRecord, SnapshotRecord
from mayfly.local import LocalWorkflowJournal
from mayfly.local._frames import (
    HEADER,
    HEADER_V1,
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
    """Encoding a batch yields exactly the committed version-2 MWJ2 bytes."""
    assert b"".join(encode_batch(golden_records())) == (GOLDEN / "batch-v2.mwj").read_bytes()


def test_golden_v2_frames_follow_the_documented_layout() -> None:
    """Each MWJ2 frame is magic, length, body CRC, a CRC of those 12 bytes, then a body with v=2."""
    data = (GOLDEN / "batch-v2.mwj").read_bytes()
    position = 0
    for record in golden_records():
        magic, length, crc, header_crc = struct.unpack_from(">4sIII", data, position)
        body = data[position + 16 : position + 16 + length]
        assert magic == b"MWJ2"
        assert zlib.crc32(data[position : position + 12]) == header_crc
        assert zlib.crc32(body) == crc
        assert body.startswith(b'{"v":2,')
        assert record.checksum.encode() in body
        position += 16 + length
    assert position == len(data)


@pytest.mark.parametrize("name", ["batch-v1.mwj", "batch-v2.mwj"])
def test_golden_journal_frames_decode(name: str) -> None:
    """The committed MWJ1 and MWJ2 bytes decode to the same records, as one committed batch."""
    data = (GOLDEN / name).read_bytes()
    index = RunIndex()
    scan(index, data, 0, RUN)
    assert (index.next_sequence, index.end, index.torn) == (3, len(data), False)
    assert decode_frames(data, RUN, 1) == golden_records()


def test_a_file_of_v1_frames_followed_by_v2_frames_reads_as_one_history(tmp_path: Path) -> None:
    """A run file written before MWJ2 keeps its MWJ1 frames; appends after it add MWJ2 frames."""
    with LocalWorkflowJournal(str(tmp_path)) as journal:
        shutil.copy(GOLDEN / "batch-v1.mwj", tmp_path / "runs" / f"{RUN}.mwj")
        later = JournalRecord.seal(
            run_id=RUN,
            sequence=3,
            event_id="00000000-0000-7000-8000-000000000004",
            event_type="NodeStarted",
            schema_version=1,
            payload=b"{}",
        )
        journal.append(RUN, 3, [later])
        assert journal.verify_run(RUN) == 3
    data = (tmp_path / "runs" / f"{RUN}.mwj").read_bytes()
    v1 = (GOLDEN / "batch-v1.mwj").read_bytes()
    assert data.startswith(v1)
    assert data[len(v1) : len(v1) + 4] == b"MWJ2"
    with LocalWorkflowJournal(str(tmp_path)) as fresh:
        assert fresh.read(RUN) == [*golden_records(), later]


def test_a_version_1_store_is_marked_version_2_on_open(tmp_path: Path) -> None:
    """Opening a store whose marker says version 1 rewrites it to 2, so older readers refuse it cleanly."""
    (tmp_path / "mayfly-local.json").write_text('{"format": "mayfly-local", "version": 1}\n')
    with LocalWorkflowJournal(str(tmp_path)):
        pass
    assert json.loads((tmp_path / "mayfly-local.json").read_text()) == {
        "format": "mayfly-local",
        "version": 2,
    }


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
    """An MWJ2 header is 16 bytes (magic, length, body CRC, header CRC); MWJ1 and MWS1 headers are 12."""
    assert HEADER.size == 16
    assert HEADER.format == ">4sIII"
    assert HEADER_V1.size == 12
    assert HEADER_V1.format == ">4sII"


def test_hint_layout_is_pinned() -> None:
    """An MWX2 hint is a 36-byte big-endian header whose CRC covers the header and the little-endian i64s."""
    offsets = array("q", [0, 40, 95])
    body = struct.pack("<3q", 0, 40, 95)
    head = struct.pack(">4sIQQQ", b"MWX2", 2, 7, 130, 3)
    expected = head + struct.pack(">I", zlib.crc32(head + body)) + body
    assert HINT_HEADER.size == 36
    assert encode_hint(7, 130, offsets) == expected
    assert decode_hint(expected) == (7, 130, offsets)


def test_every_bit_of_a_hint_is_covered_by_its_crc() -> None:
    """Flipping any single bit of a hint, header included, makes it decode to None, never to other offsets."""
    good = encode_hint(7, 130, array("q", [0, 40, 95]))
    for position in range(len(good)):
        for bit in range(8):
            flipped = bytearray(good)
            flipped[position] ^= 1 << bit
            assert decode_hint(bytes(flipped)) is None, (position, bit)


def test_damaged_hints_decode_to_none() -> None:
    """A hint with a bad CRC, magic, count or first offset is rejected, never half-trusted."""
    good = encode_hint(7, 130, array("q", [0, 40, 95]))
    flipped = bytearray(good)
    flipped[-1] ^= 0x01
    assert decode_hint(bytes(flipped)) is None
    assert decode_hint(b"MWX1" + good[4:]) is None
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
