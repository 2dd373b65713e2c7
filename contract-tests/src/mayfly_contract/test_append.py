"""Contract clauses of compare-and-append: sequences, atomic batches, idempotency and conflicts."""

from __future__ import annotations

import msgspec
import pytest

from mayfly.journal import Durability, JournalCapabilities, JournalFaults, WorkflowJournal
from mayfly.model.errors import AppendConflict, ChecksumMismatch, ConflictingRecord, CorruptionError
from mayfly_contract.support import Records, sequences


@pytest.mark.clause("journal.append.first-sequence")
def test_new_run_starts_at_one(mayfly_journal: WorkflowJournal, run_id: str, records: Records) -> None:
    """A new run reads empty, expects sequence 1, and accepts its first record there."""
    assert mayfly_journal.next_sequence(run_id) == 1
    assert list(mayfly_journal.read(run_id)) == []
    result = mayfly_journal.append(run_id, 1, records.batch(run_id, 1))
    assert result.last_sequence == 1
    assert not result.already_committed
    assert mayfly_journal.next_sequence(run_id) == 2


@pytest.mark.clause("journal.append.ack-exact")
def test_acknowledgement_returns_the_records_as_stored(
    mayfly_journal: WorkflowJournal, run_id: str, records: Records
) -> None:
    """The acknowledgement carries exactly the records asked for, and reads return them equal."""
    batch = records.batch(run_id, 1, 3)
    result = mayfly_journal.append(run_id, 1, batch)
    assert result.run_id == run_id
    assert list(result.records) == batch
    assert result.last_sequence == 3
    assert list(mayfly_journal.read(run_id)) == batch


@pytest.mark.clause("journal.append.batch-atomic")
def test_failed_batch_writes_nothing(mayfly_journal: WorkflowJournal, run_id: str, records: Records) -> None:
    """A batch whose last record conflicts is rejected whole: none of its records are stored."""
    first = records.batch(run_id, 1, 2)
    mayfly_journal.append(run_id, 1, first)
    batch = [*records.batch(run_id, 3, 2), records.record(run_id, 5, event_id=first[0].event_id)]
    with pytest.raises(ConflictingRecord):
        mayfly_journal.append(run_id, 3, batch)
    assert mayfly_journal.next_sequence(run_id) == 3
    assert sequences(mayfly_journal.read(run_id)) == [1, 2]


@pytest.mark.clause("journal.append.cas-conflict")
@pytest.mark.parametrize("offset", [-2, -1, 1, 5])
def test_wrong_expected_sequence_conflicts(
    mayfly_journal: WorkflowJournal, run_id: str, records: Records, offset: int
) -> None:
    """An append at any sequence but the next raises AppendConflict naming the actual next."""
    mayfly_journal.append(run_id, 1, records.batch(run_id, 1, 3))
    expected = 4 + offset
    with pytest.raises(AppendConflict) as caught:
        mayfly_journal.append(run_id, expected, records.batch(run_id, expected, 1))
    assert (caught.value.run_id, caught.value.expected_next, caught.value.actual_next) == (
        run_id,
        expected,
        4,
    )
    assert mayfly_journal.next_sequence(run_id) == 4


@pytest.mark.clause("journal.append.idempotent-reappend")
def test_exact_reappend_is_idempotent(mayfly_journal: WorkflowJournal, run_id: str, records: Records) -> None:
    """Re-appending committed records byte-identically succeeds as already committed, writing nothing."""
    batch = records.batch(run_id, 1, 3)
    mayfly_journal.append(run_id, 1, batch)
    again = mayfly_journal.append(run_id, 1, batch)
    assert again.already_committed
    assert again.last_sequence == 3
    assert list(again.records) == batch
    middle = mayfly_journal.append(run_id, 2, batch[1:2])
    assert middle.already_committed
    assert list(mayfly_journal.read(run_id)) == batch


@pytest.mark.clause("journal.append.partial-reappend-conflicts")
def test_reappend_running_past_the_end_conflicts(
    mayfly_journal: WorkflowJournal, run_id: str, records: Records
) -> None:
    """A batch that repeats committed records and adds new ones is a conflict, not a partial write."""
    batch = records.batch(run_id, 1, 2)
    mayfly_journal.append(run_id, 1, batch)
    with pytest.raises(AppendConflict):
        mayfly_journal.append(run_id, 2, [batch[1], *records.batch(run_id, 3, 1)])
    assert mayfly_journal.next_sequence(run_id) == 3


