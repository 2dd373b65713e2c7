"""Tests of the local file journal: MWJ1 frames, torn tails, fail-closed reads and the index."""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mayfly.identity import Uuid7IdSource
from mayfly.journal import Durability, JournalRecord, SnapshotRecord
from mayfly.local import LocalWorkflowJournal
from mayfly.local._frames import HEADER, HEADER_V1, SNAPSHOT_MAGIC, decode_hint, encode_hint
from mayfly.model.errors import (
    AppendConflict,
    ChecksumMismatch,
    CompatibilityError,
    ConflictingRecord,
    CorruptionError,
    DurabilityUnavailable,
    HistoryLost,
    InvalidBackendURL,
    JournalGap,
    JournalUnavailable,
    SnapshotCorrupt,
)

IDS = Uuid7IdSource()


def records(run_id: str, first: int, count: int, size: int = 20) -> list[JournalRecord]:
    return [
        JournalRecord.seal(
            run_id=run_id,
            sequence=sequence,
            event_id=IDS.new_id(),
            event_type="Tested",
            schema_version=1,
            payload=b'{"x":"' + b"y" * size + b'"}',
        )
        for sequence in range(first, first + count)
    ]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "journal"


@pytest.fixture
def journal(store: Path) -> Iterator[LocalWorkflowJournal]:
    with LocalWorkflowJournal(f"file://{store}") as opened:
        yield opened


def run_file(store: Path, run_id: str) -> Path:
    return store / "runs" / f"{run_id}.mwj"


@pytest.mark.parametrize(
    ("url", "durability"),
    [
        ("file:///tmp/x", Durability.DURABLE),
        ("file:///tmp/x?durability=fsync", Durability.DURABLE),
        ("file:///tmp/x?durability=flush", Durability.FLUSH),
        ("file:///tmp/x?durability=write", Durability.WRITE),
        ("/tmp/x", Durability.DURABLE),
    ],
)
def test_url_selects_durability(tmp_path: Path, url: str, durability: Durability) -> None:
    """The durability query option picks the acknowledgement point; fsync is the default."""
    url = url.replace("/tmp/x", str(tmp_path / "x"))
    with LocalWorkflowJournal(url) as journal:
        assert journal.durability is durability
        assert journal.capabilities.durability is durability
        assert journal.root == str(tmp_path / "x")


@pytest.mark.parametrize(
    "url", ["file:///tmp/x?durability=never", "file:///tmp/x?mode=1", "redis://x", "file://"]
)
def test_bad_urls_are_refused(url: str) -> None:
    """An unknown option, durability or scheme is refused before anything is opened."""
    with pytest.raises(InvalidBackendURL):
        LocalWorkflowJournal(url)


def test_relative_file_url_resolves_against_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``file://./dir`` names a directory relative to the working directory."""
    monkeypatch.chdir(tmp_path)
    with LocalWorkflowJournal("file://./.mayfly") as journal:
        assert journal.root == str(tmp_path / ".mayfly")


def test_frames_are_mwj2_with_crcs_and_embedded_payload(journal: LocalWorkflowJournal, store: Path) -> None:
    """Each record is one MWJ2 frame: magic, length, body CRC, header CRC and a JSON body holding the payload text."""
    run = IDS.new_id()
    journal.append(run, 1, records(run, 1, 1))
    data = run_file(store, run).read_bytes()
    magic, length, body_crc, header_crc = HEADER.unpack_from(data, 0)
    assert magic == b"MWJ2"
    assert len(data) == HEADER.size + length
    assert zlib.crc32(data[HEADER.size :]) == body_crc
    assert zlib.crc32(data[:12]) == header_crc
    assert b'"payload":"{\\"x\\":\\"' in data


