"""Contract clauses of bad input: oversized, non-UTF-8, malformed ids and wrong types change nothing."""

from __future__ import annotations

import msgspec
import pytest

from mayfly.journal import MAX_RECORD_PAYLOAD, JournalRecord, WorkflowJournal
from mayfly.model.errors import InvalidIdentifier, InvalidRecord, LimitExceeded
from mayfly_contract.support import Records


def unchecked(record: JournalRecord, **changes: object) -> JournalRecord:
    """Return ``record`` with fields changed and its checksum recomputed, skipping validation."""
    changed = msgspec.structs.replace(record, **changes)
    try:
        return msgspec.structs.replace(changed, checksum=changed.expected_checksum())
    except (AttributeError, TypeError, UnicodeError):
        return changed


@pytest.mark.clause("journal.inputs.oversized")
def test_oversized_payload_is_refused(mayfly_journal: WorkflowJournal, run_id: str, records: Records) -> None:
    """A payload over MAX_RECORD_PAYLOAD raises LimitExceeded and nothing is written."""
    big = unchecked(records.record(run_id, 1), payload=b"x" * (MAX_RECORD_PAYLOAD + 1))
    with pytest.raises(LimitExceeded):
        mayfly_journal.append(run_id, 1, [big])
    assert mayfly_journal.next_sequence(run_id) == 1


@pytest.mark.clause("journal.inputs.non-utf8")
def test_non_utf8_payload_is_refused(mayfly_journal: WorkflowJournal, run_id: str, records: Records) -> None:
    """A payload that is not UTF-8 raises InvalidRecord and nothing is written."""
    bad = unchecked(records.record(run_id, 1), payload=b'{"x":"\xff\xfe"}')
    with pytest.raises(InvalidRecord):
        mayfly_journal.append(run_id, 1, [bad])
    assert list(mayfly_journal.read(run_id)) == []


@pytest.mark.clause("journal.inputs.malformed-ids")
@pytest.mark.parametrize(
    "changes",
    [
        {"event_id": "not-a-uuid"},
        {"event_id": "00000000-0000-7000-8000-00000000000A"},
        {"event_id": "\udcff"},
    ],
)
def test_malformed_event_ids_are_refused(
    mayfly_journal: WorkflowJournal, run_id: str, records: Records, changes: dict[str, object]
) -> None:
    """A record with a malformed event id raises InvalidIdentifier and nothing is written."""
    bad = unchecked(records.record(run_id, 1), **changes)
    with pytest.raises(InvalidIdentifier):
        mayfly_journal.append(run_id, 1, [bad])
    assert mayfly_journal.next_sequence(run_id) == 1


@pytest.mark.clause("journal.inputs.malformed-run-id")
@pytest.mark.parametrize("bad_run", ["", "run-1", "../../etc/passwd", "00000000-0000-7000-8000-0000000000ZZ"])
def test_malformed_run_ids_are_refused(mayfly_journal: WorkflowJournal, bad_run: str) -> None:
    """Every operation refuses a malformed run id with InvalidIdentifier (no path tricks)."""
    with pytest.raises(InvalidIdentifier):
        mayfly_journal.next_sequence(bad_run)
    with pytest.raises(InvalidIdentifier):
        list(mayfly_journal.read(bad_run))
    with pytest.raises(InvalidIdentifier):
        mayfly_journal.read_snapshot(bad_run)
    with pytest.raises(InvalidIdentifier):
        mayfly_journal.list_runs(after=bad_run or "x")


@pytest.mark.clause("journal.inputs.wrong-types")
@pytest.mark.parametrize(
    "changes",
    [
        {"sequence": "1"},
        {"sequence": True},
        {"schema_version": 0},
        {"event_type": "bad type"},
        {"event_type": "X" * 65},
        {"payload": "text, not bytes"},
    ],
)
def test_wrong_field_types_are_refused(
    mayfly_journal: WorkflowJournal, run_id: str, records: Records, changes: dict[str, object]
) -> None:
    """Fields of the wrong type or outside their grammar raise InvalidRecord and change nothing."""
    bad = unchecked(records.record(run_id, 1), **changes)
    with pytest.raises(InvalidRecord):
        mayfly_journal.append(run_id, 1, [bad])
    assert mayfly_journal.next_sequence(run_id) == 1


@pytest.mark.clause("journal.inputs.bad-arguments")
def test_bad_append_and_read_arguments_are_refused(
    mayfly_journal: WorkflowJournal, run_id: str, records: Records
) -> None:
    """Empty batches, misnumbered or foreign records and negative read positions are refused."""
    other = records.new_id()
    cases: list[tuple[int, list[JournalRecord]]] = [
        (1, []),
        (0, records.batch(run_id, 0 + 1)),
        (1, records.batch(run_id, 2)),
        (1, [*records.batch(run_id, 1), *records.batch(run_id, 3)]),
        (1, records.batch(other, 1)),
    ]
    for expected, batch in cases:
        with pytest.raises(InvalidRecord):
            mayfly_journal.append(run_id, expected, batch)
    with pytest.raises(InvalidRecord):
        mayfly_journal.append(run_id, 1, records.batch(run_id, 1), fence=-1)
    with pytest.raises(InvalidRecord):
        list(mayfly_journal.read(run_id, after=-1))
    assert mayfly_journal.next_sequence(run_id) == 1
    assert mayfly_journal.next_sequence(other) == 1
