"""The LMDB journal beyond the contract suite: crashes, several processes, inspectors and the hub."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import greenlet
import pytest
from lmdb_support import Worker, batch, new_id

from mayfly.journal import Durability
from mayfly.model.errors import (
    AppendConflict,
    CorruptionError,
    FencingRejected,
    InvalidRecord,
    JournalGap,
    JournalUnavailable,
)
from mayfly.substrate import Hub, checkpoint, spawn
from mayfly_lmdb import LmdbJournal, LmdbLeaseStore, _codec


def _event_id(tag: str, sequence: int) -> str:
    return f"{tag}-0000-7000-8000-{sequence:012x}"


@pytest.mark.parametrize("options", ["", "?durability=nosync", "?map_size=64k"])
def test_sigkill_after_acknowledgements_loses_nothing(
    env_dir: Path, workers: list[Worker], options: str
) -> None:
    """A writer SIGKILLed right after acks: every acked record is there after reopen, run appendable."""
    url = f"lmdb://{env_dir}{options}"
    run = new_id()
    worker = Worker("append", url=url, run_id=run, batches=-1, batch=3, size=1500, tag="0000000b")
    workers.append(worker)
    assert worker.readline() == "ready"
    acknowledged = 0
    for _ in range(60):
        line = worker.readline()
        assert line.startswith("ack ")
        acknowledged = int(line[4:])
    worker.kill()  # most likely in the middle of its next append
    with LmdbJournal(url) as journal:
        records = journal.read(run)
        assert len(records) >= acknowledged
        assert [r.sequence for r in records] == list(range(1, len(records) + 1))
        assert [r.event_id for r in records[:acknowledged]] == [
            _event_id("0000000b", sequence) for sequence in range(1, acknowledged + 1)
        ]
        following = journal.next_sequence(run)
        assert following == len(records) + 1
        journal.append(run, following, batch(run, following, 2))


def test_processes_append_to_different_runs_of_one_environment(env_dir: Path, workers: list[Worker]) -> None:
    """Four processes appending to their own runs of one environment all keep every record."""
    url = f"lmdb://{env_dir}?map_size=64k&durability=nosync"
    runs = [new_id() for _ in range(4)]
    for index, run in enumerate(runs):
        workers.append(
            Worker("append", url=url, run_id=run, batches=80, batch=3, size=500, tag=f"0000000{index}")
        )
    for worker in workers:
        assert worker.finish()[-1] == "done"
    with LmdbJournal(url) as journal:
        for index, run in enumerate(runs):
            records = journal.read(run)
            assert [r.event_id for r in records] == [
                _event_id(f"0000000{index}", sequence) for sequence in range(1, 241)
            ]
        assert set(runs) <= set(journal.list_runs())


def test_processes_racing_on_one_run_never_duplicate(env_dir: Path, workers: list[Worker]) -> None:
    """Three processes compare-and-appending to one run produce one contiguous history."""
    url = f"lmdb://{env_dir}?durability=nosync"
    run = new_id()
    for index in range(3):
        workers.append(
            Worker("append", url=url, run_id=run, batches=60, batch=2, size=100, tag=f"0000001{index}")
        )
    for worker in workers:
        assert worker.finish()[-1] == "done"
    with LmdbJournal(url) as journal:
        records = journal.read(run)
    assert [r.sequence for r in records] == list(range(1, 361))
    assert len({r.event_id for r in records}) == 360


def test_a_readonly_inspector_reads_while_another_process_writes(
    env_dir: Path, workers: list[Worker]
) -> None:
    """An inspector opened readonly=true sees growing, contiguous, verified prefixes of a live run."""
    url = f"lmdb://{env_dir}?map_size=64k&durability=nosync"
    run = new_id()
    with LmdbJournal(url) as journal:
        journal.append(run, 1, batch(run, 1))
    writer = Worker("append", url=url, run_id=run, batches=150, batch=3, size=1500, tag="0000000c")
    workers.append(writer)
    inspector = Worker("inspect", url=f"lmdb://{env_dir}?readonly=true", run_id=run, until=451, timeout=60)
    workers.append(inspector)
    assert writer.finish()[-1] == "done"
    report = inspector.finish()[-1]
    assert report.startswith("{"), report
    assert '"last": 451' in report


def test_hub_tasks_never_switch_inside_a_transaction(url: str) -> None:
    """Many hub tasks append and read concurrently: the hub never switches inside a read, never writes itself."""
    runs = [new_id() for _ in range(5)]
    shared_run = new_id()
    switches_in_txn: list[str] = []
    switches = 0
    hub_thread = threading.get_ident()
    inside: list[int] = []
    writers: set[int] = set()

    with LmdbJournal(url + "?durability=nosync") as journal:
        shared_env = journal._env
        read, write_many = shared_env.read, shared_env._write_many

        # Instrumentation only: each transaction's body is run as before, recording where it ran.
        def traced_read(body: Any, operation: str) -> Any:
            def run(txn: Any) -> Any:
                inside.append(threading.get_ident())
                try:
                    return body(txn)
                finally:
                    inside.pop()

            return read(run, operation)

        def traced(body: Any) -> Any:
            def run(txn: Any) -> Any:
                writers.add(threading.get_ident())
                return body(txn)

            return run

        def traced_write(writes: Any) -> None:
            for queued in writes:
                queued.body = traced(queued.body)
            write_many(writes)

        shared_env.read = traced_read  # type: ignore[method-assign]
        shared_env._write_many = traced_write  # type: ignore[method-assign]

        def trace(event: str, _args: object) -> None:
            nonlocal switches
            if event in ("switch", "throw") and threading.get_ident() == hub_thread:
                switches += 1
                if hub_thread in inside:
                    switches_in_txn.append(event)

        def own(run: str) -> int:
            for sequence in range(1, 61, 3):
                journal.append(run, sequence, batch(run, sequence, 3))
                checkpoint()
                assert len(journal.read(run)) == sequence + 2
            return journal.next_sequence(run)

        def contend() -> int:
            won = 0
            while won < 20:
                expected = journal.next_sequence(shared_run)
                checkpoint()  # let a rival take this sequence first
                try:
                    journal.append(shared_run, expected, batch(shared_run, expected))
                except AppendConflict:
                    continue
                won += 1
            return won

        def main() -> list[int]:
            tasks = [spawn(own, run) for run in runs] + [spawn(contend) for _ in range(3)]
            return [task.join() for task in tasks]

        previous = greenlet.settrace(trace)
        try:
            results = Hub().run(main)
        finally:
            greenlet.settrace(previous)
        assert results == [61] * 5 + [20] * 3
        assert [r.sequence for r in journal.read(shared_run)] == list(range(1, 61))
    assert switches > 100
    assert switches_in_txn == []
    assert writers and hub_thread not in writers  # every commit ran on an offload thread


def test_fencing_is_checked_in_the_append_transaction(url: str) -> None:
    """After a grant, appends need its exact token; the rejection names the current token."""
    run = new_id()
    with LmdbJournal(url) as journal, LmdbLeaseStore(url) as leases:
        journal.append(run, 1, batch(run, 1))
        with leases.acquire(run, "a", 1000) as guard:
            with pytest.raises(FencingRejected, match=f"token {guard.fencing_token}"):
                journal.append(run, 2, batch(run, 2))
            journal.append(run, 2, batch(run, 2), fence=guard.fencing_token)
        assert journal.next_sequence(run) == 3


def test_a_missing_last_record_is_a_gap(url: str) -> None:
    """Removing the newest record (head still ahead) makes reads raise JournalGap, never shorten."""
    run = new_id()
    with LmdbJournal(url) as journal:
        journal.append(run, 1, batch(run, 1, 3))
        journal.remove_record(run, 3)
        with pytest.raises(JournalGap, match="sequence 3"):
            journal.read(run)
        assert [r.sequence for r in journal.read(run, limit=2)] == [1, 2]
        with pytest.raises(InvalidRecord):
            journal.remove_record(run, 9)


def test_a_record_beyond_the_head_is_corruption(url: str) -> None:
    """A stored record past the run's head (which no commit can produce) fails closed."""
    run = new_id()
    with LmdbJournal(url) as journal:
        journal.append(run, 1, batch(run, 1, 2))
        shared = journal._env
        from mayfly_lmdb import _codec

        (extra,) = batch(run, 3)
        shared.write(
            lambda txn: txn.put(
                _codec.record_key(_codec.run_key(run), 3), _codec.encode_record(extra), db=shared.records
            ),
            "test damage",
        )
        with pytest.raises(CorruptionError, match="beyond its head"):
            journal.read(run)


