"""JournalBase: the public journal methods once, over hooks; a backend written on it stores only rows."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from mayfly.backend import JournalBase, decode_snapshot, encode_snapshot
from mayfly.errors import (
    AppendConflict,
    ChecksumMismatch,
    CompatibilityError,
    ConflictingRecord,
    CorruptionError,
    FencingRejected,
    InvalidIdentifier,
    InvalidRecord,
    JournalGap,
    JournalUnavailable,
    SnapshotCorrupt,
)
from mayfly.identity import Uuid7IdSource
from mayfly.journal import (
    RUN_TAILS,
    AppendResult,
    Durability,
    JournalCapabilities,
    JournalRecord,
    SnapshotRecord,
    WorkflowJournal,
)
from mayfly.local import LocalWorkflowJournal

IDS = Uuid7IdSource()


class DictJournal(JournalBase):
    """The smallest journal on the kit: runs in a dict, and only the storage hooks written."""

    remedy = "restore the dict from a backup"

    def __init__(self) -> None:
        super().__init__(
            url="dict://", capabilities=JournalCapabilities.declare(Durability.MEMORY, "fencing snapshots")
        )
        self.runs: dict[str, list[JournalRecord]] = {}
        self.fences: dict[str, int] = {}
        self.snapshots: dict[str, bytes] = {}
        self.hook_calls: list[str] = []
        self.closes = 0

    def _append(
        self, run_id: str, expected_next: int, batch: tuple[JournalRecord, ...], fence: int | None
    ) -> AppendResult:
        self.hook_calls.append("append")
        stored = self.runs.setdefault(run_id, [])
        self.check_fence(run_id, fence, self.fences.get(run_id, 0))
        by_event = {record.event_id: record.sequence for record in stored}
        if expected_next != len(stored) + 1:
            return self.refused(
                run_id,
                expected_next,
                batch,
                actual_next=len(stored) + 1,
                stored_at=lambda sequence: stored[sequence - 1] if 0 < sequence <= len(stored) else None,
                sequence_of=by_event.get,
            )
        for record in batch:
            if record.event_id in by_event:
                raise self.event_id_taken(run_id, record.event_id, by_event[record.event_id])
        stored.extend(batch)
        return self.acknowledged(run_id, batch)

    def _read(self, run_id: str, after: int, limit: int | None) -> list[JournalRecord]:
        self.hook_calls.append("read")
        stored = self.runs.get(run_id, [])
        window = stored[after:] if limit is None else stored[after : after + limit]
        return self.window(
            run_id,
            after,
            limit,
            ((record.sequence, record) for record in window),
            lambda _, record: self.verified(record),
            next_sequence=len(stored) + 1,
        )

    def _next_sequence(self, run_id: str) -> int:
        return len(self.runs.get(run_id, [])) + 1

    def _list_runs(self, after: str | None, limit: int) -> list[str]:
        return sorted(
            run for run, records in self.runs.items() if records and (after is None or run > after)
        )[:limit]

    def _write_snapshot(self, run_id: str, snapshot: SnapshotRecord) -> None:
        self.hook_calls.append("write_snapshot")
        self.snapshots[run_id] = encode_snapshot(snapshot)

    def _read_snapshot(self, run_id: str) -> SnapshotRecord | None:
        body = self.snapshots.get(run_id)
        return None if body is None else decode_snapshot(run_id, body)

    def _close(self) -> None:
        self.closes += 1


def batch(run_id: str, first: int, count: int = 1) -> tuple[JournalRecord, ...]:
    """``count`` sealed records of ``run_id`` from ``first``."""
    return tuple(
        JournalRecord.seal(
            run_id=run_id,
            sequence=sequence,
            event_id=IDS.new_id(),
            event_type="Probe",
            schema_version=1,
            payload=b"{}",
        )
        for sequence in range(first, first + count)
    )


def snapshot_at(record: JournalRecord) -> SnapshotRecord:
    """A sealed snapshot ending at ``record``."""
    return SnapshotRecord.seal(
        run_id=record.run_id,
        schema_version=1,
        last_sequence=record.sequence,
        last_event_id=record.event_id,
        last_record_checksum=record.checksum,
        spec_checksum="sha256:" + "a" * 64,
        state_checksum="sha256:" + "b" * 64,
        state=b"{}",
    )


def test_a_journal_of_hooks_alone_implements_the_protocol() -> None:
    """A subclass that writes only the storage hooks is a WorkflowJournal with the contract's answers."""
    journal = DictJournal()
    assert isinstance(journal, WorkflowJournal)
    run = IDS.new_id()
    first = batch(run, 1, 2)
    assert journal.append(run, 1, first).last_sequence == 2
    assert journal.append(run, 1, first).already_committed
    with pytest.raises(AppendConflict):
        journal.append(run, 2, batch(run, 2))
    assert journal.read(run) == list(first)
    assert journal.list_runs() == [run]
    assert (journal.url, journal.durability) == ("dict://", Durability.MEMORY)