def test_torn_final_frame_is_ignored_then_truncated(journal: LocalWorkflowJournal, store: Path) -> None:
    """An incomplete final frame is invisible to readers and cut by the next append."""
    run = IDS.new_id()
    journal.append(run, 1, records(run, 1, 2))
    path = run_file(store, run)
    good = path.read_bytes()
    torn = records(run, 3, 1)
    with path.open("ab") as handle:
        handle.write(b"MWJ1\x00\x00\x01\x00partial")
    with LocalWorkflowJournal(str(store)) as fresh:
        assert [r.sequence for r in fresh.read(run)] == [1, 2]
        assert fresh.next_sequence(run) == 3
        fresh.append(run, 3, torn)
        assert [r.sequence for r in fresh.read(run)] == [1, 2, 3]
    assert path.read_bytes().startswith(good)


def test_torn_batch_is_dropped_whole(journal: LocalWorkflowJournal, store: Path) -> None:
    """A batch cut inside its last frame disappears entirely: batches stay atomic after a crash."""
    run = IDS.new_id()
    journal.append(run, 1, records(run, 1, 1))
    path = run_file(store, run)
    committed = path.stat().st_size
    journal.append(run, 2, records(run, 2, 3))
    os.truncate(path, path.stat().st_size - 5)
    with LocalWorkflowJournal(str(store)) as fresh:
        assert fresh.next_sequence(run) == 2
        assert [r.sequence for r in fresh.read(run)] == [1]
        fresh.append(run, 2, records(run, 2, 1))
    assert path.stat().st_size > committed


def test_corrupt_committed_frame_fails_closed(journal: LocalWorkflowJournal, store: Path) -> None:
    """A CRC mismatch on a complete frame that is not the torn tail raises, it is never truncated."""
    run = IDS.new_id()
    journal.append(run, 1, records(run, 1, 3))
    path = run_file(store, run)
    data = bytearray(path.read_bytes())
    data[HEADER.size + 5] ^= 0x01
    path.write_bytes(bytes(data))
    with LocalWorkflowJournal(str(store)) as fresh:
        with pytest.raises(ChecksumMismatch):
            fresh.read(run)
        with pytest.raises(ChecksumMismatch):
            fresh.append(run, 4, records(run, 4, 1))
    assert path.read_bytes() == bytes(data)


def test_corrupt_final_complete_frame_fails_closed(journal: LocalWorkflowJournal, store: Path) -> None:
    """Even the last frame fails closed when it is complete: it may have been acknowledged."""
    run = IDS.new_id()
    journal.append(run, 1, records(run, 1, 2))
    path = run_file(store, run)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(bytes(data))
    with LocalWorkflowJournal(str(store)) as fresh, pytest.raises(ChecksumMismatch):
        fresh.next_sequence(run)


def test_garbage_magic_fails_closed(journal: LocalWorkflowJournal, store: Path) -> None:
    """Bytes that are not an MWJ1 frame after committed data are corruption, not a torn tail."""
    run = IDS.new_id()
    journal.append(run, 1, records(run, 1, 1))
    with run_file(store, run).open("ab") as handle:
        handle.write(b"JUNK" + b"\x00" * 20)
    with LocalWorkflowJournal(str(store)) as fresh, pytest.raises(CorruptionError):
        fresh.read(run)


def test_fault_hooks_produce_gap_and_checksum_errors(journal: LocalWorkflowJournal) -> None:
    """The fault hooks corrupt or remove a frame so reads fail closed with the right error."""
    run = IDS.new_id()
    journal.append(run, 1, records(run, 1, 3))
    journal.remove_record(run, 2)
    with pytest.raises(JournalGap):
        journal.read(run)
    other = IDS.new_id()
    journal.append(other, 1, records(other, 1, 3))
    journal.corrupt_record(other, 2)
    with pytest.raises(ChecksumMismatch):
        journal.read(other, after=1)


def test_second_instance_sees_appends_of_the_first(store: Path) -> None:
    """Two journal instances on one directory (as two processes would) stay consistent."""
    run = IDS.new_id()
    with LocalWorkflowJournal(str(store)) as one, LocalWorkflowJournal(str(store)) as two:
        one.append(run, 1, records(run, 1, 2))
        assert two.next_sequence(run) == 3
        two.append(run, 3, records(run, 3, 1))
        with pytest.raises(AppendConflict) as caught:
            one.append(run, 3, records(run, 3, 1))
        assert caught.value.actual_next == 4
        assert [r.sequence for r in one.read(run)] == [1, 2, 3]


