"""SqliteJournal beyond the contract suite: rows changed in place, gaps located, URLs refused, on a real database."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from mayfly_example_sqlite import SqliteJournal, SqliteLeaseStore

from mayfly.identity import Uuid7IdSource
from mayfly.journal import JournalRecord
from mayfly.model.errors import (
    AppendConflict,
    ChecksumMismatch,
    CorruptionError,
    InvalidBackendURL,
    JournalGap,
)
from mayfly.runindex import IndexEntry, IndexStatus

IDS = Uuid7IdSource()


def batch(run_id: str, first: int, count: int) -> list[JournalRecord]:
    """``count`` sealed records of ``run_id`` from sequence ``first``."""
    return [
        JournalRecord.seal(
            run_id=run_id,
            sequence=sequence,
            event_id=IDS.new_id(),
            event_type="Probe",
            schema_version=1,
            payload=b'{"n":%d}' % sequence,
        )
        for sequence in range(first, first + count)
    ]


@pytest.fixture
def database(tmp_path: Path) -> Path:
    """The file of a fresh database."""
    return tmp_path / "journal.db"


@pytest.fixture
def journal(database: Path) -> Iterator[SqliteJournal]:
    """A journal on the fresh database."""
    with SqliteJournal(f"sqlite://{database}") as opened:
        yield opened


# Each damage rewrites stored columns of sequence 3 of a five-record run directly, as an operator or a
# bad restore could; :run is the run, :other another run of the same database.
DAMAGE = {
    "payload": [
        "UPDATE mayfly_records SET payload = CAST(payload || ' ' AS BLOB) WHERE run_id = :run AND sequence = 3"
    ],
    "payload-as-text": [
        "UPDATE mayfly_records SET payload = CAST(payload AS TEXT) WHERE run_id = :run AND sequence = 3"
    ],
    "payload-not-utf8": ["UPDATE mayfly_records SET payload = X'FF' WHERE run_id = :run AND sequence = 3"],
    "event-id": [
        "UPDATE mayfly_records SET event_id = '0190a0b0-0000-7000-8000-000000000099' "
        "WHERE run_id = :run AND sequence = 3"
    ],
    "event-id-not-canonical": [
        "UPDATE mayfly_records SET event_id = upper(event_id) WHERE run_id = :run AND sequence = 3"
    ],
    "event-type": ["UPDATE mayfly_records SET event_type = 'Forged' WHERE run_id = :run AND sequence = 3"],
    "event-type-invalid": [
        "UPDATE mayfly_records SET event_type = 'no such type!' WHERE run_id = :run AND sequence = 3"
    ],
    "schema-version": [
        "UPDATE mayfly_records SET schema_version = schema_version + 1 WHERE run_id = :run AND sequence = 3"
    ],
    "schema-version-as-text": [
        "UPDATE mayfly_records SET schema_version = 'one' WHERE run_id = :run AND sequence = 3"
    ],
    "checksum": [
        "UPDATE mayfly_records SET checksum = printf('%064d', 0) WHERE run_id = :run AND sequence = 3"
    ],
    "checksum-as-blob": [
        "UPDATE mayfly_records SET checksum = CAST(checksum AS BLOB) WHERE run_id = :run AND sequence = 3"
    ],
    "cut-and-renumbered": [
        "DELETE FROM mayfly_records WHERE run_id = :run AND sequence = 3",
        "UPDATE mayfly_records SET sequence = sequence - 1 WHERE run_id = :run AND sequence > 3",
    ],
    "swapped": [
        "UPDATE mayfly_records SET sequence = 100 WHERE run_id = :run AND sequence = 3",
        "UPDATE mayfly_records SET sequence = 3 WHERE run_id = :run AND sequence = 4",
        "UPDATE mayfly_records SET sequence = 4 WHERE run_id = :run AND sequence = 100",
    ],
    "moved-from-another-run": [
        "DELETE FROM mayfly_records WHERE run_id = :run AND sequence = 3",
        "UPDATE mayfly_records SET run_id = :run WHERE run_id = :other AND sequence = 3",
    ],
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_row_changed_in_place_fails_closed_on_every_read_path(
    journal: SqliteJournal, database: Path, damage: str
) -> None:
    """Rewriting any stored column of a record raises ChecksumMismatch naming run and sequence, on reads and re-appends."""
    run, other = IDS.new_id(), IDS.new_id()
    records = batch(run, 1, 5)
    journal.append(run, 1, records)
    journal.append(other, 1, batch(other, 1, 5))
    with sqlite3.connect(database, isolation_level=None) as connection:
        for statement in DAMAGE[damage]:
            connection.execute(statement, {"run": run, "other": other})
    connection.close()
    located = rf"run {run} sequence 3\b"
    with pytest.raises(ChecksumMismatch, match=located):
        journal.read(run)
    with pytest.raises(ChecksumMismatch, match=located):
        journal.read(run, after=2, limit=1)  # the lookup of a snapshot's last record
    with pytest.raises(ChecksumMismatch, match=located):
        journal.append(run, 1, records)  # an exact re-append must not pass for committed
    assert journal.read(run, limit=2) == records[:2]


def test_a_missing_record_is_reported_where_it_is(journal: SqliteJournal) -> None:
    """Record 4 of 9 removed: the gap is reported as expected sequence 4, found 5."""
    run = IDS.new_id()
    journal.append(run, 1, batch(run, 1, 9))
    journal.remove_record(run, 4)
    with pytest.raises(JournalGap, match=rf"^journal gap in run {run}: expected sequence 4, found 5; "):
        journal.read(run)
    with pytest.raises(JournalGap, match="expected sequence 4, found 5"):
        journal.read(run, after=3, limit=1)
    assert [r.sequence for r in journal.read(run, limit=3)] == [1, 2, 3]


def test_a_sequence_of_the_wrong_type_is_a_gap_where_it_belongs(
    journal: SqliteJournal, database: Path
) -> None:
    """A sequence column turned to text (SQLite keeps it) reads as a gap at that sequence, never a skip."""
    run = IDS.new_id()
    journal.append(run, 1, batch(run, 1, 5))
    with sqlite3.connect(database, isolation_level=None) as connection:
        connection.execute(
            "UPDATE mayfly_records SET sequence = 'three' WHERE run_id = ? AND sequence = 3", (run,)
        )
    connection.close()
    with pytest.raises(CorruptionError, match=rf"run {run}: expected sequence 3, found 4"):
        journal.read(run)


@pytest.mark.parametrize("opener", [SqliteJournal, SqliteLeaseStore])
def test_a_path_with_raw_control_characters_is_refused_not_stripped(tmp_path: Path, opener: type) -> None:
    """sqlite:///DIR/jour<LF>nal.db is refused; the journal.db that stripping LF would give is never created."""
    with pytest.raises(InvalidBackendURL, match="control character"):
        opener(f"sqlite://{tmp_path}/jour\nnal.db")
    assert list(tmp_path.iterdir()) == []