def test_bad_input_is_refused_before_any_hook_runs() -> None:
    """Malformed run ids, batches, windows and limits raise typed errors and never reach the store."""
    journal = DictJournal()
    run = IDS.new_id()
    with pytest.raises(InvalidIdentifier):
        journal.append("run-1", 1, batch(run, 1))
    with pytest.raises(InvalidRecord):
        journal.append(run, 1, [])
    with pytest.raises(InvalidRecord):
        journal.read(run, after=-1)
    with pytest.raises(InvalidRecord, match=r"list_runs limit must be an int in \[1, 100000\], got 0"):
        journal.list_runs(limit=0)
    assert journal.hook_calls == []
    assert journal.read(run, limit=0) == []  # an empty window never asks the store
    assert journal.hook_calls == []


def test_every_public_method_of_a_closed_journal_is_refused_naming_the_operation() -> None:
    """After close, each method raises JournalUnavailable naming what was refused; close runs once."""
    journal = DictJournal()
    run = IDS.new_id()
    records = batch(run, 1)
    journal.close()
    journal.close()
    assert journal.closes == 1 and journal.closed
    calls = {
        f"append to run {run}": lambda: journal.append(run, 1, records),
        f"read of run {run}": lambda: journal.read(run),
        f"next sequence of run {run}": lambda: journal.next_sequence(run),
        "listing runs": journal.list_runs,
        f"snapshot of run {run}": lambda: journal.write_snapshot(run, snapshot_at(records[0])),
        f"snapshot read of run {run}": lambda: journal.read_snapshot(run),
    }
    for operation, call in calls.items():
        with pytest.raises(JournalUnavailable, match=f"^{operation} refused: journal dict:// is closed"):
            call()
    assert journal.hook_calls == []


def test_the_context_manager_closes_the_journal() -> None:
    """Leaving a with block closes the journal through its hook."""
    with DictJournal() as journal:
        assert not journal.closed
    assert journal.closed and journal.closes == 1


def test_snapshot_guards_refuse_what_the_store_must_not_keep() -> None:
    """A non-snapshot, another run's snapshot or a broken checksum is InvalidRecord and writes nothing."""
    journal = DictJournal()
    run, other = IDS.new_id(), IDS.new_id()
    (record,) = batch(run, 1)
    good = snapshot_at(record)
    with pytest.raises(InvalidRecord, match="snapshot must be a SnapshotRecord, got dict"):
        journal.write_snapshot(run, {"run_id": run})  # type: ignore[arg-type]  # bad input on purpose
    with pytest.raises(InvalidRecord, match=f"snapshot of run {run} cannot be stored for run {other}"):
        journal.write_snapshot(other, good)
    with pytest.raises(InvalidRecord, match="does not match its checksum; reseal it"):
        journal.write_snapshot(run, msgspec.structs.replace(good, state=b"[]"))
    assert journal.hook_calls == []
    journal.write_snapshot(run, good)
    assert journal.read_snapshot(run) == good