def test_reads_window_and_limit_zero(url: str) -> None:
    """read(after, limit) windows the history; limit=0 reads nothing; reads past the end are empty."""
    run = new_id()
    with LmdbJournal(url) as journal:
        journal.append(run, 1, batch(run, 1, 5))
        assert journal.read(run, limit=0) == []
        assert [r.sequence for r in journal.read(run, after=1, limit=2)] == [2, 3]
        assert journal.read(run, after=5) == []
        assert journal.read(run, after=50) == []


def test_listing_pages_and_skips_leased_runs_without_records(url: str) -> None:
    """list_runs pages strictly after ``after`` and omits runs that were only leased."""
    runs = sorted(new_id() for _ in range(5))
    leased_only = new_id()
    with LmdbJournal(url) as journal, LmdbLeaseStore(url) as leases:
        for run in runs:
            journal.append(run, 1, batch(run, 1))
        leases.acquire(leased_only, "x", 1000).release()
        assert journal.list_runs() == runs
        assert journal.list_runs(after=runs[1], limit=2) == runs[2:4]
        assert journal.list_runs(after=runs[-1]) == []
        with pytest.raises(InvalidRecord):
            journal.list_runs(limit=0)


def test_a_closed_journal_refuses_work(url: str) -> None:
    """After close every operation raises JournalUnavailable; close is idempotent."""
    journal = LmdbJournal(url)
    journal.close()
    journal.close()
    run = new_id()
    with pytest.raises(JournalUnavailable, match="closed"):
        journal.append(run, 1, batch(run, 1))
    with pytest.raises(JournalUnavailable):
        journal.read(run)


