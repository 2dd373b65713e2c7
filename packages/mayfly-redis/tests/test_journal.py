"""RedisJournal against real servers: crash of the Redis server itself, key layout, listing, encoding, errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING, Any

import hypothesis.strategies as st
import pytest
import redis
from hypothesis import given
from redis.crc import key_slot

from mayfly.journal import Durability, JournalRecord
from mayfly.model.errors import (
    AppendConflict,
    ChecksumMismatch,
    ConflictingRecord,
    CorruptionError,
    InvalidBackendURL,
    JournalGap,
    JournalUnavailable,
)
from mayfly.plugins import open_journal
from mayfly_redis import RedisJournal, RedisLeaseStore
from mayfly_redis._journal import decode_element, encode_element
from mayfly_redis.testing import RedisServer

if TYPE_CHECKING:
    from conftest import Records

WRITER = textwrap.dedent(
    """
    import json, sys
    from mayfly.identity import Uuid7IdSource
    from mayfly.journal import JournalRecord
    from mayfly.model.errors import JournalUnavailable
    from mayfly.plugins import open_journal

    url, run_id = sys.argv[1], sys.argv[2]
    journal = open_journal(url)
    ids = Uuid7IdSource()
    size = 0
    while True:
        try:
            first = journal.next_sequence(run_id)
            batch = [
                JournalRecord.seal(run_id=run_id, sequence=s, event_id=ids.new_id(), event_type="Probe",
                                   schema_version=1, payload=b'{"crash":true}')
                for s in range(first, first + 1 + size % 3)
            ]
            journal.append(run_id, first, batch)
        except JournalUnavailable as error:
            print("unavailable " + str(error), flush=True)
            break
        except BaseException as error:
            print("raw " + type(error).__module__ + "." + type(error).__name__, flush=True)
            break
        print("ack " + json.dumps([[r.sequence, r.event_id] for r in batch]), flush=True)
        size += 1
    """
)


@pytest.mark.parametrize("acks", [1, 25, 200])
def test_acknowledged_records_survive_sigkill_of_the_server(
    fresh_server: RedisServer, run_id: str, acks: int
) -> None:
    """SIGKILL of redis-server right after acknowledgements, restart on the same AOF: every ack is there."""
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, fresh_server.url, run_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    acknowledged: list[tuple[int, str]] = []
    try:
        assert writer.stdout is not None
        for _ in range(acks):
            line = writer.stdout.readline()
            assert line.startswith("ack "), line + (writer.stderr.read() if writer.stderr else "")
            acknowledged += [(sequence, event) for sequence, event in json.loads(line[4:])]
        fresh_server.kill()  # the writer is most likely mid-append
        last = writer.stdout.readline()
        while last.startswith("ack "):  # acks that raced the kill count too
            acknowledged += [(sequence, event) for sequence, event in json.loads(last[4:])]
            last = writer.stdout.readline()
        assert last.startswith("unavailable "), f"writer saw {last!r}, not a mapped JournalUnavailable"
    finally:
        writer.kill()
        writer.communicate(timeout=30)
    fresh_server.start()
    with open_journal(fresh_server.url) as journal:
        stored = journal.read(run_id)
        assert [record.sequence for record in stored] == list(range(1, len(stored) + 1))
        assert [(r.sequence, r.event_id) for r in stored[: len(acknowledged)]] == acknowledged
        next_sequence = journal.next_sequence(run_id)
        assert next_sequence == len(stored) + 1


def test_every_key_of_a_run_shares_one_cluster_slot(aof_server: RedisServer, run_id: str) -> None:
    """Records, ids, fence, lease and snapshot keys carry the {run-id} hash tag: one slot per run."""
    with RedisJournal(aof_server.url + "?prefix=app.one") as journal:
        target = journal._target
        names = ("records", "ids", "fence", "lease", "snapshot")
        keys = [target.key(run_id, name) for name in names]
        assert keys[0] == f"app.one:{{{run_id}}}:records"
        assert {key_slot(key.encode()) for key in keys} == {key_slot(run_id.encode())}


def test_prefixes_isolate_journals_on_one_server(
    aof_server: RedisServer, run_id: str, records: Records
) -> None:
    """Two prefixes on one database are two independent journals."""
    with (
        RedisJournal(aof_server.url + "?prefix=left") as left,
        RedisJournal(aof_server.url + "?prefix=right") as right,
    ):
        left.append(run_id, 1, records.batch(run_id, 1, 2))
        assert (left.next_sequence(run_id), right.next_sequence(run_id)) == (3, 1)
        assert run_id in left.list_runs(after=None, limit=100_000)
        assert run_id not in right.list_runs(after=None, limit=100_000)


def test_listing_pages_the_index_without_scanning(aof_server: RedisServer, records: Records) -> None:
    """list_runs pages the sorted-set index in order; a run whose first append failed is not listed."""
    with RedisJournal(aof_server.url + "?prefix=listing") as journal:
        runs = sorted(records.new_id() for _ in range(7))
        for run in runs:
            journal.append(run, 1, records.batch(run, 1))
        failed = records.new_id()
        with pytest.raises(AppendConflict):
            journal.append(failed, 2, records.batch(failed, 2))
        seen: list[str] = []
        after = None
        while page := journal.list_runs(after=after, limit=3):
            assert len(page) <= 3
            seen += page
            after = page[-1]
        assert seen == sorted(set(seen))
        assert set(runs) <= set(seen)
        assert failed not in seen
        assert journal.list_runs(after=runs[0], limit=1) == [seen[seen.index(runs[0]) + 1]]


def test_payload_newlines_and_unicode_round_trip(records: Records, run_id: str) -> None:
    """The element encoding keeps payload bytes exact, newlines and multi-byte UTF-8 included."""
    payload = '{"text":"line one\\nline two","raw":"\n\n✓ é"}'.encode()
    (record,) = records.batch(run_id, 1, payload=payload)
    decoded = decode_element(run_id, encode_element(record))
    assert decoded == record
    decoded.verify()


@given(
    payload=st.text(max_size=300).map(lambda text: text.encode("utf-8")),
    sequence=st.integers(1, 2**63 - 1),
    event_type=st.from_regex(r"[A-Za-z][A-Za-z0-9]{0,63}", fullmatch=True),
    version=st.integers(1, 2**63 - 1),
)
def test_element_encoding_round_trips_any_record(
    payload: bytes, sequence: int, event_type: str, version: int
) -> None:
    """Any valid record (any UTF-8 payload, extreme sequences) decodes back equal and verifies."""
    record = JournalRecord.seal(
        run_id="0190a0b0-0000-7000-8000-000000000001",
        sequence=sequence,
        event_id="0190a0b0-0000-7000-8000-000000000002",
        event_type=event_type,
        schema_version=version,
        payload=payload,
    )
    decoded = decode_element(record.run_id, encode_element(record))
    assert decoded == record
    decoded.verify()


def test_unreadable_element_is_a_checksum_error(run_id: str) -> None:
    """A stored element that does not parse fails closed with ChecksumMismatch naming the run."""
    with pytest.raises(ChecksumMismatch, match=run_id):
        decode_element(run_id, b"1\nnot enough fields")
    with pytest.raises(ChecksumMismatch):
        decode_element(run_id, b"x\ny\nz\nw\nv\n{}")


def test_tail_inconsistent_with_length_refuses_appends(
    aof_server: RedisServer, run_id: str, records: Records
) -> None:
    """If the stored tail's sequence disagrees with the list length, the append script fails closed."""
    with RedisJournal(aof_server.url) as journal:
        journal.append(run_id, 1, records.batch(run_id, 1, 3))
        journal.remove_record(run_id, 2)  # now 2 elements, the last holding sequence 3
        with pytest.raises(CorruptionError, match="sequence 3"):
            journal.append(run_id, 3, records.batch(run_id, 3))