def test_a_stored_snapshot_is_verified_on_read() -> None:
    """A snapshot damaged in the store, unreadable, or filed under another run is SnapshotCorrupt."""
    journal = DictJournal()
    run, other = IDS.new_id(), IDS.new_id()
    good = snapshot_at(batch(run, 1)[0])
    journal.snapshots[run] = encode_snapshot(msgspec.structs.replace(good, state=b"[]"))
    with pytest.raises(SnapshotCorrupt, match="checksum mismatch"):
        journal.read_snapshot(run)
    journal.snapshots[run] = b'{"run_id": 7'
    with pytest.raises(SnapshotCorrupt, match="unreadable"):
        journal.read_snapshot(run)
    journal.snapshots[other] = encode_snapshot(good)
    with pytest.raises(SnapshotCorrupt, match=f"holds the snapshot of run {run}"):
        journal.read_snapshot(other)


def test_fencing_is_checked_with_the_contract_rule() -> None:
    """None is accepted only while the token is 0; any other token must equal the current one."""
    journal = DictJournal()
    run = IDS.new_id()
    journal.fences[run] = 3
    for fence in (None, 2, 4):
        with pytest.raises(FencingRejected) as caught:
            journal.append(run, 1, batch(run, 1), fence=fence)
        assert (caught.value.presented, caught.value.current) == (fence or 0, 3)
    assert journal.append(run, 1, batch(run, 1), fence=3).last_sequence == 1


def test_refused_appends_are_replays_conflicts_or_lost_races() -> None:
    """An exact re-append is acknowledged; a reused event id with other content conflicts; else AppendConflict."""
    journal = DictJournal()
    run = IDS.new_id()
    first = batch(run, 1, 3)
    journal.append(run, 1, first)
    assert journal.append(run, 2, first[1:2]).already_committed
    changed = JournalRecord.seal(
        run_id=run,
        sequence=2,
        event_id=first[1].event_id,
        event_type="Probe",
        schema_version=1,
        payload=b"[]",
    )
    with pytest.raises(
        ConflictingRecord, match=f"event id {first[1].event_id} is already committed at sequence 2"
    ):
        journal.append(run, 2, [changed])
    with pytest.raises(AppendConflict) as lost:
        journal.append(run, 2, batch(run, 2))
    assert lost.value.actual_next == 4
    with pytest.raises(ConflictingRecord, match=r"already committed at sequence 1$"):
        journal.append(run, 4, [_reusing(first[0], 4)])


def _reusing(record: JournalRecord, sequence: int) -> JournalRecord:
    return JournalRecord.seal(
        run_id=record.run_id,
        sequence=sequence,
        event_id=record.event_id,
        event_type="Probe",
        schema_version=1,
        payload=b"{}",
    )


def test_an_event_id_indexed_at_an_empty_sequence_is_corruption() -> None:
    """An index naming a sequence that holds no record fails closed as corruption, with the remedy."""
    journal = DictJournal()
    run = IDS.new_id()
    records = batch(run, 1, 2)
    with pytest.raises(
        CorruptionError, match="indexed at sequence 5, which holds no record; restore the dict"
    ):
        journal.refused(
            run, 1, records, actual_next=3, stored_at=lambda sequence: None, sequence_of=lambda event: 5
        )


def test_a_damaged_field_read_back_is_a_checksum_mismatch_naming_run_and_sequence() -> None:
    """verified() turns a field that breaks the input rules into ChecksumMismatch with the remedy."""
    journal = DictJournal()
    run = IDS.new_id()
    (record,) = batch(run, 1)
    for damaged in (
        msgspec.structs.replace(record, payload=b"\xff"),
        msgspec.structs.replace(record, event_type="no such type"),
        msgspec.structs.replace(record, checksum="0" * 64),
    ):
        with pytest.raises(ChecksumMismatch, match=f"run {run} sequence 1"):
            journal.verified(damaged)
    assert journal.verified(record) is record