def test_reappend_compares_stored_checksums(journal: LocalWorkflowJournal) -> None:
    """Exact re-appends are acknowledged; a lost race conflicts; a reused event id is a conflicting record."""
    run = IDS.new_id()
    batch = records(run, 1, 2)
    journal.append(run, 1, batch)
    assert journal.append(run, 1, batch).already_committed
    assert journal.append(run, 2, batch[1:]).already_committed
    with pytest.raises(AppendConflict):
        journal.append(run, 1, records(run, 1, 1))
    changed = JournalRecord.seal(
        run_id=run,
        sequence=2,
        event_id=batch[1].event_id,
        event_type="Tested",
        schema_version=1,
        payload=b"{}",
    )
    with pytest.raises(ConflictingRecord):
        journal.append(run, 2, [changed])
    with pytest.raises(ConflictingRecord):
        journal.append(
            run,
            3,
            records(run, 3, 1)[:0]
            or [
                JournalRecord.seal(
                    run_id=run,
                    sequence=3,
                    event_id=batch[0].event_id,
                    event_type="Tested",
                    schema_version=1,
                    payload=b"{}",
                )
            ],
        )


def test_concurrent_threads_append_without_loss(journal: LocalWorkflowJournal) -> None:
    """Threads racing compare-and-append on one journal object never lose or duplicate records."""
    run = IDS.new_id()

    def writer(_: int) -> int:
        won = 0
        while won < 20:
            expected = journal.next_sequence(run)
            try:
                journal.append(run, expected, records(run, expected, 1))
            except AppendConflict:
                continue
            won += 1
        return won

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert sum(pool.map(writer, range(4))) == 80
    stored = journal.read(run)
    assert [r.sequence for r in stored] == list(range(1, 81))
    assert len({r.event_id for r in stored}) == 80


def test_list_runs_is_sorted_paginated_and_skips_empty(journal: LocalWorkflowJournal, store: Path) -> None:
    """Run listing is sorted, paginates with after/limit, and omits runs with no records."""
    runs = sorted(IDS.new_id() for _ in range(7))
    for run in runs:
        journal.append(run, 1, records(run, 1, 1))
    run_file(store, IDS.new_id()).touch()
    assert journal.list_runs() == runs
    assert journal.list_runs(limit=3) == runs[:3]
    assert journal.list_runs(after=runs[2], limit=3) == runs[3:6]
    assert journal.list_runs(after=runs[-1]) == []


def snapshot_for(record: JournalRecord, state: bytes = b'{"s":1}') -> SnapshotRecord:
    return SnapshotRecord.seal(
        run_id=record.run_id,
        schema_version=1,
        last_sequence=record.sequence,
        last_event_id=record.event_id,
        last_record_checksum=record.checksum,
        spec_checksum="sha256:" + "0" * 64,
        state_checksum="sha256:" + "1" * 64,
        state=state,
    )


def test_snapshot_frames_round_trip_and_replace(journal: LocalWorkflowJournal, store: Path) -> None:
    """Snapshots are MWS1 frames, read back equal, replaced whole, beside an MWX1 hint, never with temp files."""
    run = IDS.new_id()
    batch = records(run, 1, 2)
    journal.append(run, 1, batch)
    assert journal.read_snapshot(run) is None
    journal.write_snapshot(run, snapshot_for(batch[0]))
    journal.write_snapshot(run, snapshot_for(batch[1], b"\x00\xff"))
    assert journal.read_snapshot(run) == snapshot_for(batch[1], b"\x00\xff")
    assert (store / "snapshots" / f"{run}.mws").read_bytes()[:4] == SNAPSHOT_MAGIC
    assert sorted(os.listdir(store / "snapshots")) == [f"{run}.idx", f"{run}.mws"]