def test_memory_mode_reports_memory(memory_server_url: str) -> None:
    """durability=memory opens on a non-persistent server and says so in durability and capabilities."""
    with open_journal(memory_server_url) as journal:
        assert journal.durability is Durability.MEMORY
        assert journal.capabilities.durability is Durability.MEMORY
        assert not journal.capabilities.crash_durable
        assert "durability=memory" in journal.url


def test_aof_mode_reports_durable(aof_server: RedisServer) -> None:
    """durability=aof on an AOF always server is durable and crash-durable."""
    with open_journal(aof_server.url) as journal:
        assert journal.durability is Durability.DURABLE
        assert journal.capabilities.crash_durable
        assert isinstance(journal, RedisJournal)
        assert "appendfsync always" in journal.persistence


def test_server_gone_maps_to_journal_unavailable(
    fresh_server: RedisServer, run_id: str, records: Records
) -> None:
    """Every operation on a journal whose server died raises JournalUnavailable, never a redis error."""
    journal = RedisJournal(fresh_server.url)
    journal.append(run_id, 1, records.batch(run_id, 1))
    fresh_server.kill()
    operations = [
        lambda: journal.append(run_id, 2, records.batch(run_id, 2)),
        lambda: journal.read(run_id),
        lambda: journal.next_sequence(run_id),
        journal.list_runs,
        lambda: journal.read_snapshot(run_id),
    ]
    for operation in operations:
        with pytest.raises(JournalUnavailable, match="unreachable"):
            operation()
    fresh_server.start()
    assert [r.sequence for r in journal.read(run_id)] == [1]
    journal.close()
    with pytest.raises(JournalUnavailable, match="closed"):
        journal.next_sequence(run_id)


