"""Contract clauses of reading: order, windows, verification, located gaps, corruption and run listing."""

from __future__ import annotations

import re
import uuid

import pytest

from mayfly.journal import JournalFaults, WorkflowJournal
from mayfly.model.errors import ChecksumMismatch, CorruptionError, JournalGap
from mayfly_contract.support import Records, sequences


@pytest.mark.clause("journal.read.order")
def test_reads_are_ordered_and_windowed(
    mayfly_journal: WorkflowJournal, run_id: str, records: Records
) -> None:
    """Reads return records after ``after`` in sequence order, at most ``limit`` of them."""
    batch = records.batch(run_id, 1, 3)
    mayfly_journal.append(run_id, 1, batch)
    mayfly_journal.append(run_id, 4, records.batch(run_id, 4, 4))
    assert sequences(mayfly_journal.read(run_id)) == list(range(1, 8))
    assert sequences(mayfly_journal.read(run_id, after=2)) == [3, 4, 5, 6, 7]
    assert sequences(mayfly_journal.read(run_id, after=2, limit=3)) == [3, 4, 5]
    assert sequences(mayfly_journal.read(run_id, after=7)) == []
    assert sequences(mayfly_journal.read(run_id, after=100)) == []
    assert list(mayfly_journal.read(run_id, limit=3)) == batch


@pytest.mark.clause("journal.read.verified")
def test_read_records_verify(mayfly_journal: WorkflowJournal, run_id: str, records: Records) -> None:
    """Every record read back carries a checksum that matches its fields, payload bytes exact."""
    payloads = [b"{}", '{"text":"ünïcödé ✓ \\u0000"}'.encode(), b'"' + b"x" * 5000 + b'"']
    for sequence, payload in enumerate(payloads, start=1):
        mayfly_journal.append(run_id, sequence, records.batch(run_id, sequence, payload=payload))
    stored = list(mayfly_journal.read(run_id))
    for record in stored:
        record.verify()
    assert [record.payload for record in stored] == payloads


@pytest.mark.clause("journal.read.unknown-run")
def test_unknown_run_reads_empty(mayfly_journal: WorkflowJournal, run_id: str) -> None:
    """A run that was never appended to reads as empty and expects sequence 1."""
    assert list(mayfly_journal.read(run_id)) == []
    assert mayfly_journal.next_sequence(run_id) == 1


@pytest.mark.clause("journal.read.gap")
@pytest.mark.capability("fault_injection")
def test_gap_fails_closed(mayfly_journal: WorkflowJournal, run_id: str, records: Records) -> None:
    """A missing record in the middle of a run makes reads raise JournalGap, never skip it."""
    for sequence in (1, 2, 3):
        mayfly_journal.append(run_id, sequence, records.batch(run_id, sequence))
    assert isinstance(mayfly_journal, JournalFaults)
    mayfly_journal.remove_record(run_id, 2)
    with pytest.raises(JournalGap):
        list(mayfly_journal.read(run_id))


@pytest.mark.clause("journal.read.checksum-corruption")
@pytest.mark.capability("fault_injection")
def test_corruption_fails_closed(mayfly_journal: WorkflowJournal, run_id: str, records: Records) -> None:
    """A damaged stored record makes reads raise a checksum or corruption error."""
    mayfly_journal.append(run_id, 1, records.batch(run_id, 1, 3))
    assert isinstance(mayfly_journal, JournalFaults)
    mayfly_journal.corrupt_record(run_id, 2)
    with pytest.raises((ChecksumMismatch, CorruptionError)):
        list(mayfly_journal.read(run_id))


@pytest.mark.clause("journal.read.gap-located")
@pytest.mark.capability("fault_injection")
def test_gap_is_reported_where_it_is(mayfly_journal: WorkflowJournal, run_id: str, records: Records) -> None:
    """Record 4 of 9 removed: JournalGap names the run and sequence 4, the first one missing."""
    mayfly_journal.append(run_id, 1, records.batch(run_id, 1, 9))
    assert isinstance(mayfly_journal, JournalFaults)
    mayfly_journal.remove_record(run_id, 4)
    for window in ({}, {"after": 2}, {"after": 3, "limit": 1}):
        with pytest.raises(JournalGap) as caught:
            list(mayfly_journal.read(run_id, **window))
        message = str(caught.value)
        assert run_id in message, f"read({window}) raised {message!r}, which does not name run {run_id}"
        assert re.search(r"\bexpected sequence 4\b", message), (
            f"read({window}) raised {message!r}: the gap is at sequence 4, the first one missing"
        )


@pytest.mark.clause("journal.read.window-verified")
@pytest.mark.capability("fault_injection")
def test_every_window_verifies(mayfly_journal: WorkflowJournal, run_id: str, records: Records) -> None:
    """A damaged record fails closed in every read window holding it (a snapshot's lookup included)."""
    mayfly_journal.append(run_id, 1, records.batch(run_id, 1, 3))
    assert isinstance(mayfly_journal, JournalFaults)
    mayfly_journal.corrupt_record(run_id, 2)
    for window in ({"after": 1}, {"after": 1, "limit": 1}, {"limit": 2}):
        with pytest.raises(CorruptionError):
            list(mayfly_journal.read(run_id, **window))


def _just_below(run_id: str) -> str:
    """The canonical UUID immediately before ``run_id``, to start paging right before it."""
    value = uuid.UUID(run_id).int - 1
    return str(uuid.UUID(int=value))


@pytest.mark.clause("journal.runs.listing")
def test_runs_are_listed_sorted_and_paginated(mayfly_journal: WorkflowJournal, records: Records) -> None:
    """Run listing is sorted, pages with after/limit without overlap, and includes every run."""
    mine = sorted(records.new_id() for _ in range(5))
    for run in mine:
        mayfly_journal.append(run, 1, records.batch(run, 1))
    # Page from just below our first run, so a store shared with other data stays cheap to scan.
    seen: list[str] = []
    after = _just_below(mine[0])
    while not seen or seen[-1] < mine[-1]:
        page = mayfly_journal.list_runs(after=after, limit=2)
        assert 1 <= len(page) <= 2, f"listing after {after} ended before run {mine[-1]}"
        assert all(run > after for run in page)
        seen.extend(page)
        after = page[-1]
    assert seen == sorted(set(seen))
    assert set(mine) <= set(seen)
    assert mayfly_journal.list_runs(after=mine[0], limit=1) == [seen[seen.index(mine[0]) + 1]]
    assert mayfly_journal.list_runs(after=_just_below(mine[0]), limit=1) == [mine[0]]