def test_snapshot_with_unknown_frame_version_is_corrupt(journal: LocalWorkflowJournal, store: Path) -> None:
    """A snapshot frame of an unknown version is reported corrupt so it gets rebuilt."""
    run = IDS.new_id()
    batch = records(run, 1, 1)
    journal.append(run, 1, batch)
    journal.write_snapshot(run, snapshot_for(batch[0]))
    path = store / "snapshots" / f"{run}.mws"
    body = path.read_bytes()[HEADER_V1.size :].replace(b'"v":1', b'"v":9', 1)
    path.write_bytes(struct.pack(">4sII", SNAPSHOT_MAGIC, len(body), zlib.crc32(body)) + body)
    with pytest.raises(SnapshotCorrupt, match="unknown snapshot frame version 9"):
        journal.read_snapshot(run)


def test_closed_journal_refuses_operations(store: Path) -> None:
    """A closed journal raises JournalUnavailable instead of touching the store."""
    journal = LocalWorkflowJournal(str(store))
    journal.close()
    with pytest.raises(JournalUnavailable):
        journal.next_sequence(IDS.new_id())


def test_foreign_format_marker_is_refused(store: Path) -> None:
    """A directory written by an unknown local format version is refused, never reinterpreted."""
    store.mkdir()
    (store / "mayfly-local.json").write_text('{"format": "mayfly-local", "version": 3}')
    with pytest.raises(CompatibilityError):
        LocalWorkflowJournal(str(store))


def test_list_runs_sees_new_runs_after_a_cached_listing(journal: LocalWorkflowJournal, store: Path) -> None:
    """A run created after a (cached) listing shows up in the next listing."""
    first = IDS.new_id()
    journal.append(first, 1, records(first, 1, 1))
    os.utime(store / "runs", ns=(0, 0))  # make the listing old enough to be cached
    assert first in journal.list_runs()
    second = IDS.new_id()
    journal.append(second, 1, records(second, 1, 1))
    assert journal.list_runs(after=first) == [second]


def v2_frame(body: bytes, length: int | None = None) -> bytes:
    """An MWJ2 frame around ``body`` with correct CRCs (``length`` overrides the stated length)."""
    head = struct.pack(">4sII", b"MWJ2", len(body) if length is None else length, zlib.crc32(body))
    return head + struct.pack(">I", zlib.crc32(head)) + body


def test_unknown_frame_version_fails_closed(journal: LocalWorkflowJournal, store: Path) -> None:
    """A journal frame of an unknown version is corruption, never skipped or guessed at."""
    run = IDS.new_id()
    journal.append(run, 1, records(run, 1, 1))
    path = run_file(store, run)
    body = path.read_bytes()[HEADER.size :].replace(b'"v":2', b'"v":3', 1)
    path.write_bytes(v2_frame(body))
    with LocalWorkflowJournal(str(store)) as fresh, pytest.raises(CorruptionError, match="unknown version 3"):
        fresh.read(run)


@pytest.mark.parametrize("version", [1, 2])
def test_oversized_frame_length_fails_closed(
    journal: LocalWorkflowJournal, store: Path, version: int
) -> None:
    """A frame header announcing more than the bounded body size is corruption, not a torn tail."""
    run = IDS.new_id()
    journal.append(run, 1, records(run, 1, 1))
    with run_file(store, run).open("ab") as handle:
        handle.write(HEADER_V1.pack(b"MWJ1", 1 << 30, 0) if version == 1 else v2_frame(b"", 1 << 30))
    with LocalWorkflowJournal(str(store)) as fresh, pytest.raises(CorruptionError, match="over the limit"):
        fresh.read(run)


MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
30 27 0:25 / /dev/shm rw,nosuid,nodev - tmpfs tmpfs rw
31 27 0:26 / /srv/my\\040data rw - xfs /dev/vdb rw
"""


@pytest.mark.parametrize(
    ("path", "fstype"),
    [("/var/lib/x", "ext4"), ("/dev/shm/j", "tmpfs"), ("/dev/shmx", "ext4"), ("/srv/my data/j", "xfs")],
)
def test_filesystem_type_picks_the_longest_mount(path: str, fstype: str) -> None:
    """The filesystem of a path is that of its longest containing mount point (escapes decoded)."""
    from mayfly.local._store import filesystem_type

    assert filesystem_type(Path(path), MOUNTINFO) == fstype


def test_fsync_durability_is_refused_on_tmpfs() -> None:
    """fsync durability on tmpfs is refused (nothing created); write durability is accepted there."""
    from mayfly.local._store import filesystem_type

    shm = Path("/dev/shm")
    if filesystem_type(shm) != "tmpfs":
        pytest.skip("this host has no tmpfs at /dev/shm to try")
    target = shm / f"mayfly-test-{IDS.new_id()}"
    with pytest.raises(DurabilityUnavailable, match="tmpfs"):
        LocalWorkflowJournal(f"file://{target}")
    assert not target.exists()
    try:
        with LocalWorkflowJournal(f"file://{target}?durability=write") as journal:
            assert journal.durability is Durability.WRITE
    finally:
        import shutil

        shutil.rmtree(target, ignore_errors=True)


def test_scan_in_small_windows_matches_a_whole_scan(
    journal: LocalWorkflowJournal, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scanning in windows smaller than a frame or a batch yields the same index as one read."""
    import mayfly.local._journal as journal_module

    run = IDS.new_id()
    journal.append(run, 1, records(run, 1, 2))
    journal.append(run, 3, records(run, 3, 5, size=900))
    journal.append(run, 8, records(run, 8, 1))
    with run_file(store, run).open("ab") as handle:
        handle.write(b"MWJ1\x00\x00")  # a torn header at the end
    monkeypatch.setattr(journal_module, "_SCAN_WINDOW", 100)
    with LocalWorkflowJournal(str(store)) as fresh:
        assert fresh.next_sequence(run) == 9
        assert [r.sequence for r in fresh.read(run)] == list(range(1, 9))
        fresh.append(run, 9, records(run, 9, 1))
        assert fresh.next_sequence(run) == 10


def test_reads_verify_the_frames_they_return_and_appends_verify_all(store: Path) -> None:
    """After open, a damaged middle frame fails only the reads that return it, the first append and verify_run."""
    run = IDS.new_id()
    with LocalWorkflowJournal(str(store)) as journal:
        journal.append(run, 1, records(run, 1, 2))
        journal.append(run, 3, records(run, 3, 2))
    path = run_file(store, run)
    data = bytearray(path.read_bytes())
    data[HEADER.size + 5] ^= 0x01  # inside the body of sequence 1
    path.write_bytes(bytes(data))
    with LocalWorkflowJournal(str(store)) as fresh:
        assert fresh.next_sequence(run) == 5
        assert [r.sequence for r in fresh.read(run, after=1)] == [2, 3, 4]
        with pytest.raises(ChecksumMismatch):
            fresh.read(run, limit=1)
        with pytest.raises(ChecksumMismatch):
            fresh.verify_run(run)
        with pytest.raises(ChecksumMismatch):
            fresh.append(run, 5, records(run, 5, 1))
    assert path.read_bytes() == bytes(data)


def test_first_append_after_open_sees_every_committed_event_id(
    journal: LocalWorkflowJournal, store: Path
) -> None:
    """An event id committed long before is still a conflict for a fresh instance that only read the tail."""
    run = IDS.new_id()
    early = records(run, 1, 3)
    journal.append(run, 1, early)
    journal.append(run, 4, records(run, 4, 3))
    journal.write_snapshot(run, snapshot_for(journal.read(run, after=5)[0]))
    with LocalWorkflowJournal(str(store)) as fresh:
        assert [r.sequence for r in fresh.read(run, after=5)] == [6]
        reused = JournalRecord.seal(
            run_id=run,
            sequence=7,
            event_id=early[0].event_id,
            event_type="Tested",
            schema_version=1,
            payload=b"{}",
        )
        with pytest.raises(ConflictingRecord):
            fresh.append(run, 7, [reused])
        assert fresh.next_sequence(run) == 7


