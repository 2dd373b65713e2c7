"""Contract clauses of snapshots: missing, round trip, replacement, stale and corrupt snapshots."""

from __future__ import annotations

import msgspec
import pytest

from mayfly.journal import JournalFaults, WorkflowJournal, check_snapshot
from mayfly.model.errors import InvalidRecord, SnapshotCorrupt
from mayfly_contract.support import Records, snapshot_of

pytestmark = pytest.mark.capability("snapshots")


@pytest.mark.clause("snapshot.missing")
def test_missing_snapshot_reads_none(mayfly_journal: WorkflowJournal, run_id: str, records: Records) -> None:
    """A run without a snapshot reads None (rebuild from events), with or without records."""
    assert mayfly_journal.read_snapshot(run_id) is None
    mayfly_journal.append(run_id, 1, records.batch(run_id, 1))
    assert mayfly_journal.read_snapshot(run_id) is None


@pytest.mark.clause("snapshot.round-trip")
def test_snapshot_round_trips_and_is_replaced(
    mayfly_journal: WorkflowJournal, run_id: str, records: Records
) -> None:
    """A written snapshot reads back equal (opaque state bytes exact) and a newer one replaces it."""
    batch = records.batch(run_id, 1, 3)
    mayfly_journal.append(run_id, 1, batch)
    first = snapshot_of(batch[0], state=bytes(range(256)))
    mayfly_journal.write_snapshot(run_id, first)
    assert mayfly_journal.read_snapshot(run_id) == first
    latest = snapshot_of(batch[2])
    mayfly_journal.write_snapshot(run_id, latest)
    assert mayfly_journal.read_snapshot(run_id) == latest


@pytest.mark.clause("snapshot.independent")
def test_snapshots_never_affect_the_journal(
    mayfly_journal: WorkflowJournal, run_id: str, records: Records
) -> None:
    """Writing a snapshot changes neither the next sequence nor what reads return."""
    batch = records.batch(run_id, 1, 2)
    mayfly_journal.append(run_id, 1, batch)
    mayfly_journal.write_snapshot(run_id, snapshot_of(batch[1]))
    assert mayfly_journal.next_sequence(run_id) == 3
    assert list(mayfly_journal.read(run_id)) == batch


@pytest.mark.clause("snapshot.stale")
def test_stale_snapshot_is_diagnosed(mayfly_journal: WorkflowJournal, run_id: str, records: Records) -> None:
    """A snapshot naming a record the journal does not hold is stored as-is and diagnosed stale."""
    batch = records.batch(run_id, 1, 2)
    mayfly_journal.append(run_id, 1, batch)
    ahead = snapshot_of(records.record(run_id, 5))
    mayfly_journal.write_snapshot(run_id, ahead)
    stored = mayfly_journal.read_snapshot(run_id)
    assert stored == ahead
    at = list(mayfly_journal.read(run_id, after=stored.last_sequence - 1, limit=1))
    assert check_snapshot(stored, at[0] if at else None) is not None
    foreign = snapshot_of(records.record(run_id, 2))
    mayfly_journal.write_snapshot(run_id, foreign)
    (record,) = mayfly_journal.read(run_id, after=1, limit=1)
    assert check_snapshot(foreign, record) is not None
    assert check_snapshot(snapshot_of(batch[1]), record) is None


@pytest.mark.clause("snapshot.corrupt")
@pytest.mark.capability("fault_injection")
def test_corrupt_snapshot_raises_snapshot_corrupt(
    mayfly_journal: WorkflowJournal, run_id: str, records: Records
) -> None:
    """A damaged stored snapshot raises SnapshotCorrupt (discard and rebuild), reads still work."""
    batch = records.batch(run_id, 1, 2)
    mayfly_journal.append(run_id, 1, batch)
    mayfly_journal.write_snapshot(run_id, snapshot_of(batch[1]))
    assert isinstance(mayfly_journal, JournalFaults)
    mayfly_journal.corrupt_snapshot(run_id)
    with pytest.raises(SnapshotCorrupt):
        mayfly_journal.read_snapshot(run_id)
    assert list(mayfly_journal.read(run_id)) == batch
    mayfly_journal.write_snapshot(run_id, snapshot_of(batch[1]))
    assert mayfly_journal.read_snapshot(run_id) == snapshot_of(batch[1])


@pytest.mark.clause("snapshot.inputs")
def test_bad_snapshots_are_refused(mayfly_journal: WorkflowJournal, run_id: str, records: Records) -> None:
    """A snapshot of another run or with a wrong checksum is refused and nothing is stored."""
    batch = records.batch(run_id, 1, 1)
    mayfly_journal.append(run_id, 1, batch)
    other = records.new_id()
    with pytest.raises(InvalidRecord):
        mayfly_journal.write_snapshot(other, snapshot_of(batch[0]))
    tampered = msgspec.structs.replace(snapshot_of(batch[0]), state=b"{}")
    with pytest.raises((InvalidRecord, SnapshotCorrupt)):
        mayfly_journal.write_snapshot(run_id, tampered)
    assert mayfly_journal.read_snapshot(run_id) is None
    assert mayfly_journal.read_snapshot(other) is None
