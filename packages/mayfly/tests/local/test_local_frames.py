"""Golden-fixture tests of the MWJ1/MWS1 frame formats: stored bytes stay readable and stable."""

from __future__ import annotations

import shutil
from pathlib import Path

from mayfly.journal import JournalRecord, SnapshotRecord
from mayfly.local import LocalWorkflowJournal
from mayfly.local._frames import (
    HEADER,
    RunIndex,
    decode_frames,
    decode_snapshot,
    encode_batch,
    encode_snapshot,
    scan,
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