@pytest.mark.clause("journal.append.conflicting-event-id")
def test_reused_event_id_fails_closed(mayfly_journal: WorkflowJournal, run_id: str, records: Records) -> None:
    """A new record reusing a committed event id is a ConflictingRecord and is not written."""
    batch = records.batch(run_id, 1, 2)
    mayfly_journal.append(run_id, 1, batch)
    with pytest.raises(ConflictingRecord):
        mayfly_journal.append(run_id, 3, [records.record(run_id, 3, event_id=batch[0].event_id)])
    assert mayfly_journal.next_sequence(run_id) == 3


@pytest.mark.clause("journal.append.conflicting-sequence")
def test_different_record_under_a_committed_identity_fails_closed(
    mayfly_journal: WorkflowJournal, run_id: str, records: Records
) -> None:
    """The same event id at the same sequence with different content is a ConflictingRecord."""
    batch = records.batch(run_id, 1, 2)
    mayfly_journal.append(run_id, 1, batch)
    changed = records.record(run_id, 2, event_id=batch[1].event_id, payload=b'{"changed":true}')
    with pytest.raises(ConflictingRecord):
        mayfly_journal.append(run_id, 2, [changed])
    assert list(mayfly_journal.read(run_id)) == batch


@pytest.mark.clause("journal.append.duplicate-in-batch")
def test_event_id_repeated_inside_a_batch_fails_closed(
    mayfly_journal: WorkflowJournal, run_id: str, records: Records
) -> None:
    """A batch that repeats an event id is a ConflictingRecord and writes nothing."""
    first = records.record(run_id, 1)
    with pytest.raises(ConflictingRecord):
        mayfly_journal.append(run_id, 1, [first, records.record(run_id, 2, event_id=first.event_id)])
    assert mayfly_journal.next_sequence(run_id) == 1


@pytest.mark.clause("journal.append.checksum-verified")
def test_record_with_a_wrong_checksum_is_refused(
    mayfly_journal: WorkflowJournal, run_id: str, records: Records
) -> None:
    """A record whose checksum does not match its fields is refused before anything is written."""
    tampered = msgspec.structs.replace(records.record(run_id, 1), payload=b'{"x":1}')
    with pytest.raises(ChecksumMismatch):
        mayfly_journal.append(run_id, 1, [tampered])
    assert mayfly_journal.next_sequence(run_id) == 1


@pytest.mark.clause("journal.append.runs-independent")
def test_runs_have_independent_sequences(mayfly_journal: WorkflowJournal, records: Records) -> None:
    """Each run has its own sequence starting at 1; appending to one never moves another."""
    one, two = records.new_id(), records.new_id()
    mayfly_journal.append(one, 1, records.batch(one, 1, 2))
    mayfly_journal.append(two, 1, records.batch(two, 1, 1))
    assert (mayfly_journal.next_sequence(one), mayfly_journal.next_sequence(two)) == (3, 2)


@pytest.mark.clause("journal.capabilities.consistent")
def test_declared_capabilities_are_consistent(mayfly_journal: WorkflowJournal) -> None:
    """One declared durability, repeated in the capabilities; crash durability implies at least write."""
    capabilities = mayfly_journal.capabilities
    assert isinstance(capabilities, JournalCapabilities)
    assert isinstance(mayfly_journal.durability, Durability)
    assert capabilities.durability is mayfly_journal.durability
    if capabilities.crash_durable:
        assert mayfly_journal.durability.meets(Durability.WRITE)
    assert isinstance(mayfly_journal.url, str)
    assert mayfly_journal.url


@pytest.mark.clause("journal.append.reappend-verified")
@pytest.mark.capability("fault_injection")
def test_reappend_over_a_damaged_record_fails_closed(
    mayfly_journal: WorkflowJournal, run_id: str, records: Records
) -> None:
    """Re-appending records whose stored copy is damaged raises CorruptionError, never already_committed."""
    batch = records.batch(run_id, 1, 3)
    mayfly_journal.append(run_id, 1, batch)
    assert isinstance(mayfly_journal, JournalFaults)
    mayfly_journal.corrupt_record(run_id, 2)
    with pytest.raises(CorruptionError):
        mayfly_journal.append(run_id, 1, batch)
    with pytest.raises(CorruptionError):
        mayfly_journal.append(run_id, 2, batch[1:])
    assert mayfly_journal.next_sequence(run_id) == 4