def test_read_windows_fail_closed_where_the_hole_is() -> None:
    """A missing, repeated, malformed or out-of-head sequence raises where it is, naming the remedy."""
    journal = DictJournal()
    run = IDS.new_id()
    records = batch(run, 1, 4)

    def window(sequences: list[object], *, head: int | None = 5, limit: int | None = None) -> object:
        rows = [(sequence, records[0]) for sequence in sequences]
        return journal.window(run, 0, limit, rows, lambda _, record: record, next_sequence=head)  # type: ignore[arg-type]

    with pytest.raises(JournalGap, match=f"^journal gap in run {run}: expected sequence 2, found 3; restore"):
        window([1, 3, 4])
    with pytest.raises(CorruptionError, match="holds sequence 1 out of order where sequence 2 belongs"):
        window([1, 1])
    with pytest.raises(CorruptionError, match="malformed sequence 'two' where sequence 2 belongs"):
        window([1, "two"])
    with pytest.raises(CorruptionError, match=r"holds sequence 3 beyond its head \(next sequence 3\)"):
        window([1, 2, 3], head=3)
    with pytest.raises(JournalGap, match=r"expected sequence 4, found none \(the run's head is at 5\)"):
        window([1, 2, 3])
    assert len(window([1, 2], limit=2)) == 2  # a limited window stops short of the head by design
    assert len(window([1, 2, 3], head=None)) == 3  # a store without a head cannot see a missing tail


def test_the_built_in_backends_are_written_on_the_kit(tmp_path: Path) -> None:
    """The local journal is a JournalBase, so it answers with the kit's wording."""
    with LocalWorkflowJournal(f"file://{tmp_path}/j") as journal:
        assert isinstance(journal, JournalBase)
        run = IDS.new_id()
    with pytest.raises(JournalUnavailable, match=f"^next sequence of run {run} refused: journal file://"):
        journal.next_sequence(run)


class TailedJournal(DictJournal):
    """DictJournal declaring run_tails, served by the kit's run-by-run default."""

    def __init__(self) -> None:
        super().__init__()
        self._capabilities = JournalCapabilities.declare(Durability.MEMORY, "fencing snapshots run_tails")


def test_run_tails_are_refused_unless_declared_and_check_their_arguments_first() -> None:
    """read_tails checks run_ids, then refuses with CompatibilityError unless run_tails is declared."""
    journal = DictJournal()
    with pytest.raises(InvalidIdentifier):
        journal.read_tails(["run-1"])
    with pytest.raises(InvalidRecord, match="more than once"):
        journal.read_tails([IDS.new_id()] * 2)
    with pytest.raises(CompatibilityError, match="does not declare run_tails"):
        journal.read_tails([IDS.new_id()])
    assert RUN_TAILS.of(journal) is None and RUN_TAILS.of(TailedJournal()) is not None


def test_the_kit_s_default_tails_verify_snapshots_and_discard_an_unusable_one() -> None:
    """The default reads each run's snapshot and the records from its last sequence on; a damaged or
    undecodable snapshot, or one filed under another run, is discarded with the whole history read."""
    journal = TailedJournal()
    runs = [IDS.new_id() for _ in range(4)]
    for run in runs:
        journal.append(run, 1, batch(run, 1, 3))
    good = snapshot_at(journal.runs[runs[0]][1])
    journal.snapshots[runs[0]] = encode_snapshot(good)
    journal.snapshots[runs[1]] = encode_snapshot(msgspec.structs.replace(good, run_id=runs[1], state=b"[]"))
    journal.snapshots[runs[2]] = b'{"run_id": 7'
    journal.snapshots[runs[3]] = encode_snapshot(good)  # another run's
    first, damaged, unreadable, foreign = journal.read_tails(runs)
    assert first.snapshot == good and [r.sequence for r in first.records] == [2, 3]
    assert first.discarded is None
    for tail in (damaged, unreadable, foreign):
        assert tail.snapshot is None and tail.discarded
        assert [r.sequence for r in tail.records] == [1, 2, 3]
    assert "holds the snapshot of run" in str(foreign.discarded)
    journal.close()
    with pytest.raises(JournalUnavailable, match="reading run tails refused"):
        journal.read_tails(runs)