def test_durability_follows_the_url(tmp_path: Path) -> None:
    """sync declares durable, nosync declares write; both stay crash-durable for the process."""
    with LmdbJournal(f"lmdb://{tmp_path}/a") as durable:
        assert durable.durability is Durability.DURABLE
        assert durable.capabilities.crash_durable
    with LmdbJournal(f"lmdb://{tmp_path}/b?durability=nosync") as fast:
        assert fast.durability is Durability.WRITE
        assert fast.capabilities.durability is Durability.WRITE
        assert fast.url.endswith("?durability=nosync")


def test_a_hot_backup_is_a_consistent_prefix(env_dir: Path, tmp_path: Path, workers: list[Worker]) -> None:
    """A backup taken while another process appends holds a contiguous, verified prefix of the run."""
    url = f"lmdb://{env_dir}?durability=nosync"
    run = new_id()
    with LmdbJournal(url) as journal:
        journal.append(run, 1, batch(run, 1))
        writer = Worker("append", url=url, run_id=run, batches=200, batch=3, size=800, tag="0000000d")
        workers.append(writer)
        assert writer.readline() == "ready"
        writer.readline()
        copy = journal.backup(tmp_path / "backup")
        with pytest.raises(JournalUnavailable, match="not empty"):
            journal.backup(copy)
        assert writer.finish()[-1] == "done"
    with LmdbJournal(f"lmdb://{copy}?readonly=true") as restored:
        records = restored.read(run)
    assert len(records) >= 4
    assert [r.sequence for r in records] == list(range(1, len(records) + 1))


def test_the_lmdb_copy_tool_backs_up_an_environment(url: str, env_dir: Path, tmp_path: Path) -> None:
    """`python -m lmdb copy --compact` (the mdb_copy equivalent) yields a journal that reads back."""
    import subprocess
    import sys

    run = new_id()
    with LmdbJournal(url) as journal:
        journal.append(run, 1, batch(run, 1, 3))
        subprocess.run(
            [sys.executable, "-m", "lmdb", "copy", "--compact", "-e", str(env_dir), str(tmp_path / "copy")],
            check=True,
            capture_output=True,
        )
    with LmdbJournal(f"lmdb://{tmp_path / 'copy'}") as restored:
        assert [r.sequence for r in restored.read(run)] == [1, 2, 3]


def _replace(value: bytes, start: int, new: bytes) -> bytes:
    return value[:start] + new + value[start + len(new) :]


# Record value layout: version (1) | checksum (32) | event id (16) | schema_version (8) | type length (1)
# | event type | payload. Each damage edits what the records database holds for sequence 3 (of five):
# (txn, records db, run key, other run key) -> None.
def _value_damage(edit: Callable[[bytes], bytes]) -> Callable[..., None]:
    def damage(txn: Any, records: Any, run: bytes, other: bytes) -> None:
        key = _codec.record_key(run, 3)
        txn.put(key, edit(txn.get(key, db=records)), db=records)

    return damage


def _renumbered(txn: Any, records: Any, run: bytes, other: bytes) -> None:
    txn.put(_codec.record_key(run, 3), txn.get(_codec.record_key(run, 4), db=records), db=records)


def _moved(txn: Any, records: Any, run: bytes, other: bytes) -> None:
    txn.put(_codec.record_key(run, 3), txn.get(_codec.record_key(other, 3), db=records), db=records)