def entry_of(run_id: str, sequence: int, status: IndexStatus = IndexStatus.NEW) -> IndexEntry:
    """A runnable (by default) index entry of ``run_id`` at ``sequence``."""
    return IndexEntry(run_id=run_id, queue="example", status=status, ready_at_ms=1_000, sequence=sequence)


def never_asked() -> IndexEntry:
    """An entry callable for appends that must be refused before they ask for it."""
    raise AssertionError("a refused append asked for its index entry")


def test_a_refused_indexed_append_stores_neither_records_nor_entry(journal: SqliteJournal) -> None:
    """A compare-and-append conflict refuses the batch before asking for its entry; the stored entry stays."""
    run_id = IDS.new_id()
    journal.append_indexed(run_id, 1, batch(run_id, 1, 2), None, lambda: entry_of(run_id, 2))
    with pytest.raises(AppendConflict):
        journal.append_indexed(run_id, 1, batch(run_id, 1, 1), None, never_asked)
    assert journal.index_get(run_id) == entry_of(run_id, 2)
    assert journal.next_sequence(run_id) == 3


def test_a_failed_entry_rolls_the_records_back(journal: SqliteJournal) -> None:
    """An entry callable that raises aborts the whole transaction: the records are not stored either."""
    run_id = IDS.new_id()

    def broken() -> IndexEntry:
        raise RuntimeError("the driver died while deciding")

    with pytest.raises(RuntimeError):
        journal.append_indexed(run_id, 1, batch(run_id, 1, 2), None, broken)
    assert journal.next_sequence(run_id) == 1
    assert journal.index_get(run_id) is None


def test_purge_drops_the_index_row(journal: SqliteJournal) -> None:
    """A purged run is no longer in the index, so no worker claims a run that is gone."""
    run_id = IDS.new_id()
    journal.append_indexed(run_id, 1, batch(run_id, 1, 1), None, lambda: entry_of(run_id, 1))
    assert journal.purge_run(run_id) is True
    assert journal.index_get(run_id) is None
    assert journal.claim("w", limit=5, ttl_ms=60_000, now_ms=2_000, queues=["example"]) == []


def test_closing_the_journal_releases_what_its_claims_hold(database: Path) -> None:
    """Leases granted by claim belong to the journal's lease store: close() releases them."""
    run_id = IDS.new_id()
    with SqliteJournal(f"sqlite://{database}") as first:
        first.append_indexed(run_id, 1, batch(run_id, 1, 1), None, lambda: entry_of(run_id, 1))
        (guard,) = first.claim("w", limit=5, ttl_ms=3_600_000, now_ms=2_000, queues=["example"])
    with SqliteJournal(f"sqlite://{database}") as second:
        (again,) = second.claim("w", limit=5, ttl_ms=60_000, now_ms=2_000, queues=["example"])
        assert (again.run_id, again.fencing_token) == (run_id, guard.fencing_token + 1)
        again.release()