def test_verify_run_counts_a_sound_history(journal: LocalWorkflowJournal) -> None:
    """verify_run returns the number of committed records of a sound run and 0 for an unknown one."""
    run = IDS.new_id()
    journal.append(run, 1, records(run, 1, 3))
    assert journal.verify_run(run) == 3
    assert journal.verify_run(IDS.new_id()) == 0


def test_snapshot_writes_a_hint_that_a_fresh_instance_uses(
    journal: LocalWorkflowJournal, store: Path
) -> None:
    """The MWX1 hint written beside a snapshot names every committed frame; later appends are walked."""
    run = IDS.new_id()
    journal.append(run, 1, records(run, 1, 3))
    journal.write_snapshot(run, snapshot_for(journal.read(run)[-1]))
    decoded = decode_hint((store / "snapshots" / f"{run}.idx").read_bytes())
    assert decoded is not None
    inode, end, offsets = decoded
    assert (inode, end, len(offsets)) == (
        run_file(store, run).stat().st_ino,
        run_file(store, run).stat().st_size,
        3,
    )
    journal.append(run, 4, records(run, 4, 2))
    with LocalWorkflowJournal(str(store)) as fresh:
        assert [r.sequence for r in fresh.read(run, after=2)] == [3, 4, 5]
        assert fresh.next_sequence(run) == 6


@pytest.mark.parametrize("damage", ["shifted", "garbage", "other-file", "old-format"])
def test_a_wrong_hint_never_changes_what_reads_return(
    journal: LocalWorkflowJournal, store: Path, damage: str
) -> None:
    """A hint that does not match the run file is ignored or retried from the file: reads stay exact."""
    run = IDS.new_id()
    batch = records(run, 1, 4)
    journal.append(run, 1, batch)
    journal.write_snapshot(run, snapshot_for(batch[-1]))
    hint = store / "snapshots" / f"{run}.idx"
    decoded = decode_hint(hint.read_bytes())
    assert decoded is not None
    inode, end, offsets = decoded
    if damage == "shifted":  # last frame still right, the middle offsets wrong
        offsets[1] += 3
        offsets[2] -= 5
        hint.write_bytes(encode_hint(inode, end, offsets))
    elif damage == "garbage":
        hint.write_bytes(b"MWX1" + b"\x00" * 40)
    elif damage == "other-file":
        hint.write_bytes(encode_hint(inode + 1, end, offsets))
    else:  # an MWX1 hint of an older Mayfly, whose CRC did not cover its header
        hint.write_bytes(b"MWX1" + encode_hint(inode, end + 100, offsets)[4:])
    with LocalWorkflowJournal(str(store)) as fresh:
        assert fresh.read(run, after=1) == batch[1:]
        assert fresh.read(run) == batch
        assert fresh.next_sequence(run) == 5


def test_an_intact_hint_beyond_the_file_is_evidence_of_lost_records(
    journal: LocalWorkflowJournal, store: Path
) -> None:
    """A hint for this very file that ends past its size proves committed bytes were cut: reads fail closed."""
    run = IDS.new_id()
    batch = records(run, 1, 4)
    journal.append(run, 1, batch)
    journal.write_snapshot(run, snapshot_for(batch[-1]))
    path = run_file(store, run)
    decoded = decode_hint((store / "snapshots" / f"{run}.idx").read_bytes())
    assert decoded is not None
    os.truncate(path, decoded[2][-1])  # the last committed record is gone
    damaged = path.read_bytes()
    with LocalWorkflowJournal(str(store)) as fresh:
        with pytest.raises(HistoryLost, match=f"run {run} lost committed records: its offset hint records 4"):
            fresh.read(run)
        with pytest.raises(HistoryLost):
            fresh.next_sequence(run)
    assert path.read_bytes() == damaged