def _field(element: bytes, index: int, value: bytes) -> bytes:
    """``element`` with its envelope field ``index`` (0 = sequence ... 4 = checksum) replaced."""
    parts = element.split(b"\n", 5)
    parts[index] = value
    return b"\n".join(parts)


# Each damage rewrites the stored element of sequence 3 (of five) directly: (run's elements, another
# run's elements) -> the new element.
ELEMENT_DAMAGE = {
    "payload": lambda mine, other: mine[2] + b" ",
    "sequence-not-canonical": lambda mine, other: _field(mine[2], 0, b"03"),
    "event-id": lambda mine, other: _field(mine[2], 1, b"0190a0b0-0000-7000-8000-000000000099"),
    "event-type": lambda mine, other: _field(mine[2], 2, b"Forged"),
    "event-type-invalid": lambda mine, other: _field(mine[2], 2, b"no such type!"),
    "schema-version": lambda mine, other: _field(mine[2], 3, b"2"),
    "schema-version-not-canonical": lambda mine, other: _field(mine[2], 3, b" 1"),
    "checksum": lambda mine, other: _field(mine[2], 4, b"0" * 64),
    "renumbered": lambda mine, other: _field(mine[3], 0, b"3"),
    "moved-from-another-run": lambda mine, other: other[2],
}


@pytest.mark.parametrize("damage", sorted(ELEMENT_DAMAGE))
def test_an_element_changed_in_place_fails_closed_on_every_read_path(
    aof_server: RedisServer, records: Records, damage: str
) -> None:
    """Rewriting any field of a stored element raises ChecksumMismatch naming run and sequence, on reads and re-appends."""
    run, other = records.new_id(), records.new_id()
    batch = records.batch(run, 1, 5)
    raw = redis.Redis(port=aof_server.port)
    with RedisJournal(aof_server.url + "?prefix=damage") as journal:
        journal.append(run, 1, batch)
        journal.append(other, 1, records.batch(other, 1, 5))
        key = journal._target.key(run, "records")
        elements = raw.lrange(key, 0, -1)
        others = raw.lrange(journal._target.key(other, "records"), 0, -1)
        raw.lset(key, 2, ELEMENT_DAMAGE[damage](elements, others))
        located = rf"run {run} sequence 3\b"
        with pytest.raises(ChecksumMismatch, match=located):
            journal.read(run)
        with pytest.raises(ChecksumMismatch, match=located):
            journal.read(run, after=2, limit=1)  # the lookup of a snapshot's last record
        with pytest.raises(ChecksumMismatch, match=located):
            journal.append(run, 1, batch)  # an exact re-append must not pass for committed
        assert journal.read(run, limit=2) == batch[:2]
    raw.close()