def _malformed_key(txn: Any, records: Any, run: bytes, other: bytes) -> None:
    key = _codec.record_key(run, 3)
    value = txn.get(key, db=records)
    txn.delete(key, db=records)
    txn.put(key + b"x", value, db=records)


RECORD_DAMAGE = {
    "value-format": _value_damage(lambda value: b"\x02" + value[1:]),
    "value-checksum": _value_damage(lambda value: _replace(value, 1, b"\x00" * 32)),
    "value-event-id": _value_damage(lambda value: _replace(value, 33, b"\x01" * 16)),
    "value-schema-version": _value_damage(lambda value: _replace(value, 49, (2).to_bytes(8, "big"))),
    "value-event-type": _value_damage(lambda value: _replace(value, 58, b"Forge")),
    "value-event-type-invalid": _value_damage(lambda value: _replace(value, 58, b"Pr be")),
    "value-payload": _value_damage(lambda value: value + b" "),
    "value-payload-not-utf8": _value_damage(lambda value: value + b"\xff"),
    "key-renumbered": _renumbered,
    "key-moved-from-another-run": _moved,
    "key-malformed": _malformed_key,
}


@pytest.mark.parametrize("damage", sorted(RECORD_DAMAGE))
def test_a_rewritten_value_or_key_fails_closed_on_every_read_path(url: str, damage: str) -> None:
    """Rewriting any byte of a stored record, or the key it is stored under, raises a corruption error naming run and sequence."""
    run, other = new_id(), new_id()
    records = batch(run, 1, 5)
    with LmdbJournal(url) as journal:
        journal.append(run, 1, records)
        journal.append(other, 1, batch(other, 1, 5))
        shared = journal._env
        shared.write(
            lambda txn: RECORD_DAMAGE[damage](
                txn, shared.records, _codec.run_key(run), _codec.run_key(other)
            ),
            "test damage",
        )
        located = rf"run {run} (holds a malformed record key .* where )?sequence 3\b"
        with pytest.raises(CorruptionError, match=located):
            journal.read(run)
        with pytest.raises(CorruptionError, match=located):
            journal.read(run, after=2, limit=1)  # the lookup of a snapshot's last record
        with pytest.raises(CorruptionError, match=rf"run {run} .*sequence 3\b"):
            journal.append(run, 1, records)  # an exact re-append must not pass for committed
        assert journal.read(run, limit=2) == records[:2]


def test_an_append_never_overwrites_a_stored_record(url: str) -> None:
    """With the head rewritten behind the records, an append is refused and the stored record stays."""
    run = new_id()
    with LmdbJournal(url) as journal:
        journal.append(run, 1, batch(run, 1, 5))
        shared = journal._env
        key = _codec.record_key(_codec.run_key(run), 3)
        before = shared.read(lambda txn: txn.get(key, db=shared.records), "test read")
        shared.write(
            lambda txn: txn.put(_codec.run_key(run), _codec.encode_head(3, 0), db=shared.heads), "test damage"
        )
        with pytest.raises(CorruptionError, match=rf"run {run} already holds a record at sequence 3"):
            journal.append(run, 3, batch(run, 3, 2))
        assert shared.read(lambda txn: txn.get(key, db=shared.records), "test read") == before
        assert journal.next_sequence(run) == 3


def test_a_missing_record_is_reported_where_it_is(url: str) -> None:
    """Record 4 of 9 removed: the gap is reported as expected sequence 4, found 5."""
    run = new_id()
    with LmdbJournal(url) as journal:
        journal.append(run, 1, batch(run, 1, 9))
        journal.remove_record(run, 4)
        with pytest.raises(JournalGap, match=rf"^journal gap in run {run}: expected sequence 4, found 5; "):
            journal.read(run)
        with pytest.raises(JournalGap, match="expected sequence 4, found 5"):
            journal.read(run, after=3, limit=1)
        assert [r.sequence for r in journal.read(run, limit=3)] == [1, 2, 3]


def test_a_missing_last_record_is_located_against_the_head(url: str) -> None:
    """Record 9 of 9 removed: reads raise JournalGap at sequence 9 against the run's head, never return 8."""
    run = new_id()
    records = batch(run, 1, 9)
    with LmdbJournal(url) as journal:
        journal.append(run, 1, records)
        journal.remove_record(run, 9)
        tail = rf"^journal gap in run {run}: expected sequence 9, found none \(the run's head is at 10\); "
        with pytest.raises(JournalGap, match=tail):
            journal.read(run)
        with pytest.raises(JournalGap, match=tail):
            journal.read(run, after=8)
        assert journal.read(run, after=5, limit=3) == records[5:8]