def test_a_file_shrinking_below_a_seen_commit_fails_closed(
    journal: LocalWorkflowJournal, store: Path
) -> None:
    """A journal instance that saw a committed end refuses a file cut below it, instead of re-reading it shorter."""
    run = IDS.new_id()
    batch = records(run, 1, 3)
    journal.append(run, 1, batch)
    path = run_file(store, run)
    size = path.stat().st_size
    os.truncate(path, size - len(path.read_bytes()) // 3)
    with pytest.raises(HistoryLost, match="shrank"):
        journal.read(run)


def test_fault_hooks_drop_the_hint(journal: LocalWorkflowJournal, store: Path) -> None:
    """Editing frames in place removes the hint, and the gap is still reported by reads and verify_run."""
    run = IDS.new_id()
    batch = records(run, 1, 3)
    journal.append(run, 1, batch)
    journal.write_snapshot(run, snapshot_for(batch[-1]))
    journal.remove_record(run, 2)
    assert not (store / "snapshots" / f"{run}.idx").exists()
    with LocalWorkflowJournal(str(store)) as fresh:
        with pytest.raises(JournalGap):
            fresh.read(run, after=1)
        with pytest.raises(JournalGap):
            fresh.verify_run(run)


def test_torn_batch_with_complete_frames_is_found_from_the_end(
    journal: LocalWorkflowJournal, store: Path
) -> None:
    """Complete frames of a batch whose closing frame is torn are not committed, for readers and writers."""
    run = IDS.new_id()
    journal.append(run, 1, records(run, 1, 2))
    journal.append(run, 3, records(run, 3, 3))
    path = run_file(store, run)
    os.truncate(path, path.stat().st_size - 4)  # frames 3 and 4 complete, 5 torn
    with LocalWorkflowJournal(str(store)) as fresh:
        assert fresh.next_sequence(run) == 3
        assert [r.sequence for r in fresh.read(run)] == [1, 2]
        fresh.append(run, 3, records(run, 3, 1))
        assert [r.sequence for r in fresh.read(run)] == [1, 2, 3]


@pytest.mark.parametrize("offset", [-8, 1 << 40])
def test_hint_offsets_outside_the_file_are_retried_from_the_file(
    journal: LocalWorkflowJournal, store: Path, offset: int
) -> None:
    """A CRC-valid hint naming an offset outside the file is never read through: reads stay exact."""
    run = IDS.new_id()
    batch = records(run, 1, 3)
    journal.append(run, 1, batch)
    journal.write_snapshot(run, snapshot_for(batch[-1]))
    hint = store / "snapshots" / f"{run}.idx"
    decoded = decode_hint(hint.read_bytes())
    assert decoded is not None
    inode, end, offsets = decoded
    offsets[1] = offset
    hint.write_bytes(encode_hint(inode, end, offsets))
    with LocalWorkflowJournal(str(store)) as fresh:
        assert fresh.read(run, after=1) == batch[1:]
        assert fresh.read(run, limit=1) == batch[:1]


def test_a_snapshot_of_a_damaged_journal_is_written_without_a_hint(
    journal: LocalWorkflowJournal, store: Path
) -> None:
    """write_snapshot stores the snapshot even when the journal cannot be located; no hint is left."""
    run = IDS.new_id()
    batch = records(run, 1, 2)
    journal.append(run, 1, batch)
    with run_file(store, run).open("ab") as handle:
        handle.write(b"JUNK" + b"\x00" * 20)
    with LocalWorkflowJournal(str(store)) as fresh:
        fresh.write_snapshot(run, snapshot_for(batch[-1]))
        assert fresh.read_snapshot(run) == snapshot_for(batch[-1])
        with pytest.raises(CorruptionError):
            fresh.read(run)
    assert not (store / "snapshots" / f"{run}.idx").exists()