def test_a_missing_record_is_reported_where_it_is(aof_server: RedisServer, records: Records) -> None:
    """Record 4 of 9 removed: the gap is reported as expected sequence 4, found 5."""
    run = records.new_id()
    with RedisJournal(aof_server.url + "?prefix=gaps") as journal:
        journal.append(run, 1, records.batch(run, 1, 9))
        journal.remove_record(run, 4)
        with pytest.raises(JournalGap, match=rf"^journal gap in run {run}: expected sequence 4, found 5; "):
            journal.read(run)
        with pytest.raises(JournalGap, match="expected sequence 4, found 5"):
            journal.read(run, after=3, limit=1)
        assert [r.sequence for r in journal.read(run, limit=3)] == [1, 2, 3]


def test_a_missing_last_record_is_a_gap_not_a_shorter_history(
    aof_server: RedisServer, records: Records
) -> None:
    """Record 9 of 9 removed: reads raise JournalGap at sequence 9 (the ids index counts 9), appends are refused."""
    run = records.new_id()
    batch = records.batch(run, 1, 9)
    with RedisJournal(aof_server.url + "?prefix=gaps") as journal:
        journal.append(run, 1, batch)
        journal.remove_record(run, 9)
        tail = rf"^journal gap in run {run}: expected sequence 9, found none \(the run's head is at 10\); "
        with pytest.raises(JournalGap, match=tail):
            journal.read(run)
        with pytest.raises(JournalGap, match=tail):
            journal.read(run, after=8)
        assert journal.read(run, after=5, limit=3) == batch[5:8]
        with pytest.raises(CorruptionError, match="the list holds 8 records but 9 were appended"):
            journal.append(run, 9, records.batch(run, 9))
        assert journal.read(run, after=9) == []


def test_a_damaged_event_id_index_fails_closed(aof_server: RedisServer, records: Records) -> None:
    """An ids field deleted or rewritten makes reads or re-appends raise a corruption error, never acknowledge."""
    run = records.new_id()
    batch = records.batch(run, 1, 5)
    raw = redis.Redis(port=aof_server.port)
    with RedisJournal(aof_server.url + "?prefix=index") as journal:
        journal.append(run, 1, batch)
        ids = journal._target.key(run, "ids")
        raw.hset(ids, batch[2].event_id, f"3 {'0' * 64}")
        with pytest.raises(ConflictingRecord, match="sequence 3"):
            journal.append(run, 1, batch)
        raw.hdel(ids, batch[4].event_id)
        with pytest.raises(
            CorruptionError, match=rf"run {run} holds sequence 5 beyond its head \(next sequence 5\)"
        ):
            journal.read(run)
        with pytest.raises(CorruptionError, match="the list holds 5 records but 4 were appended"):
            journal.append(run, 6, records.batch(run, 6))
    raw.close()


@pytest.mark.parametrize("opener", [RedisJournal, RedisLeaseStore, open_journal])
def test_a_prefix_with_raw_control_characters_is_refused_not_stripped(
    aof_server: RedisServer, records: Records, opener: Any
) -> None:
    """prefix=x\\r\\nFLUSHALL is refused at open; nothing is written under the xFLUSHALL that stripping would give."""
    tag = records.new_id()[-12:]
    raw = redis.Redis(port=aof_server.port)
    run = records.new_id()
    with pytest.raises(InvalidBackendURL, match=r"control character '\\r' at position \d+; remove it"):
        store = opener(f"{aof_server.url}?prefix=x{tag}\r\nFLUSHALL")
        if isinstance(store, RedisJournal):
            store.append(run, 1, records.batch(run, 1))
        else:
            store.acquire(run, "probe", 10_000)
    assert raw.keys(f"x{tag}*") == []
    raw.close()
