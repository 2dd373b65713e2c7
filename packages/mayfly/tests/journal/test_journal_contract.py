"""Tests of the storage-neutral journal contract: envelopes, checksums and input rules."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

from mayfly.journal import (
    MAX_RECORD_PAYLOAD,
    Durability,
    JournalCapabilities,
    JournalRecord,
    SnapshotRecord,
    check_snapshot,
    redact_url,
    validate_batch,
    validate_read,
)
from mayfly.model.errors import (
    ChecksumMismatch,
    ConflictingRecord,
    InvalidIdentifier,
    InvalidRecord,
    LimitExceeded,
    SnapshotCorrupt,
)

RUN = "00000000-0000-7000-8000-000000000001"
EVENT = "00000000-0000-7000-8000-000000000002"


def record(sequence: int = 1, event: str = EVENT, payload: bytes = b'{"a":1}') -> JournalRecord:
    return JournalRecord.seal(
        run_id=RUN,
        sequence=sequence,
        event_id=event,
        event_type="RunStarted",
        schema_version=1,
        payload=payload,
    )


def event_id(n: int) -> str:
    return f"00000000-0000-7000-8000-{n:012x}"


def snapshot(**changes: object) -> SnapshotRecord:
    base = record()
    fields: dict[str, object] = {
        "run_id": RUN,
        "schema_version": 1,
        "last_sequence": 1,
        "last_event_id": base.event_id,
        "last_record_checksum": base.checksum,
        "spec_checksum": "sha256:abc",
        "state_checksum": "sha256:def",
        "state": b"{}",
    }
    fields.update(changes)
    return SnapshotRecord.seal(**fields)  # type: ignore[arg-type]


def test_record_checksum_matches_published_vector() -> None:
    """The record checksum encoding is pinned by the test vector published in the docs."""
    assert record().checksum == "dfd8d04f45862be771356f21b849b39e332a0e86d8f7444ce046cbe881e426c1"


def test_record_checksum_is_length_prefixed_sha256() -> None:
    """The checksum is SHA-256 over the domain tag and u64 length-prefixed fields."""
    fields = [RUN.encode(), b"1", EVENT.encode(), b"RunStarted", b"1", b'{"a":1}']
    hasher = hashlib.sha256(b"mayfly.journal.record/1\x00")
    for field in fields:
        hasher.update(len(field).to_bytes(8, "big") + field)
    assert record().checksum == hasher.hexdigest()


def test_snapshot_checksum_matches_published_vector() -> None:
    """The snapshot checksum encoding is pinned by the test vector published in the docs."""
    assert snapshot().checksum == "84f14aecec698dbbcf645ddbcc13131e4b255fad9e279bedd579051c7d06fa11"


def test_field_boundaries_cannot_collide() -> None:
    """Moving bytes between adjacent fields changes the checksum (length prefixes disambiguate)."""
    one = JournalRecord.seal(
        run_id=RUN, sequence=1, event_id=EVENT, event_type="Ab", schema_version=1, payload=b"c"
    )
    two = JournalRecord.seal(
        run_id=RUN, sequence=1, event_id=EVENT, event_type="A", schema_version=1, payload=b"bc"
    )
    assert one.checksum != two.checksum


def test_verify_names_run_and_sequence() -> None:
    """A tampered record fails verification with an error naming its run and sequence."""
    bad = msgspec.structs.replace(record(sequence=7), payload=b'{"a":2}')
    with pytest.raises(ChecksumMismatch, match=f"run {RUN} sequence 7"):
        bad.verify()


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"run_id": "not-a-uuid"}, InvalidIdentifier),
        ({"event_id": "00000000-0000-7000-8000-00000000000G"}, InvalidIdentifier),
        ({"sequence": 0}, InvalidRecord),
        ({"sequence": True}, InvalidRecord),
        ({"sequence": 1 << 63}, InvalidRecord),
        ({"event_type": "9Bad"}, InvalidRecord),
        ({"event_type": "A" * 65}, InvalidRecord),
        ({"event_type": "Run_Started"}, InvalidRecord),
        ({"schema_version": 0}, InvalidRecord),
        ({"payload": "text"}, InvalidRecord),
        ({"payload": b"\xff\xfe"}, InvalidRecord),
        ({"payload": b"x" * (MAX_RECORD_PAYLOAD + 1)}, LimitExceeded),
    ],
)
def test_seal_rejects_bad_fields(changes: dict[str, object], error: type[Exception]) -> None:
    """Sealing a record with a malformed field raises the typed input error."""
    fields: dict[str, object] = {
        "run_id": RUN,
        "sequence": 1,
        "event_id": EVENT,
        "event_type": "RunStarted",
        "schema_version": 1,
        "payload": b"{}",
    }
    fields.update(changes)
    with pytest.raises(error):
        JournalRecord.seal(**fields)  # type: ignore[arg-type]


def test_payload_at_limit_is_accepted() -> None:
    """A payload of exactly MAX_RECORD_PAYLOAD bytes is within the limit."""
    assert len(record(payload=b"x" * MAX_RECORD_PAYLOAD).payload) == MAX_RECORD_PAYLOAD


def test_validate_batch_accepts_consecutive_records() -> None:
    """A well-formed batch comes back as a tuple in order."""
    batch = [record(1, event_id(10)), record(2, event_id(11))]
    assert validate_batch(RUN, 1, batch, None) == tuple(batch)


@pytest.mark.parametrize(
    ("expected_next", "records", "fence", "error"),
    [
        (0, "one", None, InvalidRecord),
        (1, [], None, InvalidRecord),
        (1, "not-a-sequence", None, InvalidRecord),
        (1, [object()], None, InvalidRecord),
        (2, "one", None, InvalidRecord),
        (1, "one", -1, InvalidRecord),
        (1, "one", "3", InvalidRecord),
        (1, "gap", None, InvalidRecord),
        (1, "dup", None, ConflictingRecord),
        (1, "tampered", None, ChecksumMismatch),
        (1, "other-run", None, InvalidRecord),
    ],
)
def test_validate_batch_rejects_bad_appends(
    expected_next: int, records: object, fence: object, error: type[Exception]
) -> None:
    """Malformed append arguments raise typed errors before a backend touches its store."""
    batches: dict[str, object] = {
        "one": [record(1, event_id(10))],
        "gap": [record(1, event_id(10)), record(3, event_id(11))],
        "dup": [record(1, event_id(10)), record(2, event_id(10))],
        "tampered": [msgspec.structs.replace(record(1), payload=b"{}")],
        "other-run": [
            JournalRecord.seal(
                run_id=event_id(99),
                sequence=1,
                event_id=EVENT,
                event_type="X",
                schema_version=1,
                payload=b"",
            )
        ],
    }
    argument = batches.get(records, records) if isinstance(records, str) else records
    with pytest.raises(error):
        validate_batch(RUN, expected_next, argument, fence)


def test_validate_batch_rejects_bad_run_id() -> None:
    """An append to a malformed run id is an InvalidIdentifier."""
    with pytest.raises(InvalidIdentifier):
        validate_batch("run-1", 1, [record()], None)


def test_validate_read_normalises_and_rejects() -> None:
    """Read arguments are checked: negative positions and non-int limits are refused."""
    assert validate_read(RUN, 0, None) == (RUN, 0, None)
    with pytest.raises(InvalidRecord):
        validate_read(RUN, -1, None)
    with pytest.raises(InvalidRecord):
        validate_read(RUN, 0, 1.5)


def test_snapshot_verify_detects_tampering() -> None:
    """A snapshot whose state changed after sealing is reported corrupt, naming the run."""
    bad = msgspec.structs.replace(snapshot(), state=b"{1}")
    with pytest.raises(SnapshotCorrupt, match=RUN):
        bad.verify()
    snapshot().verify()


def test_snapshot_seal_rejects_bad_fields() -> None:
    """A snapshot with a malformed record checksum or a zero sequence cannot be sealed."""
    with pytest.raises(InvalidRecord):
        snapshot(last_record_checksum="ABC")
    with pytest.raises(InvalidRecord):
        snapshot(last_sequence=0)


def test_check_snapshot_diagnoses_stale_snapshots() -> None:
    """A snapshot matches only the record it names; otherwise a diagnostic says why."""
    current = snapshot()
    assert check_snapshot(current, record()) is None
    assert "does not hold" in (check_snapshot(current, None) or "")
    other = record(event=event_id(77))
    assert "journal holds event" in (check_snapshot(current, other) or "")
    same_id = record(payload=b"{}")
    assert "checksum" in (check_snapshot(current, same_id) or "")


def test_durability_order() -> None:
    """Durability levels are ordered memory < write < flush < durable."""
    assert Durability.DURABLE.meets(Durability.FLUSH)
    assert Durability.WRITE.meets(Durability.WRITE)
    assert not Durability.MEMORY.meets(Durability.WRITE)
    assert Durability("durable") is Durability.DURABLE


def test_capabilities_are_a_frozen_value() -> None:
    """Capabilities are an immutable value with conservative defaults."""
    caps = JournalCapabilities(
        durability=Durability.WRITE, cross_process=False, fencing=True, crash_durable=True
    )
    assert caps.lease_expiry is False
    with pytest.raises(AttributeError):
        caps.fencing = False  # type: ignore[misc]


def test_redact_url_hides_passwords() -> None:
    """Passwords never appear in a journal's reported URL."""
    assert redact_url("postgresql://u:secret@db:5432/x") == "postgresql://u:***@db:5432/x"
    assert redact_url("file:///tmp/j") == "file:///tmp/j"
    assert redact_url("redis://u:p@h:notaport/0") == "redis://u:***@h:notaport/0"
    assert redact_url("postgresql://u:p%40ss@[::1]:5432/x") == "postgresql://u:***@[::1]:5432/x"
